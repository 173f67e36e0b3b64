"""Drift after a contract change: a feature added or renamed is new to the reference days stored
before the change, and a blocking feature that could not be tested is named, not passed over."""

import datetime as dt
import json
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import yaml

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.contracts.schema import type_rows
from ml_platform.drift.checks import drift_check_result
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.synthetic import file_bytes, generate_day
from ml_platform.platform.failures import DATA
from ml_platform.platform.run_events import classify_outcome, run_outcome
from ml_platform_tests.conftest import Platform, days_from
from ml_platform_tests.test_drift_shapes import features

NOT_YET = (
    "no reference values yet: the reference days lack the column, added to the contract after them"
)


def synthetic(folder: Path, edit) -> Contract:
    """The bundled synthetic contract as `edit` changes its document, written to `folder`."""
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    edit(document)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "synthetic.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_contract(path)


def before_the_change(document: dict) -> None:
    # The contract before: no `temperature` feature, and `segment` was called `seg`.
    features = [f for f in document["features"] if f["name"] != "temperature"]
    document["features"] = [{**f, "name": "seg"} if f["name"] == "segment" else f for f in features]


def temperature_blocking(document: dict) -> None:
    document["drift"]["features"] = {"temperature": {"blocking": True}}


def store_features(platform: Platform, contract: Contract, day: str) -> None:
    """A day's features built by `contract` from the generated day, stored as its partition."""
    frame = generate_day(dt.date.fromisoformat(day), seed=contract.source.seed, rows=1000)
    raw = read_landed_file(file_bytes(frame), "day.csv", day, ["segment"])
    platform.put(
        "features", day, build_features(type_rows(raw, contract, day), contract), "parquet"
    )


def drift_of(platform: Platform, day: str) -> tuple[dg.AssetCheckEvaluation, dict]:
    result = platform.materialize(day, ["drift_report"], checks=True)
    failures = [e.event_specific_data.error.to_string() for e in result.get_step_failure_events()]
    assert result.success, failures
    [check] = result.get_asset_check_evaluations()
    return check, json.loads(platform.stored("drift_report", day, "json").read_text())


def test_a_feature_added_or_renamed_is_not_yet_tested_and_the_others_are(tmp_path):
    old = synthetic(tmp_path / "old", before_the_change)
    new = synthetic(tmp_path / "new", temperature_blocking)
    platform = Platform(new, tmp_path)
    days = days_from("2024-01-01", 10)
    # Five days stored with the contract before the change, then the next day compared.
    for day in days[:5]:
        store_features(platform, old, day)
    store_features(platform, new, days[5])

    check, report = drift_of(platform, days[5])

    verdicts = {v["feature"]: v for v in report["features"]}
    for name in ("temperature", "segment"):
        assert verdicts[name]["status"] == "skipped"
        assert verdicts[name]["change"] == NOT_YET
    # The day's other features are tested as on any day, calibrated by the five days.
    assert report["tested_features"] == 6
    for name in ("x1", "x2", "x3", "x4", "log_amount", "hour"):
        assert verdicts[name]["effect"] is not None
        assert verdicts[name]["calibration_bound"] is not None
    assert f"segment ({NOT_YET})" in check.description
    assert f"temperature ({NOT_YET})" in check.description
    assert report["untested_blocking_features"] == {"temperature": NOT_YET}
    assert check.metadata["untested_blocking_features"].value == ["temperature"]
    assert report["features_without_reference_yet"] == ["segment", "temperature"]
    # A baseline's days do not change by themselves: the way to test the features is named.
    assert (
        "segment, temperature stay untested until the baseline days hold them: rematerialise "
        f"features for {days[0]} to {days[4]}, or move the baseline" in check.description
    )
    assert check.metadata["features_without_reference_yet"].value == ["segment", "temperature"]

    # The days after the change have the columns: the features are tested from those days,
    # calibrated once drift.calibration.min_days (4) of them hold values.
    for day in days[6:8]:
        store_features(platform, new, day)
    _, report = drift_of(platform, days[7])
    temperature = next(v for v in report["features"] if v["feature"] == "temperature")
    assert temperature["status"] != "skipped"
    assert temperature["n_reference"] == 2000
    assert temperature["calibration"] == (
        "not calibrated: 2 reference day(s) had values to compare with the others, fewer "
        "than drift.calibration.min_days 4; the fixed gate decides alone"
    )
    assert "against the 2 of the 7 reference days that have it" in temperature["change"]
    assert report["untested_blocking_features"] == {}

    for day in days[8:10]:
        store_features(platform, new, day)
    _, report = drift_of(platform, days[9])
    segment = next(v for v in report["features"] if v["feature"] == "segment")
    assert segment["status"] != "skipped" and segment["calibration_bound"] is not None


def test_a_blocking_feature_without_reference_values_is_named_as_not_tested(tmp_path):
    # temperature is blocking; its column was empty on every reference day (a source outage
    # the quality gate let through), and the day has values again.
    contract = synthetic(tmp_path, temperature_blocking)
    frames = [features(500, seed, temperature=np.nan) for seed in range(5)]
    days = days_from("2024-01-01", 5)

    outcome = drift_check_result(contract, "2024-02-10", features(500, 99), frames, days, [])

    description = outcome.check.description
    assert outcome.check.passed
    assert (
        "Blocking, not tested: temperature (no values in the reference). The day's model is "
        "trained without its drift checked" in description
    )
    assert outcome.document["untested_blocking_features"] == {
        "temperature": "no values in the reference"
    }
    assert outcome.check.metadata["untested_blocking_features"].value == ["temperature"]
    assert outcome.metadata()["untested_blocking_features"].value == ["temperature"]


def hour_categorical(document: dict) -> None:
    document["features"] = [
        {**f, "kind": "categorical"} if f["name"] == "hour" else f for f in document["features"]
    ]


def amount_itself(document: dict) -> None:
    document["features"] = [
        {**f, "transform": "identity"} if f["name"] == "log_amount" else f
        for f in document["features"]
    ]


@pytest.mark.parametrize(
    ("change", "feature"), [(hour_categorical, "hour"), (amount_itself, "log_amount")]
)
def test_a_feature_computed_otherwise_is_not_compared_with_its_old_values(
    tmp_path, change, feature
):
    # The team makes `hour` categorical: the reference days hold it as numbers (5.0), the day
    # as categories ('5'), every category of the day one the reference never had. Or it makes
    # `log_amount` the amount itself: the reference days hold logarithms, the day amounts.
    before = synthetic(tmp_path / "old", lambda document: None)
    after = synthetic(tmp_path / "new", change)
    platform = Platform(after, tmp_path)
    days = days_from("2024-01-01", 6)
    for day in days[:5]:
        store_features(platform, before, day)
    store_features(platform, after, days[5])

    check, report = drift_of(platform, days[5])

    [verdict] = [v for v in report["features"] if v["feature"] == feature]
    assert verdict["status"] == "skipped" and not verdict["unseen"]
    assert verdict["change"] == (
        "no reference values yet: the reference days hold the column as the contract defined "
        "it before (another kind, source or transform), changed in the contract after them"
    )
    assert feature not in report["drifting_features"]
    assert report["tested_features"] == 7
    assert f"Not tested, without values to compare: {feature} (no reference values yet" in (
        check.description
    )


def test_a_numeric_feature_stored_as_categories_before_is_not_read_as_numbers():
    # x1 was a categorical feature before the contract made it numeric: its stored text
    # cannot be read as numbers, which failed the day with a ValueError, retried in vain.
    contract = load_contract("synthetic")
    frames = [features(500, seed, x1="low") for seed in range(5)]
    days = days_from("2024-01-01", 5)

    outcome = drift_check_result(contract, "2024-02-10", features(500, 99), frames, days, [])

    [x1] = [v for v in outcome.document["features"] if v["feature"] == "x1"]
    assert x1["status"] == "skipped"
    assert x1["change"].startswith("no reference values yet: the reference days hold the column")
    assert outcome.document["tested_features"] == 7


@pytest.mark.parametrize(
    ("change", "held"),
    [
        (hour_categorical, "hour, now categorical hour(event_time),"),
        (amount_itself, "log_amount, now numeric identity(amount),"),
    ],
)
def test_a_day_whose_own_features_hold_the_old_definition_names_the_day_to_rematerialise(
    tmp_path, change, held
):
    # Every day, the compared one too, was stored before the change; the team reruns the day's
    # drift_report alone. Its numbers (5.0) are no category; its logarithms no amounts.
    before = synthetic(tmp_path / "old", lambda document: None)
    platform = Platform(synthetic(tmp_path / "new", change), tmp_path)
    days = days_from("2024-01-01", 6)
    for day in days:
        store_features(platform, before, day)

    result = platform.materialize(days[5], ["drift_report"], checks=True)

    assert not result.success
    [failure] = result.get_step_failure_events()
    message = failure.event_specific_data.error.to_string()
    assert (
        f"{days[5]}: the features of the day hold {held} as the contract defined it before "
        "(another kind, source or transform): they were stored before the contract declared "
        f"them so. Rematerialise features for {days[5]}, then this day's drift_report"
    ) in message
    # A deliberate stop of the day, as the failure alerts class the run: not retried.
    outcome = run_outcome(platform.instance, result.run_id, succeeded=False)
    assert outcome is not None and classify_outcome(outcome).failure_class == DATA
    retried = [
        e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY
    ]
    assert retried == []


def sliding(document: dict) -> None:
    document["drift"]["reference"] = {"mode": "previous_days", "days": 7}


def test_a_sliding_reference_says_when_a_new_feature_is_tested(tmp_path):
    contract = synthetic(tmp_path, sliding)
    frames = [features(500, seed).drop(columns=["segment"]) for seed in range(5)]
    days = days_from("2024-01-03", 5)

    outcome = drift_check_result(contract, "2024-01-08", features(500, 99), frames, days, [])

    [segment] = [v for v in outcome.document["features"] if v["feature"] == "segment"]
    assert segment["change"] == NOT_YET
    assert (
        "segment is tested from the days stored with it as they enter the reference window "
        "(by the fixed gate alone until drift.calibration.min_days of them have values); "
        "rematerialising features for 2024-01-03 to 2024-01-07 tests it sooner."
    ) in outcome.check.description


def short_window_temperature_blocking(document: dict) -> None:
    temperature_blocking(document)
    document["training"]["window_days"] = 7


def test_a_model_trained_with_a_blocking_feature_untested_says_so(tmp_path):
    contract = synthetic(tmp_path, short_window_temperature_blocking)
    platform = Platform(contract, tmp_path)
    days = days_from("2024-01-01", 7)
    # The window's days before the last held temperature empty (a source outage the gate let
    # through): the last day's temperature has no reference values to be tested against.
    for day in days:
        frame = generate_day(dt.date.fromisoformat(day), seed=contract.source.seed, rows=1000)
        raw = read_landed_file(file_bytes(frame), "day.csv", day, ["segment"])
        built = build_features(type_rows(raw, contract, day), contract)
        if day != days[-1]:
            built["temperature"] = np.nan
        platform.put("features", day, built, "parquet")

    result = platform.materialize(days[-1], ["drift_report", "model"])

    assert result.success
    [model] = [
        m.metadata
        for m in result.get_asset_materialization_events()
        for m in [m.materialization]
        if m.asset_key == platform.key("model")
    ]
    assert model["untested_blocking_features"].value == {
        "temperature": "no values in the reference"
    }
