"""What a failed lake read or write says, and whether waiting can fix it.

A storage error names what failed where: the backend names the object (`LakeStorageError`),
and the step or IO manager that knows it adds the asset and the partition (`partition_errors`).
An error that waiting cannot fix (a full disk, a read-only file system, a permission refused)
then fails the step at once (`PermanentStorageError`) instead of being retried.
"""

import contextlib
import errno
from collections.abc import Iterator

import dagster as dg
from botocore.exceptions import ClientError

from ml_platform.platform.failures import CONFIGURATION, RESOURCE_EXHAUSTION, runbook_link

REFUSED = (
    "the platform's user is not allowed to: fix the owner and mode of the lake directory, or "
    "the S3 credentials' policy (deploy/iam-policy.json)",
    CONFIGURATION,
)


# Storage errors that waiting does not fix, and what to do instead. The storage retry policy
# would spend about 22 s on each before failing with the same error: a full disk stays full, a
# read-only mount read-only, a refused permission refused.
PERMANENT_STORAGE_ERRORS = {
    errno.ENOSPC: (
        "the disk it is written to is full: free space on the lake's volume (or, for an S3 "
        "lake, in the temporary directory) or give it more",
        RESOURCE_EXHAUSTION,
    ),
    errno.EDQUOT: (
        "the disk quota of the platform's user is used up: free space or raise the quota",
        RESOURCE_EXHAUSTION,
    ),
    errno.EROFS: (
        "the lake's file system is mounted read-only: mount it read-write, or point "
        "ML_PLATFORM_LAKE_DIR at a writable volume",
        CONFIGURATION,
    ),
    errno.EACCES: REFUSED,
    errno.EPERM: REFUSED,
}


# S3's answers that mean a permission refused, read as EACCES.
S3_PERMISSION_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"})


class LakeStorageError(OSError):
    """A lake read or write failed: the message says what was done to which object, and why.

    An OSError with the cause's errno (EACCES for S3's AccessDenied), so that the failure
    classifier reads a full disk as `[Errno 28]`; the cause stays chained. Retried by the
    storage retry policy, unless `partition_errors` finds that waiting cannot help.
    """


class PartitionStorageError(LakeStorageError):
    """A `LakeStorageError` that also names the asset and the partition it was for."""


class PermanentStorageError(dg.Failure):
    """A lake error that waiting does not fix (`PERMANENT_STORAGE_ERRORS`): never retried.

    The message names the object, the asset and the partition, what to do and the runbook
    section; the storage error stays chained, so the run is classed by it.
    """

    def __init__(self, message: str):
        super().__init__(description=message, allow_retries=False)


def storage_errno(exc: BaseException) -> int | None:
    """The errno of a storage error: an OSError's own, EACCES for S3's permission refusals."""
    if isinstance(exc, OSError):
        return exc.errno
    if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in (
        S3_PERMISSION_CODES
    ):
        return errno.EACCES
    return None


def storage_error(
    doing: str, what: str, exc: BaseException, kind: type[OSError] = LakeStorageError
) -> OSError:
    """`exc` as a `kind` of error that says what was done to what ("writing s3://..."), and why."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return os_error(
        kind, storage_errno(exc), f"{doing} {what} failed: {type(exc).__name__}: {reason}"
    )


def os_error(kind: type[OSError], code: int | None, message: str) -> OSError:
    """An OSError of class `kind` with errno `code` (shown as `[Errno N]`) when there is one."""
    return kind(code, message) if code else kind(message)


@contextlib.contextmanager
def partition_errors(asset_key: dg.AssetKey, partition: str | None) -> Iterator[None]:
    """Name the asset and partition in storage errors of the block; fail now if waiting cannot help.

    An error with an errno of `PERMANENT_STORAGE_ERRORS` becomes a `PermanentStorageError`, any
    other `LakeStorageError` a `PartitionStorageError` (retried). A missing object
    (FileNotFoundError, `MissingPartitionError`) and errors that are not storage errors go
    through as they are.
    """
    where = asset_key.to_user_string() + (f" partition {partition}" if partition else "")
    try:
        yield
    except PartitionStorageError:
        raise
    except OSError as exc:
        if exc.errno in PERMANENT_STORAGE_ERRORS:
            advice, failure_class = PERMANENT_STORAGE_ERRORS[exc.errno]
            raise PermanentStorageError(
                f"{where}: {exc}. Retrying cannot help: {advice}, then rerun the day. "
                f"Runbook: {runbook_link(failure_class)}"
            ) from exc
        if isinstance(exc, LakeStorageError):
            raise os_error(
                PartitionStorageError, exc.errno, f"{where}: {exc.strerror or exc}"
            ) from exc
        raise


class MissingPartitionError(dg.Failure, FileNotFoundError):
    """An upstream partition an asset needs has never been materialised.

    A `dg.Failure` that forbids retries: waiting does not store the partition, materialising
    it does, and the message says which.
    """

    def __init__(self, message: str):
        super().__init__(description=message, allow_retries=False)


class CorruptLakeFileError(dg.Failure, ValueError):
    """A stored day's file that its format cannot read: damaged after the run that wrote it.

    Files are written whole (a temporary name, then a rename), so a truncated or garbled one
    was damaged since: a partial copy or restore, a disk or bucket fault. Retrying reads the
    same bytes; materialising the day again rewrites the file.
    """

    def __init__(self, message: str):
        super().__init__(description=message, allow_retries=False)
