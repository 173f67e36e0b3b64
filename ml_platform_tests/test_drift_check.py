"""The drift report in the graph: per partition, stored as drift_report with its check failing at
WARN; drift of a blocking feature recorded as the day's model verdict, and a day without a report
as "no drift report"; the reference days named with their data versions; each feature calibrated
by its day-to-day movement in the stored reference days; and the feature profile recorded on
every features partition."""

import datetime as dt
import json
from pathlib import Path

import dagster as dg
import pytest

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import BUNDLED_DIR, parse_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.drift.checks import FEATURES_DRIFT_CHECK
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.synthetic import Drift, file_bytes, generate_day
from ml_platform_tests.conftest import Platform, days_from

DAYS = days_from("2024-01-01", 4)


def blocking_on_x2(tmp_path: Path):
    """The synthetic contract with x2 marked blocking; x1 keeps the default (warn).

    Temperature is left out: it moves every day, and with fewer reference days than
    calibration.min_days (as on the first days here) the fixed gate rightly fires on it.
    """
    text = (BUNDLED_DIR / "synthetic.yaml").read_text()
    text += "  features:\n    x2: {blocking: true}\n    temperature: {exclude: true}\n"
    return parse_contract(text, str(tmp_path / "synthetic.yaml"))


def store_validated(platform: Platform, day: str, drift: Drift | None = None) -> None:
    """Put a day's typed rows in the lake as validated_data, as if the quality gate had run.

    The gate (Great Expectations) is tested on its own; here it would only add seconds a day.
    """
    contract = platform.contract
    frame = generate_day(
        dt.date.fromisoformat(day), seed=contract.source.seed, rows=1000, drift=drift
    )
    raw = read_landed_file(file_bytes(frame), "day.csv", day, ["segment"])
    platform.put("validated_data", day, type_rows(raw, contract, day), "parquet")


def store_features(platform: Platform, day: str) -> None:
    """Put a day's features in the lake, as if its features partition had been materialised."""
    contract = platform.contract
    frame = generate_day(dt.date.fromisoformat(day), seed=contract.source.seed, rows=1000)
    raw = read_landed_file(file_bytes(frame), "day.csv", day, ["segment"])
    features = build_features(type_rows(raw, contract, day), contract)
    platform.put("features", day, features, "parquet")


def run(platform: Platform, day: str, selection: list[str]) -> dg.ExecuteInProcessResult:
    defs = platform.defs
    return dg.materialize(
        [*(defs.assets or []), *(defs.asset_checks or [])],
        partition_key=day,
        resources=defs.resources,
        instance=platform.instance,
        selection=[platform.key(name) for name in selection],
        raise_on_error=False,
    )


def drift_check(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    (evaluation,) = [
        e for e in result.get_asset_check_evaluations() if e.check_name == FEATURES_DRIFT_CHECK
    ]
    return evaluation


DRIFT = ["features", "drift_report"]


def test_drift_check_runs_per_day_stores_its_report_and_warns_or_blocks(tmp_path):
    platform = Platform(blocking_on_x2(tmp_path), tmp_path)
    graph = platform.defs.resolve_asset_graph()
    spec = graph.get_check_spec(
        dg.AssetCheckKey(platform.key("drift_report"), FEATURES_DRIFT_CHECK)
    )
    assert spec.partitions_def is not None
    # x2 is blocking: the model reads the day's drift report as an input.
    assert platform.key("drift_report") in graph.get(platform.key("model")).parent_keys

    for day in DAYS[:3]:
        store_validated(platform, day)
    day_one = run(platform, DAYS[0], DRIFT)
    first = drift_check(day_one)
    assert first.passed and "not evaluated" in first.description  # nothing before day 1
    profile = day_one.asset_materializations_for_node(platform.node("features"))[0].metadata
    assert profile["profile/x1/count"].value == 1000
    assert profile["profile/x4/nulls"].value > 0  # x4 has about 2 % missing values
    assert profile["profile/segment/distinct"].value == 3
    assert {f"profile/x2/{s}" for s in ("mean", "std", "min", "p05", "p50", "p95", "max")} <= set(
        profile
    )
    for day in DAYS[1:3]:
        check = drift_check(run(platform, day, DRIFT))
        assert check.passed, check.description
        assert check.metadata["reference_days"].value == DAYS.index(day)

    # x1 drifts and is not blocking: the check fails at WARN and the model still trains.
    store_validated(platform, DAYS[3], Drift("x1", 1.0, dt.date.fromisoformat(DAYS[3])))
    warned = run(platform, DAYS[3], [*DRIFT, "model"])
    check = drift_check(warned)
    assert warned.success and not check.passed
    assert check.severity == dg.AssetCheckSeverity.WARN
    assert check.description.startswith("1 of 7 feature(s) drifted on 2024-01-04")
    assert "x1 (KS D" in check.description and "reference sd" in check.description
    # Three reference days are too few to know each feature's day-to-day movement.
    assert "Not calibrated: 3 reference day(s), fewer than drift.calibration.min_days 4" in (
        check.description
    )
    assert check.metadata["calibration"].value.startswith("not calibrated: 3 reference day(s)")
    assert check.metadata["reference_partitions"].value == DAYS[:3]
    assert check.metadata["drift_share"].value == pytest.approx(1 / 7, abs=1e-4)
    report = json.loads(platform.stored("drift_report", DAYS[3], "json").read_text())
    assert report["partition"] == DAYS[3] and report["drifting_features"] == ["x1"]
    assert report["features"][0]["n_current"] == 1000
    assert "data:image/svg+xml;base64," in check.metadata["report"].value
    assert warned.asset_materializations_for_node(platform.node("model"))

    [trained] = warned.asset_materializations_for_node(platform.node("model"))
    assert trained.metadata["verdict"].value == "accepted"
    model_file = Path(trained.metadata["path"].value)
    model_bytes = model_file.read_bytes()

    # The day is redone with x2 shifted: x2 is blocking, so the check fails (at WARN) and the
    # day's model, which reads the day's drift report as its input, records the verdict
    # "blocking drift" instead of training. The run succeeds, and the model the day had before
    # is kept as it was.
    store_validated(platform, DAYS[3], Drift("x2", 1.0, dt.date.fromisoformat(DAYS[3])))
    blocked = run(platform, DAYS[3], [*DRIFT, "model"])
    check = drift_check(blocked)
    assert blocked.success
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert "x2 is blocking" in check.description
    report = json.loads(platform.stored("drift_report", DAYS[3], "json").read_text())
    assert report["drifting_features"] == ["x2"]  # the rerun recorded the day's new report
    [model] = blocked.asset_materializations_for_node(platform.node("model"))
    record = {name: entry.value for name, entry in model.metadata.items()}
    assert record["verdict"] == "blocking drift"
    assert record["blocking_drift"] == ["x2"]
    assert "drifted on x2" in record["reason"] and "drift_report" in record["reason"]
    assert record["accepted"] is True  # the earlier model of the day is kept
    assert record["kept_previous_version"] == str(model_file)
    assert model_file.read_bytes() == model_bytes
    assert not any(c.check_name == "finite_weights" for c in blocked.get_asset_check_evaluations())

    # A day with no model before records the verdict as a tombstone: no model file at all.
    fifth = days_from(DAYS[3], 2)[1]
    # (x2 moved on DAYS[3], which the reference now holds: a larger shift is drift.)
    store_validated(platform, fifth, Drift("x2", 4.0, dt.date.fromisoformat(fifth)))
    first_blocked = run(platform, fifth, [*DRIFT, "model"])
    assert first_blocked.success and not drift_check(first_blocked).passed
    [model] = first_blocked.asset_materializations_for_node(platform.node("model"))
    record = {name: entry.value for name, entry in model.metadata.items()}
    assert (record["verdict"], record["accepted"], record["accepted_rows"]) == (
        "blocking drift",
        False,
        0,
    )
    assert record["blocking_drift"] == ["x2"]
    assert not platform.stored("model", fifth, "joblib").exists()


def test_a_feature_that_moves_every_day_is_judged_by_its_usual_movement(tmp_path):
    platform = Platform(load_contract("synthetic"), tmp_path)
    days = days_from("2024-01-01", 9)
    for day in days[:8]:
        store_features(platform, day)
    store_validated(platform, days[8])
    quiet = drift_check(run(platform, days[8], DRIFT))
    # The day's temperature is not the reference's (the fixed gate alone fires), but no
    # further from it than the reference days are from each other.
    assert quiet.passed, quiet.description
    assert "no more than on an ordinary day" in quiet.description
    assert "temperature (KS D" in quiet.description and "usual day-to-day" in quiet.description
    assert quiet.metadata["calibration"].value.startswith("quantile 0.975 of each feature's 8")
    bound = quiet.metadata["temperature/calibration_bound"].value
    assert quiet.metadata["temperature/ks_d"].value <= bound

    store_validated(platform, days[8], Drift("temperature", 4.0, dt.date.fromisoformat(days[8])))
    shifted = drift_check(run(platform, days[8], DRIFT))
    assert not shifted.passed and shifted.severity == dg.AssetCheckSeverity.WARN
    assert shifted.description.startswith("1 of 8 feature(s) drifted on 2024-01-09")
    assert f"(bound {bound:.3f})" in shifted.description
    report = json.loads(platform.stored("drift_report", days[8], "json").read_text())
    assert report["drifting_features"] == ["temperature"]
    row = next(f for f in report["features"] if f["feature"] == "temperature")
    assert row["effect"] > row["calibration_bound"] == pytest.approx(bound, abs=1e-4)


def latest_record(platform: Platform, asset: str, day: str) -> dg.EventLogRecord:
    [record] = platform.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=platform.key(asset), asset_partitions=[day]), limit=1
    ).records
    return record


def test_a_day_without_a_drift_report_is_not_a_day_without_drift(tmp_path):
    platform = Platform(blocking_on_x2(tmp_path), tmp_path)
    for day in DAYS[:2]:
        store_validated(platform, day)
    assert run(platform, DAYS[0], DRIFT).success
    # Day 2's features are accepted, but its drift report was never materialised: x2 is
    # blocking, so the model cannot know whether it may train.
    assert run(platform, DAYS[1], ["features"]).success
    result = run(platform, DAYS[1], ["model"])
    assert result.success, "a missing drift report is a verdict of the day, not a failed run"
    [model] = result.asset_materializations_for_node(platform.node("model"))
    record = {name: entry.value for name, entry in model.metadata.items()}
    assert (record["verdict"], record["accepted"]) == ("no drift report", False)
    assert "drift_report 2024-01-02 was never materialised" in record["reason"]
    assert record["blocking_features"] == ["x2"]
    assert not platform.stored("model", DAYS[1], "joblib").exists()
    assert not any(c.check_name == "finite_weights" for c in result.get_asset_check_evaluations())

    # Its report materialised, the same day trains.
    assert run(platform, DAYS[1], ["drift_report"]).success
    trained = run(platform, DAYS[1], ["model"])
    [model] = trained.asset_materializations_for_node(platform.node("model"))
    assert model.metadata["verdict"].value == "accepted"
    assert platform.stored("model", DAYS[1], "joblib").exists()


def test_a_model_without_blocking_features_does_not_read_the_drift_report(tmp_path):
    platform = Platform(load_contract("synthetic"), tmp_path)
    graph = platform.defs.resolve_asset_graph()
    assert graph.get(platform.key("model")).parent_keys == {platform.key("features")}
    store_validated(platform, DAYS[0])
    assert run(platform, DAYS[0], ["features"]).success
    result = run(platform, DAYS[0], ["model"])
    [model] = result.asset_materializations_for_node(platform.node("model"))
    assert model.metadata["verdict"].value == "accepted"


def test_the_drift_verdict_names_its_reference_days_and_their_data_versions(tmp_path):
    platform = Platform(load_contract("synthetic"), tmp_path)
    for day in DAYS:
        store_validated(platform, day)
    for day in DAYS[:3]:
        assert run(platform, day, ["features"]).success
    result = run(platform, DAYS[3], DRIFT)
    check = drift_check(result)
    references = DAYS[:3]
    # What Dagster recorded of each reference day's features: data version and run.
    recorded = {day: latest_record(platform, "features", day) for day in references}
    versions = {
        day: r.asset_materialization.tags["dagster/data_version"] for day, r in recorded.items()
    }
    assert all(versions.values())
    runs = {day: r.run_id for day, r in recorded.items()}
    [report] = result.asset_materializations_for_node(platform.node("drift_report"))
    for metadata in (check.metadata, report.metadata):
        assert metadata["reference_partitions"].value == references
        assert metadata["reference_data_versions"].value == versions
        assert metadata["reference_runs"].value == runs
    # The model of the day then reads the report Dagster recorded, not a file the lake holds.
    stored = json.loads(platform.stored("drift_report", DAYS[3], "json").read_text())
    assert stored["reference"]["partitions"] == references
    assert stored["reference"]["data_versions"] == versions
