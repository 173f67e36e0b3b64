"""The lake's storage on shapes the other storage tests do not try.

S3's answers come from the real S3 API server the suite starts (moto) where it gives them, else
from the same `naming` wrapper the S3 lake raises them through (as test_storage_errors does).
A lake folder the platform may not read is a real refusal of the kernel: the block runs as the
user `nobody` (the tests run as root, which every mode lets in).
"""

import contextlib
import os
import pwd
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from ml_platform.automation.lake_sweep import LakeSweepError, build_lake_sweep_sensors
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.failures import CONFIGURATION, classify_failure
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.s3 import S3Storage
from ml_platform.platform.storage import LocalStorage
from ml_platform.platform.storage_errors import PermanentStorageError, partition_errors
from ml_platform_tests.services import FAKE_AWS, s3_test_client
from ml_platform_tests.test_storage_errors import (
    DAY,
    NEXT_DAY,
    failure_of,
    s3_error,
    write_failing_with,
)


@pytest.fixture
def aws_env(monkeypatch):
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(
    ("code", "message", "advice"),
    [
        # S3 refuses every request signed more than 15 minutes off its own clock: the worker's
        # clock stays off while the retry policy waits, so each attempt is refused the same way.
        (
            "RequestTimeTooSkewed",
            "The difference between the request time and the current time is too large.",
            "the clock of the machine",
        ),
        # A lifecycle rule moved the object to Glacier: it reads only once a person restores it.
        (
            "InvalidObjectState",
            "The operation is not valid for the object's storage class",
            "the object is in an archive storage class",
        ),
    ],
    ids=["skewed-clock", "archived-object"],
)
def test_an_s3_refusal_no_wait_mends_fails_at_once_saying_what_to_do(
    tmp_path, code, message, advice
):
    stop = write_failing_with(s3_error(code, message), LocalStorage(base_dir=str(tmp_path)))

    assert isinstance(stop, PermanentStorageError), type(stop)
    assert not stop.allow_retries
    assert stop.description.startswith(f"synthetic/features partition {DAY}: writing ")
    assert f"Retrying cannot help: {advice}" in stop.description
    assert stop.description.endswith("Runbook: docs/runbook.md#configuration")
    verdict = classify_failure([failure_of(stop, "synthetic__features")], [])
    assert verdict.failure_class == CONFIGURATION


@pytest.mark.parametrize("url", ["s3://lake-root", "s3://lake-root/prod/my lake+é/"])
def test_listing_the_whole_s3_lake_lists_every_object_as_a_local_lake_does(
    s3_server, aws_env, tmp_path, url
):
    # The empty prefix is the whole lake (`check_key`): a directory lake lists every file
    # for it, and an S3 lake must not answer "nothing stored" instead.
    s3_test_client(s3_server).create_bucket(Bucket="lake-root")
    keys = ["flights/raw_data/2024-01-01/run-1.parquet", "synthetic/model/all.joblib"]
    lakes = [
        S3Storage(url=url, s3=S3Resource(endpoint_url=s3_server)),
        LocalStorage(base_dir=str(tmp_path / "lake")),
    ]
    for lake in lakes:
        for key in keys:
            lake.write_bytes(key, b"x")

    for lake in lakes:
        assert lake.list_keys("") == keys, lake
        assert lake.list_keys("flights/") == keys[:1], lake


@contextlib.contextmanager
def as_nobody() -> Iterator[None]:
    """Run the block as the unprivileged user `nobody`: the kernel refuses it what modes forbid.

    The tests run as root (as in CI), which every mode lets in; the effective user is switched
    back afterwards, as root may.
    """
    nobody = pwd.getpwnam("nobody")
    os.setegid(nobody.pw_gid)
    os.seteuid(nobody.pw_uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.fixture
def open_lake() -> Iterator[Path]:
    """A lake directory every user may enter (a pytest tmp_path sits in root's own folder)."""
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)
        yield Path(folder)


@pytest.mark.parametrize(
    "closed", [f"synthetic/validated_data/{NEXT_DAY}", "synthetic/validated_data"]
)
def test_a_lake_folder_the_platform_may_not_read_fails_listing_not_lists_it_empty(
    open_lake, closed
):
    # A folder another account made (a restore, a copy by hand) with a mode that shuts the
    # platform's user out: its days are stored, and a listing that skipped it would read as
    # "not stored", a hole in every window instead of the refusal to fix.
    storage = LocalStorage(base_dir=str(open_lake))
    keys = [f"synthetic/validated_data/{day}/run-0.parquet" for day in (DAY, NEXT_DAY)]
    for key in keys:
        storage.write_bytes(key, b"rows")
    os.chmod(open_lake / closed, 0o700)

    with as_nobody():
        for listing in (storage.list_keys, storage.partial_writes):
            key = asset_key("synthetic", "validated_data")
            with pytest.raises(PermanentStorageError) as raised, partition_errors(key, DAY):
                listing("synthetic/validated_data")

            stop = raised.value
            assert stop.description.startswith(
                f"synthetic/validated_data partition {DAY}: [Errno 13] listing "
                f"{open_lake.resolve()}/synthetic/validated_data failed: PermissionError"
            ), stop.description
            assert str(open_lake / closed) in stop.description
            assert "fix the owner and mode of the lake directory" in stop.description
    # Once the platform's user may read it, every stored day is listed.
    os.chmod(open_lake / closed, 0o755)
    with as_nobody():
        assert storage.list_keys("synthetic/validated_data") == keys


def test_the_sweep_sensor_sweeps_every_asset_of_a_failed_run_when_one_cannot_be(open_lake):
    # A killed worker left an unrecorded version of each of the run's two assets; the lake
    # refuses the listing of the first one's day. The second asset's file is still deleted,
    # and the tick fails naming the one it could not sweep, not the other.
    instance = dg.DagsterInstance.ephemeral()
    keys = [asset_key("synthetic", "features"), asset_key("synthetic", "validated_data")]
    run = instance.add_run(
        dg.DagsterRun(
            job_name="synthetic_daily_pipeline_job",
            run_id=str(uuid.uuid4()),
            status=dg.DagsterRunStatus.STARTED,
            asset_selection=frozenset(keys),
            tags={"dagster/partition": DAY},
        )
    )
    storage = LocalStorage(base_dir=str(open_lake))
    left = {key: f"{key.to_user_string()}/{DAY}/{run.run_id}-0.parquet" for key in keys}
    for stored in left.values():
        storage.write_bytes(stored, b"rows")
    # The lake is the platform's user's; the one folder another account's (root's), closed.
    nobody = pwd.getpwnam("nobody")
    for folder, _, files in os.walk(open_lake):
        for path in [folder, *(os.path.join(folder, name) for name in files)]:
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
    closed = open_lake / "synthetic" / "features" / DAY
    os.chown(closed, 0, 0)
    os.chmod(closed, 0o700)
    instance.report_run_failed(run)
    failure = instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE
    ).records[0]
    sweep = build_lake_sweep_sensors()[0]

    with (
        as_nobody(),
        dg.build_run_status_sensor_context(
            sensor_name=sweep.name,
            dagster_instance=instance,
            dagster_run=instance.get_run_by_id(run.run_id),
            dagster_event=failure.event_log_entry.dagster_event,
            resources={"io_manager": LakeIOManager(storage=storage)},
        ) as context,
        pytest.raises(LakeSweepError) as raised,
    ):
        sweep(context.for_run_failure())

    os.chmod(closed, 0o755)
    assert storage.list_keys("synthetic") == [left[keys[0]]]
    message = str(raised.value)
    assert message.startswith(f"run {run.run_id} failed; its unrecorded files of synthetic/")
    assert f"synthetic/features ({DAY}): [Errno 13] listing " in message
    assert f"Permission denied: {closed}" in message
    assert "synthetic/validated_data" not in message


def test_a_canceled_runs_unrecorded_files_are_swept_as_a_failed_runs(tmp_path):
    # The UI's Terminate (its force option kills the step at once) ends a run canceled, not
    # failed: what the step stored before recording it stayed until its days were run again.
    instance = dg.DagsterInstance.ephemeral()
    key = asset_key("synthetic", "features")
    run = instance.add_run(
        dg.DagsterRun(
            job_name="synthetic_daily_pipeline_job",
            run_id=str(uuid.uuid4()),
            status=dg.DagsterRunStatus.STARTED,
            asset_selection=frozenset([key]),
            tags={"dagster/partition": DAY},
        )
    )
    storage = LocalStorage(base_dir=str(tmp_path / "lake"))
    storage.write_bytes(f"synthetic/features/{DAY}/{run.run_id}-0.parquet", b"rows")
    instance.report_run_canceled(run)
    canceled = instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.RUN_CANCELED
    ).records[0]
    sweep = build_lake_sweep_sensors()[1]

    with dg.build_run_status_sensor_context(
        sensor_name=sweep.name,
        dagster_instance=instance,
        dagster_run=instance.get_run_by_id(run.run_id),
        dagster_event=canceled.event_log_entry.dagster_event,
        resources={"io_manager": LakeIOManager(storage=storage)},
    ) as context:
        sweep(context)

    assert storage.list_keys("synthetic") == []
