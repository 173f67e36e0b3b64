"""The whole asset graph run with dg.materialize over real data and temporary storage."""

import hashlib
import json
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from ml_platform import cli
from ml_platform_tests.conftest import (
    ALL_ASSETS,
    DAILY_ASSETS,
    contract_with,
    days_from,
    rejected_days,
)

pytestmark = pytest.mark.slow

FLIGHTS_DAYS = days_from("2013-01-01", 3)
SYNTHETIC_DAYS = days_from("2024-01-01", 3)
CLASSIFICATION_METRICS = {"precision", "recall", "f1", "roc_auc"}
REGRESSION_METRICS = {"mae", "rmse", "r2"}


@pytest.mark.parametrize(
    ("dataset", "days", "metrics"),
    [
        ("flights", FLIGHTS_DAYS, CLASSIFICATION_METRICS),
        ("synthetic", SYNTHETIC_DAYS, REGRESSION_METRICS),
    ],
)
def test_three_consecutive_days_materialise_every_asset(platform_for, dataset, days, metrics):
    platform = platform_for(dataset)
    platform.land(days[0], len(days))

    for day in days:
        result = platform.materialize(day)
        raw = result.asset_materializations_for_node(platform.node("raw_data"))[0].metadata
        landed = Path(raw["source_file"].value).read_bytes()
        assert raw["content_sha256"].value == hashlib.sha256(landed).hexdigest()
        assert raw["source_bytes"].value == raw["bytes_read"].value == len(landed)
        validated = result.asset_materializations_for_node(platform.node("validated_data"))[
            0
        ].metadata
        # validated_data empties its raw input once typed; rows_in still counts its rows.
        assert validated["rows_in"].value == raw["dagster/row_count"].value
        report = result.asset_materializations_for_node(platform.node("evaluation_report"))[
            0
        ].metadata
        assert metrics <= set(report), f"missing metrics: {metrics - set(report)}"
        assert "Evaluation of the model of" in report["report"].value
        # A rejected model (the first flights day's one-day model may be) is an outcome: the
        # run succeeds, and only the verdict (a warning) fails; every other check passes but
        # the drift check, a warning too: with fewer reference days than its calibration needs,
        # synthetic's temperature (which moves every day) passes the fixed gate alone.
        rejected = report["decision"].value == "reject"
        assert result.success, f"{dataset} {day}: {report['decision'].value}"
        failed = {c.check_name: c for c in result.get_asset_check_evaluations() if not c.passed}
        drift = failed.pop("features_drift", None)
        assert drift is None or drift.severity == dg.AssetCheckSeverity.WARN
        assert list(failed) == (["promotion_verdict"] if rejected else []), f"{dataset} {day}"

    for asset in [*ALL_ASSETS, "registered_model"]:
        assert platform.materialized(asset) == set(days), asset
    # Registered are exactly the models whose verdict follows from metrics that meet the bounds;
    # the others are recorded as not registered.
    rejected = set(rejected_days(platform.contract, platform.lake_dir, days))
    for day in days:
        registered = json.loads(platform.stored("registered_model", day, "json").read_text())
        assert registered["registered"] == (day not in rejected), day

    last = json.loads(platform.stored("evaluation_report", days[-1], "json").read_text())
    assert last["window"] == days  # three days in, the window holds all three
    for value in last["metrics"].values():
        assert not isinstance(value, float) or pd.notna(value)
    # The UI shows each metric to 4 significant digits; the stored report keeps full precision.
    for metric in metrics:
        shown, full = report[metric].value, last["metrics"][metric]
        assert shown == float(f"{shown:.4g}") and shown == pytest.approx(full, rel=5e-4), metric
    assert any(value != float(f"{value:.4g}") for value in last["metrics"].values())


def test_flights_labels_and_features_follow_the_contract(platform_for):
    platform = platform_for("flights")
    platform.land("2013-01-01", 1)
    assert platform.materialize("2013-01-01", selection=ALL_ASSETS[:3]).success

    validated = pd.read_parquet(platform.stored("validated_data", "2013-01-01", "parquet"))
    features = pd.read_parquet(platform.stored("features", "2013-01-01", "parquet"))
    assert len(validated) == len(features) == 842  # every flight of 1 January 2013
    known = validated["arr_delay"].notna()
    assert (validated.loc[known, "delayed"] == (validated.loc[known, "arr_delay"] > 15)).all()
    assert validated.loc[~known, "delayed"].isna().all()
    assert not set(platform.contract.leakage_columns) & set(features.columns)
    # Local scheduled departure, not the UTC time_hour: the first flight leaves at 05:15.
    assert str(validated["event_time"].min()) == "2013-01-01 05:15:00"


def test_rerunning_a_day_records_the_same_outputs_as_a_new_version(platform_for):
    platform = platform_for("synthetic")
    platform.land("2024-01-01", 2)
    for day in ("2024-01-01", "2024-01-02"):
        assert platform.materialize(day).success
    assets = [platform.lake_dir / "synthetic" / name for name in ALL_ASSETS]

    def stored() -> dict:
        return {p: p.read_bytes() for a in assets for p in sorted(a.rglob("*")) if p.is_file()}

    def recorded(day: str) -> dict:
        return {a: platform.stored(a, day, "").read_bytes() for a in ALL_ASSETS}

    before, recorded_before = stored(), recorded("2024-01-02")
    assert platform.materialize("2024-01-02").success

    # Nothing stored is overwritten: the rerun's versions are files of their own, one per
    # asset, which the day's records now name; the data and reports are the same bytes.
    after = stored()
    assert {p: after[p] for p in before} == before
    assert len(after) == len(before) + len(ALL_ASSETS)
    for asset, data in recorded("2024-01-02").items():
        if asset != "model":  # a joblib file: the same model, pickled at another time
            assert data == recorded_before[asset], f"{asset} changed on rerun"
    validated = pd.read_parquet(platform.stored("validated_data", "2024-01-02", "parquet"))
    assert len(validated) == platform.contract.source.rows_per_day  # no duplicated rows


def test_model_reads_exactly_the_window_ending_its_day(platform_for, tmp_path):
    platform = platform_for(contract_with(tmp_path, "synthetic", window_days=3))
    days = days_from("2024-01-01", 5)
    platform.land(days[0], 5)
    # A model reads the features of its window's days: the days are run up to features.
    for day in days:
        assert platform.materialize(day, selection=ALL_ASSETS[:3]).success

    result = platform.materialize(days[4], selection=["model"])
    assert result.success
    meta = result.asset_materializations_for_node(platform.node("model"))[0].metadata
    assert meta["window_partitions"].value == days[2:5]
    window_rows = sum(
        len(pd.read_parquet(platform.stored("features", d, "parquet"))) for d in days[2:5]
    )
    assert meta["train_rows"].value + meta["holdout_rows"].value == window_rows

    # Days outside the window are not read: the model still builds without them.
    for day in days[:2]:
        platform.stored("features", day, "parquet").unlink()
    assert platform.materialize(days[4], selection=["model"]).success
    # A day inside the window is read: without it the window is below coverage (2 of 3 days),
    # which the day's record names; the model trained before is kept.
    platform.stored("features", days[2], "parquet").unlink()
    kept = platform.stored("model", days[4], "joblib").read_bytes()
    rejected = platform.materialize(days[4], selection=["model"])
    assert rejected.success
    meta = rejected.asset_materializations_for_node(platform.node("model"))[0].metadata
    assert meta["verdict"].value == "window below coverage"
    assert f"features partition {days[2]} is not in storage" in str(meta["reason"].value)
    assert meta["missing_window_days"].value == [days[2]]
    assert meta["accepted"].value is True and "kept_previous_version" in meta
    assert platform.stored("model", days[4], "joblib").read_bytes() == kept


def test_first_days_train_on_the_days_that_exist(platform_for):
    platform = platform_for("flights")  # window of 28 days, reaching before 1 January 2013
    platform.land("2013-01-01", 1)
    # Up to the model: what is judged of a one-day model (167 held-out rows) is not the point.
    up_to_model = ALL_ASSETS[: ALL_ASSETS.index("model") + 1]
    result = platform.materialize("2013-01-01", selection=up_to_model)
    assert result.success
    meta = result.asset_materializations_for_node(platform.node("model"))[0].metadata
    assert meta["window_partitions"].value == ["2013-01-01"]


def test_a_day_without_a_landed_file_is_rejected_naming_the_file(platform_for):
    platform = platform_for("flights")
    # The zone is there, the day's file is not (a zone not there is a volume not mounted:
    # retried, nothing recorded).
    platform.landing_dir.mkdir(parents=True, exist_ok=True)

    result = platform.materialize("2013-01-05")

    # A verdict of the day, not a failed run: raw_data records it, the assets after it record
    # the day without accepted input, and nothing of the day is stored.
    assert result.success
    raw = result.asset_materializations_for_node(platform.node("raw_data"))[0].metadata
    assert raw["verdict"].value == "missing file" and raw["accepted"].value is False
    reason = str(raw["reason"].value)
    assert "No landed file for partition 2013-01-05" in reason
    assert str(platform.landing_dir / "flights_2013-01-05.csv") in reason
    records = {
        asset: result.asset_materializations_for_node(platform.node(asset))[0].metadata
        for asset in DAILY_ASSETS[1:]
    }
    # The model's window reads the day as a hole: a window without its own day.
    assert {asset: meta["verdict"].value for asset, meta in records.items()} == {
        **dict.fromkeys(DAILY_ASSETS[1:], "no accepted input"),
        "model": "window below coverage",
    }
    assert records["model"]["missing_window_days"].value[-1] == "2013-01-05"
    assert all(meta["accepted_rows"].value == 0 for meta in records.values())
    assert not list(platform.lake_dir.rglob("*2013-01-05*"))
    failed = {c.check_name for c in result.get_asset_check_evaluations() if not c.passed}
    assert {"raw_schema", "delivery_accepted"} <= failed
    outcome, rejected = cli.day_outcome(platform.instance, result.run_id, "flights")
    assert rejected and outcome.startswith("REJECTED by raw_data: missing file: No landed file")
