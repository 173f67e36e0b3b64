"""Which kind of failure a failed run is, and so which runbook section to read.

Six classes, because each needs a different fix and a different person:

- data: a landed file is missing or unreadable, an upstream partition is not stored, too few
  days of a model's window are stored, a step stopped on purpose (`dg.Failure`), or a blocking
  check failed. Waiting does not help; the upstream file or the contract must change.
- resource exhaustion: out of memory (MemoryError and its subclasses such as pyarrow's
  ArrowMemoryError, a failed allocation (ENOMEM), an OOM kill: of the run's process, or of a
  distributed engine's worker running a step) or out of disk (ENOSPC, EDQUOT). The same input
  fails again until the step gets more (`ml-platform resources`, `ml-platform health`).
- configuration: the platform may not use its storage: a read-only file system (EROFS), a
  permission refused (EACCES, EPERM, S3's AccessDenied), a file where the lake needs a folder or
  the reverse (ENOTDIR, EISDIR), a bucket that does not exist or is closed, or S3 credentials
  that are missing, incomplete or expired. Fix the mount, owner, path, bucket or credentials.
- dependency mismatch: a module is missing or an installed version does not fit the code
  (ImportError, a version conflict). Rebuild the environment from the lock.
- transient infrastructure: a timeout, a refused or dropped connection (a download cut off
  mid-file too), or S3 throttling or a 5xx answer (SlowDown, ServiceUnavailable) that
  outlasted the step's retries. Check the service, then rerun.
- code bug: anything else; reproduce it on a sample (`ml-platform reproduce RUN_ID`).

The rules read the class names and messages of each failed step's whole error chain (the
exception and its causes), so a `ConnectionRefusedError` wrapped in a storage error still
counts as transient, a full disk is resource exhaustion even when the step stopped with a
`dg.Failure` (`PermanentStorageError`, which is never retried), and a missing upstream day is
a data failure, a throttled S3 write transient, even when a range's step reports the day's
error inside its own `dg.Failure`: a `dg.Failure` is a deliberate stop only when its chain
holds no error of another class.

A failed ERROR check explains a run only when no step's failure has a class of its own: a range
records a rejected day's failed checks and goes on with its other days, so the check says
nothing of why a later day's step failed.
"""

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

DATA = "data"
RESOURCE_EXHAUSTION = "resource_exhaustion"
CONFIGURATION = "configuration"
DEPENDENCY_MISMATCH = "dependency_mismatch"
TRANSIENT_INFRASTRUCTURE = "transient_infrastructure"
CODE_BUG = "code_bug"

# The run tag that carries the class, written by the failure alerts sensor; the UI filters on it.
FAILURE_CLASS_TAG = "ml_platform/failure_class"

RUNBOOK_PATH = "docs/runbook.md"
# Every class and its docs/runbook.md section.
RUNBOOK_ANCHORS = {
    DATA: "data-failure",
    RESOURCE_EXHAUSTION: "resource-exhaustion",
    CONFIGURATION: "configuration",
    DEPENDENCY_MISMATCH: "dependency-mismatch",
    TRANSIENT_INFRASTRUCTURE: "transient-infrastructure",
    CODE_BUG: "code-bug",
}

# Errors that mean "the data is wrong or missing", whatever raised them. Matched by class name,
# as the event log records it, so a window's missing days (`WindowCoverageError`, a dg.Failure)
# and a partition never stored (`MissingPartitionError`, raised while loading an input) stay
# data failures whatever their message says.
DATA_ERROR_CLASSES = frozenset(
    {
        "MissingLandingFileError",
        "LandingFileError",
        "ContractViolationError",
        "TrainingDataError",
        "WindowCoverageError",
        "MissingPartitionError",
        "CorruptLakeFileError",
    }
)
RESOURCE_ERROR_CLASSES = frozenset({"MemoryError", "OutOfMemoryError"})
# Out of disk space (errno 28, 122).
DISK = r"\[Errno (?:28|122)\]|No space left on device|Disk quota exceeded"
DISK_PATTERN = re.compile(DISK, re.IGNORECASE)
# Killed by the kernel's OOM killer (SIGKILL, exit 137; ECS's stopped reason, Kubernetes'
# OOMKilled), an allocation refused (ENOMEM, errno 12; pyarrow's "malloc of size N failed" and
# "realloc of size N failed"), or out of disk.
RESOURCE_PATTERN = re.compile(
    r"OOMKilled|OutOfMemoryError|killed due to memory usage|out of memory|signal 9\b|SIGKILL"
    r"|\[Errno 12\]|Cannot allocate memory|alloc of size \d+ failed"
    rf"|exit(?:ed)? (?:with )?code (?:-9|137)\b|{DISK}",
    re.IGNORECASE,
)
# A read-only file system (errno 30), a permission refused (errno 13, 1; S3's codes), a file
# where a folder belongs or the reverse (errno 20, 21), S3's answers for a bucket that does not
# exist or is closed to every request, and credentials
# that are expired (S3's codes) or missing or incomplete (botocore's errors).
CONFIGURATION_ERROR_CLASSES = frozenset(
    {
        "PermissionError",
        # The landing zone's directory is not there (a volume not mounted): mount it.
        "LandingZoneMissingError",
        # The contract no longer provides a feature the serving champion needs: a person
        # resolves the contract change (docs/runbook.md).
        "ChampionFeaturesError",
        "NotADirectoryError",
        "IsADirectoryError",
        "DeletedInMlflowError",
        "NoCredentialsError",
        "PartialCredentialsError",
        # botocore refuses to send a request whose bucket is no bucket name (a location URL
        # holding an endpoint's host:port, a space): the URL is to correct.
        "ParamValidationError",
    }
)
CONFIGURATION_PATTERN = re.compile(
    r"\[Errno (?:1|13|20|21|30)\]|Read-only file system|Permission denied|Operation not permitted"
    r"|Not a directory|Is a directory"
    r"|AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch"
    r"|NoSuchBucket|AllAccessDisabled|InvalidBucketName|AccountProblem|ExpiredToken"
    # S3 refuses a request signed by a clock more than 15 minutes off: sync the worker's clock.
    r"|RequestTimeTooSkewed"
    # An object archived by a lifecycle rule (Glacier): restored by a person, not by a retry.
    r"|InvalidObjectState",
    re.IGNORECASE,
)
DEPENDENCY_ERROR_CLASSES = frozenset(
    {"ImportError", "ModuleNotFoundError", "VersionConflict", "DistributionNotFound"}
)
DEPENDENCY_PATTERN = re.compile(
    r"version conflict|incompatible version|requires [\w.-]+ ?[<>=!~]=?|"
    r"module '[\w.]+' has no attribute",
    re.IGNORECASE,
)
TRANSIENT_ERROR_CLASSES = frozenset(
    {
        "ConnectionError",
        "ConnectionRefusedError",
        "ConnectionResetError",
        "ConnectionAbortedError",
        "BrokenPipeError",
        "TimeoutError",
        "timeout",
        "URLError",
        "RemoteDisconnected",
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "RetryRequested",
        # A landed file still being written in place while raw_data read it: read again later.
        "LandedFileChangedError",
        # A download cut off mid-body (S3 closing the connection while raw_data streams a
        # landed object): botocore's error, around urllib3's and http.client's.
        "ResponseStreamingError",
        "IncompleteReadError",
        "ProtocolError",
        "IncompleteRead",
    }
)
# S3's (and other AWS services') answers for throttling and for a server error, as botocore
# writes them ("An error occurred (SlowDown) when calling ..."), and botocore's note that its
# own retries of such an answer ran out.
THROTTLED_OR_5XX = (
    r"\((?:SlowDown|ServiceUnavailable|InternalError|RequestTimeout|Throttl\w*"
    r"|RequestThrottled\w*|TooManyRequests\w*|RequestLimitExceeded|BandwidthLimitExceeded"
    r"|5\d\d)\)|reached max retries"
)
TRANSIENT_PATTERN = re.compile(
    r"Connection (?:refused|reset|broken|aborted)|timed out|Temporary failure in name resolution"
    rf"|Max retries exceeded|Service Unavailable|{THROTTLED_OR_5XX}"
    # An embedded SQLite store another process holds past the busy timeout (two datasets
    # registering at once), and a PostgreSQL server restarted or failed over under a session.
    r"|database is locked|server closed the connection unexpectedly",
    re.IGNORECASE,
)
# Dagster's error for a step whose retry policy ran out: it wraps the error the step raised.
RETRIES_EXHAUSTED_CLASS = "RetryRequestedFromPolicy"


def named_as(cls_name: str, classes: frozenset[str]) -> bool:
    """Whether an error class known by its name alone is one of `classes` or a subclass of one.

    The event log records only the class's own name, not its bases. A subclass is named after
    its base by convention (pyarrow's `ArrowMemoryError` is a MemoryError, botocore's
    `EndpointConnectionError` a ConnectionError), so a name that ends with one counts.
    """
    return any(cls_name.endswith(name) for name in classes)


def transient(exc: BaseException) -> bool:
    """Whether `exc`, or an error it came from, is an error the transient class names.

    A timeout, a refused or dropped connection, S3 throttling or a server error (5xx): trouble
    that usually passes, which a step's retry policy should meet as it was raised, not wrapped
    in a verdict that forbids retries.
    """
    for current in exception_chain(exc, context=True):
        names = {cls.__name__ for cls in type(current).__mro__}
        if names & TRANSIENT_ERROR_CLASSES or TRANSIENT_PATTERN.search(str(current)):
            return True
    return False


def exception_chain(exc: BaseException, context: bool = False) -> Iterator[BaseException]:
    """`exc` and each error it was raised from, outermost first, each once.

    `__cause__`; with `context`, else the error it was raised while handling (`__context__`).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (current.__context__ if context else None)


def out_of_disk(reason: str) -> bool:
    """Whether a resource exhaustion's reason is a full disk or quota, not memory."""
    return DISK_PATTERN.search(reason) is not None


def line_with(message: str, pattern: re.Pattern[str]) -> str:
    """The first line of a message that `pattern` finds: an engine's error within its report."""
    for line in message.splitlines():
        if pattern.search(line):
            return line.strip()
    return message.strip()


def runbook_link(failure_class: str) -> str:
    """The docs/runbook.md section of a failure class, as messages and alerts link it."""
    return f"{RUNBOOK_PATH}#{RUNBOOK_ANCHORS[failure_class]}"


@dataclasses.dataclass(frozen=True)
class StepFailure:
    """One failed step of a run, as the event log records it."""

    step: str
    error_class: str  # class name of the raised exception ("Failure" for dg.Failure)
    message: str  # first line of the error, or the dg.Failure description
    user_failure: bool  # raised as dg.Failure: a deliberate stop, e.g. a quality gate
    # "Class: message" of the exception and each of its causes, outermost first.
    chain: tuple[str, ...] = ()
    attempts: int = 1  # how many times the step ran (more than 1: it was retried)


@dataclasses.dataclass(frozen=True)
class FailedCheck:
    """An asset check evaluation that did not pass."""

    asset: str
    check: str
    severity: str  # "ERROR" or "WARN"
    description: str
    partition: str | None = None  # the day the evaluation judged (a range's runs judge many)


@dataclasses.dataclass(frozen=True)
class Classification:
    """A failure class and why it was chosen."""

    failure_class: str
    reason: str
    # The steps the class is about: the failed one, or those whose worker died.
    steps: tuple[str, ...] = ()

    @property
    def runbook_anchor(self) -> str:
        """The docs/runbook.md section to read."""
        return RUNBOOK_ANCHORS[self.failure_class]


def user_error(error: Any) -> Any:
    """The exception user code raised, unwrapped from Dagster's own errors around it.

    `error` is Dagster's serialised error (cls_name, message, cause). Dagster wraps it in its
    step-execution error (`Dagster...`), or, once the step's retry policy ran out, records the
    policy's `RetryRequestedFromPolicy` ("Exceeded max_retries of 3") with the error that was
    retried as its cause: the class and message a person acts on are that cause's. The number
    of attempts is the step's retry events' to tell (`StepFailure.attempts`).
    """
    while (
        error is not None
        and error.cause is not None
        and (
            (error.cls_name or "").startswith("Dagster")
            or error.cls_name == RETRIES_EXHAUSTED_CLASS
        )
    ):
        error = error.cause
    return error


def error_chain(error: Any) -> tuple[str, ...]:
    """The "Class: message" of a serialised error and each of its causes, outermost first."""
    links = []
    while error is not None:
        message = (error.message or "").strip()
        # Dagster's message starts with the class name, sometimes qualified with its module.
        head, sep, rest = message.partition(": ")
        if sep and head.rsplit(".", 1)[-1] == error.cls_name:
            message = rest
        links.append(f"{error.cls_name}: {message}")
        error = error.cause
    return tuple(links)


def _chain(failure: StepFailure) -> list[tuple[str, str]]:
    """(class name, message) of the error and its causes."""
    pairs = [link.partition(": ")[::2] for link in failure.chain]
    return pairs or [(failure.error_class, failure.message)]


# Resource and configuration rules come before the data rules: a step that ran out of disk or
# may not write stops with a dg.Failure so as not to be retried, yet it is not a data failure.
RESOURCE_RULES = [
    (RESOURCE_EXHAUSTION, RESOURCE_ERROR_CLASSES, RESOURCE_PATTERN),
    (CONFIGURATION, CONFIGURATION_ERROR_CLASSES, CONFIGURATION_PATTERN),
]
# Checked once no step's failure is a resource, configuration or data error, and before a
# deliberate stop: a range's step reports each failed day's error inside one dg.Failure, which
# is no gate when the error in it is a timeout or a missing module.
SOFTWARE_RULES = [
    (DEPENDENCY_MISMATCH, DEPENDENCY_ERROR_CLASSES, DEPENDENCY_PATTERN),
    (TRANSIENT_INFRASTRUCTURE, TRANSIENT_ERROR_CLASSES, TRANSIENT_PATTERN),
]


def _software_class(
    failure: StepFailure, rules: list[tuple[str, frozenset[str], re.Pattern[str]]]
) -> Classification | None:
    """The class of the first of `rules` that matches the step's error chain, if any."""
    retried = f" after {failure.attempts} attempts" if failure.attempts > 1 else ""
    for failure_class, classes, pattern in rules:
        for cls_name, message in _chain(failure):
            if named_as(cls_name, classes) or pattern.search(message):
                return Classification(
                    failure_class,
                    f"{failure.step} raised {cls_name}: {message}{retried}",
                    (failure.step,),
                )
    return None


def _data_error(failure: StepFailure) -> Classification | None:
    """DATA, naming the error and its message, if a link of the step's error chain is a data error.

    Any link: a range's step reports a day's missing upstream partition inside its own
    `dg.Failure`.
    """
    for cls_name, message in _chain(failure):
        if named_as(cls_name, DATA_ERROR_CLASSES):
            return Classification(
                DATA, f"{failure.step} raised {cls_name}: {message}", (failure.step,)
            )
    return None


def classify_failure(
    step_failures: list[StepFailure],
    failed_checks: list[FailedCheck],
    run_message: str = "",
    unfinished_steps: list[str] | tuple[str, ...] = (),
) -> Classification:
    """The class of a failed run (see the module docstring for the rules, in order).

    Step by step, a resource or configuration error in the chain (a full disk, a read-only
    lake), else a data error in it; then the other software classes, for the first step whose
    error chain matches; then a deliberate stop (`dg.Failure`), named with its message; then
    the run's own failure message (a killed run process, or a distributed engine's worker
    killed while running a step, which records no step failure: the steps begun and never
    ended are named). Only then a failed ERROR check: a range run records a rejected day's
    failed checks and goes on, so they cannot explain a step that failed on another day, while
    a blocking check that stops a one-day run fails its step with Dagster's own error, which
    no rule above matches. Otherwise a code bug.
    """
    for failure in step_failures:
        found = _software_class(failure, RESOURCE_RULES) or _data_error(failure)
        if found is not None:
            return found
    for failure in step_failures:
        found = _software_class(failure, SOFTWARE_RULES)
        if found is not None:
            return found
    for failure in step_failures:
        # A dg.Failure raised from another error is that error's account (a range step names
        # its failed days, `steps.each_day`), classed by it below; one raised alone, or from a
        # day's own dg.Failure (`each_day` wraps the failed days' errors in the step's), is a
        # deliberate stop.
        if failure.user_failure and all(name == "Failure" for name, _ in _chain(failure)[1:]):
            return Classification(
                DATA,
                f"{failure.step} stopped on a failed gate (dg.Failure): {failure.message}",
                (failure.step,),
            )
    killed = RESOURCE_PATTERN.search(run_message)
    if not step_failures and killed:
        if unfinished_steps:
            steps = ", ".join(unfinished_steps)
            return Classification(
                RESOURCE_EXHAUSTION,
                f"{steps} did not finish: the process running it was killed ({killed.group(0)}: "
                f"the kernel ends a process over its memory limit): "
                f"{line_with(run_message, RESOURCE_PATTERN)}",
                tuple(unfinished_steps),
            )
        return Classification(RESOURCE_EXHAUSTION, f"the run process died: {run_message}")
    errors = [c for c in failed_checks if c.severity == "ERROR"]
    if errors:
        names = ", ".join(f"{c.asset}:{c.check}" for c in errors)
        return Classification(DATA, f"failed blocking check(s) {names}")
    if step_failures:
        first = step_failures[0]
        if first.user_failure and len(first.chain) > 1:
            # Its message names the failed days and each day's error.
            return Classification(
                CODE_BUG, f"{first.step} raised {first.chain[-1]}: {first.message}", (first.step,)
            )
        return Classification(CODE_BUG, f"{first.step} raised {first.error_class}: {first.message}")
    return Classification(CODE_BUG, f"the run failed outside any step: {run_message or '?'}")
