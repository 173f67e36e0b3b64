"""The landing sensor's cursor, on a local directory and on a real S3 API server on 127.0.0.1.

Edge cases: same modification time, overwrite, files moved or copied in with an older mtime, a
same-size rewrite, deletion, files that fit no partition, days that are not partitions yet, a
zone of 10 000 files walked a page per tick, a file first seen after someone already
materialised its day, and a cursor of the former mtime-watermark kind.
"""

import datetime as dt
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml
from botocore.awsrequest import AWSResponse
from dagster_aws.s3 import S3Resource
from moto.server import ThreadedMotoServer

from ml_platform.automation.alerts import Notifier
from ml_platform.automation.landing_sensor import (
    SLACK_SECONDS,
    LandingCursor,
    build_landing_sensor,
)
from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.ingestion.assets import LandingFileError, read_landed_stream
from ml_platform.ingestion.landing import (
    LANDED_FILE_TAG,
    LANDED_VERSION_TAG,
    LandedObject,
    LandingStore,
    LandingZone,
    LandingZoneMissingError,
    MissingLandingFileError,
    RefusedLandingFileError,
)
from ml_platform.ingestion.s3_landing import S3LandingZone
from ml_platform.platform.partitions import daily_partitions

SYNTHETIC = load_contract("synthetic")
JOB = "daily_pipeline_job"
DAY_AGO = time.time() - 86_400


def synthetic_name(day: str) -> str:
    return f"synthetic_{day}.csv"


class Sensor:
    """A landing sensor over a zone, evaluated tick by tick as the daemon would."""

    def __init__(self, zone: LandingStore, contract: Contract = SYNTHETIC, **options):
        self.zone = zone
        self.definition = build_landing_sensor(contract, daily_partitions(contract), JOB, **options)
        self.instance = dg.DagsterInstance.ephemeral()
        self.cursor: str | None = None
        self.notifier = Notifier()

    def tick(self) -> dg.SensorResult:
        # Entered: an S3 zone's nested S3Resource is set up and torn down with the context.
        with dg.build_sensor_context(
            instance=self.instance,
            cursor=self.cursor,
            resources={"landing": self.zone, "notifier": self.notifier},
        ) as context:
            result = self.definition(context)
        assert isinstance(result, dg.SensorResult)
        self.cursor = result.cursor
        return result

    def requested(self) -> list[str]:
        return [r.partition_key for r in self.tick().run_requests or []]


class PagesListed:
    """The entries each `list_page` call of a zone returned, in call order.

    How a tick's cost is bounded, asserted by what it reads rather than by a wall clock: a
    tick lists its pages and never the whole zone.
    """

    def __init__(self) -> None:
        self.pages: list[int] = []

    def take(self) -> list[int]:
        taken, self.pages = self.pages, []
        return taken


LISTED = PagesListed()


class CountedLocalZone(LandingZone):
    def list_page(self, after: str | None, limit: int) -> tuple[list[LandedObject], str | None]:
        objects, more = super().list_page(after, limit)
        LISTED.pages.append(len(objects))
        return objects, more


class CountedS3Zone(S3LandingZone):
    def list_page(self, after: str | None, limit: int) -> tuple[list[LandedObject], str | None]:
        objects, more = super().list_page(after, limit)
        LISTED.pages.append(len(objects))
        return objects, more


def write(zone_dir: Path, name: str, data: bytes = b"a,b\n1,2\n", mtime: float | None = None):
    zone_dir.mkdir(parents=True, exist_ok=True)
    path = zone_dir / name
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


@pytest.fixture
def local(tmp_path):
    directory = tmp_path / "landing"
    directory.mkdir()
    return directory, Sensor(LandingZone(base_dir=str(directory)))


def test_new_files_run_their_days_once(local):
    directory, sensor = local
    for day in ["2024-01-03", "2024-01-01", "2024-01-02"]:
        write(directory, synthetic_name(day))

    result = sensor.tick()

    requests = result.run_requests or []
    assert [r.partition_key for r in requests] == ["2024-01-01", "2024-01-02", "2024-01-03"]
    first = requests[0]
    stat = (directory / synthetic_name("2024-01-01")).lstat()
    version = f"{stat.st_ino}-{stat.st_size}-{stat.st_ctime_ns}"
    modified = max(stat.st_mtime, stat.st_ctime)
    assert first.run_key == f"2024-01-01|synthetic_2024-01-01.csv|{version}|{modified}"
    assert first.tags[LANDED_FILE_TAG] == str(directory / "synthetic_2024-01-01.csv")
    assert first.tags[LANDED_VERSION_TAG] == version
    assert sensor.requested() == []
    assert sensor.requested() == []


def test_an_overwritten_file_reruns_exactly_its_day_with_a_new_run_key(local):
    directory, sensor = local
    for day in ["2024-01-01", "2024-01-02", "2024-01-03"]:
        write(directory, synthetic_name(day), mtime=DAY_AGO)
    first = {r.partition_key: r.run_key for r in sensor.tick().run_requests or []}

    write(directory, synthetic_name("2024-01-02"), b"a,b\n1,3\n")  # corrected, mtime now
    again = sensor.tick().run_requests or []

    assert [r.partition_key for r in again] == ["2024-01-02"]
    assert again[0].run_key != first["2024-01-02"]
    assert sensor.requested() == []


def test_files_sharing_one_modification_time_are_each_handled_once(local):
    directory, sensor = local
    stamp = time.time() - 60
    write(directory, synthetic_name("2024-01-02"), mtime=stamp)
    assert sensor.requested() == ["2024-01-02"]

    # Lands later with the same mtime, and sorts *before* the file already handled: a cursor
    # of (mtime, key) alone would skip it.
    write(directory, synthetic_name("2024-01-01"), mtime=stamp)
    assert sensor.requested() == ["2024-01-01"]

    # Same mtime, different content (size): a new version.
    write(directory, synthetic_name("2024-01-02"), b"a,b\n1,2\n3,4\n", mtime=stamp)
    assert sensor.requested() == ["2024-01-02"]
    assert sensor.requested() == []


def test_an_unchanged_file_is_never_rerun_however_old(local):
    directory, sensor = local
    write(directory, synthetic_name("2024-01-01"), mtime=DAY_AGO)
    assert sensor.requested() == ["2024-01-01"]
    assert set(LandingCursor.loads(sensor.cursor).seen) == {synthetic_name("2024-01-01")}
    for _ in range(3):
        assert sensor.requested() == []


def prepared_elsewhere(tmp_path: Path, name: str, data: bytes, mtime: float) -> Path:
    """A finished file outside the zone, last modified long ago, ready to move in."""
    outside = tmp_path / "outbox"
    outside.mkdir(exist_ok=True)
    return write(outside, name, data, mtime=mtime)


def test_a_file_moved_in_with_an_older_mtime_runs_its_day(local, tmp_path):
    directory, sensor = local
    write(directory, synthetic_name("2024-01-01"))
    assert sensor.requested() == ["2024-01-01"]

    # Prepared a week ago and renamed into place: the standard atomic landing, which keeps the
    # old mtime. Once as a new day, once replacing a day already run.
    week_ago = time.time() - 7 * 86_400
    for day in ["2024-01-02", "2024-01-01"]:
        path = prepared_elsewhere(tmp_path, synthetic_name(day), b"a,b\n9,9\n", week_ago)
        os.rename(path, directory / synthetic_name(day))
        assert (directory / synthetic_name(day)).stat().st_mtime == pytest.approx(week_ago)
        assert sensor.requested() == [day]
        assert sensor.requested() == []


def test_a_copy_keeping_its_mtime_runs_its_day(local, tmp_path):
    directory, sensor = local
    write(directory, synthetic_name("2024-01-01"), mtime=DAY_AGO)
    assert sensor.requested() == ["2024-01-01"]
    week_ago = time.time() - 7 * 86_400

    # `cp -p`, as shutil.copy2 does: the copy carries the source's week-old mtime, over a file
    # the sensor has seen and as a new day.
    for day in ["2024-01-01", "2024-01-03"]:
        source = prepared_elsewhere(tmp_path, synthetic_name(day), b"a,b\n4,4\n", week_ago)
        shutil.copy2(source, directory / synthetic_name(day))
        assert sensor.requested() == [day]
    assert sensor.requested() == []


def test_a_same_size_rewrite_with_the_same_mtime_runs_its_day_again(local):
    directory, sensor = local
    path = write(directory, synthetic_name("2024-01-01"), b"a,b\n1,2\n", mtime=DAY_AGO)
    before = path.stat()
    assert sensor.requested() == ["2024-01-01"]

    # Rewritten in place (same inode), same size, its mtime put back: only its ctime moved.
    path.write_bytes(b"a,b\n3,4\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    assert sensor.requested() == ["2024-01-01"]
    assert sensor.requested() == []


def test_a_cursor_of_the_mtime_watermark_kind_is_taken_over_without_rerunning_the_zone(
    local, tmp_path
):
    directory, sensor = local
    write(directory, synthetic_name("2024-01-01"), mtime=DAY_AGO)
    write(directory, synthetic_name("2024-01-02"), mtime=DAY_AGO)
    # What the sensor stored before it kept a version per file: a walk that began after both
    # files landed (a ctime cannot be set back, so the watermark is put after the files).
    watermark = time.time() + SLACK_SECONDS + 60
    sensor.cursor = json.dumps(
        {"v": 1, "watermark": watermark, "seen": {}, "walk": None, "pending": {}}
    )

    assert sensor.requested() == []
    cursor = LandingCursor.loads(sensor.cursor)
    assert cursor.walked and cursor.legacy_watermark is None
    assert set(cursor.seen) == {synthetic_name("2024-01-01"), synthetic_name("2024-01-02")}
    # From now on a version decides, not the watermark: a file moved in with an old mtime runs.
    path = prepared_elsewhere(tmp_path, synthetic_name("2024-01-02"), b"a,b\n0,0\n", DAY_AGO)
    os.rename(path, directory / synthetic_name("2024-01-02"))
    assert sensor.requested() == ["2024-01-02"]


def test_deleted_files_do_nothing(local):
    directory, sensor = local
    for day in ["2024-01-01", "2024-01-02"]:
        write(directory, synthetic_name(day))
    assert sensor.requested() == ["2024-01-01", "2024-01-02"]

    (directory / synthetic_name("2024-01-01")).unlink()

    assert sensor.requested() == []
    assert set(LandingCursor.loads(sensor.cursor).seen) == {synthetic_name("2024-01-02")}
    # Landing it again is a new delivery.
    write(directory, synthetic_name("2024-01-01"), b"a,b\n5,6\n")
    assert sensor.requested() == ["2024-01-01"]


def test_a_zone_whose_directory_is_gone_fails_the_tick_and_forgets_nothing(local, tmp_path):
    directory, sensor = local
    for day in ["2024-01-01", "2024-01-02"]:
        write(directory, synthetic_name(day))
    assert sensor.requested() == ["2024-01-01", "2024-01-02"]
    seen = sensor.cursor

    # The volume is unmounted (the directory moved away): not an empty zone.
    directory.rename(tmp_path / "unmounted")
    with pytest.raises(LandingZoneMissingError, match=f"the landing zone {directory} does not"):
        sensor.tick()
    assert sensor.cursor == seen

    # Nor is a look-up of one day's file (the freshness sensor's) "no file yet": it would call
    # every watched day late and page the data's owners for a volume that is not mounted.
    with pytest.raises(LandingZoneMissingError, match=f"the landing zone {directory} does not"):
        LandingZone(base_dir=str(directory)).find(synthetic_name("2024-01-01"))

    # Mounted again: every file is one the sensor has seen, so no day runs again.
    (tmp_path / "unmounted").rename(directory)
    assert sensor.requested() == []
    assert LandingZone(base_dir=str(directory)).find(synthetic_name("2024-01-09")) is None


def test_files_being_written_are_not_listed(local):
    directory, sensor = local
    write(directory, ".synthetic_2024-01-01.csv.abc.tmp")
    assert sensor.requested() == []


def test_a_file_without_a_valid_date_is_logged_and_alerted_not_skipped(local, caplog):
    directory, sensor = local
    write(directory, "synthetic_2024-13-45.csv")
    write(directory, "notes.txt")
    write(directory, synthetic_name("2023-12-31"))  # before the first partition
    write(directory, synthetic_name("2024-01-01"))

    with caplog.at_level(logging.WARNING, logger="ml_platform.alerts"):
        result = sensor.tick()

    assert [r.partition_key for r in result.run_requests or []] == ["2024-01-01"]
    alerts = [r.getMessage() for r in caplog.records if r.name == "ml_platform.alerts"]
    assert len(alerts) == 1
    assert '"rule": "landing_misfit"' in alerts[0]
    assert '"severity": "WARNING"' in alerts[0]
    assert "3 landed file(s) fit no partition of synthetic" in alerts[0]
    for name in ["synthetic_2024-13-45.csv", "notes.txt", "synthetic_2023-12-31.csv"]:
        assert name in alerts[0]
    assert "no parsable date" in alerts[0]
    assert "before the first partition 2024-01-01" in alerts[0]
    assert "docs/runbook.md#landing-file-fits-no-partition" in alerts[0]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ml_platform.alerts"):
        assert sensor.tick().run_requests == []
    assert not [r for r in caplog.records if r.name == "ml_platform.alerts"]


def test_a_day_that_is_not_a_partition_yet_waits_until_it_is(local):
    directory, sensor = local
    tomorrow = (dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)).isoformat()
    write(directory, synthetic_name(tomorrow))

    assert sensor.requested() == []
    assert synthetic_name(tomorrow) in LandingCursor.loads(sensor.cursor).pending

    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)
    with dg.partition_loading_context(effective_dt=later):
        assert sensor.requested() == [tomorrow]
    assert LandingCursor.loads(sensor.cursor).pending == {}
    assert sensor.requested() == []


def test_turning_the_sensor_on_does_not_rerun_days_already_materialised(local):
    directory, sensor = local
    write(directory, synthetic_name("2024-01-01"), mtime=DAY_AGO)
    write(directory, synthetic_name("2024-01-02"), mtime=DAY_AGO)
    # As `make run` does: land days and materialise them at once.
    write(directory, synthetic_name("2024-01-03"))
    time.sleep(1.1)  # the local zone's mtime slack
    for day in ["2024-01-01", "2024-01-03"]:
        sensor.instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key=["synthetic", "raw_data"], partition=day)
        )

    assert sensor.requested() == ["2024-01-02"]
    # A corrected file for a materialised day still reruns it.
    write(directory, synthetic_name("2024-01-01"), b"a,b\n7,8\n")
    assert sensor.requested() == ["2024-01-01"]


def contract_from(tmp_path: Path, start: str) -> Contract:
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["partitions"]["start_date"] = start
    path = tmp_path / "synthetic_long.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_contract(path)


def test_ten_thousand_local_files_are_walked_a_page_per_tick(tmp_path):
    contract = contract_from(tmp_path, "1990-01-01")
    directory = tmp_path / "landing"
    directory.mkdir()
    first = dt.date(1990, 1, 1)
    days = [(first + dt.timedelta(days=i)).isoformat() for i in range(10_000)]
    for day in days:
        write(directory, synthetic_name(day), b"x", mtime=DAY_AGO)
    sensor = Sensor(
        CountedLocalZone(base_dir=str(directory)), contract, page_size=1000, pages_per_tick=1
    )
    LISTED.take()

    requested: list[str] = []
    for _ in range(10):
        result = sensor.tick()
        requested += [r.partition_key for r in result.run_requests or []]
        assert len(result.run_requests or []) == 1000
        assert LISTED.take() == [1000]  # one page of entries looked at, never the zone

    assert requested == days
    cursor = LandingCursor.loads(sensor.cursor)
    assert cursor.walk is None and cursor.walked and len(cursor.seen) == 10_000
    # A second walk finds nothing new, still a page per tick, and the cursor stays compact:
    # a version per file, compressed.
    for _ in range(10):
        assert sensor.requested() == []
        assert LISTED.take() == [1000]
    assert len(sensor.cursor or "") < 150_000


def test_a_tick_requests_at_most_its_limit_and_the_walk_resumes_mid_page(tmp_path):
    directory = tmp_path / "landing"
    days = [(dt.date(2024, 1, 1) + dt.timedelta(days=i)).isoformat() for i in range(25)]
    for day in days:
        write(directory, synthetic_name(day), mtime=DAY_AGO)
    sensor = Sensor(LandingZone(base_dir=str(directory)), page_size=10, max_requests_per_tick=4)

    per_tick = [sensor.requested() for _ in range(7)]

    assert [len(requested) for requested in per_tick] == [4, 4, 4, 4, 4, 4, 1]
    assert [day for requested in per_tick for day in requested] == days
    assert LandingCursor.loads(sensor.cursor).walk is None
    assert sensor.requested() == []


@pytest.fixture(scope="module")
def s3_endpoint():
    """A real S3 API (moto in server mode) on 127.0.0.1, with test credentials."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def s3_zone(s3_endpoint, request):
    bucket = f"landing-{request.node.name.replace('_', '-')[:40].lower()}"
    zone = S3LandingZone(url=f"s3://{bucket}/incoming", s3=S3Resource(endpoint_url=s3_endpoint))
    zone.client().create_bucket(Bucket=bucket)
    return zone


def put(zone: S3LandingZone, name: str, data: bytes = b"a,b\n1,2\n") -> None:
    zone.client().put_object(Bucket=zone.bucket, Key=zone.prefix + name, Body=data)


def test_s3_new_overwritten_unchanged_and_deleted_objects(s3_zone):
    sensor = Sensor(s3_zone)
    for day in ["2024-01-01", "2024-01-02", "2024-01-03"]:
        put(s3_zone, synthetic_name(day))
    put(s3_zone, "synthetic_20240104.csv")  # no valid date

    first = sensor.tick().run_requests or []
    assert [r.partition_key for r in first] == ["2024-01-01", "2024-01-02", "2024-01-03"]
    etag = first[1].tags[LANDED_VERSION_TAG]
    assert first[1].run_key.startswith(f"2024-01-02|synthetic_2024-01-02.csv|{etag}|")
    assert (
        first[1].tags[LANDED_FILE_TAG] == f"s3://{s3_zone.bucket}/incoming/synthetic_2024-01-02.csv"
    )
    assert sensor.requested() == []

    put(s3_zone, synthetic_name("2024-01-02"), b"a,b\n9,9\n")  # corrected
    again = sensor.tick().run_requests or []
    assert [r.partition_key for r in again] == ["2024-01-02"]
    assert again[0].run_key != first[1].run_key

    # Uploaded again with the same bytes: a new LastModified, the same ETag, nothing to do.
    put(s3_zone, synthetic_name("2024-01-02"), b"a,b\n9,9\n")
    assert sensor.requested() == []

    s3_zone.client().delete_object(Bucket=s3_zone.bucket, Key="incoming/synthetic_2024-01-01.csv")
    assert sensor.requested() == []


def test_s3_an_earlier_version_put_back_after_a_correction_runs_its_day_again(s3_zone):
    sensor = Sensor(s3_zone)
    name = synthetic_name("2024-01-01")
    keys = []
    # The first delivery, its correction, then the first put back: each is what the day holds.
    for data in (b"a,b\n1,2\n", b"a,b\n9,9\n", b"a,b\n1,2\n"):
        # Deliveries seconds apart at least, as they come: S3 stamps LastModified to the second.
        time.sleep(1.1)
        put(s3_zone, name, data)
        [request] = sensor.tick().run_requests or []
        keys.append(request.run_key)
    # The ETag of the first content comes back; a run key used before would be skipped by the
    # daemon (one run per run key), leaving the day on the correction the zone no longer holds.
    assert len(set(keys)) == 3


def test_a_name_that_is_not_utf8_is_refused_by_name_and_the_zone_goes_on(local, caplog):
    directory, sensor = local
    write(directory, synthetic_name("2024-01-01"))
    # "données.csv" from a system writing latin-1: the name's bytes are no UTF-8.
    with open(os.path.join(os.fsencode(directory), "donn\xe9es.csv".encode("latin-1")), "wb") as f:
        f.write(b"x")

    with caplog.at_level(logging.WARNING, logger="ml_platform.alerts"):
        result = sensor.tick()

    assert [r.partition_key for r in result.run_requests or []] == ["2024-01-01"]
    [alert] = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ml_platform.alerts"]
    assert "donn\\xe9es.csv: its name is not valid UTF-8" in alert["alert"]["cause"]
    assert sensor.requested() == []


def test_a_dataset_whose_pattern_extends_anothers_runs_its_own_files(local, tmp_path, caplog):
    directory, _ = local

    def dataset(name: str) -> Contract:
        document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
        document["name"] = name
        document["landing"]["file_pattern"] = f"{name}_{{date}}.csv"
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(document))
        return load_contract(path)

    sales, returns = dataset("sales"), dataset("sales_returns")
    for name in ("sales_2024-01-01.csv", "sales_returns_2024-01-02.csv", "sales_notes.csv"):
        write(directory, name)
    zone = LandingZone(base_dir=str(directory))
    served = [sales, returns]

    # sales' pattern fits "sales_returns_2024-01-02.csv" too (its "date" returns_2024-01-02):
    # the file is the dataset's whose pattern spells more of its name.
    def alerted() -> list[str]:
        alerts = [r.getMessage() for r in caplog.records if r.name == "ml_platform.alerts"]
        caplog.clear()
        return alerts

    with caplog.at_level(logging.WARNING, logger="ml_platform.alerts"):
        assert Sensor(zone, sales, other_datasets=served).requested() == ["2024-01-01"]
        # A file only sales' pattern fits is sales' to report, and only sales'.
        [misfit] = alerted()
        assert "sales_notes.csv" in misfit and "sales_returns" not in misfit
        assert Sensor(zone, returns, other_datasets=served).requested() == ["2024-01-02"]
        assert alerted() == []


def test_s3_reads_a_landed_object_and_names_a_missing_one(s3_zone):
    put(s3_zone, synthetic_name("2024-01-01"), b"x,y\n")
    assert s3_zone.read_bytes(synthetic_name("2024-01-01"), "2024-01-01") == b"x,y\n"
    assert [o.name for o in s3_zone.entries() if o.refused is None] == [
        synthetic_name("2024-01-01")
    ]
    with pytest.raises(
        FileNotFoundError,
        match="No landed file for partition 2024-01-09: "
        "expected s3://.*/incoming/synthetic_2024-01-09.csv",
    ):
        s3_zone.read_bytes(synthetic_name("2024-01-09"), "2024-01-09")


def answer_a_missing_key_forbidden(zone: S3LandingZone) -> None:
    """The zone's client answers HEAD and GET of a key absent from the bucket with 403.

    What AWS answers a user without an unconditional s3:ListBucket, as under the project's own
    least-privilege policy (deploy/iam-policy.json); moto's server does not model that rule,
    so the answer is given before the request is sent, for absent keys only.
    """

    class Body:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def stream(self, **_: object):
            yield self.data

    denied = (
        b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code>"
        b"<Message>Access Denied</Message></Error>"
    )

    def hook(request, event_name: str = "", **_: object):
        operation = event_name.rsplit(".", 1)[-1]
        if operation not in ("HeadObject", "GetObject"):
            return None
        key = request.url.split(f"/{zone.bucket}/", 1)[1].split("?", 1)[0]
        listed = zone.client().list_objects_v2(Bucket=zone.bucket, Prefix=key, MaxKeys=1)
        if any(item["Key"] == key for item in listed.get("Contents", [])):
            return None
        return AWSResponse(request.url, 403, {}, Body(b"" if operation == "HeadObject" else denied))

    zone.client().meta.events.register("before-send.s3.*", hook)


def test_s3_a_day_not_landed_is_missing_not_forbidden_under_the_least_privilege_policy(s3_zone):
    answer_a_missing_key_forbidden(s3_zone)
    put(s3_zone, synthetic_name("2024-01-01"))
    name = synthetic_name("2024-01-02")

    # The freshness sensor's look-up: not landed yet, not a permissions error.
    assert s3_zone.find(name) is None
    found = s3_zone.find(synthetic_name("2024-01-01"))
    assert found is not None and found.name == synthetic_name("2024-01-01")
    # raw_data's read: the day's verdict (no file landed), not a configuration failure.
    with pytest.raises(MissingLandingFileError, match="No landed file for partition 2024-01-02"):
        s3_zone.read_bytes(name, "2024-01-02")
    assert s3_zone.read_bytes(synthetic_name("2024-01-01"), "2024-01-01") == b"a,b\n1,2\n"


def test_s3_landed_object_is_parsed_and_hashed_as_it_streams(s3_zone):
    whole, cut = b"x,y\n1,a\n2,b\n", b"x,y\n1,a\n2,b\n3"
    put(s3_zone, synthetic_name("2024-01-01"), whole)
    with s3_zone.open_file(synthetic_name("2024-01-01"), "2024-01-01") as stream:
        landed = read_landed_stream(stream, synthetic_name("2024-01-01"), "2024-01-01")
    assert landed.frame.to_dict("list") == {"x": [1, 2], "y": ["a", "b"]}
    assert (landed.sha256, landed.size) == (hashlib.sha256(whole).hexdigest(), len(whole))

    put(s3_zone, synthetic_name("2024-01-02"), cut)
    with (
        pytest.raises(LandingFileError, match="partition 2024-01-02.*truncated"),
        s3_zone.open_file(synthetic_name("2024-01-02"), "2024-01-02") as stream,
    ):
        read_landed_stream(stream, synthetic_name("2024-01-02"), "2024-01-02")
    with (
        pytest.raises(FileNotFoundError, match="No landed file for partition 2024-01-09"),
        s3_zone.open_file(synthetic_name("2024-01-09"), "2024-01-09"),
    ):
        pass


def test_s3_keys_that_could_leave_the_prefix_are_refused_alerted_once_and_never_read(
    s3_zone, monkeypatch, caplog, capsys
):
    put(s3_zone, synthetic_name("2024-01-01"))
    tricks = {
        "../synthetic_2024-01-02.csv": "'..' segment",
        "./synthetic_2024-01-03.csv": "'.' or '..' segment",
        "/etc/synthetic_2024-01-04.csv": "absolute path",  # incoming//etc/...
    }
    for name in tricks:
        put(s3_zone, name, b"secret,line\n1,2\n")
    listed = {o.name: o.refused for o in s3_zone.entries()}
    assert set(listed) == {synthetic_name("2024-01-01"), *tricks}, listed
    sensor = Sensor(s3_zone)

    with caplog.at_level(logging.WARNING, logger="ml_platform.alerts"):
        assert sensor.requested() == ["2024-01-01"]
        assert sensor.requested() == []
    [alert] = [r.getMessage() for r in caplog.records if r.name == "ml_platform.alerts"]
    assert "3 landed file(s) of synthetic refused or fit no partition" in alert
    for name, reason in tricks.items():
        assert name in alert and reason in alert
        assert listed[name] is not None and reason in listed[name]
        with (
            pytest.raises(RefusedLandingFileError, match="refused"),
            s3_zone.open_file(name, "2024-01-02"),
        ):
            pass
    assert "secret,line" not in caplog.text

    from ml_platform.cli import main

    monkeypatch.setenv("ML_PLATFORM_LANDING_URL", s3_zone.url)
    monkeypatch.setenv("ML_PLATFORM_S3_ENDPOINT_URL", s3_zone.s3.endpoint_url or "")
    assert main(["landing-status", "--dataset", "synthetic"]) == 1
    out = capsys.readouterr()
    assert "1 day file(s) of synthetic" in out.out
    for name, reason in tricks.items():
        assert f"{s3_zone.path_for(name)} is refused" in out.err and reason in out.err
    assert "secret,line" not in out.out + out.err


def test_ten_thousand_s3_objects_keep_each_tick_short(s3_zone, tmp_path):
    from moto.s3.models import s3_backends

    contract = contract_from(tmp_path, "1990-01-01")
    first = dt.date(1990, 1, 1)
    days = [(first + dt.timedelta(days=i)).isoformat() for i in range(10_000)]
    # Seeded straight into the server's store: 10 000 PUTs over HTTP would take minutes. Every
    # listing below still goes through the S3 API over HTTP.
    backend = s3_backends["123456789012"]["aws"]
    for day in days:
        backend.put_object(s3_zone.bucket, f"incoming/{synthetic_name(day)}", b"x")
    zone = CountedS3Zone(url=s3_zone.url, s3=s3_zone.s3)
    sensor = Sensor(zone, contract, page_size=1000, pages_per_tick=2)
    LISTED.take()

    requested: list[str] = []
    for _ in range(5):
        result = sensor.tick()
        requested += [r.partition_key for r in result.run_requests or []]
        # Two ListObjectsV2 pages per tick, never the whole bucket.
        assert LISTED.take() == [1000, 1000]

    assert requested == days
    assert LandingCursor.loads(sensor.cursor).walk is None


def test_the_landing_zone_is_chosen_by_configuration(monkeypatch, tmp_path):
    from ml_platform.cli import configured
    from ml_platform.definitions import defs

    monkeypatch.setenv("ML_PLATFORM_DATASET", "synthetic")
    monkeypatch.setenv("ML_PLATFORM_LANDING_DIR", str(tmp_path))
    monkeypatch.delenv("ML_PLATFORM_LANDING_URL", raising=False)
    assert isinstance(defs().resources["landing"], LandingZone)

    monkeypatch.setenv("ML_PLATFORM_LANDING_URL", "s3://deliveries/flights/daily")
    monkeypatch.setenv("ML_PLATFORM_S3_ENDPOINT_URL", "http://127.0.0.1:9000")
    landing = defs().resources["landing"]
    assert isinstance(landing, S3LandingZone)
    # Variables, not values: the UI shows where the configuration comes from.
    assert landing.url == dg.EnvVar("ML_PLATFORM_LANDING_URL")
    with configured(landing) as resolved:
        assert (resolved.bucket, resolved.prefix) == ("deliveries", "flights/daily/")
        assert resolved.s3.endpoint_url == "http://127.0.0.1:9000"

    monkeypatch.setenv("ML_PLATFORM_LANDING_URL", "https://deliveries/flights")
    with pytest.raises(ValueError, match="ML_PLATFORM_LANDING_URL='https://deliveries/flights'"):
        defs()
