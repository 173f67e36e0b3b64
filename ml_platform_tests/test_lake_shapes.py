"""The lake on shapes its normal paths do not meet: keys that would leave it, a run that records
its day while the sweep looks at it, an S3 location whose bucket is no bucket name.

Storage is a real directory or a real S3 API server (moto); Dagster's records are a real
ephemeral instance.
"""

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

import ml_platform.platform.io_manager as io_manager_module
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.s3 import S3Storage
from ml_platform.platform.storage import LakeStorage, LocalStorage
from ml_platform.platform.storage_errors import (
    PermanentStorageError,
    UnsafeLakeKeyError,
    partition_errors,
)
from ml_platform_tests.services import FAKE_AWS, s3_test_client

DAY = "2024-01-01"
FEATURES = dg.AssetKey(["tiny", "features"])


@pytest.fixture
def aws_env(monkeypatch):
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path, aws_env) -> LakeStorage:
    if request.param == "local":
        return LocalStorage(base_dir=str(tmp_path / "lake"))
    endpoint = request.getfixturevalue("s3_server")
    s3_test_client(endpoint).create_bucket(Bucket="lake-bucket")
    return S3Storage(url="s3://lake-bucket/prod/lake", s3=S3Resource(endpoint_url=endpoint))


def outside_file(tmp_path: Path) -> Path:
    """A readable JSON file beside the lake directory, not in it."""
    path = tmp_path / "outside.json"
    path.write_text(json.dumps({"secret": "not the lake's"}))
    return path


@pytest.mark.parametrize(
    "recorded",
    [
        "../outside.json",
        "tiny/features/../../../outside.json",
        "{outside}",  # an absolute path
    ],
)
def test_a_recorded_lake_key_outside_the_lake_is_refused_not_read(tmp_path, recorded):
    outside = outside_file(tmp_path)
    recorded = recorded.format(outside=outside)
    instance = dg.DagsterInstance.ephemeral()
    # Anyone who can report an asset event sets the key a reader follows.
    instance.report_runless_asset_event(
        dg.AssetMaterialization(FEATURES, partition=DAY, metadata={"lake_key": recorded})
    )
    io_manager = LakeIOManager(storage=LocalStorage(base_dir=str(tmp_path / "lake")))

    with pytest.raises(UnsafeLakeKeyError) as caught:
        io_manager.load_recorded(instance, FEATURES, DAY, "json")

    assert not caught.value.allow_retries
    assert f"lake key {recorded!r} refused" in caught.value.description
    assert "outside the lake" in caught.value.description


@pytest.mark.parametrize("key", ["../escaped.json", "a/../../escaped.json", "{tmp}/escaped.json"])
def test_no_storage_call_reads_or_writes_outside_the_lake(storage, tmp_path, key):
    key = key.format(tmp=tmp_path)  # the lake is tmp_path/lake: each key is tmp_path/escaped.json
    for call in (
        lambda: storage.write_bytes(key, b"{}"),
        lambda: storage.write_with(key, lambda handle: handle.write(b"{}")),
        lambda: storage.read_bytes(key),
        lambda: storage.exists(key),
        lambda: storage.delete(key),
        lambda: storage.list_keys(key.rsplit("/", 1)[0] or "/"),
    ):
        with pytest.raises(UnsafeLakeKeyError):
            call()
    assert not (tmp_path / "escaped.json").exists()
    # A lake key, and a folder's with its trailing '/', are what they always were.
    storage.write_bytes("tiny/features/2024-01-01/run-0.json", b"{}")
    assert storage.list_keys("tiny/features/") == ["tiny/features/2024-01-01/run-0.json"]


def test_the_sweep_keeps_a_file_its_run_records_just_before_ending(tmp_path, monkeypatch):
    """Run A stores a day; while another run's step sweeps the day, A records it and fails later.

    The sweep read the records before A recorded the file and saw A ended after: it took the
    file of a good, recorded day for one no run recorded, and deleted it.
    """
    instance = dg.DagsterInstance.ephemeral()
    run = instance.add_run(
        dg.DagsterRun(
            job_name="daily", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED
        )
    )
    storage = LocalStorage(base_dir=str(tmp_path / "lake"))
    key = f"tiny/features/{DAY}/{run.run_id}-0.json"
    storage.write_bytes(key, b"{}")
    read_records = io_manager_module.recorded_lake_keys

    def records_then_run_records_and_ends(*args, **kwargs):
        recorded = read_records(*args, **kwargs)
        instance.report_runless_asset_event(
            dg.AssetMaterialization(FEATURES, partition=DAY, metadata={"lake_key": key})
        )
        instance.report_run_failed(run)
        return recorded

    monkeypatch.setattr(io_manager_module, "recorded_lake_keys", records_then_run_records_and_ends)
    io_manager = LakeIOManager(storage=storage)

    assert io_manager.sweep(instance, FEATURES, [DAY]) == []

    assert storage.exists(key)
    assert io_manager.load_recorded(instance, FEATURES, DAY, "json") == {}
    # Once ended and recorded, the run's file stays, and an unrecorded one of it goes.
    monkeypatch.setattr(io_manager_module, "recorded_lake_keys", read_records)
    unrecorded = f"tiny/features/{DAY}/{run.run_id}-1.json"
    storage.write_bytes(unrecorded, b"{}")
    assert io_manager.sweep(instance, FEATURES, [DAY]) == [unrecorded]
    assert storage.list_keys("tiny/features") == [key]


@pytest.mark.parametrize("url", ["s3://my lake/prod", "s3://minio.internal:9000/lake"])
def test_an_s3_location_whose_bucket_is_no_bucket_name_fails_at_once_naming_it(
    aws_env, s3_server, url
):
    lake = S3Storage(url=url, s3=S3Resource(endpoint_url=s3_server))

    with pytest.raises(PermanentStorageError) as caught, partition_errors(FEATURES, DAY):
        lake.write_bytes(f"tiny/features/{DAY}/run-0.json", b"{}")

    stop = caught.value
    assert not stop.allow_retries
    assert stop.description.startswith(
        f"tiny/features partition {DAY}: writing {url}/tiny/features/{DAY}/run-0.json failed: "
        "ParamValidationError"
    )
    assert "Retrying cannot help: the S3 client refuses the request's parameters" in (
        stop.description
    )
    assert "ML_PLATFORM_LAKE_URL" in stop.description


KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from ml_platform.platform.storage import LocalStorage

    def write(handle):
        handle.write(b"part of a day " * 100_000)
        handle.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer, mid-write

    LocalStorage(base_dir=sys.argv[1]).write_with(sys.argv[2], write)
    """
)


def test_the_sweep_deletes_what_a_killed_write_of_an_ended_run_left(tmp_path):
    """A worker killed mid-write leaves its temporary file (1.4 MB here, a day's parquet in
    production); the run ends (run monitoring records it failed) and its leftover goes with
    its unrecorded files. A running run's write in progress is left alone."""
    instance = dg.DagsterInstance.ephemeral()
    killed, running = (
        instance.add_run(
            dg.DagsterRun(
                job_name="daily", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED
            )
        )
        for _ in range(2)
    )
    lake = tmp_path / "lake"
    for run in (killed, running):
        worker = subprocess.run(
            [sys.executable, "-c", KILLED_WRITER, str(lake)]
            + [f"tiny/features/{DAY}/{run.run_id}-0.json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert worker.returncode == -9, worker.stderr[-2000:]
    storage = LocalStorage(base_dir=str(lake))
    left = storage.partial_writes("tiny/features")
    assert [key.rsplit("/", 1)[1].split(".")[1] for key in left] == sorted(
        f"{run.run_id}-0" for run in (killed, running)
    ), left
    # Readers never see it: it is no key.
    assert storage.list_keys("tiny/features") == []
    io_manager = LakeIOManager(storage=storage)
    assert io_manager.sweep(instance, FEATURES, [DAY]) == []  # both runs may still be going

    instance.report_run_failed(killed)

    [swept] = io_manager.sweep(instance, FEATURES, [DAY])
    assert swept.startswith(f"tiny/features/{DAY}/.{killed.run_id}-0.json.")
    assert storage.partial_writes("tiny/features") == [
        key for key in left if f"/.{running.run_id}-0.json." in key
    ]
