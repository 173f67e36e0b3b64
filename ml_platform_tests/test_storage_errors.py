"""Storage errors name the object, the asset and the day; those waiting cannot fix are not retried.

The lake lives on a real small file system (a tmpfs mounted for the test; the tests run as root,
as in CI): a full one gives the kernel's ENOSPC, a read-only one its EROFS.
"""

import errno
import os
import re
from pathlib import Path

import dagster as dg
import moto.settings
import pytest
from botocore.exceptions import ClientError
from dagster_aws.s3 import S3Resource

from ml_platform.ingestion.s3_landing import S3LandingZone
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.failures import (
    CONFIGURATION,
    DATA,
    RESOURCE_EXHAUSTION,
    StepFailure,
    classify_failure,
)
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


def test_a_damaged_lake_file_fails_the_day_reading_it_once_naming_file_and_day(platform_for):
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
    # A partial restore of the lake: the day's file cut in half.
    [stored] = (Path(platform.lake_dir) / "synthetic" / "raw_data" / DAY).iterdir()
    stored.write_bytes(stored.read_bytes()[: stored.stat().st_size // 2])

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
