"""What went wrong in a run: the failed step, the log lines before it, and the failure class.

Everything is read from the instance's event log (the run's `DAGSTER_HOME`), so it works for
any run, whoever launched it, long after the run process is gone.
"""

import dataclasses
import datetime as dt
import logging

import dagster as dg

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


class RunNotFoundError(LookupError):
    """No run with this id (or id prefix) in the instance."""


class AmbiguousRunIdError(LookupError):
    """More than one run's id starts with the prefix given."""


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
    classification: Classification | None  # None when the run did not fail
    last_lines: list[str]  # log lines up to and including the first failure
    # Out of memory: each step's request, last recorded peak and the command that sizes it.
    sizes: list[str] = dataclasses.field(default_factory=list)

    @property
    def failed_steps(self) -> list[StepFailure]:
        """The steps that failed, in the order they failed."""
        return self.outcome.step_failures

    def render(self) -> str:
        """The diagnosis as text for a terminal."""
        outcome = self.outcome
        lines = [
            f"run {self.run_id}: {self.status}",
            f"job: {outcome.job_name}   partition: {outcome.partition or '-'}",
        ]
        if self.classification is None:
            return "\n".join([*lines, "the run did not fail: nothing to diagnose"])
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


def diagnose_run(
    instance: dg.DagsterInstance,
    run_id: str,
    lines: int = 15,
    contracts: list[Contract] | None = None,
) -> Diagnosis:
    """Read the run's event log and explain its failure.

    `run_id` may be any prefix of one run's id; RunNotFoundError if no run has it,
    AmbiguousRunIdError if several do. With the served `contracts`, a step out of memory is
    shown with its request and its last recorded peak.
    """
    run_id = resolve_run_id(instance, run_id)
    run = instance.get_run_by_id(run_id)
    assert run is not None  # resolved from the instance's own run ids
    failed = run.status == dg.DagsterRunStatus.FAILURE
    outcome = run_outcome(instance, run_id, succeeded=not failed)
    assert outcome is not None  # the run exists: checked above
    classification = classify_outcome(outcome) if failed else None
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
        last_lines=last_lines_before_failure(list(instance.all_logs(run_id)), lines),
        sizes=memory_advice(instance, contracts or [], classification.steps)
        if memory and classification is not None
        else [],
    )


def tag_failure_class(instance: dg.DagsterInstance, diagnosis: Diagnosis) -> None:
    """Write the failure class as the run tag the UI and the alerts use."""
    if diagnosis.classification is not None:
        instance.add_run_tags(
            diagnosis.run_id, {FAILURE_CLASS_TAG: diagnosis.classification.failure_class}
        )
