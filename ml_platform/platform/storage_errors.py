"""What a failed lake read or write says, and whether waiting can fix it.

A storage error names what failed where: the backend names the object (`LakeStorageError`),
and the step or IO manager that knows it adds the asset and the partition (`partition_errors`).
An error that waiting cannot fix (a full disk, a read-only file system, a permission refused,
a bucket that does not exist, S3 credentials missing or expired, a clock S3 finds skewed)
then fails the step at once (`PermanentStorageError`) instead of being retried.
"""

import contextlib
import errno
from collections.abc import Iterator

import dagster as dg
from botocore.exceptions import (
    ClientError,
    NoCredentialsError,
    ParamValidationError,
    PartialCredentialsError,
)

from ml_platform.platform.failures import (
    CONFIGURATION,
    RESOURCE_EXHAUSTION,
    exception_chain,
    runbook_link,
)

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
    # A file where the lake needs a folder, or the reverse (ML_PLATFORM_LAKE_DIR naming a file,
    # a file left where a dataset's folder goes): it stays so until a person moves it.
    errno.ENOTDIR: (
        "a file stands where the lake needs a folder: point ML_PLATFORM_LAKE_DIR at a folder, "
        "or move the file out of the lake",
        CONFIGURATION,
    ),
    errno.EISDIR: (
        "a folder stands where the lake needs a file: move the folder out of the lake",
        CONFIGURATION,
    ),
}


# S3's answers that mean a permission refused, read as EACCES.
S3_PERMISSION_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"})

LOCATION_URLS = "ML_PLATFORM_LAKE_URL or ML_PLATFORM_LANDING_URL"
CREDENTIALS_CHAIN = (
    "the boto3 chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, or an instance "
    "or task role"
)

# S3's other answers that waiting does not fix, and what to do instead: the bucket stays
# missing or closed, credentials expired and a clock off, until a person acts. Every one is a
# configuration failure (`failures.CONFIGURATION_PATTERN` names the same codes).
PERMANENT_S3_ERRORS = {
    "NoSuchBucket": (
        "the bucket does not exist: create it, or correct the bucket of the location's URL "
        f"({LOCATION_URLS})"
    ),
    "InvalidBucketName": (
        "the bucket's name is not a valid S3 bucket name: correct the location's URL "
        f"({LOCATION_URLS})"
    ),
    "AllAccessDisabled": (
        "every access to the bucket is disabled: have its owner (or AWS) enable it again, or "
        f"point the location's URL ({LOCATION_URLS}) at another bucket"
    ),
    "AccountProblem": (
        "the AWS account of the credentials cannot make requests (billing, a suspended "
        "account): settle it with AWS, or give the platform another account's credentials"
    ),
    "ExpiredToken": (
        "the S3 credentials' session token has expired: give the platform fresh credentials "
        "(renew AWS_SESSION_TOKEN), or credentials that renew themselves (a profile, or an "
        "instance or task role)"
    ),
    # S3 refuses a request signed more than 15 minutes off its clock; the worker's clock stays
    # off while the retry policy waits.
    # An object a lifecycle rule moved to an archive class (Glacier) cannot be read until it
    # is restored, which no retry does.
    "InvalidObjectState": (
        "the object is in an archive storage class (S3 Glacier, moved by a lifecycle rule): "
        "restore it (aws s3api restore-object) and keep the lake's prefix out of archiving rules"
    ),
    "RequestTimeTooSkewed": (
        "the clock of the machine the step runs on is more than 15 minutes off S3's: set it "
        "right (run NTP or chrony on it), then the step's requests are signed with the time "
        "S3 accepts"
    ),
}
# botocore's errors for credentials it could not find or found only in part, and for a request
# it refuses to send (a location URL whose bucket is no bucket name: `s3://my bucket/lake`,
# `s3://host:9000/lake`), before any request: every attempt fails the same way.
PERMANENT_CREDENTIAL_ERRORS: dict[type[Exception], str] = {
    NoCredentialsError: (
        "no S3 credentials were found: give the platform's processes some through "
        f"{CREDENTIALS_CHAIN}"
    ),
    PartialCredentialsError: (
        "the S3 credentials are incomplete: set both AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, or use a profile or a role that holds both"
    ),
    ParamValidationError: (
        "the S3 client refuses the request's parameters, most often a bucket that is no valid "
        f"bucket name: correct the location's URL ({LOCATION_URLS}) to s3://bucket/prefix, "
        "with the endpoint in ML_PLATFORM_S3_ENDPOINT_URL"
    ),
}


class LakeStorageError(OSError):
    """A lake read or write failed: the message says what was done to which object, and why.

    An OSError with the cause's errno (EACCES for S3's AccessDenied), so that the failure
    classifier reads a full disk as `[Errno 28]`; the cause stays chained. Retried by the
    storage retry policy, unless `partition_errors` finds that waiting cannot help.
    """


class MissingLakeObjectError(FileNotFoundError):
    """A read found no object under its key: the message names the key and where it lives.

    One that was there when the reader looked it up, or that a record names, was deleted since.
    Waiting does not store it again: `partition_errors` makes it a `MissingPartitionError`
    naming the asset and the day, never retried.
    """


class PartitionStorageError(LakeStorageError):
    """A `LakeStorageError` that also names the asset and the partition it was for."""


class PermanentStorageError(dg.Failure):
    """A lake error that waiting does not fix (`permanent_advice`): never retried.

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


def permanent_s3_error(exc: BaseException) -> str | None:
    """What to do about an S3 or botocore error in `exc`'s chain that waiting cannot fix, if any.

    A `LakeStorageError` chains the S3 error it was raised from; a refused permission is not
    looked up here, since its errno (EACCES) already says it (`storage_errno`).
    """
    for current in exception_chain(exc):
        if isinstance(current, ClientError):
            code = current.response.get("Error", {}).get("Code")
            if code in PERMANENT_S3_ERRORS:
                return PERMANENT_S3_ERRORS[code]
        for kind, advice in PERMANENT_CREDENTIAL_ERRORS.items():
            if isinstance(current, kind):
                return advice
    return None


def permanent_advice(exc: OSError) -> tuple[str, str] | None:
    """What to do about a storage error waiting cannot fix, and its failure class; else None."""
    if exc.errno in PERMANENT_STORAGE_ERRORS:
        return PERMANENT_STORAGE_ERRORS[exc.errno]
    advice = permanent_s3_error(exc)
    return None if advice is None else (advice, CONFIGURATION)


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

    An error with an errno of `PERMANENT_STORAGE_ERRORS`, or from an S3 answer or a botocore
    error of `PERMANENT_S3_ERRORS` / `PERMANENT_CREDENTIAL_ERRORS`, becomes a
    `PermanentStorageError`, any other `LakeStorageError` a `PartitionStorageError` (retried).
    An object a read found missing (`MissingLakeObjectError`) becomes a `MissingPartitionError`
    (never retried); other errors that are not storage errors go through as they are.
    """
    where = asset_key.to_user_string() + (f" partition {partition}" if partition else "")
    try:
        yield
    except PartitionStorageError:
        raise
    except MissingLakeObjectError as exc:
        # Deleted after it was recorded or looked up (by hand, a lifecycle rule, a restore
        # that left it out): retries would read the same absence.
        raise MissingPartitionError(
            f"{where}: {exc.strerror or exc}. Retrying cannot bring it back: materialise "
            f"{where} again"
        ) from exc
    except OSError as exc:
        permanent = permanent_advice(exc)
        if permanent is not None:
            advice, failure_class = permanent
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


class UnsafeLakeKeyError(dg.Failure, ValueError):
    """A key that would name an object outside the lake: refused before any read or write.

    The lake's own keys never do, but a reader also follows the key a materialisation records
    (`lake_key`), which anyone who can report an asset event sets. Retrying reads the same key.
    """

    def __init__(self, message: str):
        super().__init__(description=message, allow_retries=False)
