"""What a finished run did, read from the instance's event log: its steps, failures and checks.

`diagnose` explains a failed run from it, and the alert sensors decide what to tell people from
it. Everything comes from the run's events, so it works for any run of the instance, whoever
launched it, long after the run process is gone.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import dagster as dg

from ml_platform.platform.failures import (
    CODE_BUG,
    Classification,
    FailedCheck,
    StepFailure,
    classify_failure,
    error_chain,
    user_error,
)

RUN_EVENTS = {
    dg.DagsterEventType.STEP_START,
    dg.DagsterEventType.STEP_FAILURE,
    dg.DagsterEventType.STEP_SUCCESS,
    dg.DagsterEventType.STEP_SKIPPED,
    # A distributed executor's step events: sent to a worker (before it starts).
    dg.DagsterEventType.ENGINE_EVENT,
    dg.DagsterEventType.ASSET_CHECK_EVALUATION,
    dg.DagsterEventType.RUN_FAILURE,
    dg.DagsterEventType.STEP_UP_FOR_RETRY,
}

ENDED = {
    dg.DagsterEventType.STEP_SUCCESS,
    dg.DagsterEventType.STEP_FAILURE,
    dg.DagsterEventType.STEP_SKIPPED,
}


@dataclasses.dataclass(frozen=True)
class EpisodeNews:
    """Episodes a check said opened or closed on a day (its `opened` / `closed` metadata)."""

    asset: str
    check: str
    partition: str | None
    opened: list[dict[str, Any]]
    closed: list[dict[str, Any]]


def episode_news(asset: str, data: Any) -> EpisodeNews | None:
    """The episodes a check evaluation opened or closed, if it says of any."""
    metadata = data.metadata or {}
    opened, closed = metadata.get("opened"), metadata.get("closed")
    lists = [m.value if m is not None else [] for m in (opened, closed)]
    if not any(lists):
        return None
    return EpisodeNews(asset, data.check_name, data.partition, list(lists[0]), list(lists[1]))


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What the alert rules and `diagnose` need to know about a finished run."""

    run_id: str
    root_run_id: str  # the first run of a retry chain; its retries share it
    job_name: str
    partition: str | None
    succeeded: bool
    step_failures: list[StepFailure]
    succeeded_steps: list[str]
    failed_checks: list[FailedCheck]
    run_message: str  # the run failure's message, for failures outside any step
    # Steps begun (started, or sent to a worker) that never ended: their process or worker died.
    unfinished_steps: list[str] = dataclasses.field(default_factory=list)
    # Episodes (drift) that the run's checks opened or closed, by day.
    episodes: list[EpisodeNews] = dataclasses.field(default_factory=list)
    # An error Dagster recorded outside any step (on an engine event): a run worker that could
    # not load the code ("Could not load job definition.") records its error there, and then a
    # run failure with none.
    run_error: StepFailure | None = None


def classify_outcome(outcome: RunOutcome) -> Classification:
    """The failure class of a finished, failed run.

    A run with no failed step is classed by the error recorded outside any step, if any, as a
    step's would be: a run worker that cannot import a module is a dependency mismatch.
    """
    found = classify_failure(
        outcome.step_failures, outcome.failed_checks, outcome.run_message, outcome.unfinished_steps
    )
    if outcome.step_failures or outcome.run_error is None or found.failure_class != CODE_BUG:
        return found  # explained already (a killed process, a failed blocking check)
    return classify_failure(
        [outcome.run_error], outcome.failed_checks, outcome.run_message, outcome.unfinished_steps
    )


def partition_of(run: dg.DagsterRun) -> str | None:
    """The partition (or partition range) a run worked on."""
    return partition_of_tags(run.tags)


def partition_of_tags(tags: Mapping[str, str]) -> str | None:
    """The partition, or "start...end" of the partition range, that a run's tags name."""
    if "dagster/partition" in tags:
        return tags["dagster/partition"]
    start = tags.get("dagster/asset_partition_range_start")
    end = tags.get("dagster/asset_partition_range_end")
    return f"{start}...{end}" if start and end else None


def step_failure(entry: dg.EventLogEntry, data: Any, step: str, attempts: int) -> StepFailure:
    """A STEP_FAILURE event as the failure a person reads: the step, the error and its chain."""
    user = getattr(data, "user_failure_data", None)
    error = user_error(getattr(data, "error", None))
    message = (user.description if user and user.description else None) or (
        error.message.split(": ", 1)[-1] if error else entry.message
    )
    return StepFailure(
        step=step,
        error_class=error.cls_name if error and error.cls_name else "Error",
        message=message,
        user_failure=user is not None,
        chain=error_chain(error),
        attempts=attempts,
    )


# The "step" an error recorded outside any step is named for.
RUN_WORKER = "the run worker"


def run_error(entry: dg.EventLogEntry, error: Any) -> StepFailure:
    """An error an engine event recorded outside any step, as the failure a person reads."""
    cause = user_error(error)
    return StepFailure(
        step=RUN_WORKER,
        error_class=cause.cls_name or "Error",
        message=f"{entry.message} {error_chain(cause)[0]}".strip(),
        user_failure=False,
        chain=error_chain(error),
    )


def run_outcome(instance: dg.DagsterInstance, run_id: str, succeeded: bool) -> RunOutcome | None:
    """What a finished run did, read from its event log; None if the run is gone."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        return None
    retries: dict[str, int] = {}
    step_failures: list[StepFailure] = []
    succeeded_steps: list[str] = []
    failed_checks: list[FailedCheck] = []
    run_message = ""
    outside: StepFailure | None = None
    begun: list[str] = []
    ended: set[str] = set()
    episodes: list[EpisodeNews] = []
    for record in instance.get_records_for_run(run_id, of_type=RUN_EVENTS).records:
        entry = record.event_log_entry
        event = entry.dagster_event
        if event is None:
            continue
        data: Any = event.event_specific_data
        step = event.step_key or "?"
        if event.step_key is not None and event.step_key not in begun:
            begun.append(event.step_key)
        if event.event_type in ENDED:
            ended.add(step)
        if event.event_type == dg.DagsterEventType.STEP_FAILURE:
            step_failures.append(step_failure(entry, data, step, retries.get(step, 0) + 1))
        elif event.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY:
            retries[step] = retries.get(step, 0) + 1
        elif event.event_type == dg.DagsterEventType.STEP_SUCCESS:
            succeeded_steps.append(step)
        elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            news = episode_news(data.asset_key.to_user_string(), data)
            if news is not None:
                episodes.append(news)
            if not data.passed:
                failed_checks.append(
                    FailedCheck(
                        asset=data.asset_key.to_user_string(),
                        check=data.check_name,
                        severity=data.severity.value,
                        description=data.description or "",
                        partition=data.partition,
                    )
                )
        elif event.event_type == dg.DagsterEventType.ENGINE_EVENT and event.step_key is None:
            error = getattr(data, "error", None)
            if error is not None and outside is None:
                outside = run_error(entry, error)
        elif event.event_type == dg.DagsterEventType.RUN_FAILURE:
            error = getattr(data, "error", None)
            # A run failure with no error of its own says only that the run was marked failed:
            # the error recorded before it (a run worker that could not load the code) says why.
            run_message = (
                error.message
                if error
                else f"{entry.message} {outside.message}"
                if outside
                else entry.message
            )
    return RunOutcome(
        run_id=run_id,
        root_run_id=run.tags.get("dagster/root_run_id", run_id),
        job_name=run.job_name,
        partition=partition_of(run),
        succeeded=succeeded,
        step_failures=step_failures,
        succeeded_steps=succeeded_steps,
        failed_checks=failed_checks,
        run_message=run_message,
        unfinished_steps=[step for step in begun if step not in ended],
        episodes=episodes,
        run_error=outside,
    )
