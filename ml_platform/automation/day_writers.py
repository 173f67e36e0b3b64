"""One writer per day: a command-line run of a day waits for every other run writing that day.

Runs launched by sensors and schedules go through the run queue, whose
`ml_platform/dataset_partition` limit (dagster.yaml) keeps two of them off one day at once.
`ml-platform materialize` executes its runs in its own process, outside the queue, so it keeps
the rule itself, both ways:

- before it runs a day, it waits until no other run of the dataset that writes the day is
  queued or in progress, whatever started it (a sensor, a schedule, the UI, a backfill's range,
  another `materialize`), read from the runs' tags in the instance;
- its own run carries the day's `ml_platform/dataset_partition` tag, so a sensor or schedule run
  of the day queued meanwhile waits in the queue until it ends.

A run that starts while a command's run of the day executes, without the day's tag (launched
from the UI, or a backfill's range), is held by its own steps instead: each step waits while an
earlier run writes its days (`platform/writers.py`). One race is left, and reported rather than
hidden: a tagged run that the daemon takes from the queue in the instant between the command's
last look and its run's start (the daemon counts the runs in progress, then launches); the
later of the two then waits in its steps. After each of its runs the command looks for a run of
the day that was in progress at the same time and did not wait for it, or it for that run
(`overlapping`), and fails the day naming it.

A command-line run has no run worker that run monitoring could watch: killed with SIGKILL it
would stay STARTED, and its tag would hold the day's queued runs forever. Its tag names its host
and process, and the next `materialize` records such a run failed.
"""

import datetime as dt
import os
import socket
import time
from collections.abc import Callable, Collection

import dagster as dg

from ml_platform.automation.jobs import day_run_tags
from ml_platform.platform.partitions import run_days
from ml_platform.platform.writers import (
    CLI_PROCESS_TAG,
    DATASET_PARTITION_TAG,
    POLL_SECONDS,
    UNFINISHED,
    record_dead_cli_runs,
    started_by,
    waited_for,
)


def cli_run_tags(dataset: str, day: str) -> dict[str, str]:
    """Tags of this process's run of a day: the day's queue tag and where the run executes."""
    return {**day_run_tags(dataset, day), CLI_PROCESS_TAG: f"{socket.gethostname()}:{os.getpid()}"}


def writes_day(run: dg.DagsterRun, dataset: str, day: str, jobs: Collection[str]) -> bool:
    """Whether `run` writes `day` of `dataset`: by its day tag, else its partition or range.

    `jobs` are the dataset's job names; a run of another job (`__ASSET_JOB`, from the UI or a
    backfill) belongs to the dataset when it selects one of the dataset's assets.
    """
    tags = dict(run.tags)
    if DATASET_PARTITION_TAG in tags:
        return tags[DATASET_PARTITION_TAG] == f"{dataset}:{day}"
    if day not in run_days(tags):
        return False
    selected = run.asset_selection or set()
    return run.job_name in jobs or any(key.path[0] == dataset for key in selected)


def other_writers(
    instance: dg.DagsterInstance, dataset: str, day: str, jobs: Collection[str]
) -> list[dg.DagsterRun]:
    """The runs of the instance, queued or in progress, that write `day` of `dataset`."""
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=UNFINISHED))
    return [run for run in runs if writes_day(run, dataset, day, jobs)]


def _advice(run: dg.DagsterRun) -> str:
    if run.status == dg.DagsterRunStatus.QUEUED:
        return "; it starts when dagster-daemon takes it from the queue"
    if CLI_PROCESS_TAG in run.tags:
        # Only this host's dead processes are recognised; another machine's need a person.
        return "; if that process is gone, terminate the run in the UI (Runs)"
    return ""


def wait_for_other_writers(
    instance: dg.DagsterInstance,
    dataset: str,
    day: str,
    jobs: Collection[str],
    say: Callable[[str], None],
) -> list[str]:
    """Wait until no other run writes `day` of `dataset`; the ids of the runs waited for.

    `say` is told once of each run waited for: its id, who started it and its status. A run
    that waits in the queue starts only once dagster-daemon takes it; without a daemon the wait
    lasts until the run is canceled (UI, Runs) or this command is stopped.
    """
    waited: list[str] = []
    while True:
        for run in record_dead_cli_runs(instance):
            say(
                f"recorded run {run.run_id} of {', '.join(run_days(run.tags))} failed: "
                f"its process {run.tags[CLI_PROCESS_TAG]} is gone"
            )
        writers = other_writers(instance, dataset, day, jobs)
        if not writers:
            return waited
        for run in writers:
            if run.run_id not in waited:
                waited.append(run.run_id)
                say(
                    f"waiting for run {run.run_id} ({started_by(run)}, {run.status.value}) "
                    f"to end: it writes this day too{_advice(run)}"
                )
        time.sleep(POLL_SECONDS)


def overlapping(
    instance: dg.DagsterInstance,
    run_id: str,
    dataset: str,
    day: str,
    jobs: Collection[str],
    since: float,
) -> list[dg.DagsterRun]:
    """Other runs of `day` of `dataset` that were in progress while run `run_id` was.

    `since` is when the command last saw no other writer (before `run_id` started): a run in
    progress during `run_id` changed status after it.
    """
    records = instance.get_run_records(
        filters=dg.RunsFilter(updated_after=dt.datetime.fromtimestamp(since, dt.UTC))
    )
    own = next(r for r in records if r.dagster_run.run_id == run_id)
    start, end = own.start_time or since, own.end_time or time.time()
    # Runs in progress beside this one whose steps waited for it, or it for them, wrote apart.
    apart = waited_for(instance, run_id)
    return [
        record.dagster_run
        for record in records
        if record.dagster_run.run_id != run_id
        and record.start_time is not None
        and record.start_time < end
        and (record.end_time is None or record.end_time > start)
        and writes_day(record.dagster_run, dataset, day, jobs)
        and record.dagster_run.run_id not in apart
        and run_id not in waited_for(instance, record.dagster_run.run_id)
    ]
