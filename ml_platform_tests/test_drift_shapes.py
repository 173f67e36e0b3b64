"""Drift on the days the code was not shaped for: huge values, features without values, too few
days to calibrate a feature, stale verdicts of features the contract no longer tests."""

import datetime as dt
import json

import dagster as dg
import numpy as np
import pandas as pd

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import DriftEpisodeSpec
from ml_platform.drift.checks import drift_check_result
from ml_platform.drift.episodes import FeatureDay, advance
from ml_platform.platform.failures import DATA
from ml_platform.platform.run_events import classify_outcome, run_outcome
from ml_platform_tests.conftest import Platform, days_from

SYNTHETIC = load_contract("synthetic")
DAY = "2024-02-10"
# The largest value the quality gate accepts in a float column is the largest finite float.
FLOAT_MAX = np.finfo("float64").max


def features(rows: int, seed: int, **columns) -> pd.DataFrame:
    """A day of the synthetic contract's features, with `columns` replaced."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "x1": rng.normal(0.0, 1.0, rows),
            "x2": rng.normal(5.0, 2.0, rows),
            "x3": rng.uniform(-1.0, 1.0, rows),
            "x4": rng.normal(0.0, 1.0, rows),
            "log_amount": rng.normal(3.0, 1.0, rows),
            "segment": pd.Series(rng.choice(["A", "B", "C"], rows), dtype="str"),
            "hour": rng.integers(0, 24, rows).astype("float64"),
            "temperature": rng.normal(12.0, 2.0, rows),
        }
    )
    return frame.assign(**columns)


def reference_days(count: int, rows: int = 500, **columns) -> tuple[list[pd.DataFrame], list[str]]:
    frames = [features(rows, seed, **columns) for seed in range(count)]
    days = [(dt.date(2024, 1, 1) + dt.timedelta(days=i)).isoformat() for i in range(count)]
    return frames, days


def test_a_drifted_feature_with_values_near_the_largest_float_is_reported_with_its_plots():
    # A source that writes the largest float as a "no reading" sentinel: the gate accepts it.
    frames, days = reference_days(5)
    frames = [f.assign(x1=np.where(np.arange(len(f)) < 50, -FLOAT_MAX, f["x1"])) for f in frames]
    today = features(500, 99, x1=np.where(np.arange(500) < 100, FLOAT_MAX, 3.0))

    outcome = drift_check_result(SYNTHETIC, DAY, today, frames, days, [])

    assert not outcome.check.passed
    assert outcome.document["drifting_features"] == ["x1"]
    assert "data:image/svg+xml;base64," in outcome.check.metadata["report"].value


def test_stale_verdicts_of_a_feature_no_longer_tested_do_not_reopen_its_episode():
    spec = DriftEpisodeSpec()
    days = [(dt.date(2024, 2, 1) + dt.timedelta(days=i)).isoformat() for i in range(6)]
    # f drifted where the reference never was: such a day opens an episode at once.
    drifted = {"f": FeatureDay(True, 0.9, unseen=True), "g": FeatureDay(False, 0.01)}
    states: dict = {}
    for day in days[:3]:
        states = advance(day, drifted, states, spec, monitored={"f", "g"}).states
    assert states["f"].episode is not None
    # The team excludes f from drift; the drift reports of the next days were made before
    # the change and still judge it. Its episode ends once, and nothing about f opens again.
    told = []
    for day in days[3:]:
        result = advance(day, drifted, states, spec, monitored={"g"})
        states = result.states
        told += [("opened", e.feature, day) for e in result.opened]
        told += [("closed", e.feature, day) for e in result.closed]
    assert told == [("closed", "f", days[3])]
    assert "f" not in states


def test_a_feature_with_values_on_fewer_reference_days_than_min_days_is_not_calibrated():
    # Five reference days (min_days is 4), but x1 has values on two of them only, far apart:
    # one distance between two days is no measure of its usual day-to-day movement.
    frames, days = reference_days(5)
    frames = [f.assign(x1=np.nan) for f in frames[:3]] + [
        frames[3],
        frames[4].assign(x1=frames[4]["x1"] + 2.0),
    ]
    today = features(500, 99, x1=np.random.default_rng(7).normal(-1.0, 1.0, 500))

    outcome = drift_check_result(SYNTHETIC, DAY, today, frames, days, [])

    [x1] = [v for v in outcome.document["features"] if v["feature"] == "x1"]
    assert x1["status"] == "drift" and x1["calibration_bound"] is None
    assert x1["calibration"] == (
        "not calibrated: 2 reference day(s) had values to compare with the others, fewer "
        "than drift.calibration.min_days 4; the fixed gate decides alone"
    )
    # The features with values on every reference day are calibrated as before.
    [x2] = [v for v in outcome.document["features"] if v["feature"] == "x2"]
    assert x2["calibration_bound"] is not None


def test_a_day_without_rows_is_not_called_free_of_drift():
    frames, days = reference_days(5)

    outcome = drift_check_result(SYNTHETIC, DAY, features(0, 99), frames, days, [])

    assert outcome.document["tested_features"] == 0
    assert outcome.check.description.startswith(
        f"Drift not tested on {DAY}: none of its 8 feature(s) had values to compare"
    )
    assert "x1 (no values in the day)" in outcome.check.description
    assert "No drift" not in outcome.check.description


def test_a_feature_without_values_on_the_day_is_named_as_not_tested():
    frames, days = reference_days(5)

    outcome = drift_check_result(SYNTHETIC, DAY, features(500, 99, x1=np.nan), frames, days, [])

    description = outcome.check.description
    assert description.startswith(f"No drift on {DAY} in 7 tested feature(s)")
    assert "Not tested, without values to compare: x1 (no values in the day)." in description


def test_reference_days_stored_before_the_contract_declared_a_feature_are_named(tmp_path):
    # The team added `segment` and `temperature` to the contract; the features of the first
    # reference days were stored before, without them. The features are tested from the
    # reference days that have them (`test_drift_contract_change.py`: none has them yet).
    platform = Platform(SYNTHETIC, tmp_path)
    days = days_from("2024-01-01", 5)
    for i, day in enumerate(days):
        frame = features(200, i)
        platform.put(
            "features",
            day,
            frame.drop(columns=["segment", "temperature"]) if i < 2 else frame,
            "parquet",
        )

    result = platform.materialize(days[-1], ["drift_report"], checks=True)

    assert result.success
    report = json.loads(platform.stored("drift_report", days[-1], "json").read_text())
    verdicts = {v["feature"]: v for v in report["features"]}
    assert report["tested_features"] == 8
    for name in ("segment", "temperature"):
        assert verdicts[name]["n_reference"] == 400
        assert verdicts[name]["change"].endswith(
            "; against the 2 of the 4 reference days that have it (the others lack the column, "
            "added to the contract after them)"
        )
    assert verdicts["x1"]["n_reference"] == 800


def test_a_day_whose_own_features_lack_a_declared_feature_names_the_day_to_rematerialise(
    tmp_path,
):
    # The day's own features were stored before the contract declared `temperature`.
    platform = Platform(SYNTHETIC, tmp_path)
    days = days_from("2024-01-01", 5)
    for i, day in enumerate(days):
        frame = features(200, i)
        platform.put(
            "features", day, frame.drop(columns=["temperature"]) if i == 4 else frame, "parquet"
        )

    result = platform.materialize(days[-1], ["drift_report"], checks=True)

    assert not result.success
    [failure] = result.get_step_failure_events()
    message = failure.event_specific_data.error.to_string()
    assert (
        f"{days[-1]}: the features of the day lack temperature, which the contract declares"
    ) in message
    assert f"Rematerialise features for {days[-1]}, then this day's drift_report" in message
    assert "KeyError" not in message
    # A deliberate stop of the day, as the failure alerts class the run: not a code bug.
    outcome = run_outcome(platform.instance, result.run_id, succeeded=False)
    assert outcome is not None
    assert classify_outcome(outcome).failure_class == DATA


def test_rejected_reference_days_are_named_as_rejected_not_as_days_to_materialise(tmp_path):
    platform = Platform(SYNTHETIC, tmp_path)
    days = days_from("2024-01-01", 4)
    for day in days[:2]:
        # Each of the first days' features was recorded rejected: a tombstone, no data.
        platform.instance.report_runless_asset_event(
            dg.AssetMaterialization(
                platform.key("features"),
                partition=day,
                metadata={
                    "verdict": "no accepted input",
                    "accepted": False,
                    "reason": "validated_data was rejected (schema mismatch)",
                },
            )
        )
    platform.put("features", days[3], features(200, 3), "parquet")
    defs = platform.defs

    result = dg.materialize(
        [*(defs.assets or []), *(defs.asset_checks or [])],
        partition_key=days[3],
        resources=defs.resources,
        instance=platform.instance,
        selection=[platform.key("drift_report")],
        raise_on_error=False,
    )

    assert result.success
    [check] = result.get_asset_check_evaluations()
    assert check.passed
    # days[2] was never materialised; days[0] and days[1] were, and were rejected: running
    # them again rejects the same files.
    assert check.description == (
        f"Drift not evaluated for {days[3]}: none of its reference days (the baseline "
        f"2024-01-01 to 2024-01-28) has accepted features. Rejected: {days[0]}, {days[1]}: "
        "correct and re-deliver their files (`ml-platform rejected --dataset synthetic` lists "
        f"them); not stored: {days[2]}: materialise features for them. Then rerun this check."
    )
    report = json.loads(platform.stored("drift_report", days[3], "json").read_text())
    assert report["reference"]["rejected_partitions"] == days[:2]


def test_a_day_compared_without_some_reference_days_says_which_were_rejected():
    frames, days = reference_days(3)
    gone = ["2024-01-04", "2024-01-05"]

    outcome = drift_check_result(
        SYNTHETIC, DAY, features(500, 99), frames, days, gone, rejected_partitions=gone[:1]
    )

    assert outcome.check.description.endswith(
        "Reference days left out: 2024-01-04 (rejected); 2024-01-05 (not stored)."
    )
    assert outcome.check.metadata["rejected_reference_partitions"].value == gone[:1]
