"""Known problems of the automation: a landed file's metadata and bytes, and late data.

The landing sensor is ticked as the daemon ticks it, over the instance a real materialisation of
raw_data recorded into (`Platform`), so "the content raw_data read" is what raw_data recorded.
"""

import datetime as dt
import os
from pathlib import Path

import dagster as dg

from ml_platform.automation.alerts import Notifier
from ml_platform.automation.freshness import FRESH, day_freshness, deadlines
from ml_platform.automation.jobs import day_run_tags
from ml_platform.automation.landing_sensor import build_landing_sensor
from ml_platform.contracts import load_contract
from ml_platform.contracts.model import FreshnessSpec
from ml_platform.ingestion.landing import LandingZone
from ml_platform.platform.partitions import daily_partitions
from ml_platform.platform.records import ACCEPTED, UNCHANGED, day_records

SYNTHETIC = load_contract("synthetic")
DAYS = ["2024-01-01", "2024-01-02"]


def file_of(day: str) -> str:
    return SYNTHETIC.landing.file_name(day)


class Ticks:
    """The synthetic landing sensor over `landing_dir`, ticked against `instance`."""

    def __init__(self, landing_dir: Path, instance: dg.DagsterInstance, **options) -> None:
        self.zone = LandingZone(base_dir=str(landing_dir))
        self.instance = instance
        self.definition = build_landing_sensor(
            SYNTHETIC, daily_partitions(SYNTHETIC), "daily_pipeline_job", **options
        )
        self.cursor: str | None = None

    def requested(self) -> list[str]:
        with dg.build_sensor_context(
            instance=self.instance,
            cursor=self.cursor,
            resources={"landing": self.zone, "notifier": Notifier()},
        ) as context:
            result = self.definition(context)
        assert isinstance(result, dg.SensorResult)
        self.cursor = result.cursor
        return [r.partition_key for r in result.run_requests or []]


def landed_and_run(platform_for) -> tuple[object, Ticks]:
    """Two days landed, requested by the sensor, and run (raw_data) as the daemon would."""
    platform = platform_for("synthetic")
    platform.land(DAYS[0], len(DAYS))
    sensor = Ticks(platform.landing_dir, platform.instance)
    assert sensor.requested() == DAYS
    for day in DAYS:
        assert platform.materialize(day, selection=["raw_data"]).success
    assert sensor.requested() == []
    return platform, sensor


def test_a_chmod_of_the_landing_zone_reruns_no_day(platform_for):
    platform, sensor = landed_and_run(platform_for)
    # An operator opens the zone to a group: each file's ctime moves, not a byte of it.
    for day in DAYS:
        os.chmod(platform.landing_dir / file_of(day), 0o640)

    assert sensor.requested() == []
    assert sensor.requested() == []


def test_the_same_bytes_delivered_again_rerun_no_day_but_new_bytes_do(platform_for):
    platform, sensor = landed_and_run(platform_for)
    first, second = (platform.landing_dir / file_of(day) for day in DAYS)
    # Upstream sends day 1 again, as it sends any file: a new file renamed over the old one.
    again = platform.landing_dir / f".{first.name}.tmp"
    again.write_bytes(first.read_bytes())
    os.replace(again, first)
    # Day 2 is corrected in place, same size, its mtime put back: only its bytes differ.
    before = second.stat()
    data = second.read_bytes()
    second.write_bytes(data[:-2] + (b"0" if data[-2:-1] != b"0" else b"1") + data[-1:])
    os.utime(second, ns=(before.st_atime_ns, before.st_mtime_ns))

    assert sensor.requested() == [DAYS[1]]
    assert sensor.requested() == []


def test_the_same_bytes_again_run_their_day_while_a_run_of_it_is_in_flight(platform_for):
    platform, sensor = landed_and_run(platform_for)
    # A correction's run is going: it read other bytes, which it has not recorded yet.
    platform.instance.add_run(
        dg.DagsterRun(
            job_name="synthetic_daily_pipeline_job",
            status=dg.DagsterRunStatus.STARTED,
            tags=day_run_tags("synthetic", DAYS[0]),
        )
    )
    path = platform.landing_dir / file_of(DAYS[0])
    again = platform.landing_dir / f".{path.name}.tmp"
    again.write_bytes(path.read_bytes())
    os.replace(again, path)

    assert sensor.requested() == [DAYS[0]]


def test_files_left_uncompared_when_the_tick_ran_out_of_time_are_compared_next_walk(
    platform_for,
):
    platform, sensor = landed_and_run(platform_for)
    for day in DAYS:
        path = platform.landing_dir / file_of(day)
        path.write_bytes(path.read_bytes() + b"\n")
    hurried = Ticks(platform.landing_dir, platform.instance, content_budget_seconds=0.0)
    hurried.cursor = sensor.cursor

    # The first file is compared whatever the budget; the other waits for the next walk.
    assert hurried.requested() == [DAYS[0]]
    sensor.cursor = hurried.cursor
    assert sensor.requested() == [DAYS[1]]
    assert sensor.requested() == []


def test_a_file_too_large_to_compare_within_the_budget_is_run_not_put_off(platform_for):
    platform = platform_for("synthetic")
    platform.land(DAYS[0], 1)
    path = platform.landing_dir / file_of(DAYS[0])
    header, *rows = path.read_bytes().splitlines(keepends=True)
    # About 3 MiB, read in several chunks: the budget runs out inside it.
    data = header + b"".join(rows * ((3 << 20) // len(b"".join(rows)) + 1))
    path.write_bytes(data)
    sensor = Ticks(platform.landing_dir, platform.instance)
    assert sensor.requested() == [DAYS[0]]
    assert platform.materialize(DAYS[0], selection=["raw_data"]).success
    os.chmod(path, 0o640)
    hurried = Ticks(platform.landing_dir, platform.instance, content_budget_seconds=0.0)
    hurried.cursor = sensor.cursor

    assert hurried.requested() == [DAYS[0]]
    assert hurried.requested() == []
    # Given the time, the same file after another chmod is compared and not run.
    os.chmod(path, 0o600)
    sensor.cursor = hurried.cursor
    assert sensor.requested() == []


def test_a_file_put_back_after_a_rejected_correction_runs_its_day(platform_for):
    platform, sensor = landed_and_run(platform_for)
    path = platform.landing_dir / file_of(DAYS[0])
    good = path.read_bytes()
    path.write_bytes(b"not,the,contract\n1,2,3\n")
    assert sensor.requested() == [DAYS[0]]
    platform.materialize(DAYS[0], selection=["raw_data"])
    record = day_records(platform.instance, platform.key("raw_data"), [DAYS[0]])[DAYS[0]]
    assert record.verdict not in (ACCEPTED, UNCHANGED)
    # The accepted bytes back: raw_data's latest record is the rejection, so the day runs.
    path.write_bytes(good)
    assert sensor.requested() == [DAYS[0]]


def test_a_rejected_correction_of_an_accepted_day_is_not_called_late_data(platform_for):
    platform = platform_for("synthetic")
    platform.land(DAYS[0], 1)
    assert platform.materialize(DAYS[0], selection=["raw_data", "validated_data"]).success
    # A correction that fails the quality gate: the day keeps the delivery it accepted.
    platform.land(DAYS[0], 1, fault="null_burst")
    platform.materialize(DAYS[0], selection=["raw_data", "validated_data"])
    record = day_records(platform.instance, platform.key("validated_data"), [DAYS[0]])[DAYS[0]]
    assert (record.verdict, record.accepted) == ("failed quality gate", True)

    contract = SYNTHETIC.model_copy(
        update={"freshness": FreshnessSpec(expected_by="06:00", lookback_days=2)}
    )
    due, _ = deadlines(contract, contract.freshness, DAYS[0])
    zone = LandingZone(base_dir=str(platform.landing_dir))
    (status,) = [
        s
        for s in day_freshness(contract, zone, platform.instance, due + dt.timedelta(hours=3))
        if s.day == DAYS[0]
    ]
    assert (status.state, status.late) == (FRESH, False)
