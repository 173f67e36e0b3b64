"""A range of days in one run (what a backfill from the UI launches) against one run per day."""

import datetime as dt
import json
from typing import Any

import dagster as dg
import joblib
import numpy as np
import pandas as pd
import pytest
import yaml

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.platform.failures import CODE_BUG
from ml_platform.platform.run_events import classify_outcome, run_outcome
from ml_platform_tests.conftest import ALL_ASSETS, DAILY_ASSETS, Platform, contract_with, days_from

pytestmark = pytest.mark.slow

DAYS = days_from("2024-01-01", 3)


def materialize_range(
    platform: Platform,
    first: str,
    last: str,
    selection: list[str] = DAILY_ASSETS,
    **resources: Any,
) -> dg.ExecuteInProcessResult:
    """One run of the daily assets and their checks over first..last, as a backfill runs it.

    `resources` replace the code location's of the same names.
    """
    return dg.materialize(
        [*(platform.defs.assets or []), *(platform.defs.asset_checks or [])],
        resources={**(platform.defs.resources or {}), **resources},
        instance=platform.instance,
        selection=[platform.key(name) for name in selection],
        tags={
            "dagster/asset_partition_range_start": first,
            "dagster/asset_partition_range_end": last,
        },
        raise_on_error=False,
    )


def latest_evaluations(
    platform: Platform, asset: str, check: str
) -> dict[str, dg.AssetCheckEvaluation]:
    """Latest evaluation of a check per partition, from the instance."""
    records = platform.instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(platform.key(asset), check), limit=100
    )
    latest: dict[str, dg.AssetCheckEvaluation] = {}
    for record in reversed(records):  # oldest first, so the latest wins
        evaluation = record.event.dagster_event.event_specific_data if record.event else None
        if isinstance(evaluation, dg.AssetCheckEvaluation) and evaluation.partition:
            latest[evaluation.partition] = evaluation
    return latest


def evaluations(platform: Platform, asset: str, check: str) -> dict[str, bool]:
    """Whether the latest evaluation of a check passed, per partition."""
    return {day: e.passed for day, e in latest_evaluations(platform, asset, check).items()}


def alias_moves(platform: Platform) -> tuple[list[tuple], dict]:
    """Each registered day's alias move and the aliases after it, and the registry's aliases."""
    moves = []
    for day in DAYS:
        path = platform.stored("registered_model", day, "json")
        if path.exists():
            value = json.loads(path.read_text())
            moves.append((day, value["alias"], value["champion_after"], value["challenger_after"]))
    return moves, platform.registry().aliases()


@pytest.fixture(scope="module")
def one_by_one(tmp_path_factory) -> Platform:
    """The days run one at a time through the daily job: what every way of running them must
    reach. Tests only read it."""
    root = tmp_path_factory.mktemp("one_by_one")
    by_day = Platform(contract_with(root, "synthetic"), root / "by_day")
    by_day.land(DAYS[0], len(DAYS))
    for day in DAYS:
        assert by_day.materialize(day, selection=DAILY_ASSETS).success, day
    return by_day


def test_a_range_in_one_run_reaches_what_one_run_per_day_reaches(tmp_path, one_by_one):
    by_day = one_by_one
    in_range = Platform(contract_with(tmp_path, "synthetic"), tmp_path / "in_range")
    in_range.land(DAYS[0], len(DAYS))

    result = materialize_range(in_range, DAYS[0], DAYS[-1])

    assert result.success
    for asset in DAILY_ASSETS:
        assert in_range.materialized(asset) == set(DAYS), asset
    for day in DAYS:
        for asset in ("raw_data", "validated_data", "features"):
            pd.testing.assert_frame_equal(
                pd.read_parquet(in_range.stored(asset, day, "parquet")),
                pd.read_parquet(by_day.stored(asset, day, "parquet")),
            )
        models = [
            joblib.load(p.stored("model", day, "joblib")).pipeline.named_steps["estimator"]
            for p in (in_range, by_day)
        ]
        np.testing.assert_array_equal(models[0].coef_, models[1].coef_)
        reports = [
            json.loads(p.stored("evaluation_report", day, "json").read_text())
            for p in (in_range, by_day)
        ]
        for key in ("decision", "metrics", "window"):
            assert reports[0][key] == reports[1][key], (day, key)
        registered = [
            json.loads(p.stored("registered_model", day, "json").read_text())
            for p in (in_range, by_day)
        ]
        for key in ("decision", "champion_met", "champion_after", "improvements"):
            assert registered[0].get(key) == registered[1].get(key), (day, key)
        # The range reads its earlier days once as references of its later ones and counts
        # their categories once: each day's drift report is still that of its own run.
        drift = [
            json.loads(p.stored("drift_report", day, "json").read_text())
            for p in (in_range, by_day)
        ]
        # The reference versions name the runs that recorded the reference days (and Dagster's
        # data versions of them), which differ between the two; the days are the same.
        for report in drift:
            versions = report["reference"]
            assert set(versions.pop("data_versions")) == set(versions.pop("runs"))
            assert set(versions["partitions"]) <= {d for d in DAYS if d < day}
        assert drift[0] == drift[1], day
    assert alias_moves(in_range) == alias_moves(by_day)

    # Each day is its own partition: its own metadata and its own check evaluations.
    rows = {
        m.partition: m.metadata["dagster/row_count"].value
        for m in result.asset_materializations_for_node(in_range.node("raw_data"))
    }
    assert rows == {day: 1000 for day in DAYS}
    for asset in DAILY_ASSETS:
        for event in result.asset_materializations_for_node(in_range.node(asset)):
            assert event.metadata["step_wall_seconds"].value > 0, asset
    assert evaluations(in_range, "validated_data", "gx_validity") == {day: True for day in DAYS}
    assert set(evaluations(in_range, "drift_report", "features_drift")) == set(DAYS)


def test_a_bad_delivery_is_the_days_verdict_and_keeps_its_good_version(tmp_path):
    contract = contract_with(tmp_path, "synthetic")
    platform = Platform(contract, tmp_path / "platform")
    platform.land(DAYS[0], len(DAYS))
    assert platform.materialize(DAYS[1], selection=["raw_data", "validated_data"]).success
    good = platform.stored("validated_data", DAYS[1], "parquet").read_bytes()
    platform.land(DAYS[1], 1, fault="out_of_range")

    result = materialize_range(platform, DAYS[0], DAYS[-1])

    # A rejected delivery is an outcome of its day: the range succeeds, the day's gate fails.
    assert result.success
    assert evaluations(platform, "validated_data", "gx_validity") == {
        DAYS[0]: True,
        DAYS[1]: False,
        DAYS[2]: True,
    }
    # The bad day keeps its good version, and every asset after it went on with it.
    assert platform.stored("validated_data", DAYS[1], "parquet").read_bytes() == good
    [record] = [
        m
        for m in result.asset_materializations_for_node(platform.node("validated_data"))
        if m.partition == DAYS[1]
    ]
    assert record.metadata["accepted"].value is True
    assert "kept_previous_version" in record.metadata
    for asset in DAILY_ASSETS:
        assert platform.materialized(asset) == set(DAYS), asset


def test_each_day_is_compared_with_the_columns_of_the_accepted_day_before(tmp_path):
    """In a range the day before is the one this step accepted, or Dagster's record of it (the
    day before the range, a day rejected in the range); a later run reads Dagster's record."""
    platform = Platform(contract_with(tmp_path, "synthetic"), tmp_path / "platform")
    days = days_from("2024-01-01", 5)
    platform.land(days[0], len(days))
    (platform.landing_dir / platform.contract.landing.file_name(days[1])).unlink()

    assert materialize_range(platform, days[0], days[3], ["raw_data"]).success
    assert platform.materialize(days[4], selection=["raw_data"]).success

    described = {
        day: evaluation.description or ""
        for day, evaluation in latest_evaluations(platform, "raw_data", "schema_change").items()
    }
    assert "no accepted delivery of 2023-12-31 to compare with" in described[days[0]]
    assert days[1] not in described  # no file, no columns: only its delivery is judged
    assert "no accepted delivery of 2024-01-02 to compare with" in described[days[2]]
    assert "same columns and types as 2024-01-03" in described[days[3]]
    assert "same columns and types as 2024-01-04" in described[days[4]]


def test_rejected_days_of_a_range_are_not_registered_and_do_not_stop_the_others(tmp_path):
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    # No model can reach these: every day is rejected.
    document["evaluation"]["value_thresholds"] = {"r2": 0.9999}
    path = tmp_path / "synthetic.yaml"
    path.write_text(yaml.safe_dump(document))
    platform = Platform(load_contract(path), tmp_path / "platform")
    platform.land(DAYS[0], 2)

    result = materialize_range(platform, DAYS[0], DAYS[1])

    assert result.success
    assert evaluations(platform, "evaluation_report", "promotion_verdict") == {
        DAYS[0]: False,
        DAYS[1]: False,
    }
    assert platform.registry().versions() == []
    assert platform.registry().aliases() == {"champion": None, "challenger": None}
    for day in DAYS[:2]:
        registered = json.loads(platform.stored("registered_model", day, "json").read_text())
        assert registered["version"] is None and registered["registered"] is False
        assert registered["decision"] == "reject"
        assert registered["outcome"] == f"rejected: {registered['reason']}"
        assert "misses the bound (at least 0.9999)" in registered["reason"]


def test_a_day_whose_input_was_never_materialised_fails_alone_named(tmp_path):
    contract = contract_with(tmp_path, "synthetic")
    platform = Platform(contract, tmp_path / "platform")
    platform.land(DAYS[0], 3)
    ingestion = ["raw_data", "validated_data", "features"]
    assert materialize_range(platform, DAYS[0], DAYS[2], ingestion).success
    assert materialize_range(platform, DAYS[0], DAYS[1], ["model"]).success

    # The evaluations of the three days: the third day's model was never materialised, which
    # is no verdict about the data but a failure of that day.
    result = materialize_range(platform, DAYS[0], DAYS[2], ["evaluation_report"])

    assert not result.success
    message = result.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert "evaluation_report: 1 of 3 days failed" in message
    assert f"model partition {DAYS[2]} is not in storage" in message
    # The other days were computed, but the failed step records none of them, so none is kept.
    folder = platform.lake_dir / contract.name / "evaluation_report"
    assert not [p for p in folder.rglob("*") if p.is_file()]
    assert not platform.materialized("evaluation_report")


def test_evaluations_in_any_order_then_the_chain_reach_the_one_by_one_verdicts(
    tmp_path, one_by_one
):
    # A backfill's runs: the evaluation's chunks run side by side in any order (here the later
    # chunk first), then the registry and the champion's monitoring take the evaluated range.
    by_day = one_by_one
    chunked = Platform(contract_with(tmp_path, "synthetic"), tmp_path / "chunked")
    chunked.land(DAYS[0], len(DAYS))
    upstream = ALL_ASSETS

    assert materialize_range(chunked, DAYS[0], DAYS[1], upstream[:4]).success
    assert materialize_range(chunked, DAYS[2], DAYS[2], upstream).success
    assert materialize_range(chunked, DAYS[0], DAYS[1], upstream[4:]).success
    assert not (chunked.lake_dir / "synthetic/registry").exists()
    chain = ["registered_model", "champion_performance"]
    assert materialize_range(chunked, DAYS[0], DAYS[2], chain).success

    fields = ("decision", "champion_met", "champion_before", "champion_after", "improvements")
    registered = {
        p: [json.loads(p.stored("registered_model", day, "json").read_text()) for day in DAYS]
        for p in (by_day, chunked)
    }
    assert [[r[f] for f in fields] for r in registered[chunked]] == [
        [r[f] for f in fields] for r in registered[by_day]
    ]
    # Each day met the champion the day before left.
    for before, after in zip(registered[chunked], registered[chunked][1:], strict=False):
        assert after["champion_met"] == before["champion_after"]
    assert alias_moves(chunked) == alias_moves(by_day)
    # The monitoring of each day scored the same serving champion as one by one.
    monitoring = [
        [json.loads(p.stored("champion_performance", day, "json").read_text()) for day in DAYS]
        for p in (chunked, by_day)
    ]
    assert monitoring[0] == monitoring[1]


def failing_on(monkeypatch, day: str, error: Exception, times: int) -> list[str]:
    """The features of `day` raise `error` its first `times` computations; every day computed."""
    import ml_platform.features.assets as features

    computed: list[str] = []
    real = features.build_features

    def build(frame: pd.DataFrame, contract: Any) -> pd.DataFrame:
        this = str(frame["event_time"].iloc[0])[:10]
        computed.append(this)
        if this == day and computed.count(day) <= times:
            raise error
        return real(frame, contract)

    monkeypatch.setattr(features, "build_features", build)
    return computed


def validated_range(tmp_path) -> Platform:
    """A synthetic platform with DAYS landed and validated, their features not yet built."""
    platform = Platform(contract_with(tmp_path, "synthetic"), tmp_path / "platform")
    platform.land(DAYS[0], 3)
    assert materialize_range(platform, DAYS[0], DAYS[2], ["raw_data", "validated_data"]).success
    return platform


def retries(result: dg.ExecuteInProcessResult) -> int:
    return len(
        [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    )


def test_a_bug_on_one_day_of_a_range_fails_the_step_at_once_naming_the_day(tmp_path, monkeypatch):
    platform = validated_range(tmp_path)
    computed = failing_on(monkeypatch, DAYS[1], KeyError("amount"), times=99)

    result = materialize_range(platform, DAYS[0], DAYS[2], ["features"])

    assert not result.success
    # The same input meets the same bug: no retry, and the days after it were computed.
    assert retries(result) == 0
    assert computed == DAYS
    message = result.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert "features: 1 of 3 days failed" in message
    assert f"{DAYS[1]}: KeyError: 'amount'" in message
    assert not platform.materialized("features")
    # A bug, not a data gate, though the step failed with the account of its days.
    classified = classify_outcome(run_outcome(platform.instance, result.run_id, result.success))
    assert classified.failure_class == CODE_BUG
    assert classified.reason.startswith("synthetic__features raised KeyError: 'amount'")


def test_a_dropped_connection_on_one_day_of_a_range_is_retried(tmp_path, monkeypatch):
    platform = validated_range(tmp_path)
    computed = failing_on(monkeypatch, DAYS[1], ConnectionResetError("reset by peer"), times=1)

    result = materialize_range(platform, DAYS[0], DAYS[2], ["features"])

    assert result.success
    assert retries(result) == 1
    assert computed == [*DAYS, *DAYS]
    assert set(platform.materialized("features")) == set(DAYS)


def test_each_day_of_a_range_counts_the_bytes_it_read_itself(tmp_path):
    platform = Platform(contract_with(tmp_path, "synthetic"), tmp_path / "platform")
    rejected = dt.date.fromisoformat(DAYS[1])
    platform.land(DAYS[0], 3, fault="out_of_range", fault_days={rejected})

    assert materialize_range(platform, DAYS[0], DAYS[2], ["raw_data", "validated_data"]).success

    def metadata(asset: str) -> dict[str, dict[str, Any]]:
        records = platform.instance.fetch_materializations(platform.key(asset), limit=10).records
        return {
            str(r.partition_key): {k: v.value for k, v in r.asset_materialization.metadata.items()}
            for r in records
            if r.asset_materialization is not None
        }

    raw, validated = metadata("raw_data"), metadata("validated_data")
    assert validated[DAYS[1]]["accepted"] is False
    # An accepted day read its own raw file: not the range's screen of every day before it,
    # nor what the rejected day before it read.
    for day in (DAYS[0], DAYS[2]):
        assert validated[day]["bytes_read"] == raw[day]["stored_bytes"], day
    # The rejected day records what it read too.
    assert validated[DAYS[1]]["bytes_read"] >= raw[DAYS[1]]["stored_bytes"]
