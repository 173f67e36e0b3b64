"""Which kind of failure a failed run is: data or software.

A minimal classifier, the seam that issue 7 refines into resource exhaustion, dependency
mismatch, data/schema, transient infrastructure and code bug. The alerts only need the class
name and the rule that produced it, so a richer classifier can replace `classify_failure`
without touching the alert rules.
"""

import dataclasses

DATA = "data"
SOFTWARE = "software"

# Errors that mean "the data is wrong or missing", whatever raised them.
DATA_ERROR_CLASSES = frozenset(
    {"MissingLandingFileError", "LandingFileError", "ContractViolationError", "TrainingDataError"}
)


@dataclasses.dataclass(frozen=True)
class StepFailure:
    """One failed step of a run, as the event log records it."""

    step: str
    error_class: str  # class name of the raised exception ("Failure" for dg.Failure)
    message: str  # first line of the error, or the dg.Failure description
    user_failure: bool  # raised as dg.Failure: a deliberate stop, e.g. a quality gate


@dataclasses.dataclass(frozen=True)
class FailedCheck:
    """An asset check evaluation that did not pass."""

    asset: str
    check: str
    severity: str  # "ERROR" or "WARN"
    description: str


@dataclasses.dataclass(frozen=True)
class Classification:
    """A failure class and why it was chosen."""

    failure_class: str
    reason: str


def classify_failure(
    step_failures: list[StepFailure], failed_checks: list[FailedCheck]
) -> Classification:
    """Data when a check failed at ERROR severity or a step stopped on purpose; else software.

    Quality gates fail a blocking check and raise `dg.Failure(allow_retries=False)`; a missing
    or unreadable landed file raises a data error. Anything else (an exception nobody raised
    on purpose, a crashed process) is treated as a software failure.
    """
    errors = [c for c in failed_checks if c.severity == "ERROR"]
    if errors:
        names = ", ".join(f"{c.asset}:{c.check}" for c in errors)
        return Classification(DATA, f"failed blocking check(s) {names}")
    for failure in step_failures:
        if failure.error_class in DATA_ERROR_CLASSES:
            return Classification(DATA, f"{failure.step} raised {failure.error_class}")
        if failure.user_failure:
            return Classification(DATA, f"{failure.step} stopped on a failed gate (dg.Failure)")
    if step_failures:
        first = step_failures[0]
        return Classification(SOFTWARE, f"{first.step} raised {first.error_class}")
    return Classification(SOFTWARE, "the run failed outside any step")
