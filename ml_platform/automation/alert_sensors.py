"""Alert sensors: Dagster's run-status sensors decide what a finished run tells people.

- `run_failure_alerts_sensor` (`@dg.run_failure_sensor`) and `run_success_alerts_sensor`
  (`@dg.run_status_sensor` on SUCCESS) are handed each finished run once, in order, by
  Dagster's own cursor over run events, from the moment they are first turned on. For each run
  they read its events (`run_events.run_outcome`), count failure streaks from the instance's
  earlier runs, and write the alerts the run raises to the run as the tag `ml_platform/alerts`
  (with `ml_platform/alert_delivery=pending`); a failed run also gets its failure class as the
  tag `ml_platform/failure_class`, which the Runs page filters on. A successful run raises
  alerts too: a failed WARN check (drift, rejection_streak, champion_decay...) and the end of
  a failure streak.
- A run of a backfill leaves its rejected days to `backfill_summary_sensor`, which sends one
  summary per dataset when the backfill ends (its days, the rejected ones with where and why,
  its failed runs and the rerun command; a backfill that failed or was canceled before it ran
  all its days says so), delivering it itself (its cursor keeps what it told).
- `alert_delivery_sensor` sends the pending alerts through the notifier each tick. Its cursor
  keeps what was sent (deduplication) and what a failed sink still has to send, so a webhook
  that is down is tried again on the next ticks although no further run finishes.
- `pool_limits_sensor` (`ml_platform.platform.pools`) is served with them, on from the start
  as they are: it stores the limit of a pool added with a dataset while the daemon runs.

A streak ("job daily_pipeline_job failed 3 times in a row") is read from the runs before the
one at hand, newest first: failed runs of the job (or runs where the asset's step failed) count
once per root run, until a success; so nothing is lost when a sensor is reset, and the count is
what the Runs page shows.
"""

import datetime as dt
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import dagster as dg

from ml_platform.automation.alerts import (
    INFO,
    REJECTED_DAY_SECTION,
    WARNING,
    Alert,
    DeliveryState,
    Notifier,
    dataset_of_asset,
    dataset_of_job,
    evaluate_run,
    one_line,
    recovery_keys,
    streak_keys,
)
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.failures import FAILURE_CLASS_TAG
from ml_platform.platform.partitions import run_days
from ml_platform.platform.pools import POOL_LIMITS_SENSOR, build_pool_limits_sensor
from ml_platform.platform.records import ACCEPTED, UNCHANGED, day_records
from ml_platform.platform.rejected import rejected_days, rerun_command
from ml_platform.platform.run_events import RunOutcome, classify_outcome, run_outcome
from ml_platform.validation.assets import DELIVERY_CHECK

RUN_FAILURE_ALERTS_SENSOR = "run_failure_alerts_sensor"
RUN_SUCCESS_ALERTS_SENSOR = "run_success_alerts_sensor"
ALERT_DELIVERY_SENSOR = "alert_delivery_sensor"
BACKFILL_SUMMARY_SENSOR = "backfill_summary_sensor"
# The instance-wide sensors, on from the start (the pools' is no alert sensor, but is served
# and started with them).
ALERT_SENSORS = (
    RUN_FAILURE_ALERTS_SENSOR,
    RUN_SUCCESS_ALERTS_SENSOR,
    ALERT_DELIVERY_SENSOR,
    BACKFILL_SUMMARY_SENSOR,
    POOL_LIMITS_SENSOR,
)
# Dagster's tag on the runs a backfill launched: the backfill's id.
BACKFILL_TAG = "dagster/backfill"
# A backfill in one of these states launches no more runs (Dagster's BulkActionStatus values).
BACKFILL_ENDED = frozenset(
    {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
)
# A backfill that stopped before it ran each of its days (Dagster's BulkActionStatus values):
# its summary says so, or the days it never ran would pass for all it was asked to do.
BACKFILL_STOPPED = {
    "FAILED": "failed before it ran all its days",
    "CANCELED": "was canceled before it ran all its days",
}
# What to do about the days a stopped backfill did not run.
RERUN_SECTION = "rerun-failed-days"
# The alerts a run raised (a JSON list), and whether they still have to be handed to the notifier.
ALERTS_TAG = "ml_platform/alerts"
ALERT_DELIVERY_TAG = "ml_platform/alert_delivery"
PENDING = "pending"
DELIVERED = "delivered"
FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE]
# How far back a streak is looked for: runs that neither fail nor succeed a key (other jobs,
# other assets) are passed over up to this many finished runs.
LOOKBACK_RUNS = 200
PAGE = 50


def runs_before(instance: dg.DagsterInstance, run_id: str, limit: int) -> Iterator[dg.DagsterRun]:
    """The finished runs created before `run_id`, newest first, at most `limit`."""
    cursor, seen = run_id, 0
    while seen < limit:
        page = instance.get_runs(
            filters=dg.RunsFilter(statuses=FINISHED), cursor=cursor, limit=min(PAGE, limit - seen)
        )
        if not page:
            return
        yield from page
        seen += len(page)
        cursor = page[-1].run_id


def failure_streaks(
    instance: dg.DagsterInstance,
    outcome: RunOutcome,
    threshold: int,
    lookback: int = LOOKBACK_RUNS,
) -> dict[str, int]:
    """The streak counts `evaluate_run` takes, from the runs before `outcome`'s run.

    For each key the run fails, the failed runs in a row it makes (absent when it retries a root
    run already in the streak); for each key it succeeds, the failed runs in a row it ends.
    Counting stops at `threshold` earlier roots: beyond it, neither a new page nor a recovery
    depends on the exact number.
    """
    failing = [] if outcome.succeeded else streak_keys(outcome)
    keys = set(failing) | set(recovery_keys(outcome))
    roots: dict[str, list[str]] = {key: [] for key in keys}
    outcomes: dict[str, RunOutcome | None] = {}
    for run in runs_before(instance, outcome.run_id, lookback):
        if not keys:
            break
        failed = run.status == dg.DagsterRunStatus.FAILURE
        root = run.tags.get("dagster/root_run_id", run.run_id)
        for key in sorted(keys):
            kind, name = key.split(" ", 1)
            if kind == "job":
                if run.job_name != name:
                    continue
                ended = not failed
            else:
                if run.step_keys_to_execute is not None and name not in run.step_keys_to_execute:
                    continue  # the run did not plan this step: no need to read its events
                if run.run_id not in outcomes:
                    outcomes[run.run_id] = run_outcome(instance, run.run_id, not failed)
                earlier = outcomes[run.run_id]
                if earlier is None:
                    continue
                if name in earlier.succeeded_steps:
                    ended = True
                elif any(f.step == name for f in earlier.step_failures):
                    ended = False
                else:
                    continue  # the step did not run (an upstream step failed)
            if not ended and root not in roots[key]:
                roots[key].append(root)
            if ended or len(roots[key]) >= threshold:
                keys.discard(key)
    counts = {}
    for key in failing:
        if outcome.root_run_id not in roots[key]:
            counts[key] = len(roots[key]) + 1
    for key in recovery_keys(outcome):
        counts[key] = len(roots[key])
    return counts


def judged_at(
    instance: dg.DagsterInstance, key: dg.AssetKey, day: str, run_id: str
) -> float | None:
    """When run `run_id` recorded `day` of `key` (None: it recorded none Dagster still holds)."""
    cursor = None
    while True:
        result = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[day]), limit=100, cursor=cursor
        )
        for record in result.records:
            if record.run_id == run_id:
                return record.timestamp
        if not result.has_more:
            return None
        cursor = result.cursor


def rejected_in_a_row(
    instance: dg.DagsterInstance, outcome: RunOutcome, limit: int
) -> dict[tuple[str, str], int]:
    """For each day the run rejected, the rejected days in a row through it when it was judged.

    `limit` when the day is the one that makes them `limit` (the streak is news), fewer when
    they are fewer, more when its days before or after were `limit` rejected days already (the
    streak was told). Counted by day from Dagster's records of the dataset's validated_data,
    whichever runs judged them (a backfill's chunk and a day of the landing sensor alike), as
    they stood when the run recorded the day: a day that lands late between rejected days
    completes their streak, and the sensor's lag behind the runs changes no count.
    """
    counts = {}
    for check in outcome.failed_checks:
        if check.check != DELIVERY_CHECK or check.partition is None:
            continue
        dataset, day = dataset_of_asset(check.asset), check.partition
        key = asset_key(dataset, "validated_data")
        end = dt.date.fromisoformat(day)
        near = {
            step: [(end + dt.timedelta(days=step * n)).isoformat() for n in range(1, limit + 1)]
            for step in (-1, 1)
        }
        records = day_records(
            instance, key, near[-1] + near[1], before=judged_at(instance, key, day, outcome.run_id)
        )
        rejected = {}
        for step, days in near.items():
            rejected[step] = 0
            for other in days:
                record = records.get(other)
                if record is None or record.verdict in (ACCEPTED, UNCHANGED):
                    break
                rejected[step] += 1
        told = max(rejected.values()) >= limit
        counts[(dataset, day)] = limit + 1 if told else min(1 + sum(rejected.values()), limit)
    return counts


def raise_alerts(context: dg.RunStatusSensorContext, notifier: Notifier, succeeded: bool) -> None:
    """Write the alerts of the run the context is about (and a failure's class) to its tags."""
    now = time.time()
    run_id = context.dagster_run.run_id
    outcome = run_outcome(context.instance, run_id, succeeded)
    if outcome is None:
        context.log.warning(f"run {run_id} is no longer in the instance: no alerts for it")
        return
    streaks = failure_streaks(context.instance, outcome, notifier.failure_streak)
    rejected = rejected_in_a_row(context.instance, outcome, notifier.failure_streak)
    in_backfill = BACKFILL_TAG in context.dagster_run.tags
    alerts = evaluate_run(outcome, streaks, notifier, now, rejected, in_backfill)
    tags = {}
    if not succeeded:
        tags[FAILURE_CLASS_TAG] = classify_outcome(outcome).failure_class
    if alerts:
        alerts_json = [alert.to_json() for alert in alerts]
        tags[ALERTS_TAG] = json.dumps(alerts_json, sort_keys=True, separators=(",", ":"))
        tags[ALERT_DELIVERY_TAG] = PENDING
    if tags:
        context.instance.add_run_tags(run_id, tags)
    shown = ", ".join(f"{a.severity} {a.rule}" for a in alerts) or "none"
    context.log.info(f"run {run_id} ({'success' if succeeded else 'failure'}): alerts {shown}")


def build_alert_sensors(
    *, minimum_interval_seconds: int = 30, batch: int = 200
) -> list[dg.SensorDefinition]:
    """The sensors that turn finished runs into alerts and deliver them; all start RUNNING.

    Alerts are on from the start: failing in silence is the one thing never wanted. They watch
    every run of the instance, whichever code location launched it. The pools' sensor comes
    with them: a new dataset's pools need their limits whether or not anyone turned it on.
    """

    def raising(succeeded: bool) -> Callable[[dg.RunStatusSensorContext, Notifier], None]:
        def evaluate(context: dg.RunStatusSensorContext, notifier: Notifier) -> None:
            raise_alerts(context, notifier, succeeded)

        return evaluate

    watch_every_run: dict[str, Any] = {
        "minimum_interval_seconds": minimum_interval_seconds,
        "monitor_all_code_locations": True,
        "default_status": dg.DefaultSensorStatus.RUNNING,
    }
    run_failure_alerts_sensor = dg.run_failure_sensor(
        name=RUN_FAILURE_ALERTS_SENSOR,
        description=(
            "Tags each failed run with its failure class and raises its alerts (CRITICAL after "
            "3 failed runs in a row of a job or asset); see docs/runbook.md."
        ),
        **watch_every_run,
    )(raising(succeeded=False))
    run_success_alerts_sensor = dg.run_status_sensor(
        run_status=dg.DagsterRunStatus.SUCCESS,
        name=RUN_SUCCESS_ALERTS_SENSOR,
        description=(
            "Raises the alerts of successful runs: failed warning checks, and the end of a "
            "failure streak; see docs/runbook.md."
        ),
        **watch_every_run,
    )(raising(succeeded=True))

    @dg.sensor(
        name=ALERT_DELIVERY_SENSOR,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Sends the alerts runs raised to the log, the webhook and email, once per dedup "
            "window, retrying a sink that failed; see docs/runbook.md#alert-delivery-failed."
        ),
    )
    def alert_delivery_sensor(
        context: dg.SensorEvaluationContext, notifier: Notifier
    ) -> dg.SensorResult:
        now = time.time()
        state = DeliveryState.from_json(json.loads(context.cursor) if context.cursor else None)
        runs = context.instance.get_runs(
            filters=dg.RunsFilter(tags={ALERT_DELIVERY_TAG: PENDING}), limit=batch, ascending=True
        )
        alerts = [Alert.from_json(data) for run in runs for data in pending_alerts(run)]
        state = notifier.deliver(alerts, state, context.log, now=now)
        for run in runs:
            try:
                context.instance.add_run_tags(run.run_id, {ALERT_DELIVERY_TAG: DELIVERED})
            except dg.DagsterRunNotFoundError:
                # Deleted (the UI's Delete) while its alerts went out: they are delivered and
                # no run is left to mark. Raised, the tick would keep no cursor, and the next
                # would send every alert of it again.
                context.log.info(f"run {run.run_id} was deleted as its alerts were delivered")
        summary = (
            f"{len(alerts)} alert(s) of {len(runs)} run(s) handed to the notifier, "
            f"{len(state.outbox)} awaiting delivery"
        )
        return dg.SensorResult(cursor=json.dumps(state.to_json()), skip_reason=summary)

    @dg.sensor(
        name=BACKFILL_SUMMARY_SENSOR,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Sends one summary when a backfill ends: its days, the rejected ones with where "
            "and why, its failed runs, and the command that reruns the rejected days; see "
            "docs/runbook.md#rejected-day."
        ),
    )
    def backfill_summary_sensor(
        context: dg.SensorEvaluationContext, notifier: Notifier
    ) -> dg.SensorResult:
        now = time.time()
        ended = [
            b
            for b in context.instance.get_backfills(limit=batch)
            if b.status.value in BACKFILL_ENDED
        ]
        if context.cursor is None:
            # Backfills that ended before the sensor first ran are not news.
            state = {"told": [b.backfill_id for b in ended], "delivery": DeliveryState().to_json()}
            return dg.SensorResult(
                cursor=json.dumps(state), skip_reason=f"{len(ended)} earlier backfill(s) noted"
            )
        cursor = json.loads(context.cursor)
        told = set(cursor["told"])
        new = [b for b in ended if b.backfill_id not in told]
        alerts = [
            alert
            for backfill in reversed(new)  # oldest first
            for alert in backfill_summaries(
                context.instance,
                backfill.backfill_id,
                notifier,
                now,
                status=backfill.status.value,
                error=backfill.error.message if backfill.error else None,
            )
        ]
        delivery = notifier.deliver(
            alerts, DeliveryState.from_json(cursor["delivery"]), context.log, now=now
        )
        # Only the backfills still listed can come back: the others need not be remembered.
        listed = {b.backfill_id for b in ended}
        state = {
            "told": sorted((told & listed) | {b.backfill_id for b in new}),
            "delivery": delivery.to_json(),
        }
        return dg.SensorResult(
            cursor=json.dumps(state),
            skip_reason=f"{len(new)} ended backfill(s) summarised in {len(alerts)} alert(s)",
        )

    return [
        run_failure_alerts_sensor,
        run_success_alerts_sensor,
        alert_delivery_sensor,
        backfill_summary_sensor,
        build_pool_limits_sensor(minimum_interval_seconds),
    ]


def backfill_summaries(
    instance: dg.DagsterInstance,
    backfill_id: str,
    notifier: Notifier,
    now: float,
    status: str = "COMPLETED_SUCCESS",
    error: str | None = None,
) -> list[Alert]:
    """One alert per dataset a backfill worked on: its days, rejected days and failed runs.

    A run's datasets are those of the assets it selected; a run that selected none (a job
    backfill's: `dagster job backfill -j flights_daily_pipeline_job`, or the UI's backfill of a
    job) is its job's dataset's, one of the notifier's datasets (`dataset_of_job`). A backfill
    that failed or was canceled (`status`, Dagster's; `error`, the one it recorded) says so, and
    is told even when it launched no run.
    """
    runs = instance.get_runs(filters=dg.RunsFilter(tags={BACKFILL_TAG: backfill_id}))
    days: dict[str, set[str]] = {}
    failed: dict[str, list[str]] = {}
    for run in runs:
        try:
            run_covers = run_days(run.tags)
        except ValueError:
            # A range that is no days (another code location's hourly assets, in the same
            # instance): not a run of this platform, whose assets are all daily. Raised here, it
            # would fail every tick and keep every later backfill from being told.
            continue
        datasets = {key.path[0] for key in run.asset_selection or ()}
        if not datasets:
            # Dagster launches a job backfill's runs without an asset selection: the whole job.
            by_job = dataset_of_job(run.job_name, notifier.owners)
            datasets = {by_job} if by_job else set()
        for name in datasets:
            days.setdefault(name, set()).update(run_covers)
            if run.status == dg.DagsterRunStatus.FAILURE:
                failed.setdefault(name, []).append(run.run_id)
    stopped = BACKFILL_STOPPED.get(status)
    by_dataset: list[tuple[str | None, set[str]]] = list(sorted(days.items()))
    if not by_dataset and stopped is not None:
        by_dataset = [(None, set())]  # no run names its dataset: its stop is told all the same
    alerts = []
    for dataset, covered in by_dataset:
        ordered = sorted(covered)
        rejected = rejected_days(instance, dataset, ordered) if dataset else []
        runs_failed = failed.get(dataset, []) if dataset else []
        told = [f"{r.day} ({r.asset}: {r.verdict})" for r in rejected]
        if rejected and dataset is not None:
            cause = (
                f"rejected: {', '.join(told)}; once their files are corrected: "
                f"{rerun_command(dataset, [r.day for r in rejected])}"
            )
        else:
            cause = "every day it ran accepted" if stopped else "every day accepted"
        if runs_failed:
            cause += f"; {len(runs_failed)} run(s) failed: {', '.join(runs_failed)}"
        if stopped is not None:
            said = f": {one_line(error)}" if error and one_line(error) else ""
            cause = f"the backfill {stopped}{said}; {cause}"
        of = f" of {dataset}" if dataset else ""
        alerts.append(
            Alert(
                severity=WARNING if rejected or runs_failed or stopped else INFO,
                rule="backfill_summary",
                title=(
                    f"backfill {backfill_id}{of} {status.lower() if stopped else 'ended'}: "
                    f"{len(ordered)} day(s), {len(rejected)} rejected, "
                    f"{len(runs_failed)} failed run(s)"
                ),
                cause=cause,
                subject=f"backfill {backfill_id}",
                failure_class=None,
                run_id=None,
                partition=f"{ordered[0]}...{ordered[-1]}" if ordered else None,
                run_url=f"{notifier.ui_url.rstrip('/')}/runs/b/{backfill_id}",
                runbook=notifier.runbook(
                    RERUN_SECTION if stopped and not rejected else REJECTED_DAY_SECTION
                ),
                # A canceled backfill was stopped by someone, who knows: it is logged.
                page=bool(rejected or runs_failed or status == "FAILED"),
                occurred_at=now,
                owners=notifier.owners_of(dataset) if dataset else (),
                dataset=dataset,
            )
        )
    return alerts


def pending_alerts(run: dg.DagsterRun) -> list[dict[str, Any]]:
    """The alerts a run raised, as written to its tag."""
    return json.loads(run.tags.get(ALERTS_TAG, "[]"))
