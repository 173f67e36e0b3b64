"""One writer per day, kept by every step: a step waits while an earlier run writes its days.

The run queue keeps two tagged runs of one day apart (`ml_platform/dataset_partition`,
dagster.yaml), and `ml-platform materialize` waits before it starts a day
(`automation/day_writers.py`). Neither holds back a run that starts while another executes
without the day's tag: a run launched from the UI or a backfill's range while a command's run
of the day executes, or two such runs at once. So each step, before it touches its days
(`steps.each_day`), looks at the runs in progress: one that started before its own run and
writes one of its days of the dataset holds it until that run ends. Later runs wait for earlier
ones, never the reverse, so two runs never wait for each other.

A run writes a day of a dataset when it carries the day's tag, or when its partition or range
holds the day and Dagster planned it to materialise one of the dataset's assets (the run's
`ASSET_MATERIALIZATION_PLANNED` events, which Dagster records when it creates the run).

The step says what it waits for in the run's log before it waits, and that it waited
(`waited_for` reads both back), so the command that ran first can tell a run that waits for it
from one that overlapped it.
"""

import os
import re
import socket
import time
from collections.abc import Callable, Iterable

import dagster as dg

from ml_platform.platform.partitions import run_days

# `<dataset>:<day>`: the tag the queue's one-run-per-day limit keys on (dagster.yaml).
# `dagster/partition` holds the day only, the same for every dataset: a limit per unique value
# of it would make one dataset's run of a day wait for another dataset's run of that day.
DATASET_PARTITION_TAG = "ml_platform/dataset_partition"
# `<host>:<pid>` of the `ml-platform materialize` process executing a run.
CLI_PROCESS_TAG = "ml_platform/cli_process"
# Statuses of a run whose steps may be writing.
EXECUTING = [dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
# Every status of a run that has not ended: it writes its days, or may start to.
UNFINISHED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    *EXECUTING,
]
# How often a waiting step or command looks at the instance again.
POLL_SECONDS = 1.0
# The log lines of a step that waits, then waited: `waited_for` finds the runs they name.
WAITING = "one writer per day: waiting for run {run_id}"
WAITED = "one writer per day: waited for run {run_id}"
_WAITS = re.compile(r"one writer per day: wait(?:ing|ed) for run ([0-9a-f-]{36})")


def started_by(run: dg.DagsterRun) -> str:
    """Who started a run, in words: a sensor, a schedule, a backfill, a command, the UI or API."""
    tags = run.tags
    if "dagster/sensor_name" in tags:
        return f"sensor {tags['dagster/sensor_name']}"
    if "dagster/schedule_name" in tags:
        return f"schedule {tags['dagster/schedule_name']}"
    if "dagster/backfill" in tags:
        return f"backfill {tags['dagster/backfill']}"
    if CLI_PROCESS_TAG in tags:
        return f"ml-platform materialize, process {tags[CLI_PROCESS_TAG]}"
    return "the UI or the API"


def _process_gone(tag: str) -> bool:
    host, _, pid = tag.rpartition(":")
    if host != socket.gethostname():
        return False  # another machine's process: only that machine can tell
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


def record_dead_cli_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    """Record failed each unfinished command-line run of this host whose process is gone.

    Run monitoring records a launched run failed when its worker dies; a command-line run has
    no worker it watches. The failure also lets lake_sweep_sensor delete its unrecorded files,
    and frees the runs that wait for it.
    """
    dead = [
        run
        for run in instance.get_runs(filters=dg.RunsFilter(statuses=UNFINISHED))
        if CLI_PROCESS_TAG in run.tags and _process_gone(run.tags[CLI_PROCESS_TAG])
    ]
    for run in dead:
        instance.report_run_failed(
            run,
            message=(
                f"the ml-platform materialize process {run.tags[CLI_PROCESS_TAG]} that executed "
                "this run ended without recording it (killed, e.g. SIGKILL or out of memory); "
                "rerun the day"
            ),
        )
    return dead


def planned_datasets(instance: dg.DagsterInstance, run_id: str) -> set[str]:
    """The datasets whose assets Dagster planned the run to materialise."""
    records = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
    ).records
    events = [r.event_log_entry.dagster_event for r in records]
    return {e.asset_key.path[0] for e in events if e is not None and e.asset_key is not None}


def days_written(
    instance: dg.DagsterInstance, run: dg.DagsterRun, dataset: str, days: Iterable[str]
) -> list[str]:
    """Which of `days` of `dataset` the run writes (see the module's docstring)."""
    tags = dict(run.tags)
    if DATASET_PARTITION_TAG in tags:
        return [d for d in days if tags[DATASET_PARTITION_TAG] == f"{dataset}:{d}"]
    among = set(run_days(tags))
    shared = [d for d in days if d in among]
    return shared if shared and dataset in planned_datasets(instance, run.run_id) else []


def waited_for(instance: dg.DagsterInstance, run_id: str) -> set[str]:
    """The runs a run's steps wait or waited for, from its log."""
    records = instance.get_records_for_run(run_id).records
    messages = (r.event_log_entry.user_message for r in records)
    return {m.group(1) for message in messages if (m := _WAITS.search(message or ""))}


def earlier_writers(
    instance: dg.DagsterInstance, run_id: str, dataset: str, days: list[str]
) -> dict[str, tuple[dg.DagsterRun, list[str]]]:
    """Runs executing that started before run `run_id` and write some of `days` of `dataset`."""
    own = instance.get_run_record_by_id(run_id)
    if own is None or own.start_time is None:
        return {}
    mine = (own.start_time, run_id)
    found = {}
    for record in instance.get_run_records(filters=dg.RunsFilter(statuses=EXECUTING)):
        run = record.dagster_run
        if record.start_time is None or (record.start_time, run.run_id) >= mine:
            continue  # not started, or started after this run: that one waits for this one
        shared = days_written(instance, run, dataset, days)
        if shared:
            found[run.run_id] = (run, shared)
    return found


def wait_for_earlier_writers(
    instance: dg.DagsterInstance,
    run_id: str,
    dataset: str,
    days: list[str],
    say: Callable[[str], None],
) -> list[str]:
    """Wait until no run that started before `run_id` writes any of `days` of `dataset`.

    `say` is told once of each run waited for and once that it ended. The ids waited for.
    """
    waiting: dict[str, float] = {}  # run id -> when this step began to wait for it
    waited: list[str] = []
    while True:
        record_dead_cli_runs(instance)
        writers = earlier_writers(instance, run_id, dataset, days)
        for other, (run, shared) in writers.items():
            if other not in waiting:
                waiting[other] = time.monotonic()
                say(
                    f"{WAITING.format(run_id=other)} ({started_by(run)}, {run.status.value}) "
                    f"to end: it writes {', '.join(shared)} of {dataset} too; if that run no "
                    "longer executes, terminate it in the UI (Runs)"
                )
        for other in [o for o in waiting if o not in writers]:
            say(f"{WAITED.format(run_id=other)} for {time.monotonic() - waiting.pop(other):.0f}s")
            waited.append(other)
        if not writers:
            return waited
        time.sleep(POLL_SECONDS)
