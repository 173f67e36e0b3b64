"""Schedules: the previous day every night, and a full retrain every Monday.

Both run at 02:00 in the timezone of the dataset's partitions (the contract's
`event_time.timezone`), so "the previous day" is the day that just ended where the data lives.
The partition comes from the partitions definition at the scheduled time, not from the clock
of whatever machine evaluates the tick. Once the partitions have ended (`partitions.end_date`),
both skip: their last day ran on the night after it.
"""

import datetime as dt
import zoneinfo
from collections.abc import Sequence

import dagster as dg

from ml_platform.automation.jobs import day_run_tags, day_runs_in_flight
from ml_platform.platform.datasets import dataset_name
from ml_platform.platform.records import done_days

DAILY_SCHEDULE = "daily_pipeline_schedule"
WEEKLY_RETRAIN_SCHEDULE = "weekly_retrain_schedule"
NIGHTLY_CRON = "0 2 * * *"
MONDAY_CRON = "0 2 * * 1"


def previous_day(
    partitions: dg.TimeWindowPartitionsDefinition, context: dg.ScheduleEvaluationContext
) -> str | dg.SkipReason:
    """The day that just ended at the tick's scheduled time, or why there is none to run.

    There is none before the first day has ended, nor after the last partition (a contract's
    end_date): the last key stays that day for ever, and a schedule's run key only keeps one
    tick from launching twice, so every later tick would run that day again.
    """
    when = context.scheduled_execution_time or dt.datetime.now(dt.UTC)
    with dg.partition_loading_context(effective_dt=when):
        last = partitions.get_last_partition_key()
    if last is None:
        return dg.SkipReason("no complete day yet: the first partition has not ended")
    local = when.astimezone(zoneinfo.ZoneInfo(partitions.timezone))
    ended = (local.date() - dt.timedelta(days=1)).isoformat()
    if last < ended:
        return dg.SkipReason(
            f"the last partition, {last}, ended before {local.date()}: there is no later "
            "day to run (the contract's partitions.end_date)"
        )
    return last


def build_daily_schedule(
    dataset: str,
    partitions: dg.TimeWindowPartitionsDefinition,
    job_name: str,
    keys: Sequence[dg.AssetKey],
) -> dg.ScheduleDefinition:
    """At 02:00, run the previous day unless it is already done (e.g. by the landing sensor)."""
    name = dataset_name(dataset, DAILY_SCHEDULE)

    @dg.schedule(
        name=name,
        cron_schedule=NIGHTLY_CRON,
        job_name=job_name,
        execution_timezone=partitions.timezone,
        description=(
            "At 02:00 (dataset timezone), runs the day that just ended, unless every asset of "
            "the job already accepted that day (the landing sensor ran it when its file landed) "
            "or a run of it is queued or running; a rejected day runs again."
        ),
    )
    def daily_pipeline_schedule(context: dg.ScheduleEvaluationContext):
        day = previous_day(partitions, context)
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
    dataset: str, partitions: dg.TimeWindowPartitionsDefinition, job_name: str
) -> dg.ScheduleDefinition:
    """On Mondays at 02:00, retrain on the window ending the previous day (Sunday).

    `job_name` is the retrain job (the longer training window); this schedule only decides
    when and for which day.
    """
    name = dataset_name(dataset, WEEKLY_RETRAIN_SCHEDULE)

    @dg.schedule(
        name=name,
        cron_schedule=MONDAY_CRON,
        job_name=job_name,
        execution_timezone=partitions.timezone,
        description="Mondays at 02:00 (dataset timezone): full retrain ending the previous day.",
    )
    def weekly_retrain_schedule(context: dg.ScheduleEvaluationContext):
        day = previous_day(partitions, context)
        if isinstance(day, dg.SkipReason):
            return day
        return dg.RunRequest(
            run_key=f"{name}:{day}", partition_key=day, tags=day_run_tags(dataset, day)
        )

    return weekly_retrain_schedule
