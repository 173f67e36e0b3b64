"""Windows with holes: a window input loads the stored days, a model trains over a hole or its day
is rejected (window below coverage).

The IO manager is tested on a tiny graph of its own (a `features` asset and readers of its
window and of its day), in one-day and range runs, and its listing of stored partitions on a
directory and on a real S3 API server; the model, its evaluation and registration on the
synthetic dataset with a short window and few epochs.
"""

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from ml_platform import cli
from ml_platform.platform.failures import DATA
from ml_platform.platform.formats import FORMAT_KEY
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.rejected import rejected_days
from ml_platform.platform.retries import STORAGE_RETRY_POLICY
from ml_platform.platform.run_events import classify_outcome, run_outcome
from ml_platform.platform.s3 import S3Storage
from ml_platform.platform.steps import DataVerdict, Verdict, daily_backfill_policy, each_day
from ml_platform.platform.storage import LakeStorage, LocalStorage
from ml_platform.training.assets import (
    WindowCoverageError,
    fill_command,
    require_coverage,
    window_coverage,
    window_input,
)
from ml_platform_tests.conftest import DAILY_ASSETS, Platform, contract_with, days_from
from ml_platform_tests.services import FAKE_AWS, s3_test_client
from ml_platform_tests.test_backfill_range import materialize_range

pytestmark = pytest.mark.slow

DAILY = dg.DailyPartitionsDefinition(start_date="2024-01-01")
DAYS = days_from("2024-01-01", 5)


@dg.asset(name="features", key_prefix="tiny", partitions_def=DAILY, metadata={FORMAT_KEY: "json"})
def tiny_features(context: dg.AssetExecutionContext) -> dict:
    """The day's key, as a stand-in for its feature rows."""
    return {"day": context.partition_key}


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=daily_backfill_policy(),
    metadata={FORMAT_KEY: "json"},
    ins={"features": window_input("tiny", 3)},
)
def window_read(context: dg.AssetExecutionContext, features: Any) -> Iterator:
    """Which days of its 3-day window each day received."""

    def day_of(day: str, features: Mapping[str, dict]) -> Iterator:
        # The window loads each day when it is read.
        yield dg.MaterializeResult(value={"keys": sorted(features), "values": dict(features)})

    yield from each_day(context, day_of, features=features)


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=daily_backfill_policy(),
    metadata={FORMAT_KEY: "json"},
    # As every daily asset: retries on storage errors, none for a partition never stored.
    retry_policy=STORAGE_RETRY_POLICY,
    ins={"features": dg.AssetIn(["tiny", "features"])},
)
def day_read(context: dg.AssetExecutionContext, features: Any) -> Iterator:
    """The day's own features (not a window): a missing day must fail, named."""

    def day_of(day: str, features: dict) -> Iterator:
        yield dg.MaterializeResult(value=features)

    yield from each_day(context, day_of, features=features)


class TinyLake:
    """The tiny graph over a temporary lake: `features` stored on some days only."""

    def __init__(self, root: Path, stored_days: list[str]):
        self.root = root
        self.io_manager = LakeIOManager(storage=LocalStorage(base_dir=str(root)))
        self.instance = dg.DagsterInstance.ephemeral()
        for day in stored_days:
            assert self.run([tiny_features], day).success

    def run(self, assets: list, day: str | None = None, last: str | None = None):
        tags = {}
        if last is not None:
            tags = {
                "dagster/asset_partition_range_start": day,
                "dagster/asset_partition_range_end": last,
            }
            day = None
        return dg.materialize(
            [tiny_features, window_read, day_read],
            selection=assets,
            partition_key=day,
            tags=tags,
            resources={"io_manager": self.io_manager},
            instance=self.instance,
            raise_on_error=False,
        )

    def value(self, asset: str, day: str) -> Any:
        return self.io_manager.load_recorded(self.instance, dg.AssetKey(asset), day, "json")


def failure_message(result: dg.ExecuteInProcessResult) -> str:
    failures = result.get_step_failure_events()
    assert failures, "the run has no failed step"
    return failures[0].event_specific_data.error.to_string()


def test_a_one_day_window_loads_only_its_stored_days(tmp_path):
    lake = TinyLake(tmp_path, ["2024-01-01", "2024-01-03", "2024-01-04"])

    assert lake.run([window_read], "2024-01-04").success

    read = lake.value("window_read", "2024-01-04")
    assert read["keys"] == ["2024-01-03", "2024-01-04"]
    assert read["values"]["2024-01-03"] == {"day": "2024-01-03"}


def test_each_day_of_a_range_loads_only_its_stored_days(tmp_path):
    lake = TinyLake(tmp_path, ["2024-01-01", "2024-01-03", "2024-01-04", "2024-01-05"])

    assert lake.run([window_read], "2024-01-01", last="2024-01-05").success

    assert {day: lake.value("window_read", day)["keys"] for day in DAYS} == {
        "2024-01-01": ["2024-01-01"],
        "2024-01-02": ["2024-01-01"],
        "2024-01-03": ["2024-01-01", "2024-01-03"],
        "2024-01-04": ["2024-01-03", "2024-01-04"],
        "2024-01-05": ["2024-01-03", "2024-01-04", "2024-01-05"],
    }


def test_a_missing_partition_of_a_non_window_input_still_fails_named(tmp_path):
    lake = TinyLake(tmp_path, ["2024-01-01", "2024-01-03"])

    result = lake.run([day_read], "2024-01-02")

    assert not result.success
    assert "features partition 2024-01-02 is not in storage" in failure_message(result)
    assert attempts(result, "day_read") == 1  # waiting would not store it: no retry
    outcome = run_outcome(lake.instance, result.run_id, succeeded=False)
    assert outcome is not None
    assert classify_outcome(outcome).failure_class == DATA

    # In a range, the other days are computed, so the failure names that day alone; nothing
    # of the failed step is recorded, so nothing of it stays in the lake.
    result = lake.run([day_read], "2024-01-01", last="2024-01-03")

    assert not result.success
    message = failure_message(result)
    assert "day_read: 1 of 3 days failed" in message
    assert "features partition 2024-01-02 is not in storage" in message
    assert lake.value("day_read", "2024-01-03") is None
    assert lake.io_manager.storage.list_keys("day_read") == []


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path, monkeypatch) -> LakeStorage:
    if request.param == "local":
        return LocalStorage(base_dir=str(tmp_path / "lake"))
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)
    endpoint = request.getfixturevalue("s3_server")
    s3_test_client(endpoint).create_bucket(Bucket="lake-bucket")
    return S3Storage(url="s3://lake-bucket/prod/lake", s3=S3Resource(endpoint_url=endpoint))


def test_a_window_reads_the_versions_dagster_records_and_nothing_else(storage):
    instance = dg.DagsterInstance.ephemeral()
    features = dg.AssetKey(["tiny", "features"])
    for key in [
        "tiny/features/2024-01-01/run-a-0.json",
        # A version no run recorded (its run was killed), and a write in progress.
        "tiny/features/2024-01-01/run-b-0.json",
        "tiny/features/2024-01-02/.run-a-0.json.tmp",
        # A day recorded before versions had files of their own.
        "tiny/features/2024-01-03.json",
        "tiny/features/2024-01-04/run-c-0.json",
        "tiny/features_v2/2024-01-05/run-a-0.json",
    ]:
        storage.write_bytes(key, b"{}")
    recorded = {
        "2024-01-01": {"lake_key": "tiny/features/2024-01-01/run-a-0.json"},
        "2024-01-02": {"lake_key": "tiny/features/2024-01-02/run-a-0.json"},
        "2024-01-03": {},
        "2024-01-05": {"lake_key": "tiny/features/2024-01-05/run-a-0.json"},
    }
    for day, metadata in recorded.items():
        instance.report_runless_asset_event(
            dg.AssetMaterialization(features, partition=day, metadata=metadata)
        )
    io_manager = LakeIOManager(storage=storage)

    stored = io_manager.stored_versions(instance, features, DAYS, "json")

    assert stored == {
        "2024-01-01": "tiny/features/2024-01-01/run-a-0.json",
        "2024-01-03": "tiny/features/2024-01-03.json",
    }
    # Unrecorded files of runs this instance does not know are not its to delete
    # (test_lake_records.py deletes those of its own ended runs).
    assert io_manager.sweep(instance, features, DAYS) == []


def test_the_days_a_running_step_computed_are_read_as_it_computed_them_unasked(tmp_path):
    """A range's later days read its earlier ones (a drift episode's state, a decay streak):
    those come from what the step computed, and Dagster is asked about the other days only."""
    instance = dg.DagsterInstance.ephemeral()
    features = dg.AssetKey(["tiny", "features"])
    storage = LocalStorage(base_dir=str(tmp_path))
    for day in DAYS[:3]:
        key = f"tiny/features/{day}/run-a-0.json"
        storage.write_bytes(key, json.dumps({"day": day, "run": "a"}).encode())
        instance.report_runless_asset_event(
            dg.AssetMaterialization(features, partition=day, metadata={"lake_key": key})
        )
    io_manager = LakeIOManager(storage=storage)
    # The running step computed 01-02 again (a new version), rejected 01-03 and computed 01-04.
    io_manager.step_computed(features, DAYS[1], "tiny/features/2024-01-02/run-b-0.json")
    io_manager.step_computed(features, DAYS[2], None)
    io_manager.step_computed(features, DAYS[3], "tiny/features/2024-01-04/run-b-0.json")
    asked: list[str] = []
    fetch = instance.fetch_materializations

    def counted(records_filter, *args, **kwargs):
        asked.extend(records_filter.asset_partitions or [])
        return fetch(records_filter, *args, **kwargs)

    instance.fetch_materializations = counted  # type: ignore[method-assign]

    versions = io_manager.recorded_versions(instance, features, DAYS, "json")

    assert versions == {
        "2024-01-01": "tiny/features/2024-01-01/run-a-0.json",
        "2024-01-02": "tiny/features/2024-01-02/run-b-0.json",
        "2024-01-04": "tiny/features/2024-01-04/run-b-0.json",
    }
    assert sorted(asked) == ["2024-01-01", "2024-01-05"]
    asked.clear()
    assert io_manager.load_recorded(instance, features, DAYS[2], "json") is None
    assert asked == []
    # Once the step ended, Dagster's records are read again.
    io_manager.step_ended(features, DAYS)
    assert io_manager.load_recorded(instance, features, DAYS[2], "json") == {
        "day": "2024-01-03",
        "run": "a",
    }


def test_a_record_read_already_loads_its_version_or_none(tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    features = dg.AssetKey(["tiny", "features"])
    storage = LocalStorage(base_dir=str(tmp_path))
    storage.write_bytes("tiny/features/2024-01-01/run-a-0.json", b'{"day": "2024-01-01"}')
    for day, metadata in [
        ("2024-01-01", {"lake_key": "tiny/features/2024-01-01/run-a-0.json"}),
        # Accepted, but its file is gone; rejected.
        ("2024-01-02", {"lake_key": "tiny/features/2024-01-02/run-a-0.json"}),
        ("2024-01-03", {"accepted": False, "verdict": "failed quality gate"}),
    ]:
        instance.report_runless_asset_event(
            dg.AssetMaterialization(features, partition=day, metadata=metadata)
        )
    io_manager = LakeIOManager(storage=storage)
    records = io_manager.records(instance, features, DAYS)

    loaded = {day: io_manager.load_of(records.get(day), features, day, "json") for day in DAYS}

    assert loaded == {
        "2024-01-01": {"day": "2024-01-01"},
        "2024-01-02": None,
        "2024-01-03": None,
        "2024-01-04": None,
        "2024-01-05": None,
    }


def test_the_first_days_of_a_dataset_are_fully_covered():
    coverage = window_coverage("2024-01-02", 28, "2024-01-01", ["2024-01-01", "2024-01-02"])

    assert coverage.expected == ["2024-01-01", "2024-01-02"]
    assert coverage.share == 1.0
    assert coverage.missing == []
    require_coverage(coverage, 0.75, "model", "synthetic")


def test_coverage_at_the_threshold_trains_and_names_the_hole():
    stored = ["2024-01-02", "2024-01-03", "2024-01-05"]
    coverage = window_coverage("2024-01-05", 4, "2024-01-01", stored)

    assert coverage.missing == ["2024-01-04"]
    assert coverage.share == 0.75
    require_coverage(coverage, 0.75, "model", "synthetic")


def test_coverage_below_the_threshold_is_a_verdict_of_the_day_naming_days_and_command():
    coverage = window_coverage("2024-01-10", 7, "2024-01-01", ["2024-01-04", "2024-01-10"])

    with pytest.raises(WindowCoverageError) as raised:
        require_coverage(coverage, 0.75, "model", "synthetic")

    verdict = raised.value
    # A data verdict recorded as the day's outcome: never a step failure, so never retried.
    assert isinstance(verdict, DataVerdict) and not isinstance(verdict, dg.Failure)
    assert verdict.verdict == Verdict.WINDOW_BELOW_COVERAGE
    text = verdict.reason
    assert "only 2 of the 7 days of its feature window 2024-01-04..2024-01-10" in text
    for day in days_from("2024-01-05", 5):
        assert day in text
    assert "`ml-platform materialize --dataset synthetic --start 2024-01-05 --days 6`" in text
    assert "Materialize" in text
    assert verdict.metadata["missing_window_days"] == days_from("2024-01-05", 5)
    assert verdict.metadata["window_coverage"] == pytest.approx(2 / 7)


def test_a_day_without_its_own_features_is_not_trained_however_full_its_window():
    coverage = window_coverage("2024-01-28", 28, "2024-01-01", days_from("2024-01-01", 27))

    assert coverage.share == 27 / 28
    with pytest.raises(WindowCoverageError, match="features partition 2024-01-28 is not in"):
        require_coverage(coverage, 0.75, "model", "synthetic")


def test_the_fill_command_spans_the_first_missing_day_through_the_day():
    assert fill_command("synthetic", "2024-01-30", "2024-02-02") == (
        "ml-platform materialize --dataset synthetic --start 2024-01-30 --days 4"
    )


def day_records_of(
    result: dg.ExecuteInProcessResult, platform: Platform, asset: str
) -> dict[str, dict[str, Any]]:
    """The metadata each day of `asset` was recorded with in the run, by day."""
    return {
        str(event.partition): {key: value.value for key, value in event.metadata.items()}
        for event in result.asset_materializations_for_node(platform.node(asset))
    }


def attempts(result: dg.ExecuteInProcessResult, step: str) -> int:
    """How many times a step of the run started (1: it was not retried)."""
    return sum(
        1
        for event in result.all_events
        if event.step_key == step and event.event_type == dg.DagsterEventType.STEP_START
    )


@pytest.fixture(scope="module")
def holed(tmp_path_factory) -> tuple[Platform, dg.ExecuteInProcessResult]:
    """Synthetic days 01-01..01-05 with a 4-day window, 01-04 never landed; the run of 01-05."""
    root = tmp_path_factory.mktemp("holed")
    contract = contract_with(root, "synthetic", window_days=4)
    platform = Platform(contract, root / "platform")
    platform.land(DAYS[0], 3)
    platform.land(DAYS[4], 1)
    assert materialize_range(platform, DAYS[0], DAYS[2], DAILY_ASSETS).success
    return platform, platform.materialize(DAYS[4])


def test_a_model_over_a_hole_trains_on_the_rest_and_names_the_missing_day(holed):
    platform, result = holed

    assert result.success
    (event,) = result.asset_materializations_for_node(platform.node("model"))
    metadata = {key: value.value for key, value in event.metadata.items()}
    assert metadata["missing_window_days"] == ["2024-01-04"]
    assert metadata["window_coverage"] == 0.75
    assert metadata["window_partitions"] == ["2024-01-02", "2024-01-03", "2024-01-05"]
    # The evaluation of the day saw the model's window, and the day's model is registered.
    report = json.loads(platform.stored("evaluation_report", DAYS[4], "json").read_text())
    assert report["window"] == ["2024-01-02", "2024-01-03", "2024-01-05"]
    assert DAYS[4] in platform.materialized("evaluation_report")
    registered = json.loads(platform.stored("registered_model", DAYS[4], "json").read_text())
    assert registered["version"] == "daily-2024-01-05"
    assert registered["manifest"]["input_partitions"] == metadata["window_partitions"]
    assert DAYS[4] in platform.materialized("registered_model")


def test_below_coverage_the_days_model_is_rejected_once_naming_the_days_and_command(holed):
    platform, _ = holed
    # 01-07's window 01-04..01-07 lacks 01-04 and 01-06: 2 of its 4 days are left.
    platform.land("2024-01-07", 1)

    result = platform.materialize("2024-01-07")

    # A verdict of the day, not a failed run: the day is recorded, the model step ran once.
    assert result.success
    assert attempts(result, platform.node("model")) == 1
    (model,) = day_records_of(result, platform, "model").values()
    assert model["verdict"] == Verdict.WINDOW_BELOW_COVERAGE
    assert model["accepted"] is False and model["accepted_rows"] == 0
    reason = model["reason"]
    assert "only 2 of the 4 days of its feature window 2024-01-04..2024-01-07" in reason
    assert "features partitions 2024-01-04, 2024-01-06 are not in storage" in reason
    assert "`ml-platform materialize --dataset synthetic --start 2024-01-04 --days 4`" in reason
    assert model["missing_window_days"] == ["2024-01-04", "2024-01-06"]
    assert not platform.stored("model", "2024-01-07", "joblib").exists()
    # The assets after the model record the day without accepted input, naming the model.
    for asset in ("evaluation_report", "registered_model"):
        (record,) = day_records_of(result, platform, asset).values()
        assert record["verdict"] == Verdict.NO_ACCEPTED_INPUT and record["accepted"] is False
        assert "model 2024-01-07 was rejected (window below coverage)" in record["reason"]
        assert not platform.stored(asset, "2024-01-07", "json").exists()
    # What `ml-platform materialize` prints, and `ml-platform rejected` lists.
    outcome, rejected = cli.day_outcome(platform.instance, result.run_id, "synthetic")
    assert rejected
    assert outcome.startswith("REJECTED by model: window below coverage: model 2024-01-07 was")
    (day,) = rejected_days(platform.instance, "synthetic", ["2024-01-07"])
    assert (day.asset, day.verdict, day.kept) == ("model", Verdict.WINDOW_BELOW_COVERAGE, False)


def test_in_a_range_a_day_below_coverage_is_rejected_alone(tmp_path):
    contract = contract_with(tmp_path, "synthetic", window_days=4)
    platform = Platform(contract, tmp_path / "platform")
    # 01-02 never lands: its raw_data is rejected (missing file), and its features with it.
    platform.land(DAYS[0], 1)
    platform.land(DAYS[2], 3)
    ingestion = ["raw_data", "validated_data", "features"]
    assert materialize_range(platform, DAYS[0], DAYS[4], ingestion).success
    assert not platform.stored("features", DAYS[1], "parquet").exists()

    # 01-03 keeps 2 of its 3 days (67 %); 01-04 and 01-05 keep 3 of 4 (75 %).
    result = materialize_range(platform, DAYS[2], DAYS[4], ["model"])

    assert result.success
    assert attempts(result, platform.node("model")) == 1
    models = day_records_of(result, platform, "model")
    assert sorted(models) == DAYS[2:]
    rejected = models[DAYS[2]]
    assert rejected["verdict"] == Verdict.WINDOW_BELOW_COVERAGE and rejected["accepted"] is False
    reason = rejected["reason"]
    assert "model 2024-01-03 was not trained: features partition 2024-01-02 is not" in reason
    assert "only 2 of the 3 days of its feature window 2024-01-01..2024-01-03" in reason
    assert not platform.stored("model", DAYS[2], "joblib").exists()
    for day in DAYS[3:]:
        assert models[day]["verdict"] == "accepted"
        assert models[day]["missing_window_days"] == [DAYS[1]]
        assert platform.stored("model", day, "joblib").is_file()
    # Each rejected day is listed where it was rejected first.
    listed = rejected_days(platform.instance, "synthetic", DAYS)
    assert [(d.day, d.asset, d.verdict) for d in listed] == [
        (DAYS[1], "raw_data", Verdict.MISSING_FILE),
        (DAYS[2], "model", Verdict.WINDOW_BELOW_COVERAGE),
    ]
