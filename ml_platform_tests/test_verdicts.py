"""How a day can end: the table in docs/verdicts.md, the code's verdicts, and each on a real day.

A data verdict is an outcome of the day: the run succeeds, the day is recorded with its verdict
and reason and no data file, and the assets after it record "no accepted input".
"""

import re
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from ml_platform.platform.records import day_records
from ml_platform.platform.steps import Verdict
from ml_platform_tests.conftest import DAILY_ASSETS, Platform, contract_with

TABLE = Path(__file__).parents[1] / "docs" / "verdicts.md"


def table_rows() -> list[list[str]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 5 and not set(cells[0]) <= {"-", " "}:
            rows.append(cells)
    return rows[1:]  # the header


def test_the_table_lists_every_data_verdict_and_nothing_else_as_one():
    data_verdicts = {
        verdict
        for _, _, kind, recorded, _ in table_rows()
        if kind == "data verdict"
        for verdict in re.findall(r"`([^`]+)`", recorded)
    }
    assert data_verdicts == {v.value for v in Verdict}
    kinds = {row[2] for row in table_rows()}
    assert {"data verdict", "software failure"} <= kinds
    # Software failures record nothing: the step fails.
    assert all(row[3].startswith("none") for row in table_rows() if row[2].startswith("software"))


def latest(platform: Platform, asset: str, day: str) -> dict:
    records = day_records(platform.instance, platform.key(asset), [day])
    record = platform.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=platform.key(asset), asset_partitions=[day]), limit=1
    ).records[0]
    metadata = record.asset_materialization.metadata
    assert records[day].verdict == metadata["verdict"].value
    return {name: entry.value for name, entry in metadata.items()}


def assert_rejected(platform: Platform, asset: str, day: str, verdict: Verdict, ext: str) -> dict:
    """The day of `asset` is a tombstone: verdict, reason, not accepted, no file."""
    record = latest(platform, asset, day)
    assert record["verdict"] == verdict.value, record
    assert record["accepted"] is False and record["accepted_rows"] == 0
    assert record["reason"]
    assert not platform.stored(asset, day, ext).exists()
    return record


DAY = "2024-01-02"


def landed_file(platform: Platform, day: str) -> Path:
    return platform.landing_dir / f"synthetic_{day}.csv"


SCENARIOS = {
    Verdict.MISSING_FILE: ("raw_data", lambda p: landed_file(p, DAY).unlink()),
    Verdict.UNREADABLE_FILE: ("raw_data", lambda p: p.land(DAY, 1, fault="binary_garbage")),
    Verdict.SCHEMA_MISMATCH: ("raw_data", lambda p: p.land(DAY, 1, fault="missing_column")),
    Verdict.QUALITY_GATE: ("validated_data", lambda p: p.land(DAY, 1, fault="null_burst")),
}


@pytest.mark.slow
@pytest.mark.parametrize("verdict", list(SCENARIOS), ids=lambda v: v.name.lower())
def test_a_rejected_delivery_is_recorded_and_flows_down_as_no_accepted_input(tmp_path, verdict):
    platform = Platform(contract_with(tmp_path, "synthetic"), tmp_path / "p")
    platform.land("2024-01-01", 2)
    asset, spoil = SCENARIOS[verdict]
    spoil(platform)
    result = platform.materialize(DAY)
    assert result.success, "a data verdict never fails a run"
    assert not any(e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY for e in result.all_events)
    record = assert_rejected(platform, asset, DAY, verdict, "parquet")
    assert f"synthetic_{DAY}.csv" in record["reason"]
    # Every asset after it records the day as having no accepted input, naming where and why.
    after = DAILY_ASSETS[DAILY_ASSETS.index(asset) + 1 :]
    exts = {"features": "parquet", "model": "joblib"}
    for later in after:
        downstream = latest(platform, later, DAY)
        assert downstream["accepted"] is False, later
        if later == "validated_data" or later == "features":
            assert downstream["verdict"] == Verdict.NO_ACCEPTED_INPUT.value
            assert f"{asset} {DAY} was rejected ({verdict.value})" in downstream["reason"]
        if later in exts:
            assert not platform.stored(later, DAY, exts[later]).exists()
    # The day's delivery check fails with the reason: the Partitions tab lists rejected days.
    [delivery] = [
        c for c in result.get_asset_check_evaluations() if c.check_name == "delivery_accepted"
    ]
    assert not delivery.passed and delivery.severity == dg.AssetCheckSeverity.ERROR
    assert delivery.partition == DAY and verdict.value in (delivery.description or "")


@pytest.mark.slow
def test_a_window_below_coverage_and_a_day_without_labels_are_the_models_verdicts(tmp_path):
    contract = contract_with(tmp_path, "synthetic", min_window_coverage=1.0)
    platform = Platform(contract, tmp_path / "p")
    platform.land("2024-01-01", 3)
    platform.land("2024-01-02", 1, fault="null_burst")
    # The window is the days' features: the days before the judged one are run up to them.
    data = ["raw_data", "validated_data", "features"]
    for day in ("2024-01-01", "2024-01-02"):
        assert platform.materialize(day, selection=data).success
    assert platform.materialize("2024-01-03").success
    record = assert_rejected(
        platform, "model", "2024-01-03", Verdict.WINDOW_BELOW_COVERAGE, "joblib"
    )
    assert record["missing_window_days"] == ["2024-01-02"]
    assert "min_window_coverage" in record["reason"]

    # A first day whose flights all arrived on time: one class, nothing to tell apart.
    on_time = Platform(contract_with(tmp_path, "flights"), tmp_path / "on_time")
    on_time.land("2013-01-01", 1)
    path = on_time.landing_dir / "flights_2013-01-01.csv"
    frame = pd.read_csv(path)
    frame.loc[frame[on_time.contract.label.source].notna(), on_time.contract.label.source] = 0
    frame.to_csv(path, index=False)
    assert on_time.materialize("2013-01-01").success
    assert latest(on_time, "validated_data", "2013-01-01")["verdict"] == "accepted"
    record = assert_rejected(on_time, "model", "2013-01-01", Verdict.TRAINING_DATA, "joblib")
    assert "single class" in record["reason"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rows", "asset", "ext", "reason"),
    [
        # Among the training rows: no fit survives squares that overflow.
        ("earliest", "model", "joblib", "are too large to fit: their squares overflow"),
        # Among the held-out rows: RMSE would be inf, R² NaN, a bootstrap judged on a few draws.
        ("latest", "evaluation_report", "json", "squared errors on 3 of"),
    ],
)
def test_a_label_too_large_to_square_is_the_models_or_the_evaluations_verdict(
    tmp_path, rows, asset, ext, reason
):
    # The synthetic contract leaves its regression label unbounded: 1e308 passes the gate.
    platform = Platform(contract_with(tmp_path, "synthetic"), tmp_path / "p")
    day = "2024-01-01"
    platform.land(day, 1)
    path = platform.landing_dir / platform.contract.landing.file_name(day)
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    order = pd.to_datetime(frame["event_time"]).sort_values(kind="stable").index
    frame.loc[order[:3] if rows == "earliest" else order[-3:], "target"] = "1e308"
    path.write_text(frame.to_csv(index=False))

    assert platform.materialize(day).success
    record = assert_rejected(platform, asset, day, Verdict.TRAINING_DATA, ext)
    assert reason in record["reason"], record["reason"]
    assert "Bound target in the contract (columns[].min / max)" in record["reason"]


@pytest.mark.slow
def test_a_rejected_sunday_still_gets_its_weekly_retrain(tmp_path):
    # 2024-01-07 is a Sunday: the Monday schedule retrains on the window ending it.
    sunday = "2024-01-07"
    platform = Platform(contract_with(tmp_path, "synthetic", full_window_days=7), tmp_path / "p")
    platform.land("2024-01-01", 7)
    platform.land(sunday, 1, fault="null_burst")
    days = ["2024-01-0" + str(n) for n in range(1, 8)]
    for day in days:
        ingested = platform.materialize(day, selection=["raw_data", "validated_data", "features"])
        assert ingested.success, day
    # Six days accepted; the Sunday's delivery rejected, a verdict recorded by a successful run.
    verdicts = {day: latest(platform, "validated_data", day)["verdict"] for day in days}
    assert verdicts == {**dict.fromkeys(days[:-1], "accepted"), sunday: "failed quality gate"}

    weekly = platform.materialize(sunday, selection=["full_model", "full_evaluation_report"])
    assert weekly.success
    model = latest(platform, "full_model", sunday)
    assert model["verdict"] == "accepted" and model["missing_window_days"] == [sunday]
    assert platform.stored("full_model", sunday, "joblib").exists()
    assert latest(platform, "full_evaluation_report", sunday)["verdict"] == "accepted"
    # The daily model of that Sunday has no day of its own to hold out: a recorded verdict.
    daily = platform.materialize(sunday, selection=["model"])
    assert daily.success
    record = assert_rejected(platform, "model", sunday, Verdict.WINDOW_BELOW_COVERAGE, "joblib")
    assert f"own day, {sunday}" in record["reason"]
