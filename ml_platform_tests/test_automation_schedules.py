"""Schedules request the right partition in the dataset's timezone, and jobs carry their tags."""

import datetime as dt
from zoneinfo import ZoneInfo

import dagster as dg
import pytest

from ml_platform.automation.alert_sensors import ALERT_SENSORS
from ml_platform.automation.jobs import DATASET_PARTITION_TAG, INGESTION_JOB, WORKLOAD_TAG
from ml_platform.automation.landing_sensor import LANDING_SENSOR
from ml_platform.automation.schedules import DAILY_SCHEDULE, WEEKLY_RETRAIN_SCHEDULE
from ml_platform.contracts import load_contract
from ml_platform.definitions import DAILY_JOB, WEEKLY_RETRAIN_JOB, build_definitions
from ml_platform.platform.datasets import asset_key, dataset_name

FLIGHTS_DAILY_SCHEDULE = dataset_name("flights", DAILY_SCHEDULE)
FLIGHTS_WEEKLY_RETRAIN_SCHEDULE = dataset_name("flights", WEEKLY_RETRAIN_SCHEDULE)
FLIGHTS_DAILY_JOB = dataset_name("flights", DAILY_JOB)
FLIGHTS_WEEKLY_RETRAIN_JOB = dataset_name("flights", WEEKLY_RETRAIN_JOB)
FLIGHTS_INGESTION_JOB = dataset_name("flights", INGESTION_JOB)
FLIGHTS_LANDING_SENSOR = dataset_name("flights", LANDING_SENSOR)


@pytest.fixture(scope="module")
def flights(tmp_path_factory):
    root = tmp_path_factory.mktemp("flights")
    defs = build_definitions(
        load_contract("flights"), landing_dir=str(root / "landing"), lake_dir=str(root / "lake")
    )
    return defs, defs.get_repository_def()


def evaluate(defs, repository, name: str, at: dt.datetime, instance=None):
    schedule = defs.resolve_schedule_def(name)
    if instance is None:
        with dg.instance_for_test() as fresh:
            return evaluate(defs, repository, name, at, fresh)
    context = dg.build_schedule_context(
        instance=instance, scheduled_execution_time=at, repository_def=repository
    )
    return schedule.evaluate_tick(context)


NEW_YORK = ZoneInfo("America/New_York")


def test_daily_schedule_runs_the_day_that_just_ended_in_the_dataset_timezone(flights):
    defs, repository = flights
    schedule = defs.resolve_schedule_def(FLIGHTS_DAILY_SCHEDULE)
    # When the day's file is due: flights' freshness says 06:00 the next day, 60 minutes' grace.
    # At 02:00 it has not landed yet, and a run would record the day rejected as a missing file.
    assert schedule.cron_schedule == "0 7 * * *"
    assert schedule.execution_timezone == "America/New_York"  # the flights contract's timezone
    assert schedule.job_name == FLIGHTS_DAILY_JOB

    # 07:00 in New York is 12:00 UTC: the previous day there, not the UTC day.
    result = evaluate(
        defs, repository, FLIGHTS_DAILY_SCHEDULE, dt.datetime(2013, 3, 5, 7, tzinfo=NEW_YORK)
    )

    [request] = result.run_requests
    assert request.partition_key == "2013-03-04"
    assert request.tags["dagster/partition"] == "2013-03-04"
    assert request.run_key == f"{FLIGHTS_DAILY_SCHEDULE}:2013-03-04"
    # The instance's one-run-per-day limit keys on the dataset and the day together.
    assert request.tags[DATASET_PARTITION_TAG] == "flights:2013-03-04"


def test_daily_schedule_skips_a_day_that_is_already_accepted_and_reruns_a_rejected_one(flights):
    defs, repository = flights
    job_assets = defs.resolve_job_def(FLIGHTS_DAILY_JOB).asset_layer.executable_asset_keys
    at = dt.datetime(2013, 3, 5, 7, tzinfo=NEW_YORK)
    with dg.instance_for_test() as instance:
        for key in job_assets:
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    asset_key=key,
                    partition="2013-03-04",
                    metadata={"verdict": "accepted", "accepted": True, "accepted_rows": 10},
                )
            )
        accepted = evaluate(defs, repository, FLIGHTS_DAILY_SCHEDULE, at, instance)
        # The day is delivered again and rejected (a tombstone of validated_data, and the days
        # after it without accepted input): it is not done, and a corrected file may come.
        for key in job_assets:
            if key.path[-1] == "raw_data":
                continue
            gate = key.path[-1] == "validated_data"
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    asset_key=key,
                    partition="2013-03-04",
                    metadata={
                        "verdict": "failed quality gate" if gate else "no accepted input",
                        "reason": "the file holds 200 rows, expected between 300 and 2000",
                        "accepted": False,
                        "accepted_rows": 0,
                    },
                )
            )
        rejected = evaluate(defs, repository, FLIGHTS_DAILY_SCHEDULE, at, instance)

    assert accepted.run_requests == []
    assert "2013-03-04 is already accepted" in (accepted.skip_message or "")
    [request] = rejected.run_requests
    assert request.partition_key == "2013-03-04"


@pytest.mark.parametrize(
    ("status", "runs_again"),
    [
        # (A queued run needs a code location's origin here; it is in the same list of states.)
        (dg.DagsterRunStatus.NOT_STARTED, False),
        (dg.DagsterRunStatus.STARTED, False),
        (dg.DagsterRunStatus.FAILURE, True),
        (dg.DagsterRunStatus.SUCCESS, True),  # ended, and the day not accepted (rejected)
    ],
)
def test_daily_schedule_leaves_a_day_to_its_run_in_flight(flights, status, runs_again):
    # The file landed at 06:55: the landing sensor's run of the day is queued or running at
    # 07:00. A second run would wait behind it, then compute the same day again.
    defs, repository = flights
    at = dt.datetime(2013, 3, 5, 7, tzinfo=NEW_YORK)
    with dg.instance_for_test() as instance:
        sensors_run = instance.add_run(
            dg.DagsterRun(
                job_name=FLIGHTS_DAILY_JOB,
                status=status,
                tags={DATASET_PARTITION_TAG: "flights:2013-03-04"},
            )
        )
        # The same day of another dataset is not this one's.
        instance.add_run(
            dg.DagsterRun(
                job_name="synthetic_daily_pipeline_job",
                status=dg.DagsterRunStatus.STARTED,
                tags={DATASET_PARTITION_TAG: "synthetic:2013-03-04"},
            )
        )
        result = evaluate(defs, repository, FLIGHTS_DAILY_SCHEDULE, at, instance)

    if runs_again:
        [request] = result.run_requests
        assert request.partition_key == "2013-03-04"
    else:
        assert result.run_requests == []
        assert f"2013-03-04 has a run queued or running ({sensors_run.run_id})" in (
            result.skip_message or ""
        )


def test_weekly_retrain_runs_once_sunday_has_its_verdict(flights):
    defs, repository = flights
    schedule = defs.resolve_schedule_def(FLIGHTS_WEEKLY_RETRAIN_SCHEDULE)
    # Every hour of Monday from Sunday's deadline (07:00): Sunday's own run starts then.
    assert schedule.cron_schedule == "0 * * * 1"
    assert schedule.execution_timezone == "America/New_York"
    assert schedule.job_name == FLIGHTS_WEEKLY_RETRAIN_JOB
    monday = dt.datetime(2013, 1, 7, 7, tzinfo=NEW_YORK)
    assert monday.weekday() == 0

    with dg.instance_for_test() as instance:
        # Sunday has no verdict yet: a window without its last day would never be redone.
        waiting = evaluate(defs, repository, FLIGHTS_WEEKLY_RETRAIN_SCHEDULE, monday, instance)
        before_deadline = evaluate(
            defs, repository, FLIGHTS_WEEKLY_RETRAIN_SCHEDULE, monday.replace(hour=6), instance
        )
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                asset_key=asset_key("flights", "features"), partition="2013-01-06"
            )
        )
        later = monday.replace(hour=8)
        [request] = evaluate(
            defs, repository, FLIGHTS_WEEKLY_RETRAIN_SCHEDULE, later, instance
        ).run_requests
        instance.add_run(
            dg.DagsterRun(
                job_name=FLIGHTS_WEEKLY_RETRAIN_JOB,
                status=dg.DagsterRunStatus.SUCCESS,
                tags={"dagster/partition": "2013-01-06"},
            )
        )
        again = evaluate(
            defs, repository, FLIGHTS_WEEKLY_RETRAIN_SCHEDULE, later.replace(hour=9), instance
        )

    assert waiting.run_requests == []
    assert "2013-01-06 has no verdict of flights/features yet" in (waiting.skip_message or "")
    assert before_deadline.run_requests == []
    assert "2013-01-05, not a Sunday" in (before_deadline.skip_message or "")
    assert request.partition_key == "2013-01-06"
    assert request.run_key == f"{FLIGHTS_WEEKLY_RETRAIN_SCHEDULE}:2013-01-06"
    # Once a week: the ticks after its run leave it.
    assert again.run_requests == []
    assert "the retrain of 2013-01-06 ran already" in (again.skip_message or "")


def test_synthetic_schedules_use_utc(tmp_path):
    defs = build_definitions(
        load_contract("synthetic"),
        landing_dir=str(tmp_path / "landing"),
        lake_dir=str(tmp_path / "lake"),
    )
    at = dt.datetime(2024, 3, 1, 2, tzinfo=dt.UTC)
    result = evaluate(
        defs, defs.get_repository_def(), dataset_name("synthetic", DAILY_SCHEDULE), at
    )
    assert [r.partition_key for r in result.run_requests] == ["2024-02-29"]


def test_automation_is_registered_with_safe_defaults(flights):
    defs, _ = flights
    assert defs.resolve_sensor_def(FLIGHTS_LANDING_SENSOR).job_name == FLIGHTS_DAILY_JOB
    # New-file runs and schedules start stopped: turning them on is a deliberate act.
    assert (
        defs.resolve_sensor_def(FLIGHTS_LANDING_SENSOR).default_status
        == dg.DefaultSensorStatus.STOPPED
    )
    for name in (FLIGHTS_DAILY_SCHEDULE, FLIGHTS_WEEKLY_RETRAIN_SCHEDULE):
        assert defs.resolve_schedule_def(name).default_status == dg.DefaultScheduleStatus.STOPPED
    # Alerts are on from the start: failing in silence is the one thing never wanted.
    for name in ALERT_SENSORS:
        assert defs.resolve_sensor_def(name).default_status == dg.DefaultSensorStatus.RUNNING


def test_jobs_carry_the_workload_tag_the_concurrency_limits_use(flights):
    defs, _ = flights
    assert defs.resolve_job_def(FLIGHTS_DAILY_JOB).tags[WORKLOAD_TAG] == "training"
    assert defs.resolve_job_def(FLIGHTS_WEEKLY_RETRAIN_JOB).tags[WORKLOAD_TAG] == "training"
    ingestion = defs.resolve_job_def(FLIGHTS_INGESTION_JOB)
    assert ingestion.tags[WORKLOAD_TAG] == "ingestion"
    assert {k.to_user_string() for k in ingestion.asset_layer.executable_asset_keys} == {
        "flights/raw_data",
        "flights/validated_data",
        "flights/features",
    }


def test_every_storage_step_retries_with_backoff_and_jitter(flights):
    defs, _ = flights
    graph = defs.resolve_asset_graph()
    for name in ("raw_data", "validated_data", "features"):
        node = graph.get(asset_key("flights", name))
        policy = node.assets_def.op.retry_policy
        assert policy is not None, name
        assert policy.max_retries == 3
        assert policy.backoff == dg.Backoff.EXPONENTIAL
        assert policy.jitter == dg.Jitter.PLUS_MINUS


def test_schedules_run_the_last_day_once_and_nothing_after_the_partitions_end(flights):
    # flights ends 2013-12-31. A schedule reruns whatever a tick requests (its run key is kept
    # per tick only): after the end, the last day would run again every night and every Monday.
    defs, repository = flights
    last_night = dt.datetime(2014, 1, 1, 7, tzinfo=NEW_YORK)
    [request] = evaluate(defs, repository, FLIGHTS_DAILY_SCHEDULE, last_night).run_requests
    assert request.partition_key == "2013-12-31"

    for name, at in [
        (FLIGHTS_DAILY_SCHEDULE, dt.datetime(2014, 1, 2, 7, tzinfo=NEW_YORK)),
        (FLIGHTS_DAILY_SCHEDULE, dt.datetime(2026, 12, 7, 7, tzinfo=NEW_YORK)),
        (FLIGHTS_WEEKLY_RETRAIN_SCHEDULE, dt.datetime(2014, 1, 6, 7, tzinfo=NEW_YORK)),
    ]:
        result = evaluate(defs, repository, name, at)
        assert result.run_requests == []
        assert "the last partition, 2013-12-31, ended" in (result.skip_message or "")
