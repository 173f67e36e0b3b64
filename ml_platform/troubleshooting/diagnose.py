"""What went wrong in a run: the failed step, the log lines before it, and the failure class.

Everything is read from the instance's event log (the run's `DAGSTER_HOME`), so it works for
any run, whoever launched it, long after the run process is gone. A run still going is
diagnosed as far as it got (the steps failed so far), and a canceled run is said to be one,
with what canceled it, as the event log recorded it.
"""

import dataclasses
import datetime as dt
import logging

import dagster as dg

from ml_platform.automation.jobs import DATASET_PARTITION_TAG
from ml_platform.contracts import Contract
from ml_platform.platform.failures import (
    FAILURE_CLASS_TAG,
    RESOURCE_EXHAUSTION,
    RESOURCE_PATTERN,
    Classification,
    StepFailure,
    line_with,
    out_of_disk,
    runbook_link,
)
from ml_platform.platform.run_events import RunOutcome, classify_outcome, run_outcome
from ml_platform.troubleshooting.sizing import memory_advice

FAILURE_EVENTS = (dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE)
# A run in any other status has not ended (queued, starting, started, being canceled, ...).
FINISHED = frozenset(
    {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
)
# A run in one of these has run no step yet: it waits in the run queue, or was created and never
# launched (a launch that stopped before it submitted the run).
NOT_BEGUN = {
    dg.DagsterRunStatus.QUEUED: "it waits in the run queue for a free slot",
    dg.DagsterRunStatus.NOT_STARTED: "it was created but never launched",
}
# What a cancellation records: the request (its message says who or what asked: the UI's or
# the API's termination, the queue, run monitoring's time limit) and the run's end.
CANCEL_EVENTS = (dg.DagsterEventType.RUN_CANCELING, dg.DagsterEventType.RUN_CANCELED)


class RunNotFoundError(LookupError):
    """No run with this id (or id prefix) in the instance."""


class AmbiguousRunIdError(LookupError):
    """More than one run's id starts with the prefix given."""


class RunEventsGoneError(LookupError):
    """The run ended without success, and the instance holds none of its events to say why."""


def resolve_run_id(instance: dg.DagsterInstance, run_id: str) -> str:
    """The full id of the one run whose id is or starts with `run_id`.

    `ml-platform materialize` prints the first 8 characters, as `git` shows short commits; any
    longer or shorter prefix works while it names one run.
    """
    wanted = run_id.strip().lower()
    if wanted and instance.get_run_by_id(wanted) is not None:
        return wanted
    # Prefixes of a run id are not a filter of the run storage: scan the ids, a string each.
    matches = [r for r in instance.get_run_ids() if wanted and r.startswith(wanted)]
    if not matches:
        raise RunNotFoundError(
            f"no run {run_id} in the Dagster instance at {instance.root_directory}: "
            "is DAGSTER_HOME the instance the run ran on?"
        )
    if len(matches) > 1:
        shown = ", ".join(sorted(matches)[:5]) + (", ..." if len(matches) > 5 else "")
        raise AmbiguousRunIdError(
            f"run id prefix '{run_id}' matches {len(matches)} runs ({shown}): "
            "give more characters of the id"
        )
    return matches[0]


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """A failed run explained: where it failed, what was logged before, and which class."""

    run_id: str
    status: str
    outcome: RunOutcome
    # None when nothing failed: a run that succeeded, or one still going or canceled without
    # a failed step. A run still going or canceled is classed by the steps failed so far.
    classification: Classification | None
    last_lines: list[str]  # log lines up to and including the first failure
    # Out of memory: each step's request, last recorded peak and the command that sizes it.
    sizes: list[str] = dataclasses.field(default_factory=list)
    # The messages of the run's cancellation events: what asked to cancel it, and its end.
    canceled_by: list[str] = dataclasses.field(default_factory=list)

    @property
    def failed_steps(self) -> list[StepFailure]:
        """The steps that failed, in the order they failed."""
        return self.outcome.step_failures

    @property
    def finished(self) -> bool:
        """Whether the run has ended: only then is the diagnosis final."""
        return dg.DagsterRunStatus(self.status) in FINISHED

    def state(self) -> list[str]:
        """What the run's status means for the diagnosis, when it did not simply fail."""
        failed = len(self.failed_steps)
        so_far = f"{failed} step(s) failed so far" if failed else "no step has failed so far"
        lines = []
        status = dg.DagsterRunStatus(self.status)
        if status in NOT_BEGUN:
            # Nothing ran: "still running" would send the user to wait for steps that may
            # never run.
            lines.append(
                f"the run has not started ({self.status}): {NOT_BEGUN[status]}; no step has run, "
                "so there is nothing to diagnose yet"
            )
        elif not self.finished:
            lines.append(
                f"the run is still running ({self.status}): {so_far}; other steps may still "
                "fail, so diagnose it again once it has ended"
            )
        elif self.status == dg.DagsterRunStatus.CANCELED.value:
            before = f"{failed} step(s) failed" if failed else "no step failed"
            lines.append(f"the run was canceled: {before} before it ended")
        elif self.canceled_by:
            # Run monitoring asks a run over its time limit to stop, then records it failed.
            lines.append(f"the run was asked to stop before it ended ({self.status}):")
        lines += [f"  {message}" for message in self.canceled_by]
        return lines

    def render(self) -> str:
        """The diagnosis as text for a terminal."""
        outcome = self.outcome
        lines = [
            f"run {self.run_id}: {self.status}",
            f"job: {outcome.job_name}   partition: {outcome.partition or '-'}",
            *self.state(),
        ]
        if self.classification is None:
            if self.status == dg.DagsterRunStatus.SUCCESS.value:
                lines.append("the run did not fail: nothing to diagnose")
            return "\n".join(lines)
        for failure in self.failed_steps:
            retried = f" (after {failure.attempts} attempts)" if failure.attempts > 1 else ""
            lines.append(f"failed step: {failure.step}{retried}")
            lines += [f"  {link}" for link in failure.chain or (failure.message,)]
        if not self.failed_steps and outcome.unfinished_steps:
            steps = ", ".join(outcome.unfinished_steps)
            lines.append(f"did not finish: {steps}")
            lines.append(f"  {line_with(outcome.run_message, RESOURCE_PATTERN)}")
        elif not self.failed_steps:
            lines.append(f"failed outside any step: {outcome.run_message}")
        for check in outcome.failed_checks:
            lines.append(f"failed check: {check.asset}:{check.check} ({check.severity})")
            lines.append(f"  {check.description}")
        lines.append("last log lines before the failure:")
        lines += [f"  {line}" for line in self.last_lines]
        verdict = self.classification
        lines.append(f"failure class: {verdict.failure_class} ({verdict.reason})")
        lines += self.sizes
        lines.append(f"runbook: {runbook_link(verdict.failure_class)}")
        return "\n".join(lines)


def log_line(entry: dg.EventLogEntry) -> str:
    """One event log entry as a line: time, level, step and message."""
    when = dt.datetime.fromtimestamp(entry.timestamp, dt.UTC).strftime("%H:%M:%S")
    where = entry.step_key or "run"
    event = entry.dagster_event
    kind = f" {event.event_type_value}" if event is not None else ""
    message = (entry.message or "").strip().splitlines()
    return f"{when} {logging.getLevelName(entry.level)} {where}{kind}: " + (
        message[0] if message else ""
    )


def last_lines_before_failure(entries: list[dg.EventLogEntry], count: int) -> list[str]:
    """The `count` log lines up to and including the run's first failure event."""
    end = len(entries)
    for index, entry in enumerate(entries):
        if entry.dagster_event is not None and entry.dagster_event.event_type in FAILURE_EVENTS:
            end = index + 1
            break
    return [log_line(entry) for entry in entries[max(0, end - count) : end]]


def cancellations(entries: list[dg.EventLogEntry]) -> list[str]:
    """The run's cancellation events, in order: who or what asked, and how the run ended."""
    found = []
    for entry in entries:
        event = entry.dagster_event
        message = (entry.message or "").strip().splitlines()
        if event is None or event.event_type not in CANCEL_EVENTS or not message:
            continue
        asked = event.event_type == dg.DagsterEventType.RUN_CANCELING
        found.append(f"{'cancel requested' if asked else 'canceled'}: {message[0]}")
    return found


def diagnose_run(
    instance: dg.DagsterInstance,
    run_id: str,
    lines: int = 15,
    contracts: list[Contract] | None = None,
) -> Diagnosis:
    """Read the run's event log and explain its failure.

    `run_id` may be any prefix of one run's id; RunNotFoundError if no run has it,
    AmbiguousRunIdError if several do. With the served `contracts`, a step out of memory is
    shown with its request and its last recorded peak. A run still going, or canceled, is
    classed by the steps that failed so far, if any did. RunEventsGoneError if the run ended
    without success and its events are gone.
    """
    run_id = resolve_run_id(instance, run_id)
    run = instance.get_run_by_id(run_id)
    assert run is not None  # resolved from the instance's own run ids
    entries = list(instance.all_logs(run_id))
    if not entries and run.status in FINISHED - {dg.DagsterRunStatus.SUCCESS}:
        # Every run records events from its launch on: none at all means they were removed
        # (a clean-up of the event log), and a class guessed from nothing would be tagged on
        # the run as if it were known.
        partition = run.tags.get("dagster/partition")
        dataset = run.tags.get(DATASET_PARTITION_TAG, "").partition(":")[0]
        option = f" --dataset {dataset}" if dataset else ""
        again = (
            f"`ml-platform materialize{option} --start {partition} --force` for its day"
            if partition
            else "the UI's Materialize of its assets"
        )
        raise RunEventsGoneError(
            f"run {run_id} is recorded {run.status.value}, but the instance holds none of its "
            "events (its event log was removed): nothing says where or why it failed. Rerun it "
            f"({again}) and diagnose the new run"
        )
    failed = run.status == dg.DagsterRunStatus.FAILURE
    outcome = run_outcome(instance, run_id, succeeded=not failed)
    assert outcome is not None  # the run exists: checked above
    # A step fails for good (its retries spent) before its run ends: a run still going or
    # canceled that has one is explained by it, never as a run that "did not fail".
    classification = classify_outcome(outcome) if failed or outcome.step_failures else None
    memory = (
        classification is not None
        and classification.failure_class == RESOURCE_EXHAUSTION
        and not out_of_disk(classification.reason)
    )
    return Diagnosis(
        run_id=run_id,
        status=run.status.value,
        outcome=outcome,
        classification=classification,
        last_lines=last_lines_before_failure(entries, lines),
        sizes=memory_advice(instance, contracts or [], classification.steps)
        if memory and classification is not None
        else [],
        canceled_by=cancellations(entries),
    )


def tag_failure_class(instance: dg.DagsterInstance, diagnosis: Diagnosis) -> None:
    """Write the failure class as the run tag the UI and the alerts use.

    Only on a failed run: the tag classes runs that failed, and the failure alerts sensor
    writes it once a run still going has ended (a canceled run is no failure).
    """
    if (
        diagnosis.classification is not None
        and diagnosis.status == dg.DagsterRunStatus.FAILURE.value
    ):
        instance.add_run_tags(
            diagnosis.run_id, {FAILURE_CLASS_TAG: diagnosis.classification.failure_class}
        )
