"""Storage errors name the object, the asset and the day; those waiting cannot fix are not retried.

The lake lives on a real small file system (a tmpfs mounted for the test; the tests run as root,
as in CI): a full one gives the kernel's ENOSPC, a read-only one its EROFS. S3's answers come
from a real S3 API server where it can give them (a missing bucket, no credentials), otherwise
from the same `naming` wrapper the S3 lake raises them through.
"""

import dataclasses
import errno
import os
import re
from pathlib import Path
from typing import Any

import dagster as dg
import moto.settings
import pytest
from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError
from dagster_aws.s3 import S3Resource

from ml_platform.ingestion.s3_landing import S3LandingZone
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.failures import (
    CONFIGURATION,
    DATA,
    RESOURCE_EXHAUSTION,
    TRANSIENT_INFRASTRUCTURE,
    StepFailure,
    classify_failure,
)
from ml_platform.platform.run_events import classify_outcome, run_outcome
from ml_platform.platform.s3 import S3Storage
from ml_platform.platform.storage import LocalStorage
from ml_platform.platform.storage_errors import (
    PartitionStorageError,
    PermanentStorageError,
    partition_errors,
)
from ml_platform.troubleshooting.diagnose import diagnose_run
from ml_platform_tests.conftest import fill, tmpfs
from ml_platform_tests.services import FAKE_AWS

DAY = "2024-01-01"
NEXT_DAY = "2024-01-02"


def files_in(root: Path) -> set[str]:
    """Every file below `root`, temporary dot-files included."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def failure_of(exc: BaseException, step: str) -> StepFailure:
    """A raised error as the event log records its step's failure: the error and its causes."""
    chain = []
    link: BaseException | None = exc
    while link is not None:
        message = link.description if isinstance(link, dg.Failure) else str(link)
        chain.append(f"{type(link).__name__}: {message}")
        link = link.__cause__
    user = isinstance(exc, dg.Failure)
    return StepFailure(step, type(exc).__name__, chain[0].split(": ", 1)[1], user, tuple(chain))


def test_a_lake_that_fills_during_a_day_fails_it_once_naming_where_and_leaves_no_part(
    platform_for,
):
    platform = platform_for("synthetic")
    with tmpfs(platform.lake_dir, "1m") as lake:
        platform.land(DAY, 2)
        # Room for the first day's file (about 80 kB) and a part of the second's.
        filler = fill(lake, leave_pages=24)

        # Two days in one run, as a backfill runs them.
        result = dg.materialize(
            list(platform.defs.assets or []),
            resources=platform.defs.resources,
            instance=platform.instance,
            selection=[platform.key("raw_data"), platform.key("validated_data")],
            tags={
                "dagster/asset_partition_range_start": DAY,
                "dagster/asset_partition_range_end": NEXT_DAY,
            },
            raise_on_error=False,
        )

        assert not result.success
        events = platform.instance.all_logs(result.run_id)
        kinds = [e.dagster_event.event_type for e in events if e.dagster_event is not None]
        # One attempt: waiting would not free the disk.
        assert dg.DagsterEventType.STEP_UP_FOR_RETRY not in kinds
        assert kinds.count(dg.DagsterEventType.STEP_FAILURE) == 1
        diagnosis = diagnose_run(platform.instance, result.run_id)
        (failure,) = diagnosis.failed_steps
        assert failure.attempts == 1
        # The error names the object, the asset and the day, and what to do.
        assert "1 of 2 days failed" in failure.message
        assert f"synthetic/raw_data partition {NEXT_DAY}: [Errno 28] writing " in failure.message
        written = re.search(
            r"writing (\S+) failed: OSError: No space left on device", failure.message
        )
        assert written is not None, failure.message
        assert written[1].startswith(
            f"{lake.resolve()}/synthetic/raw_data/{NEXT_DAY}/{result.run_id}"
        )
        assert "Retrying cannot help: the disk it is written to is full" in failure.message
        assert diagnosis.classification is not None
        assert diagnosis.classification.failure_class == RESOURCE_EXHAUSTION
        assert "runbook: docs/runbook.md#resource-exhaustion" in diagnosis.render()
        # Nothing half-written: the second day's partial file is gone, and so is the first
        # day's whole one, which no materialisation records.
        assert files_in(lake) == {filler.name}
        assert platform.materialized("raw_data") == set()


@pytest.mark.parametrize(
    "damage",
    [
        # A partial restore of the lake: the day's file cut in half.
        lambda data: data[: len(data) // 2],
        # A bad disk block: a data page overwritten, the footer whole (pyarrow then raises an
        # OSError of its own, with no errno).
        lambda data: data[:100] + b"\xff" * 300 + data[400:],
    ],
    ids=["cut in half", "a data page overwritten"],
)
def test_a_damaged_lake_file_fails_the_day_reading_it_once_naming_file_and_day(
    platform_for, damage
):
    platform = platform_for("synthetic")
    platform.land(DAY, 1)
    selection = {
        "raw_data": [platform.key("raw_data")],
        "validated": [platform.key("validated_data")],
    }

    def run(name: str) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            list(platform.defs.assets or []),
            resources=platform.defs.resources,
            instance=platform.instance,
            selection=selection[name],
            partition_key=DAY,
            raise_on_error=False,
        )

    assert run("raw_data").success
    [stored] = (Path(platform.lake_dir) / "synthetic" / "raw_data" / DAY).iterdir()
    stored.write_bytes(damage(stored.read_bytes()))

    result = run("validated")

    assert not result.success
    kinds = [
        e.dagster_event.event_type
        for e in platform.instance.all_logs(result.run_id)
        if e.dagster_event
    ]
    assert dg.DagsterEventType.STEP_UP_FOR_RETRY not in kinds
    diagnosis = diagnose_run(platform.instance, result.run_id)
    (failure,) = diagnosis.failed_steps
    assert (
        f"synthetic/raw_data partition {DAY} cannot be read: {stored.resolve()} is not a whole "
        "parquet file"
    ) in failure.message
    assert "materialise the day again" in failure.message
    assert diagnosis.classification is not None
    assert diagnosis.classification.failure_class == DATA


def test_a_read_only_lake_fails_at_once_classed_configuration(tmp_path):
    key = asset_key("synthetic", "validated_data")
    with tmpfs(tmp_path / "lake", "1m", "ro") as lake:
        storage = LocalStorage(base_dir=str(lake))
        object_key = f"synthetic/validated_data/{DAY}/run-0.parquet"
        with pytest.raises(PermanentStorageError) as raised, partition_errors(key, DAY):
            storage.write_bytes(object_key, b"rows")

    stop = raised.value
    assert not stop.allow_retries
    assert stop.description.startswith(
        f"synthetic/validated_data partition {DAY}: [Errno 30] writing "
        f"{lake.resolve()}/{object_key} failed: OSError: Read-only file system."
    )
    assert "mount it read-write" in stop.description
    verdict = classify_failure([failure_of(stop, "synthetic__validated_data")], [])
    assert verdict.failure_class == CONFIGURATION
    assert verdict.runbook_anchor == "configuration"


def test_a_lake_folder_that_is_a_file_fails_at_once_classed_configuration(tmp_path):
    # ML_PLATFORM_LAKE_DIR naming a file: every write meets "Not a directory", which the storage
    # retry policy spent about 22 s on before failing the same way.
    lake = tmp_path / "lake"
    lake.write_text("not a folder")
    key = asset_key("synthetic", "raw_data")
    storage = LocalStorage(base_dir=str(lake))
    object_key = f"synthetic/raw_data/{DAY}/run-0.parquet"
    with pytest.raises(PermanentStorageError) as raised, partition_errors(key, DAY):
        storage.write_bytes(object_key, b"rows")

    stop = raised.value
    assert not stop.allow_retries
    assert stop.description.startswith(f"synthetic/raw_data partition {DAY}: [Errno 20] writing ")
    assert "point ML_PLATFORM_LAKE_DIR at a folder" in stop.description
    verdict = classify_failure([failure_of(stop, "synthetic__raw_data")], [])
    assert verdict.failure_class == CONFIGURATION


@pytest.mark.parametrize(
    ("refusal", "reason"),
    [
        # As root the kernel grants every mode; this is its refusal to any other user.
        (
            PermissionError(errno.EACCES, os.strerror(errno.EACCES)),
            "PermissionError: Permission denied",
        ),
        # What boto3 raises when S3 refuses the credentials' policy.
        (
            ClientError(
                {"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "PutObject"
            ),
            "ClientError: An error occurred (AccessDenied) when calling the PutObject operation",
        ),
    ],
    ids=["EACCES", "S3-AccessDenied"],
)
def test_a_refused_permission_fails_at_once_classed_configuration(refusal, reason, tmp_path):
    def refused(handle) -> None:
        raise refusal

    key = asset_key("synthetic", "features")
    storage = LocalStorage(base_dir=str(tmp_path))
    object_key = f"synthetic/features/{DAY}/run-0.parquet"
    with pytest.raises(PermanentStorageError) as raised, partition_errors(key, DAY):
        storage.write_with(object_key, refused)

    stop = raised.value
    assert not stop.allow_retries
    assert stop.description.startswith(
        f"synthetic/features partition {DAY}: [Errno 13] writing "
        f"{tmp_path.resolve()}/{object_key} failed: {reason}"
    )
    assert "fix the owner and mode of the lake directory" in stop.description
    # The refused write left no temporary file.
    assert files_in(tmp_path) == set()
    verdict = classify_failure([failure_of(stop, "synthetic__features")], [])
    assert verdict.failure_class == CONFIGURATION


def test_a_storage_error_waiting_can_fix_names_the_day_and_stays_retried(tmp_path):
    def dropped(handle) -> None:
        raise ConnectionResetError(errno.ECONNRESET, os.strerror(errno.ECONNRESET))

    key = asset_key("synthetic", "model")
    storage = LocalStorage(base_dir=str(tmp_path))
    with pytest.raises(PartitionStorageError) as raised, partition_errors(key, DAY):
        storage.write_with(f"synthetic/model/{DAY}/run-0.joblib", dropped)

    assert not isinstance(raised.value, dg.Failure)  # the retry policy retries it
    assert str(raised.value).startswith(
        f"[Errno 104] synthetic/model partition {DAY}: writing {tmp_path.resolve()}/synthetic/"
    )


def test_a_landed_file_the_credentials_may_not_read_fails_at_once_naming_it(s3_server, monkeypatch):
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)
    zone = S3LandingZone(url="s3://landing/incoming/", s3=S3Resource(endpoint_url=s3_server))
    zone.client().create_bucket(Bucket="landing")
    name = f"synthetic_{DAY}.csv"
    zone.client().put_object(Bucket="landing", Key=f"incoming/{name}", Body=b"a,b\n1,2\n")
    # From now on the S3 server checks credentials, and knows none: it refuses ours.
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)

    with pytest.raises(PermanentStorageError) as raised, zone.open_file(name, DAY):
        pass

    # Not a verdict of the day (the file may be fine) and not retried: waiting changes no policy.
    stop = raised.value
    assert not stop.allow_retries
    assert stop.description.startswith(
        f"s3://landing/incoming/{name} (partition {DAY}) may not be read: ClientError: "
        "An error occurred (InvalidAccessKeyId)"
    )
    assert "s3:GetObject on the landing prefix" in stop.description
    verdict = classify_failure([failure_of(stop, "synthetic__raw_data")], [])
    assert verdict.failure_class == CONFIGURATION


def s3_error(code: str, message: str, **metadata: object) -> ClientError:
    """What boto3 raises for a PUT that S3 answers with the error `code`."""
    response: dict[str, Any] = {"Error": {"Code": code, "Message": message}}
    if metadata:
        response["ResponseMetadata"] = metadata
    return ClientError(response, "PutObject")


def write_failing_with(error: BaseException, storage: LocalStorage) -> BaseException:
    """The error a features write that raises `error` leaves, named by `partition_errors`."""

    def failing(handle) -> None:
        raise error

    key = asset_key("synthetic", "features")
    with pytest.raises(Exception) as raised, partition_errors(key, DAY):
        # The same `naming` wrapper as S3Storage's: what S3's answers reach the step as.
        storage.write_with(f"synthetic/features/{DAY}/run-0.parquet", failing)
    return raised.value


def write_failing_with_s3(lake: S3Storage) -> BaseException:
    """The error a features write to the S3 lake `lake` leaves, named by `partition_errors`."""
    with (
        pytest.raises(Exception) as raised,
        partition_errors(asset_key("synthetic", "features"), DAY),
    ):
        lake.write_bytes(f"synthetic/features/{DAY}/run-0.parquet", b"rows")
    return raised.value


def s3_failing_features(monkeypatch: pytest.MonkeyPatch, error: ClientError) -> None:
    """Make every write of a features file raise `error`, as boto3 raises S3's answer."""
    real = LocalStorage.write_with

    def write_with(self: LocalStorage, key: str, write) -> None:
        if "/features/" not in key:
            return real(self, key, write)
        with self.naming("writing", key):
            raise error

    monkeypatch.setattr(LocalStorage, "write_with", write_with)


# S3's answers and botocore's errors that waiting does not fix, and the advice each one gets.
PERMANENT_S3 = {
    "NoSuchBucket": (
        s3_error("NoSuchBucket", "The specified bucket does not exist"),
        "the bucket does not exist: create it, or correct the bucket of the location's URL "
        "(ML_PLATFORM_LAKE_URL or ML_PLATFORM_LANDING_URL)",
    ),
    "InvalidBucketName": (
        s3_error("InvalidBucketName", "The specified bucket is not valid."),
        "the bucket's name is not a valid S3 bucket name",
    ),
    "AllAccessDisabled": (
        s3_error("AllAccessDisabled", "All access to this Amazon S3 resource has been disabled."),
        "every access to the bucket is disabled",
    ),
    "AccountProblem": (
        s3_error("AccountProblem", "There is a problem with your AWS account."),
        "the AWS account of the credentials cannot make requests",
    ),
    "ExpiredToken": (
        s3_error("ExpiredToken", "The provided token has expired."),
        "the S3 credentials' session token has expired",
    ),
    "NoCredentialsError": (NoCredentialsError(), "no S3 credentials were found"),
    "PartialCredentialsError": (
        PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"),
        "the S3 credentials are incomplete: set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    ),
}


@pytest.mark.parametrize("name", sorted(PERMANENT_S3))
def test_an_s3_error_waiting_cannot_fix_fails_at_once_saying_what_to_fix(name, tmp_path):
    error, advice = PERMANENT_S3[name]

    stop = write_failing_with(error, LocalStorage(base_dir=str(tmp_path)))

    assert isinstance(stop, PermanentStorageError), type(stop)
    assert not stop.allow_retries
    assert stop.description.startswith(
        f"synthetic/features partition {DAY}: writing {tmp_path.resolve()}/synthetic/features/"
    )
    assert f"failed: {type(error).__name__}: {error}" in stop.description
    assert f"Retrying cannot help: {advice}" in stop.description
    assert stop.description.endswith("Runbook: docs/runbook.md#configuration")
    verdict = classify_failure([failure_of(stop, "synthetic__features")], [])
    assert verdict.failure_class == CONFIGURATION
    # A run recorded before such errors stopped at once was retried: its chain is classed the
    # same, by the S3 error in it.
    retried = classify_failure([failure_of(stop.__cause__, "synthetic__features")], [])
    assert retried.failure_class == CONFIGURATION


def test_a_lake_bucket_that_does_not_exist_fails_at_once_naming_it(s3_server, monkeypatch):
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)
    lake = S3Storage(url="s3://no-such-bucket/lake/", s3=S3Resource(endpoint_url=s3_server))

    stop = write_failing_with_s3(lake)

    assert isinstance(stop, PermanentStorageError), type(stop)
    assert not stop.allow_retries
    assert stop.description.startswith(
        f"synthetic/features partition {DAY}: writing s3://no-such-bucket/lake/synthetic/"
        f"features/{DAY}/run-0.parquet failed: NoSuchBucket: An error occurred (NoSuchBucket)"
    )
    assert "Retrying cannot help: the bucket does not exist: create it" in stop.description
    verdict = classify_failure([failure_of(stop, "synthetic__features")], [])
    assert verdict.failure_class == CONFIGURATION


def test_an_s3_lake_without_credentials_fails_at_once_saying_where_to_give_them(
    s3_server, monkeypatch, tmp_path
):
    # No credentials anywhere in the boto3 chain: no variables, files, or instance metadata.
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", FAKE_AWS["AWS_DEFAULT_REGION"])
    lake = S3Storage(url="s3://lake/", s3=S3Resource(endpoint_url=s3_server))

    stop = write_failing_with_s3(lake)

    assert isinstance(stop, PermanentStorageError), type(stop)
    assert not stop.allow_retries
    assert "failed: NoCredentialsError: Unable to locate credentials" in stop.description
    assert "Retrying cannot help: no S3 credentials were found" in stop.description
    assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in stop.description
    verdict = classify_failure([failure_of(stop, "synthetic__features")], [])
    assert verdict.failure_class == CONFIGURATION


def test_a_missing_bucket_fails_a_real_run_once_classed_configuration(platform_for, monkeypatch):
    platform = platform_for("synthetic")
    platform.land(DAY, 1)
    assert platform.materialize(DAY, selection=["raw_data", "validated_data"]).success
    s3_failing_features(
        monkeypatch, s3_error("NoSuchBucket", "The specified bucket does not exist")
    )

    result = platform.materialize(DAY, selection=["features"])

    assert not result.success
    kinds = [e.event_type for e in result.all_events]
    # One attempt: waiting does not create the bucket.
    assert dg.DagsterEventType.STEP_UP_FOR_RETRY not in kinds
    diagnosis = diagnose_run(platform.instance, result.run_id)
    (failure,) = diagnosis.failed_steps
    assert failure.attempts == 1
    assert diagnosis.classification is not None
    assert diagnosis.classification.failure_class == CONFIGURATION
    assert "the bucket does not exist: create it" in diagnosis.classification.reason


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("SlowDown", "Please reduce your request rate."),
        ("ServiceUnavailable", "Please reduce your request rate."),
        ("InternalError", "We encountered an internal error. Please try again."),
        ("RequestTimeout", "Your socket connection to the server was not read from in time."),
        ("ThrottlingException", "Rate exceeded"),
        ("503", "Service Unavailable"),
    ],
)
def test_s3_throttling_or_a_server_error_is_retried_and_classed_transient(code, message, tmp_path):
    error = write_failing_with(s3_error(code, message), LocalStorage(base_dir=str(tmp_path)))

    assert isinstance(error, PartitionStorageError)
    assert not isinstance(error, dg.Failure)  # the retry policy retries it
    failure = dataclasses.replace(failure_of(error, "synthetic__features"), attempts=4)
    verdict = classify_failure([failure], [])
    assert verdict.failure_class == TRANSIENT_INFRASTRUCTURE, verdict.reason
    assert f"({code})" in verdict.reason and verdict.reason.endswith("after 4 attempts")


def test_an_s3_error_botocore_gave_up_retrying_is_classed_transient(tmp_path):
    # botocore retries what it knows passes (here a request still in progress) and says so.
    gave_up = s3_error(
        "PriorRequestNotComplete", "Retry later", MaxAttemptsReached=True, RetryAttempts=4
    )
    error = write_failing_with(gave_up, LocalStorage(base_dir=str(tmp_path)))

    assert "(reached max retries: 4)" in str(error)
    verdict = classify_failure([failure_of(error, "synthetic__features")], [])
    assert verdict.failure_class == TRANSIENT_INFRASTRUCTURE, verdict.reason


@pytest.mark.slow
def test_s3_throttling_in_a_real_run_is_retried_then_classed_by_its_own_error(
    platform_for, monkeypatch
):
    platform = platform_for("synthetic")
    platform.land(DAY, 1)
    assert platform.materialize(DAY, selection=["raw_data", "validated_data"]).success
    s3_failing_features(monkeypatch, s3_error("SlowDown", "Please reduce your request rate."))

    result = platform.materialize(DAY, selection=["features"])  # about 22 s of backoff

    assert not result.success
    kinds = [e.event_type for e in result.all_events]
    assert kinds.count(dg.DagsterEventType.STEP_UP_FOR_RETRY) == 3
    outcome = run_outcome(platform.instance, result.run_id, succeeded=False)
    assert outcome is not None
    (failure,) = outcome.step_failures
    assert failure.attempts == 4
    # The error the step raised, not Dagster's note that its retry policy ran out.
    assert failure.error_class != "RetryRequestedFromPolicy"
    assert not any("RetryRequestedFromPolicy" in link for link in failure.chain)
    assert "Exceeded max_retries" not in failure.message
    assert failure.chain[-1] == (
        "ClientError: An error occurred (SlowDown) when calling the PutObject operation: "
        "Please reduce your request rate."
    )
    verdict = classify_outcome(outcome)
    assert verdict.failure_class == TRANSIENT_INFRASTRUCTURE, verdict.reason
    assert "(SlowDown)" in verdict.reason and verdict.reason.endswith("after 4 attempts")
    assert "RetryRequestedFromPolicy" not in verdict.reason
