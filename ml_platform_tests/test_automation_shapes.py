"""Automation on contract shapes it was not built on: where the day ends, and which file is whose.

The landing sensor, the schedules, the freshness judgement and the backfill summary were built
on flights (America/New_York) and a UTC dataset. Here they are driven through days of contracts
that start in the year and end, in a zone 14 hours ahead of UTC (Pacific/Kiritimati), one 11
hours behind (Pacific/Pago_Pago) and two whose clocks jump at midnight (America/Santiago,
America/Havana); of datasets sharing a landing zone with patterns that differ by a prefix, put
the date in the middle or spell the extension in capitals; of a day delivered, corrected and
corrected back; and of a zone of 2,000 files with 3 new ones a tick. Sensors and schedules are
ticked in-process against a real instance, at the instants given (`partition_loading_context`,
`scheduled_execution_time`); the backfill summary reads real runs of the ingestion job.
"""

import datetime as dt
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg
import pytest
import yaml

from ml_platform.automation.alert_sensors import BACKFILL_TAG, backfill_summaries
from ml_platform.automation.alerts import Notifier
from ml_platform.automation.freshness import MISSING, deadlines, judge_days
from ml_platform.automation.landing_sensor import CONTENT_ENTRY, build_landing_sensor
from ml_platform.automation.schedules import DAILY_SCHEDULE, WEEKLY_RETRAIN_SCHEDULE
from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import FreshnessSpec, bundled_contracts
from ml_platform.definitions import build_definitions
from ml_platform.ingestion.landing import LandedObject, LandingZone, land_days
from ml_platform.platform.datasets import asset_key, dataset_name
from ml_platform.platform.partitions import daily_partitions
from ml_platform.platform.records import ACCEPTED

FAR_EAST = "Pacific/Kiritimati"  # UTC+14
FAR_WEST = "Pacific/Pago_Pago"  # UTC-11
# Each zone with a day whose end (midnight) the clocks skip: the next day begins at 01:00.
MIDNIGHT_JUMPS = {"America/Santiago": "2024-09-07", "America/Havana": "2024-03-09"}


def shaped(
    tmp_path: Path,
    name: str = "shaped",
    *,
    timezone: str = "UTC",
    pattern: str | None = None,
    start: str = "2024-03-05",
    end: str | None = "2024-12-31",
    training: dict | None = None,
) -> Contract:
    """The synthetic contract as another dataset: its name, zone, file pattern and partitions."""
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["name"] = name
    document["event_time"]["timezone"] = timezone
    document["landing"]["file_pattern"] = pattern or f"{name}_{{date}}.csv"
    document["partitions"] = {"start_date": start, **({"end_date": end} if end else {})}
    document["drift"]["reference"]["start"] = start  # the baseline starts with the partitions
    document["training"].update(training or {})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_contract(path)


def day_ends(contract: Contract, day: str) -> dt.datetime:
    """The instant `day` ends in the contract's zone: the first instant of the next local day.

    Read off the zone's own offsets, not Dagster's: on a day whose midnight the clocks skip,
    midnight of the next day (fold 0) is the instant of the jump.
    """
    zone = ZoneInfo(contract.event_time.timezone)
    next_day = dt.date.fromisoformat(day) + dt.timedelta(days=1)
    return dt.datetime.combine(next_day, dt.time(), zone).astimezone(dt.UTC)


class Sensor:
    """A dataset's landing sensor over a zone, ticked as the daemon ticks it, at a given time."""

    def __init__(
        self,
        zone: LandingZone,
        contract: Contract,
        served: list[Contract] | None = None,
        instance: dg.DagsterInstance | None = None,
    ):
        self.zone = zone
        self.definition = build_landing_sensor(
            contract, daily_partitions(contract), "job", other_datasets=served or []
        )
        self.instance = instance or dg.DagsterInstance.ephemeral()
        self.cursor: str | None = None
        self.notifier = Notifier()

    def tick(self, at: dt.datetime | None = None) -> list[dg.RunRequest]:
        """The run requests of one tick, evaluated at `at` (default: now)."""
        resources = {"landing": self.zone, "notifier": self.notifier}
        # The partitions that exist at `at`: the days that have ended by then in the zone.
        when = at or dt.datetime.now(dt.UTC)
        with (
            dg.build_sensor_context(self.instance, cursor=self.cursor, resources=resources) as ctx,
            dg.partition_loading_context(effective_dt=when),
        ):
            result = self.definition(ctx)
        assert isinstance(result, dg.SensorResult)
        self.cursor = result.cursor
        return list(result.run_requests or [])

    def requested(self, at: dt.datetime | None = None) -> list[str]:
        return [str(r.partition_key) for r in self.tick(at)]


def put(directory: Path, name: str, data: bytes = b"a\n1\n") -> Path:
    """Land `data` as `name` the way uploads do: written aside, then renamed into place."""
    directory.mkdir(parents=True, exist_ok=True)
    aside = directory / f".{name}.part"
    aside.write_bytes(data)
    os.replace(aside, directory / name)
    return directory / name


@pytest.mark.parametrize("timezone", [FAR_EAST, FAR_WEST, *MIDNIGHT_JUMPS])
def test_a_days_file_runs_once_just_after_the_day_ends_where_the_data_lives(tmp_path, timezone):
    contract = shaped(tmp_path, timezone=timezone)
    day = MIDNIGHT_JUMPS.get(timezone, "2024-09-07")
    days = [(dt.date.fromisoformat(day) + dt.timedelta(days=n)).isoformat() for n in (-1, 0, 1)]
    directory = tmp_path / "landing"
    for each in days:
        put(directory, contract.landing.file_name(each))
    sensor = Sensor(LandingZone(base_dir=str(directory)), contract)
    minute = dt.timedelta(minutes=1)

    # The first day's file waits until the day is over there, then runs; its successors wait,
    # the day whose midnight never shows on the clocks included, each until its own end.
    assert sensor.requested(day_ends(contract, days[0]) - minute) == []
    for each in days:
        assert sensor.requested(day_ends(contract, each) - minute) == []
        assert sensor.requested(day_ends(contract, each) + minute) == [each]
    assert sensor.requested(day_ends(contract, days[-1]) + dt.timedelta(days=3)) == []
    # The instant taken for the end is Dagster's end of the day's partition.
    window = daily_partitions(contract).time_window_for_partition_key(day)
    assert window.end.timestamp() == day_ends(contract, day).timestamp()


@pytest.mark.parametrize("timezone", [FAR_EAST, FAR_WEST, *MIDNIGHT_JUMPS])
def test_files_before_the_first_or_after_the_last_partition_run_nothing(tmp_path, timezone, caplog):
    contract = shaped(tmp_path, timezone=timezone, start="2024-06-15", end="2024-12-31")
    directory = tmp_path / "landing"
    for day in ("2024-06-14", "2024-06-15", "2024-12-31", "2025-01-01"):
        put(directory, contract.landing.file_name(day))
    sensor = Sensor(LandingZone(base_dir=str(directory)), contract)

    with caplog.at_level("WARNING", logger="ml_platform.alerts"):
        assert sensor.requested(day_ends(contract, "2025-01-05")) == ["2024-06-15", "2024-12-31"]
    [alert] = [r.getMessage() for r in caplog.records if r.name == "ml_platform.alerts"]
    assert "before the first partition 2024-06-15" in alert
    assert "after the last partition 2024-12-31" in alert
    # Nothing of them waits: a day outside the partitions never becomes one.
    assert sensor.requested(day_ends(contract, "2025-02-01")) == []


def schedule_requests(
    defs: dg.Definitions, name: str, at: dt.datetime, instance: dg.DagsterInstance | None = None
) -> list[str] | str:
    """The days a schedule's tick at `at` requests, or why it skipped."""
    if instance is None:
        with dg.instance_for_test() as fresh:
            return schedule_requests(defs, name, at, fresh)
    # The repository is built outside the instance's block, and the context is left as a
    # context manager: otherwise Dagster's current state storage stays that of an instance
    # gone, and later tests of the process that build a repository fail on it.
    repository, schedule = defs.get_repository_def(), defs.resolve_schedule_def(name)
    with dg.build_schedule_context(
        instance=instance, scheduled_execution_time=at, repository_def=repository
    ) as context:
        result = schedule.evaluate_tick(context)
    if result.run_requests:
        return [str(r.partition_key) for r in result.run_requests]
    return result.skip_message or ""


@pytest.mark.parametrize("timezone", [FAR_EAST, FAR_WEST, *MIDNIGHT_JUMPS])
def test_the_nightly_schedule_runs_the_day_that_just_ended_through_the_partitions(
    tmp_path, timezone
):
    contract = shaped(tmp_path, timezone=timezone, start="2024-03-05", end="2024-12-31")
    defs = build_definitions(
        contract, landing_dir=str(tmp_path / "landing"), lake_dir=str(tmp_path / "lake")
    )
    name = dataset_name(contract.name, DAILY_SCHEDULE)
    zone = ZoneInfo(timezone)
    jump = dt.date.fromisoformat(MIDNIGHT_JUMPS.get(timezone, "2024-09-07"))

    def at_two(day: dt.date) -> dt.datetime:
        return dt.datetime.combine(day, dt.time(2), zone)

    assert "no day is due yet" in schedule_requests(defs, name, at_two(dt.date(2024, 3, 5)))
    assert schedule_requests(defs, name, at_two(dt.date(2024, 3, 6))) == ["2024-03-05"]
    # Across the night the clocks jump at midnight: each day once, none skipped.
    nights = [jump + dt.timedelta(days=n) for n in range(3)]
    assert [schedule_requests(defs, name, at_two(night)) for night in nights] == [
        [(night - dt.timedelta(days=1)).isoformat()] for night in nights
    ]
    # The last day runs once, the night after it; later nights run nothing.
    assert schedule_requests(defs, name, at_two(dt.date(2025, 1, 1))) == ["2024-12-31"]
    assert "the last partition, 2024-12-31, ended" in schedule_requests(
        defs, name, at_two(dt.date(2025, 1, 2))
    )


@pytest.fixture
def test_instance():
    with dg.instance_for_test() as instance:
        yield instance


@pytest.mark.parametrize(
    ("start", "first_monday", "first_retrain"),
    [
        # Starting on a Sunday: the first Monday retrains on that one day.
        ("2024-03-03", dt.date(2024, 3, 4), "2024-03-03"),
        # Starting on a Monday: no day is due at its 02:00, the next Monday has a week.
        ("2024-03-04", dt.date(2024, 3, 11), "2024-03-10"),
    ],
)
def test_the_weekly_retrain_takes_the_sunday_from_the_first_week_to_the_last(
    tmp_path, start, first_monday, first_retrain, test_instance
):
    contract = shaped(tmp_path, start=start, end="2024-12-31", training={"window_days": 7})
    defs = build_definitions(
        contract, landing_dir=str(tmp_path / "landing"), lake_dir=str(tmp_path / "lake")
    )
    name = dataset_name(contract.name, WEEKLY_RETRAIN_SCHEDULE)
    # Every hour of Monday from 02:00 (no freshness deadline), until Sunday has its verdict.
    assert defs.resolve_schedule_def(name).cron_schedule == "0 * * * 1"
    instance = test_instance

    def monday(day: dt.date) -> dt.datetime:
        assert day.weekday() == 0
        return dt.datetime.combine(day, dt.time(2), dt.UTC)

    def retrain(day: dt.date) -> list[str] | str:
        sunday = (day - dt.timedelta(days=1)).isoformat()
        # Sunday's features recorded, as its nightly run records them.
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                asset_key=asset_key(contract.name, "features"), partition=sunday
            )
        )
        return schedule_requests(defs, name, monday(day), instance)

    if first_monday > dt.date(2024, 3, 4):
        assert "no day is due yet" in schedule_requests(defs, name, monday(dt.date(2024, 3, 4)))
    assert retrain(first_monday) == [first_retrain]
    # 2024-12-31 is a Tuesday: the Monday after it has no Sunday of the partitions to run.
    assert retrain(dt.date(2024, 12, 30)) == ["2024-12-29"]
    assert "the last partition, 2024-12-31, ended" in schedule_requests(
        defs, name, monday(dt.date(2025, 1, 6))
    )


@pytest.mark.parametrize(
    ("timezone", "day", "expected_by", "due_utc"),
    [
        # The clocks go from 00:00 to 01:00 as the day ends: a file due at 00:00 is due the
        # instant the day ended, one due at 06:00 five hours of real time later (06:00 -03).
        ("America/Santiago", "2024-09-07", "00:00", "2024-09-08T04:00:00+00:00"),
        ("America/Santiago", "2024-09-07", "06:00", "2024-09-08T09:00:00+00:00"),
        # The clocks go back from 00:00 to 23:00 as the day ends: a day of 25 hours.
        ("America/Santiago", "2024-04-06", "00:00", "2024-04-07T04:00:00+00:00"),
        ("America/Havana", "2024-03-09", "00:00", "2024-03-10T05:00:00+00:00"),
        ("America/Havana", "2024-03-09", "06:00", "2024-03-10T10:00:00+00:00"),
        # 06:00 on the next day there is 16:00 UTC on the day itself, and 17:00 UTC the day after.
        (FAR_EAST, "2024-09-07", "06:00", "2024-09-07T16:00:00+00:00"),
        (FAR_WEST, "2024-09-07", "06:00", "2024-09-08T17:00:00+00:00"),
    ],
)
def test_freshness_judges_the_deadline_of_the_day_in_its_zone(
    tmp_path, timezone, day, expected_by, due_utc
):
    spec = FreshnessSpec(expected_by=expected_by, grace_minutes=30, lookback_days=2)
    contract = shaped(tmp_path, timezone=timezone).model_copy(update={"freshness": spec})
    due, late_at = deadlines(contract, spec, day)
    assert due.astimezone(dt.UTC).isoformat() == due_utc
    # Never due before the day is over; the grace is 30 minutes of real time.
    assert due.timestamp() >= day_ends(contract, day).timestamp()
    assert late_at.timestamp() - due.timestamp() == 30 * 60

    def judged(now: dt.datetime) -> dict:
        return {s.day: s for s in judge_days(contract, now, {}, {})}

    # In UTC, as the sensor and `ml-platform landing-status` judge.
    minute = dt.timedelta(minutes=1)
    assert day not in judged(late_at.astimezone(dt.UTC) - minute)
    status = judged(late_at.astimezone(dt.UTC) + minute)[day]
    assert (status.state, status.late) == (MISSING, True)
    assert status.overdue == dt.timedelta(minutes=31)


def test_datasets_sharing_a_zone_each_run_their_own_files_whatever_the_patterns_shape(tmp_path):
    patterns = {
        "a": "a_{date}.csv",
        "ba": "ba_{date}.csv",  # a's pattern with a prefix
        "mid": "export-{date}-final.csv",  # the date in the middle
        "up": "UP.v1.{date}.final.CSV",  # capitals, and dots that are no wildcards
    }
    served = [shaped(tmp_path, name, pattern=p, start="2024-01-01") for name, p in patterns.items()]
    directory = tmp_path / "landing"
    landed = {"a": "2024-01-01", "ba": "2024-01-02", "mid": "2024-01-03", "up": "2024-01-04"}
    for contract in served:
        put(directory, contract.landing.file_name(landed[contract.name]))
    zone = LandingZone(base_dir=str(directory))
    instance = dg.DagsterInstance.ephemeral()

    for contract in served:
        sensor = Sensor(zone, contract, served, instance)
        assert sensor.requested() == [landed[contract.name]], contract.name
        assert sensor.requested() == []


def test_the_same_file_sent_again_after_its_removal_reruns_nothing(tmp_path):
    # An upstream that archives and resends, or an S3 delete then put: the same delivery.
    contract = shaped(tmp_path)
    day, data = "2024-09-07", b"a\n1\n"
    directory = tmp_path / "landing"
    sensor = Sensor(LandingZone(base_dir=str(directory)), contract)
    path = put(directory, contract.landing.file_name(day), data)
    assert sensor.requested() == [day]
    accept(sensor.instance, contract.name, day, data)
    path.unlink()
    assert sensor.requested() == []

    put(directory, contract.landing.file_name(day), data)

    assert sensor.requested() == []
    # Other bytes under the same name are a correction, which runs.
    put(directory, contract.landing.file_name(day), data + b"2\n")
    assert sensor.requested() == [day]


def test_a_file_misnamed_in_case_is_told_to_the_dataset_it_fits_not_to_the_others(tmp_path, caplog):
    a = shaped(tmp_path, "a", pattern="a_{date}.csv", start="2024-01-01")
    ba = shaped(tmp_path, "ba", pattern="ba_{date}.csv", start="2024-01-01")
    directory = tmp_path / "landing"
    put(directory, "a_2024-01-08.CSV")
    zone = LandingZone(base_dir=str(directory))

    with caplog.at_level(logging.WARNING, logger="ml_platform.alerts"):
        assert Sensor(zone, ba, [a, ba]).requested() == []
        # ba's owners would be told to rename a's file after ba's pattern.
        assert [r for r in caplog.records if r.name == "ml_platform.alerts"] == []
        assert Sensor(zone, a, [a, ba]).requested() == []
    [alert] = [r.getMessage() for r in caplog.records if r.name == "ml_platform.alerts"]
    assert "a_2024-01-08.csv" in alert


def test_a_file_no_dataset_fits_is_reported_once_not_by_every_dataset_of_the_zone(tmp_path, caplog):
    # A README left in a zone three datasets share paged each of their teams.
    served = [shaped(tmp_path, name, pattern=f"{name}_{{date}}.csv") for name in ("b", "a", "c")]
    directory = tmp_path / "landing"
    put(directory, "README.txt")
    zone = LandingZone(base_dir=str(directory))

    with caplog.at_level(logging.WARNING, logger="ml_platform.alerts"):
        for contract in served:
            assert Sensor(zone, contract, served).requested() == []
    alerts = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ml_platform.alerts"]

    assert [(a["alert"]["dataset"], a["alert"]["subject"]) for a in alerts] == [("a", "README.txt")]


def accept(instance: dg.DagsterInstance, dataset: str, day: str, data: bytes) -> None:
    """What raw_data records of a day whose delivery it accepted: the bytes' sha256."""
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key=asset_key(dataset, "raw_data"),
            partition=day,
            metadata={
                "verdict": ACCEPTED,
                "accepted": True,
                CONTENT_ENTRY: hashlib.sha256(data).hexdigest(),
            },
        )
    )


@pytest.mark.parametrize("timezone", [FAR_EAST, "America/Santiago"])
def test_a_day_delivered_corrected_and_corrected_back_runs_each_delivery_once(tmp_path, timezone):
    contract = shaped(tmp_path, timezone=timezone)
    day = "2024-09-07"  # Santiago's clocks skip the midnight that ends it
    name = contract.landing.file_name(day)
    directory = tmp_path / "landing"
    sensor = Sensor(LandingZone(base_dir=str(directory)), contract)
    first, corrected = b"a\n1\n", b"a\n2\n"
    keys = []

    for data in (first, corrected, first):
        path = put(directory, name, data)
        [request] = sensor.tick()
        assert request.partition_key == day
        keys.append(request.run_key)
        accept(sensor.instance, contract.name, day, data)
        assert sensor.tick() == []
    # The first bytes put back are a delivery of their own: a run key not used before.
    assert len(set(keys)) == 3
    # A chmod of the file is no delivery; nor is its removal once its day is done.
    os.chmod(path, 0o600)
    assert sensor.tick() == []
    path.unlink()
    assert sensor.tick() == []


class PagesListed(LandingZone):
    """A local zone that counts the entries each page of a listing returned."""

    def list_page(self, after: str | None, limit: int) -> tuple[list[LandedObject], str | None]:
        objects, more = super().list_page(after, limit)
        PAGES.append(len(objects))
        return objects, more


PAGES: list[int] = []


def test_a_zone_of_two_thousand_files_runs_only_the_three_new_ones_each_tick(tmp_path):
    contract = shaped(tmp_path, start="2015-01-01", end=None)
    directory = tmp_path / "landing"
    directory.mkdir()
    first = dt.date(2015, 1, 1)
    days = [(first + dt.timedelta(days=n)).isoformat() for n in range(2012)]
    long_ago = time.time() - 86_400
    for day in days[:2000]:
        path = directory / contract.landing.file_name(day)
        path.write_bytes(b"x")
        os.utime(path, (long_ago, long_ago))
    sensor = Sensor(PagesListed(base_dir=str(directory)), contract)
    assert sensor.requested() == days[:2000]

    for tick in range(4):
        new = days[2000 + 3 * tick : 2003 + 3 * tick]
        for day in new:
            put(directory, contract.landing.file_name(day))
        PAGES.clear()
        assert sensor.requested() == new
        # The whole zone is walked every tick (5 pages of 1,000 a tick at most).
        assert sum(PAGES) == 2003 + 3 * tick
    assert sensor.requested() == []


def test_a_job_backfill_of_one_of_two_datasets_sharing_a_zone_is_summarised_as_its_own(tmp_path):
    # In UTC: the synthetic rows' event times are UTC times of their day.
    a = shaped(tmp_path, "a", start="2024-06-15")
    ba = shaped(tmp_path, "ba", start="2024-06-15")
    landing = tmp_path / "landing"
    zone = LandingZone(base_dir=str(landing))
    landing.mkdir()
    # a's file of 06-16 never lands; ba's does, and is not a's.
    list(land_days(a, zone, [dt.date(2024, 6, 15), dt.date(2024, 6, 17)]))
    list(land_days(ba, zone, [dt.date(2024, 6, 16)]))
    defs = build_definitions([a, ba], landing_dir=str(landing), lake_dir=str(tmp_path / "lake"))
    notifier = defs.resources["notifier"]
    # Dagster resolves the job against the current instance: the test's.
    job = defs.resolve_job_def(dataset_name("a", "ingestion_job"))
    with dg.instance_for_test() as instance:
        # What `dagster job backfill -j a_ingestion_job` launches: a run a day, tagged with it.
        for day in ("2024-06-15", "2024-06-16", "2024-06-17"):
            job.execute_in_process(
                instance=instance,
                partition_key=day,
                tags={BACKFILL_TAG: "shared"},
                raise_on_error=False,
            )
        [summary] = backfill_summaries(instance, "shared", notifier, now=0.0)

    assert summary.dataset == "a"
    assert summary.title == "backfill shared of a ended: 3 day(s), 1 rejected, 0 failed run(s)"
    assert summary.cause == (
        "rejected: 2024-06-16 (raw_data: missing file); once their files are corrected: "
        "ml-platform materialize --dataset a --start 2024-06-16 --days 1"
    )
    assert summary.partition == "2024-06-15...2024-06-17"
