"""Pipeline health over the last N days, read from the instance's runs and event log.

Success rates per job (a canceled run counts as no success, and is named) and per asset step,
p50/p95 step durations, queue wait (from a run's creation to its start), retries, check pass
rates, and a memory request per asset: the largest `step_peak_rss_mb` its materialisations
recorded (steps.day_metrics) plus headroom, rounded up (`platform.sizes.memory_request_mb`,
which `ml-platform resources` also applies), to size container requests from what the steps
really used.
"""

import collections
import dataclasses
import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
import numpy as np

from ml_platform.automation.launch import (
    HEARTBEAT_INTERVAL_SECONDS,
    QUEUE_DAEMON,
    QUEUE_SILENCE_SECONDS,
)
from ml_platform.platform.observability import STEP_PREFIX
from ml_platform.platform.records import DayRecord
from ml_platform.platform.sizes import MEMORY_HEADROOM, memory_request_mb
from ml_platform.registry.monitoring import (
    CHAMPION_PERFORMANCE,
    EPISODE_LOOKBACK,
    EPISODES_KEY,
    OPEN_EPISODES_KEY,
)

PEAK_KEY = f"{STEP_PREFIX}peak_rss_mb"
START_DAEMON = "`ml-platform pools && dagster-daemon run -w workspace.yaml`"
EVENTS = {
    dg.DagsterEventType.STEP_SUCCESS,
    dg.DagsterEventType.STEP_FAILURE,
    dg.DagsterEventType.STEP_UP_FOR_RETRY,
    dg.DagsterEventType.ASSET_CHECK_EVALUATION,
    dg.DagsterEventType.ASSET_MATERIALIZATION,
}


def duration(seconds: float) -> str:
    """e.g. "40s", "12.5min", "2.0h"."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}min"
    return f"{seconds / 3600:.1f}h"


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile of `values`; None when there are none."""
    return float(np.percentile(values, q)) if values else None


@dataclasses.dataclass
class Tally:
    """Successes and failures of one job, step or check, and a job's runs canceled."""

    ok: int = 0
    failed: int = 0
    # A canceled run delivered nothing, as a failed one: it counts against the rate, and is
    # named apart, since someone stopped it rather than it failing.
    canceled: int = 0

    @property
    def total(self) -> int:
        """Every one counted."""
        return self.ok + self.failed + self.canceled

    @property
    def rate(self) -> float:
        """Share of successes."""
        return self.ok / self.total if self.total else 0.0

    def text(self) -> str:
        """e.g. "92% of 12", "50% of 4 (1 canceled)"."""
        canceled = f" ({self.canceled} canceled)" if self.canceled else ""
        return f"{self.rate:.0%} of {self.total}{canceled}"


@dataclasses.dataclass
class HealthReport:
    """What `ml-platform health` prints."""

    days: float
    runs: int
    jobs: dict[str, Tally]
    steps: dict[str, Tally]
    step_seconds: dict[str, list[float]]
    queue_seconds: list[float]
    run_retries: int  # runs that re-execute another (retries, "re-execute from failure")
    step_retries: dict[str, int]
    checks: dict[str, Tally]
    peak_rss_mb: dict[str, float]
    # Per dataset: its latest monitored day and the drift episodes open at its end (None when
    # no recent day records them: unknown, not none).
    open_episodes: dict[str, tuple[str, list[str] | None]] = dataclasses.field(default_factory=dict)
    # How long each run still queued has waited so far: never started, so no queue wait above.
    queued_seconds: list[float] = dataclasses.field(default_factory=list)
    # Seconds since a dagster-daemon last reported working the run queue; None if none ever did.
    queue_daemon_seconds: float | None = None

    def memory_request_mb(self, asset: str) -> int:
        """Peak memory plus headroom, rounded up to a multiple of MEMORY_STEP_MB."""
        return memory_request_mb(self.peak_rss_mb[asset])

    @property
    def queue_daemon_silent(self) -> bool:
        """Whether the daemon that worked the queue stopped reporting: it stopped or hangs."""
        return (
            self.queue_daemon_seconds is not None
            and self.queue_daemon_seconds > QUEUE_SILENCE_SECONDS
        )

    def silent_daemon(self) -> str:
        """How long the queue's daemon has been silent, and what to start."""
        return (
            f"no dagster-daemon has worked the queue of this instance for "
            f"{duration(self.queue_daemon_seconds or 0.0)} (its last heartbeat; one at work "
            f"reports every {HEARTBEAT_INTERVAL_SECONDS}s): it stopped or hangs, so nothing "
            f"starts queued runs; start one ({START_DAEMON})"
        )

    def queued_line(self) -> str:
        """The runs waiting in the queue now, and whether a daemon takes them from it."""
        start = f"start one ({START_DAEMON})"
        if self.queue_daemon_seconds is None:
            daemon = f"no dagster-daemon ever worked the queue of this instance: {start}"
        elif self.queue_daemon_silent:
            daemon = self.silent_daemon()
        else:
            daemon = (
                f"a dagster-daemon last worked the queue {duration(self.queue_daemon_seconds)} "
                f"ago: if none runs now, {start}; while one runs, they wait for the limits of "
                "dagster.yaml (one run a day of a dataset, the pools)"
            )
        return (
            f"queued now: {len(self.queued_seconds)} run(s), the oldest for "
            f"{duration(max(self.queued_seconds))}; {daemon}"
        )

    def render(self) -> str:
        """The report as text for a terminal."""

        def seconds(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f}s"

        lines = [
            f"last {self.days:g} day(s): {self.runs} run(s), {self.run_retries} retried run(s)"
        ]
        lines.append(
            f"queue wait: p50 {seconds(percentile(self.queue_seconds, 50))}, "
            f"p95 {seconds(percentile(self.queue_seconds, 95))}"
        )
        if self.queued_seconds:
            lines.append(self.queued_line())
        elif self.queue_daemon_silent:
            # Nothing waits yet, but whatever a sensor, schedule or person launches will.
            lines.append(f"queue: {self.silent_daemon()}")
        lines.append("jobs (success rate):")
        lines += [f"  {job}: {tally.text()}" for job, tally in sorted(self.jobs.items())]
        lines.append("assets (success rate, p50/p95 duration, step retries):")
        for step, tally in sorted(self.steps.items()):
            durations = self.step_seconds.get(step, [])
            lines.append(
                f"  {step}: {tally.text()}, p50 {seconds(percentile(durations, 50))}, "
                f"p95 {seconds(percentile(durations, 95))}, {self.step_retries.get(step, 0)} "
                "retries"
            )
        lines.append("checks (pass rate):")
        lines += [f"  {check}: {tally.text()}" for check, tally in sorted(self.checks.items())]
        lines.append("open drift episodes (at each dataset's latest monitored day):")
        for dataset, (day, episodes) in sorted(self.open_episodes.items()):
            if episodes is None:
                lines.append(
                    f"  {dataset} ({day}): unknown (neither this day nor the {EPISODE_LOOKBACK} "
                    "days before it record them)"
                )
                continue
            lines.append(f"  {dataset} ({day}): {len(episodes) or 'none'}")
            lines += [f"    {episode}" for episode in episodes]
        lines.append(f"memory requests (peak RSS x {MEMORY_HEADROOM}, rounded up):")
        for asset, peak in sorted(self.peak_rss_mb.items()):
            lines.append(
                f"  {asset}: peak {peak:.0f} MiB -> request {self.memory_request_mb(asset)} MiB"
            )
        return "\n".join(lines)


def pipeline_health(
    instance: dg.DagsterInstance, days: float, now: float | None = None
) -> HealthReport:
    """Summarise the runs created in the last `days` days."""
    now = now or time.time()
    since = now - days * 86400
    records = instance.get_run_records(
        filters=dg.RunsFilter(created_after=dt.datetime.fromtimestamp(since, dt.UTC)),
        order_by="create_timestamp",
    )
    jobs: dict[str, Tally] = collections.defaultdict(Tally)
    steps: dict[str, Tally] = collections.defaultdict(Tally)
    checks: dict[str, Tally] = collections.defaultdict(Tally)
    step_seconds: dict[str, list[float]] = collections.defaultdict(list)
    step_retries: collections.Counter[str] = collections.Counter()
    peaks: dict[str, float] = {}
    queue: list[float] = []
    # Every run waiting now, however long ago it was created: the ones created before the
    # window have waited longest.
    queued = [
        max(0.0, now - waiting.create_timestamp.timestamp())
        for waiting in instance.get_run_records(
            filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED])
        )
    ]
    retried_runs = 0
    for record in records:
        run = record.dagster_run
        if run.status == dg.DagsterRunStatus.SUCCESS:
            jobs[run.job_name].ok += 1
        elif run.status == dg.DagsterRunStatus.FAILURE:
            jobs[run.job_name].failed += 1
        elif run.status == dg.DagsterRunStatus.CANCELED:
            jobs[run.job_name].canceled += 1
        if record.start_time is not None:
            queue.append(max(0.0, record.start_time - record.create_timestamp.timestamp()))
        if "dagster/parent_run_id" in run.tags:
            retried_runs += 1
        for event_record in instance.get_records_for_run(run.run_id, of_type=EVENTS).records:
            event = event_record.event_log_entry.dagster_event
            if event is None:
                continue
            data: Any = event.event_specific_data
            step = event.step_key or "?"
            if event.event_type == dg.DagsterEventType.STEP_SUCCESS:
                steps[step].ok += 1
                step_seconds[step].append(data.duration_ms / 1000)
            elif event.event_type == dg.DagsterEventType.STEP_FAILURE:
                steps[step].failed += 1
            elif event.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY:
                step_retries[step] += 1
            elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
                name = f"{data.asset_key.to_user_string()}:{data.check_name}"
                if data.passed:
                    checks[name].ok += 1
                else:
                    checks[name].failed += 1
            elif event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
                materialization = data.materialization
                peak = materialization.metadata.get(PEAK_KEY)
                if peak is not None:
                    asset = materialization.asset_key.to_user_string()
                    peaks[asset] = max(peaks.get(asset, 0.0), float(peak.value))
    return HealthReport(
        days=days,
        runs=len(records),
        jobs=dict(jobs),
        steps=dict(steps),
        step_seconds=dict(step_seconds),
        queue_seconds=queue,
        run_retries=retried_runs,
        step_retries=dict(step_retries),
        checks=dict(checks),
        peak_rss_mb=peaks,
        open_episodes=open_episodes(instance),
        queued_seconds=queued,
        queue_daemon_seconds=queue_daemon_seconds(instance, now),
    )


def queue_daemon_seconds(instance: dg.DagsterInstance, now: float) -> float | None:
    """Seconds since a dagster-daemon last reported working the run queue; None if none ever did.

    Read from the heartbeats the daemon stores in the instance, whichever host it runs on.
    """
    heartbeat = instance.get_daemon_heartbeats().get(QUEUE_DAEMON)
    return None if heartbeat is None else max(0.0, now - heartbeat.timestamp)


def open_episodes(instance: dg.DagsterInstance) -> dict[str, tuple[str, list[str] | None]]:
    """Each dataset's drift episodes open at its latest monitored day of champion_performance.

    A day whose features were rejected (a tombstone) or that kept its earlier version
    (`unchanged`) records no episodes: the day shown is the latest whose record does, at most
    EPISODE_LOOKBACK days back, as monitoring carries the episodes from it. Episodes None (and
    the latest day) when no record of those days has them: unknown, which is not "none open".
    """
    found: dict[str, tuple[str, list[str] | None]] = {}
    for key in instance.get_asset_keys():
        if key.path[-1] != CHAMPION_PERFORMANCE:
            continue
        days = instance.get_materialized_partitions(key)
        if not days:
            continue
        latest = max(days)
        # Monitoring carries a feature's episode from a stored day at most EPISODE_LOOKBACK
        # days back: a record older than that says nothing of the episodes open now.
        back = dt.timedelta(days=EPISODE_LOOKBACK)
        try:
            first = (dt.date.fromisoformat(latest) - back).isoformat()
        except ValueError:
            first = latest  # not a day: its own record only
        recent = sorted((day for day in days if day >= first), reverse=True)
        found[key.path[0]] = next(
            (
                (day, episodes)
                for day, episodes in recorded_episodes(instance, key, recent)
                if episodes is not None
            ),
            (latest, None),
        )
    return found


def recorded_episodes(
    instance: dg.DagsterInstance, key: dg.AssetKey, days: list[str]
) -> Iterator[tuple[str, list[str] | None]]:
    """Each of `days` in turn, with the open episodes its records say, or None if none does.

    A day recorded again unchanged, or whose re-delivery was rejected while it kept its earlier
    version, carries no episodes in its latest record: those of the version it kept are in an
    earlier record of the day, the latest one that has them. A day whose data was rejected
    outright has no monitoring of its own.
    """
    by_day: dict[str, list[DayRecord]] = {day: [] for day in days}
    cursor = None
    while days:
        result = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=days),
            limit=100,
            cursor=cursor,
        )
        for record in result.records:  # newest first
            if record.partition_key in by_day:
                by_day[record.partition_key].append(DayRecord.of(record))
        if not result.has_more:
            break
        cursor = result.cursor
    for day in days:
        records = by_day[day]
        if not records or not records[0].accepted:
            yield day, None
            continue
        carrying = next((r.metadata for r in records if EPISODES_KEY in r.metadata), None)
        if carrying is None:
            yield day, None
            continue
        text, count = carrying[EPISODES_KEY], carrying.get(OPEN_EPISODES_KEY)
        yield day, str(text).splitlines() if count else []
