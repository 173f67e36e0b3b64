"""Versions of landed files that change without their content: a chmod, a touch, a re-upload.

The landing sensor and the freshness sensor over a real local landing zone, ticked as the
daemon ticks them; what a metadata change must not do (alert a misfit again, make an on-time
delivery late) and what a real change of content still does.
"""

import dataclasses
import datetime as dt
import logging
import os
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from ml_platform.automation.alerts import Notifier
from ml_platform.automation.freshness import (
    AWAITING,
    DayFreshness,
    FreshnessCursor,
    day_freshness,
    first_arrivals,
    judge_days,
)
from ml_platform.automation.landing_sensor import build_landing_sensor
from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import FreshnessSpec
from ml_platform.ingestion.landing import LandedObject, LandingZone
from ml_platform.platform.partitions import daily_partitions

SYNTHETIC = load_contract("synthetic")
ALERTS = "ml_platform.alerts"


class Sensor:
    """The landing sensor over a local zone, evaluated tick by tick as the daemon would."""

    def __init__(
        self,
        directory: Path,
        contract: Contract = SYNTHETIC,
        instance: dg.DagsterInstance | None = None,
    ):
        self.zone = LandingZone(base_dir=str(directory))
        self.definition = build_landing_sensor(
            contract, daily_partitions(contract), "daily_pipeline_job"
        )
        self.instance = instance or dg.DagsterInstance.ephemeral()
        self.cursor: str | None = None

    def tick(self) -> dg.SensorResult:
        # Identical alerts are not deduplicated: what a chmod an hour later meets.
        resources = {"landing": self.zone, "notifier": Notifier(dedup_seconds=0)}
        with dg.build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources=resources
        ) as context:
            result = self.definition(context)
        assert isinstance(result, dg.SensorResult)
        self.cursor = result.cursor
        return result


def alerted(sensor: Sensor, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The alerts one tick raised (each a JSON line on the alerts logger)."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=ALERTS):
        sensor.tick()
    return [r.getMessage() for r in caplog.records if r.name == ALERTS]


def skipped(result: dg.SensorResult) -> str:
    """Why the tick requested no run, as the UI shows it ("" if it requested runs)."""
    return result.skip_reason.skip_message or "" if result.skip_reason else ""


def metadata_changed(path: Path) -> None:
    """A chown, a chmod and a touch: the entry's ctime (and mtime) move, its bytes do not."""
    found = os.lstat(path)
    time.sleep(0.02)  # the file system's clock ticks in milliseconds at best
    os.chown(path, found.st_uid, found.st_gid, follow_symlinks=False)
    if not path.is_symlink():  # a link has no mode of its own on Linux
        os.chmod(path, 0o640)
    os.utime(path, follow_symlinks=False)
    assert os.lstat(path).st_ctime_ns != found.st_ctime_ns


def test_a_chmod_or_touch_of_a_misfit_or_refused_entry_alerts_nothing_again(tmp_path, caplog):
    directory = tmp_path / "landing"
    directory.mkdir()
    misfit = directory / "synthetic_2024-13-45.csv"
    misfit.write_bytes(b"a,b\n1,2\n")
    notes = directory / "notes.txt"
    notes.write_bytes(b"hello\n")
    link = directory / "synthetic_2024-01-05.csv"
    link.symlink_to(notes)
    folder = directory / "processed"
    folder.mkdir()
    sensor = Sensor(directory)

    [first] = alerted(sensor, caplog)
    for name in [misfit.name, notes.name, link.name, folder.name]:
        assert name in first

    # An hourly `chmod -R g+r` of the zone, a touch by a sync tool, an archive job filing a
    # file in `processed/`: nothing that was alerted is different.
    for path in [misfit, notes, link]:
        metadata_changed(path)
    (folder / "synthetic_2024-01-01.csv").write_bytes(b"a,b\n1,2\n")
    assert alerted(sensor, caplog) == []
    assert alerted(sensor, caplog) == []

    # A real change of content is alerted again: the misfit rewritten, a new link put there.
    misfit.write_bytes(b"a,b\n1,2\n3,4\n")
    link.unlink()
    link.symlink_to(folder / "synthetic_2024-01-01.csv")
    [again] = alerted(sensor, caplog)
    assert misfit.name in again and link.name in again
    assert notes.name not in again
    assert alerted(sensor, caplog) == []


def test_a_misfit_renamed_to_its_days_name_runs_that_day(tmp_path, caplog):
    directory = tmp_path / "landing"
    directory.mkdir()
    (directory / "Synthetic_2024-01-02.CSV").write_bytes(b"a,b\n1,2\n")
    sensor = Sensor(directory)
    assert len(alerted(sensor, caplog)) == 1

    (directory / "Synthetic_2024-01-02.CSV").rename(directory / "synthetic_2024-01-02.csv")
    assert [r.partition_key for r in sensor.tick().run_requests or []] == ["2024-01-02"]
    metadata_changed(directory / "synthetic_2024-01-02.csv")
    # A readable file of a day is remembered by its version: its bytes are compared then.
    assert [r.partition_key for r in sensor.tick().run_requests or []] == ["2024-01-02"]


def days_from(start: dt.date) -> Contract:
    """The synthetic contract with its partitions starting on `start`."""
    return SYNTHETIC.model_copy(
        update={"partitions": SYNTHETIC.partitions.model_copy(update={"start_date": start})}
    )


def test_a_file_for_a_day_far_ahead_is_told_once_and_runs_when_its_day_has_ended(tmp_path, capsys):
    directory = tmp_path / "landing"
    directory.mkdir()
    today = dt.datetime.now(dt.UTC).date()
    tomorrow = (today + dt.timedelta(days=1)).isoformat()
    ahead = (today + dt.timedelta(days=10)).isoformat()  # a date typed wrong, or sent early
    (directory / f"synthetic_{tomorrow}.csv").write_bytes(b"a,b\n1,2\n")
    (directory / f"synthetic_{ahead}.csv").write_bytes(b"a,b\n1,2\n")
    sensor = Sensor(directory, days_from(today - dt.timedelta(days=3)))

    capsys.readouterr()
    result = sensor.tick()
    assert result.run_requests == []
    assert f"synthetic_{ahead}.csv waits for its day {ahead}" in skipped(result)
    assert tomorrow not in skipped(result)  # a time zone ahead delivers it early
    # The tick's log (Dagster's sensor logger writes to stderr here, the daemon's log there).
    [warning] = [line for line in capsys.readouterr().err.splitlines() if " - WARNING - " in line]
    assert f"synthetic_{ahead}.csv is for {ahead}, more than a day ahead" in warning
    assert "waits for its day" in warning

    os.chmod(directory / f"synthetic_{ahead}.csv", 0o640)  # a new version: told once all the same
    assert "waits" not in skipped(sensor.tick())
    assert " - WARNING - " not in capsys.readouterr().err

    after = dt.datetime.combine(
        dt.date.fromisoformat(ahead) + dt.timedelta(days=1), dt.time(1), dt.UTC
    )
    with dg.partition_loading_context(effective_dt=after):
        requested = [r.partition_key for r in sensor.tick().run_requests or []]
    assert requested == [tomorrow, ahead]


def due_at_midnight(start: dt.date) -> Contract:
    """Days from `start` whose file is due at midnight UTC after the day, watched for a day."""
    return days_from(start).model_copy(
        update={"freshness": FreshnessSpec(expected_by="00:00", lookback_days=1)}
    )


def test_a_chmod_after_the_deadline_keeps_when_the_files_content_arrived(tmp_path):
    # Today's file lands now, in time; the freshness sensor watches it from its deadline on,
    # then a chmod (a permissions job, a sync) moves the file's ctime.
    today = dt.datetime.now(dt.UTC).date()
    contract = due_at_midnight(today)
    directory = tmp_path / "landing"
    directory.mkdir()
    path = directory / f"synthetic_{today}.csv"
    path.write_bytes(b"a,b\n1,2\n")
    zone = LandingZone(base_dir=str(directory))
    instance = dg.DagsterInstance.ephemeral()
    deadline = dt.datetime.combine(today + dt.timedelta(days=1), dt.time(), dt.UTC)
    cursor = FreshnessCursor()

    def judged(now: dt.datetime) -> DayFreshness:
        [status] = day_freshness(contract, zone, instance, now, arrived=cursor.arrived)
        return status

    landed_at = judged(deadline + dt.timedelta(minutes=1)).landed_at
    metadata_changed(path)
    cursor = FreshnessCursor.loads(cursor.dumps())  # kept across ticks and restarts
    after = judged(deadline + dt.timedelta(minutes=2))
    assert after.landed_at == landed_at
    assert after.landed_at is not None
    assert after.landed_at.timestamp() < os.lstat(path).st_ctime

    # New bytes are a new delivery, arriving now.
    path.write_bytes(b"a,b\n1,2\n3,4\n")
    corrected = judged(deadline + dt.timedelta(minutes=3))
    assert corrected.landed_at is not None
    found = os.lstat(path)
    assert corrected.landed_at.timestamp() == pytest.approx(max(found.st_mtime, found.st_ctime))


def test_an_entry_whose_metadata_changed_after_the_deadline_is_not_late():
    # The judgement over what the listing reports: the same content (inode and size), its
    # ctime moved past the deadline by a chmod.
    contract = due_at_midnight(dt.date(2024, 3, 1))
    late_at = dt.datetime(2024, 3, 5, tzinfo=dt.UTC)
    now = late_at + dt.timedelta(minutes=30)
    on_time = LandedObject(
        name="synthetic_2024-03-04.csv",
        modified=(late_at - dt.timedelta(hours=3)).timestamp(),
        version="7-100-1",
        content="7-100",
    )
    chmodded = dataclasses.replace(
        on_time, modified=(late_at + dt.timedelta(minutes=20)).timestamp(), version="7-100-2"
    )
    arrived: dict[str, list[Any]] = {}

    first_arrivals({"2024-03-04": on_time}, arrived)
    landed = first_arrivals({"2024-03-04": chmodded}, arrived)

    [status] = judge_days(contract, now, landed, {})
    assert (status.state, status.late) == (AWAITING, False)
    assert status.landed_at == dt.datetime.fromtimestamp(on_time.modified, dt.UTC)
    # What the judgement said of the chmodded entry as the listing reports it:
    [unremembered] = judge_days(contract, now, {"2024-03-04": chmodded}, {})
    assert unremembered.late


def test_turning_the_sensor_on_after_a_chmod_of_the_zone_reruns_no_day_already_read(
    platform_for,
):
    # `make run` landed and ran the days with the sensor off; then the zone's files were
    # chmodded (or rsynced to a new volume): each one's ctime is now after its day's run.
    platform = platform_for("synthetic")
    platform.land("2024-01-01", 2)
    assert platform.materialize("2024-01-01", selection=["raw_data"]).success
    assert platform.materialize("2024-01-02", selection=["raw_data"]).success
    time.sleep(1.1)  # past the local zone's second of slack on modification times
    for path in sorted(platform.landing_dir.iterdir()):
        os.chmod(path, 0o640)
    corrected = platform.landing_dir / "synthetic_2024-01-02.csv"
    corrected.write_bytes(corrected.read_bytes() + corrected.read_bytes().splitlines(True)[-1])

    sensor = Sensor(platform.landing_dir, platform.contract, platform.instance)
    # The day whose bytes differ from those its run read runs; the other one does not.
    assert [r.partition_key for r in sensor.tick().run_requests or []] == ["2024-01-02"]
    assert sensor.tick().run_requests == []
