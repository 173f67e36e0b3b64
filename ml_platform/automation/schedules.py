"""Schedules: each day once its file is due, and a full retrain once a week.

The nightly schedule runs the day that just ended at the time its file is due: the contract's
freshness deadline (`freshness.expected_by` the next day, plus `grace_minutes`), or 02:00 the
next day without one. Earlier, a file due at 06:00 has not landed yet: the day would be recorded
rejected as a missing file, alerted, and, with the landing sensor off, never run with its file.
Both run in the timezone of the dataset's partitions (the contract's `event_time.timezone`), and
the partition comes from the partitions definition at the scheduled time, not from the clock of
whatever machine evaluates the tick. Once the partitions have ended (`partitions.end_date`),
both skip: their last day ran at its deadline.

The weekly retrain trains on the window ending Sunday once Sunday has its verdict: it looks every
hour of the day Sunday's file is due, from that deadline, and runs once Sunday's features are
recorded (accepted or rejected). Run at the same tick as Sunday's own run, it would train without
Sunday and never be redone.
"""

import datetime as dt
import zoneinfo
from collections.abc import Sequence

import dagster as dg

from ml_platform.automation.jobs import day_run_tags, day_runs_in_flight
from ml_platform.contracts.model import FreshnessSpec
from ml_platform.platform.datasets import dataset_name
from ml_platform.platform.records import day_records, done_days

DAILY_SCHEDULE = "daily_pipeline_schedule"
WEEKLY_RETRAIN_SCHEDULE = "weekly_retrain_schedule"
# Without a freshness deadline: 02:00 after the day.
DEFAULT_DEADLINE = dt.timedelta(hours=2)


def deadline_after_day(freshness: FreshnessSpec | None) -> dt.timedelta:
    """How long after a day ends its file is due and late: expected_by the next day + grace."""
    if freshness is None:
        return DEFAULT_DEADLINE
    expected = freshness.expected_time
    return dt.timedelta(hours=expected.hour, minutes=expected.minute + freshness.grace_minutes)


def previous_day(
    partitions: dg.TimeWindowPartitionsDefinition,
    context: dg.ScheduleEvaluationContext,
    deadline: dt.timedelta = DEFAULT_DEADLINE,
) -> str | dg.SkipReason:
    """The latest day whose file's deadline has passed at the tick's time, or why none runs.

    There is none before the first day's deadline, nor after the last partition (a contract's
    end_date): the last key stays that day for ever, and a schedule's run key only keeps one
    tick from launching twice, so every later tick would run that day again.
    """
    when = context.scheduled_execution_time or dt.datetime.now(dt.UTC)
    with dg.partition_loading_context(effective_dt=when):
        first = partitions.get_first_partition_key()
        last = partitions.get_last_partition_key()
    local = when.astimezone(zoneinfo.ZoneInfo(partitions.timezone))
    # Day D is due at its end (D+1 00:00) + the deadline, on the wall clock of its timezone.
    day = ((local.replace(tzinfo=None) - deadline).date() - dt.timedelta(days=1)).isoformat()
    if first is None or last is None or day < first:
        return dg.SkipReason("no day is due yet: the first partition's deadline has not passed")
    if last < day:
        return dg.SkipReason(
            f"the last partition, {last}, ended before {day}: there is no later day to run "
            "(the contract's partitions.end_date)"
        )
    return day


def build_daily_schedule(
    dataset: str,
    partitions: dg.TimeWindowPartitionsDefinition,
    job_name: str,
    keys: Sequence[dg.AssetKey],
    freshness: FreshnessSpec | None = None,
) -> dg.ScheduleDefinition:
    """At the day's deadline, run it unless it is already done (e.g. by the landing sensor)."""
    name = dataset_name(dataset, DAILY_SCHEDULE)
    deadline = deadline_after_day(freshness)
    at = (dt.datetime.min + deadline).time()

    @dg.schedule(
        name=name,
        cron_schedule=f"{at.minute} {at.hour} * * *",
        job_name=job_name,
        execution_timezone=partitions.timezone,
        description=(
            f"At {at:%H:%M} (dataset timezone), when the file of the day that just ended is due "
            "(freshness: expected_by + grace; 02:00 without), runs that day, unless every "
            "asset of the job already accepted it (the landing sensor ran it when its file "
            "landed) or a run of it is queued or running; a rejected day runs again."
        ),
    )
    def daily_pipeline_schedule(context: dg.ScheduleEvaluationContext):
        day = previous_day(partitions, context, deadline)
        if isinstance(day, dg.SkipReason):
            return day
        # A rejected day (a tombstone) is not done: its run may meet a corrected file.
        missing = [
            key.to_user_string()
            for key in keys
            if day not in done_days(context.instance, key, [day])
        ]
        if not missing:
            return dg.SkipReason(f"{day} is already accepted for every asset of {job_name}")
        # The landing sensor's run of a file that landed just before: a second run of the day
        # would wait for it in the queue, then do the same day again.
        in_flight = day_runs_in_flight(context.instance, dataset, day)
        if in_flight:
            return dg.SkipReason(
                f"{day} has a run queued or running ({in_flight[0].run_id}): it does the day; "
                "if it fails, the failure is alerted and its retries rerun it"
            )
        return dg.RunRequest(
            run_key=f"{name}:{day}", partition_key=day, tags=day_run_tags(dataset, day)
        )

    return daily_pipeline_schedule


def build_weekly_retrain_schedule(
    dataset: str,
    partitions: dg.TimeWindowPartitionsDefinition,
    job_name: str,
    sunday_key: dg.AssetKey,
    freshness: FreshnessSpec | None = None,
) -> dg.ScheduleDefinition:
    """Once Sunday has its verdict, retrain on the window ending Sunday.

    `job_name` is the retrain job (the longer training window); `sunday_key` the asset whose
    record of Sunday it waits for (the features the window reads). It looks every hour of the
    day Sunday's deadline falls on (Monday, or Tuesday when the deadline crosses midnight).
    """
    name = dataset_name(dataset, WEEKLY_RETRAIN_SCHEDULE)
    deadline = deadline_after_day(freshness)
    at = (dt.datetime.min + deadline).time()
    weekday = 1 + deadline.days  # cron: Monday is 1

    @dg.schedule(
        name=name,
        cron_schedule=f"{at.minute} * * * {weekday}",
        job_name=job_name,
        execution_timezone=partitions.timezone,
        description=(
            "Full retrain on the window ending Sunday, once Sunday's features have their "
            "verdict: it looks every hour from Sunday's deadline (dataset timezone)."
        ),
    )
    def weekly_retrain_schedule(context: dg.ScheduleEvaluationContext):
        day = previous_day(partitions, context, deadline)
        if isinstance(day, dg.SkipReason):
            return day
        date = dt.date.fromisoformat(day)
        sunday = (date - dt.timedelta(days=(date.weekday() + 1) % 7)).isoformat()
        if sunday != day:
            return dg.SkipReason(f"the latest day past its deadline is {day}, not a Sunday")
        retrains = context.instance.get_runs(
            filters=dg.RunsFilter(job_name=job_name, tags={"dagster/partition": sunday}),
            limit=1,
        )
        if retrains:
            return dg.SkipReason(f"the retrain of {sunday} ran already ({retrains[0].run_id})")
        if sunday not in day_records(context.instance, sunday_key, [sunday]):
            return dg.SkipReason(
                f"{sunday} has no verdict of {sunday_key.to_user_string()} yet: the retrain "
                "waits for it (a window without its last day would never be redone)"
            )
        return dg.RunRequest(
            run_key=f"{name}:{sunday}", partition_key=sunday, tags=day_run_tags(dataset, sunday)
        )

    return weekly_retrain_schedule
