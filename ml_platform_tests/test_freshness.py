"""Late data: the lateness judgement, Dagster's freshness policy, the sensor's alerts, and a daemon.

The judgement is a pure function of the time, the contract, the landed files and the recorded
verdicts; the sensor is ticked as the daemon ticks it over an ephemeral instance and a real
webhook; the integration test runs the real `dagster-daemon` against a contract whose deadline
has just passed.
"""

import datetime as dt
import os
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster_aws.s3 import S3Resource

from ml_platform.automation.alerts import RESOLVED, WARNING, Notifier
from ml_platform.automation.freshness import (
    AWAITING,
    FRESH,
    FRESHNESS_ENTRY,
    LATE,
    MISSING,
    REFUSED,
    REJECTED,
    VERDICT_ALLOWANCE,
    build_freshness_sensors,
    day_freshness,
    deadlines,
    freshness_policy,
    judge_days,
    status_line,
)
from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import FreshnessSpec, PartitionSpec, bundled_contracts
from ml_platform.ingestion.landing import LandedObject, LandingStore, LandingZone
from ml_platform.ingestion.s3_landing import S3LandingZone
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.records import ACCEPTED, DayRecord
from ml_platform_tests.conftest import REPO, Platform
from ml_platform_tests.services import FAKE_AWS, DagsterProcesses, webhook_server

FLIGHTS = load_contract("flights")
NEW_YORK = dt.timezone(dt.timedelta(hours=-5))  # EST: the days below are in March, before DST


def flights(**freshness: Any) -> Contract:
    """The flights contract with the freshness settings given (the bundled ones by default)."""
    spec = FreshnessSpec(**{"expected_by": "06:00", "grace_minutes": 60, **freshness})
    return FLIGHTS.model_copy(update={"freshness": spec})


def at(day: str, hhmm: str) -> dt.datetime:
    """A New York wall-clock time in March 2013."""
    return dt.datetime.fromisoformat(f"{day}T{hhmm}").replace(tzinfo=NEW_YORK)


def landed(day: str, when: dt.datetime, refused: str | None = None) -> LandedObject:
    return LandedObject(
        name=f"flights_{day}.csv", modified=when.timestamp(), version="v1", refused=refused
    )


def record(verdict: str, reason: str = "") -> DayRecord:
    return DayRecord(verdict=verdict, accepted=verdict == ACCEPTED, reason=reason, run_id="r1")


def by_day(contract: Contract, now: dt.datetime, files=None, records=None) -> dict[str, Any]:
    return {s.day: s for s in judge_days(contract, now, files or {}, records or {})}


def test_a_missing_file_is_late_after_its_grace_not_before():
    # Day 03-04's file is due 03-05 06:00 New York time, late from 07:00.
    within_grace = by_day(flights(lookback_days=1), at("2013-03-05", "06:59"))
    assert "2013-03-04" not in within_grace
    status = by_day(flights(lookback_days=1), at("2013-03-05", "09:05"))["2013-03-04"]
    assert (status.state, status.late) == (MISSING, True)
    assert status.due == at("2013-03-05", "06:00")
    assert status.overdue == dt.timedelta(hours=3, minutes=5)
    line = status_line(status, "/landing/")
    assert line == (
        "2013-03-04: due 2013-03-05 06:00 EST, 3 h 5 min late: "
        "no file flights_2013-03-04.csv in /landing/"
    )


def test_only_days_whose_deadline_fell_within_the_lookback_and_the_partitions_are_watched():
    now = at("2013-03-10", "08:00")
    assert sorted(by_day(flights(lookback_days=3), now)) == [
        "2013-03-07",
        "2013-03-08",
        "2013-03-09",
    ]
    # The dataset ends (partitions.end_date) or starts inside the window: only its days.
    ended = flights(lookback_days=3).model_copy(
        update={"partitions": PartitionSpec(start_date="2013-01-01", end_date="2013-03-07")}
    )
    assert sorted(by_day(ended, now)) == ["2013-03-07"]
    assert by_day(FLIGHTS, dt.datetime(2026, 12, 2, tzinfo=dt.UTC)) == {}


def test_a_rejected_delivery_is_late_and_an_accepted_one_is_fresh_even_once_its_file_is_gone():
    now = at("2013-03-05", "09:00")
    contract = flights(lookback_days=1)
    arrived = {"2013-03-04": landed("2013-03-04", at("2013-03-05", "02:00"))}
    rejected = by_day(contract, now, arrived, {"2013-03-04": record("rejected", "gx_volume")})
    status = rejected["2013-03-04"]
    assert (status.state, status.late) == (REJECTED, True)
    assert "flights_2013-03-04.csv is there but was rejected (rejected: gx_volume)" in (
        status_line(status, "/landing/")
    )
    accepted = by_day(contract, now, {}, {"2013-03-04": record(ACCEPTED)})["2013-03-04"]
    assert (accepted.state, accepted.late, accepted.overdue) == (FRESH, False, dt.timedelta(0))


def test_a_file_awaiting_its_verdict_is_late_at_once_when_it_came_after_the_deadline():
    now = at("2013-03-05", "07:10")
    contract = flights(lookback_days=1)
    in_time = {"2013-03-04": landed("2013-03-04", at("2013-03-05", "06:55"))}
    status = by_day(contract, now, in_time)["2013-03-04"]
    assert (status.state, status.late) == (AWAITING, False)
    after = {"2013-03-04": landed("2013-03-04", at("2013-03-05", "07:05"))}
    status = by_day(contract, now, after)["2013-03-04"]
    assert (status.state, status.late) == (AWAITING, True)
    link = {"2013-03-04": landed("2013-03-04", at("2013-03-05", "05:00"), "it is a link")}
    status = by_day(contract, now, link)["2013-03-04"]
    assert (status.state, status.late, status.reason) == (REFUSED, True, "it is a link")


def test_a_file_landed_in_time_that_no_run_judged_turns_late_after_its_allowance():
    # Due 03-05 06:00, late from 07:00; landed at 05:00, and its run failed or never ran.
    contract = flights()
    files = {"2013-03-04": landed("2013-03-04", at("2013-03-05", "05:00"))}
    # It may await its verdict until two hours after the deadline.
    assert at("2013-03-05", "07:00") + VERDICT_ALLOWANCE == at("2013-03-05", "09:00")
    being_run = by_day(contract, at("2013-03-05", "08:59"), files)["2013-03-04"]
    assert (being_run.state, being_run.late, being_run.reason) == (AWAITING, False, "")
    for now in [at("2013-03-05", "09:00"), at("2013-03-08", "09:00")]:
        status = by_day(contract, now, files)["2013-03-04"]
        assert (status.state, status.late) == (AWAITING, True)
        assert status.overdue == now - at("2013-03-05", "06:00")
    # What to do is in the line: nobody judged the file, and how to have it judged.
    assert status_line(status, "/landing/") == (
        "2013-03-04: due 2013-03-05 06:00 EST, 3 d 3 h late: flights_2013-03-04.csv landed "
        "2013-03-05 05:00 EST but no verdict was recorded by 2013-03-05 09:00 EST: its run failed "
        "or never ran (is flights_landing_sensor running?); see the day's runs, or run it: "
        "ml-platform materialize --dataset flights --start 2013-03-04 --days 1"
    )
    # A file that landed late is late at once; it awaits its verdict for the same allowance.
    files = {"2013-03-04": landed("2013-03-04", at("2013-03-05", "08:00"))}
    waiting = by_day(contract, at("2013-03-05", "09:59"), files)["2013-03-04"]
    assert waiting.late and status_line(waiting, "/landing/").endswith("and awaits its verdict")
    stalled = by_day(contract, at("2013-03-05", "10:00"), files)["2013-03-04"]
    assert "but no verdict was recorded by 2013-03-05 10:00 EST" in status_line(stalled, "/")


def test_dagsters_freshness_policy_on_raw_data_has_the_contracts_deadline_and_timezone():
    # While the flights days are still delivered (they end 2013-12-31).
    in_2013 = dt.date(2013, 3, 5)
    policy = freshness_policy(FLIGHTS, in_2013)
    assert isinstance(policy, dg.FreshnessPolicy)
    # 06:00 + 60 min of grace; the delivery window opens when the day is over, at midnight.
    assert (policy.deadline_cron, policy.timezone) == ("0 7 * * *", "America/New_York")
    assert policy.lower_bound_delta == dt.timedelta(hours=7)
    # A grace past midnight: Dagster's window is at most the cron's day.
    late_night = freshness_policy(flights(expected_by="23:30", grace_minutes=60), in_2013)
    assert late_night is not None and late_night.deadline_cron == "30 0 * * *"
    assert late_night.lower_bound_delta == dt.timedelta(days=1)
    assert freshness_policy(load_contract("synthetic")) is None
    # The last day's file is due the day after it; from the day after that, none is expected:
    # no policy that would fail raw_data every day of the years after.
    assert freshness_policy(FLIGHTS, dt.date(2014, 1, 1)) is not None
    assert freshness_policy(FLIGHTS, dt.date(2014, 1, 2)) is None
    assert freshness_policy(FLIGHTS) is None


def test_the_grace_is_time_that_passes_on_the_night_the_clocks_go_back():
    # New York leaves summer time at 02:00 on 2013-11-03: 01:00 to 02:00 happens twice.
    contract = flights(expected_by="01:00", grace_minutes=60)
    due, late_at = deadlines(contract, contract.freshness, "2013-11-02")
    assert due.isoformat() == "2013-11-03T01:00:00-04:00"
    assert late_at.timestamp() - due.timestamp() == 3600
    assert late_at.isoformat() == "2013-11-03T01:00:00-05:00"
    # A file landed in the repeated hour, 30 minutes of real time after the deadline, is in
    # time; one landed 90 minutes after is not.
    for minutes, late in ((30, False), (90, True)):
        when = dt.datetime.fromtimestamp(due.timestamp() + 60 * minutes, dt.UTC)
        files = {"2013-11-02": landed("2013-11-02", when)}
        status = by_day(contract, when + dt.timedelta(hours=2), files)["2013-11-02"]
        assert (status.state, status.late) == (AWAITING, late), minutes


def freshness_seen(instance: dg.DagsterInstance, dataset: str) -> list[tuple[str, str]]:
    """(partition, late or fresh) of each observation of raw_data's freshness, oldest first."""
    records = instance.fetch_observations(asset_key(dataset, "raw_data"), limit=20).records
    observations = [r.asset_observation for r in reversed(records) if r.asset_observation]
    return [(str(o.partition), o.metadata[FRESHNESS_ENTRY].value) for o in observations]


@pytest.fixture(params=["local", "s3"])
def zone(request, tmp_path, monkeypatch) -> LandingStore:
    """An empty landing zone: a local directory, or a prefix of a real S3 server on 127.0.0.1."""
    if request.param == "local":
        # Its directory is there: a missing one is an error (LandingZoneMissingError), not empty.
        (tmp_path / "landing").mkdir()
        return LandingZone(base_dir=str(tmp_path / "landing"))
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)
    endpoint = request.getfixturevalue("s3_server")
    s3 = S3LandingZone(url="s3://landing/incoming/", s3=S3Resource(endpoint_url=endpoint))
    s3.client().create_bucket(Bucket="landing")
    return s3


def put(zone: LandingStore, name: str) -> None:
    if isinstance(zone, S3LandingZone):
        zone.client().put_object(Bucket=zone.bucket, Key=zone.prefix + name, Body=b"a\n1\n")
    else:
        path = Path(zone.path_for(name))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"a\n1\n")


def test_the_sensor_warns_once_per_late_day_and_resolves_once_it_is_accepted(zone):
    # A contract whose days' files are due at midnight: yesterday's is late all day today.
    today = dt.datetime.now(dt.UTC).date()
    yesterday = (today - dt.timedelta(days=1)).isoformat()
    contract = load_contract("synthetic").model_copy(
        update={
            "freshness": FreshnessSpec(expected_by="00:00", lookback_days=1),
            "partitions": PartitionSpec(start_date=yesterday),
        }
    )
    [sensor] = build_freshness_sensors(contract, minimum_interval_seconds=5)
    instance = dg.DagsterInstance.ephemeral()
    with webhook_server() as hook:
        notifier = Notifier(webhook_url=hook.url)
        cursor = None

        def tick() -> list[dict]:
            nonlocal cursor
            before = len(hook.received)
            resources = {"landing": zone, "notifier": notifier}
            with dg.build_sensor_context(instance, cursor=cursor, resources=resources) as context:
                result = sensor(context)
            assert isinstance(result, dg.SensorResult)
            cursor = result.cursor
            return [body["ml_platform_alert"] for body in hook.received[before:]]

        [warning] = tick()
        assert tick() == []  # still late: told once
        put(zone, f"synthetic_{yesterday}.csv")
        assert tick() == []  # landed, not accepted yet: still late, already told
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                asset_key("synthetic", "validated_data"),
                partition=yesterday,
                metadata={"verdict": ACCEPTED, "accepted": True},
            )
        )
        [resolved] = tick()
        assert tick() == []
    assert (warning["severity"], warning["rule"], warning["partition"]) == (
        WARNING,
        "data_late",
        yesterday,
    )
    assert warning["owners"] == ["team:ml-platform"]
    location = str(zone.path_for(""))
    assert warning["cause"] == (
        f"expected synthetic_{yesterday}.csv (pattern synthetic_{{date}}.csv) in {location}; "
        f"no file synthetic_{yesterday}.csv in {location}"
    )
    assert warning["subject"] == f"{location.rstrip('/')}/synthetic_{yesterday}.csv"
    assert warning["runbook"].endswith("#data-did-not-arrive")
    assert (resolved["severity"], resolved["partition"]) == (RESOLVED, yesterday)
    assert f"synthetic_{yesterday}.csv landed {today} " in resolved["cause"]
    assert freshness_seen(instance, "synthetic") == [(yesterday, LATE), (yesterday, FRESH)]


def test_a_file_landed_today_for_today_and_never_judged_is_late_tomorrow_after_its_allowance(
    tmp_path,
):
    # Today's file is due at midnight: it landed now, in time; then no run judged it (the
    # landing sensor off, or the day's run failed). Judged by the sensor's own look-ups.
    today = dt.datetime.now(dt.UTC).date()
    contract = load_contract("synthetic").model_copy(
        update={
            "freshness": FreshnessSpec(expected_by="00:00", lookback_days=1),
            "partitions": PartitionSpec(start_date=today),
        }
    )
    zone = LandingZone(base_dir=str(tmp_path / "landing"))
    put(zone, f"synthetic_{today}.csv")
    instance = dg.DagsterInstance.ephemeral()
    deadline = dt.datetime.combine(today + dt.timedelta(days=1), dt.time(), dt.UTC)
    verdict_by = deadline + VERDICT_ALLOWANCE

    [being_run] = day_freshness(contract, zone, instance, verdict_by - dt.timedelta(minutes=1))
    assert (being_run.state, being_run.late) == (AWAITING, False)
    [stalled] = day_freshness(contract, zone, instance, verdict_by)
    assert (stalled.state, stalled.late) == (AWAITING, True)
    location = str(zone.path_for(""))
    assert f"synthetic_{today}.csv landed {today} " in status_line(stalled, location)
    assert status_line(stalled, location).endswith(
        f"but no verdict was recorded by {today + dt.timedelta(days=1)} 02:00 UTC: its run failed "
        "or never ran (is synthetic_landing_sensor running?); see the day's runs, or run it: "
        f"ml-platform materialize --dataset synthetic --start {today} --days 1"
    )
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key("synthetic", "validated_data"),
            partition=today.isoformat(),
            metadata={"verdict": ACCEPTED, "accepted": True},
        )
    )
    [fresh] = day_freshness(contract, zone, instance, verdict_by)
    assert (fresh.state, fresh.late) == (FRESH, False)


def late_synthetic(tmp_path: Path, first_day: str, expected_by: str, lookback_days: int) -> Path:
    """A synthetic contract file starting at `first_day` whose files are due by `expected_by`."""
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["partitions"] = {"start_date": first_day}
    document["drift"]["reference"]["start"] = first_day  # the baseline starts with the partitions
    document["freshness"] = {"expected_by": expected_by, "lookback_days": lookback_days}
    path = tmp_path / "synthetic.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_landing_status_lists_each_late_day_with_its_file_deadline_and_rejection(
    tmp_path, monkeypatch, capsys
):
    today = dt.datetime.now(dt.UTC).date()
    before, yesterday = (today - dt.timedelta(days=n) for n in (2, 1))
    contract_file = late_synthetic(tmp_path, before.isoformat(), "00:00", lookback_days=3)
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / f"synthetic_{before}.csv").write_text("event_time,x1\n")
    (tmp_path / "dagster.yaml").write_text("")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with dg.DagsterInstance.get() as instance:
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                asset_key("synthetic", "validated_data"),
                partition=before.isoformat(),
                metadata={"verdict": "schema mismatch", "accepted": False, "reason": "no x2"},
            )
        )
    from ml_platform.cli import main

    args = ["landing-status", "--dataset", str(contract_file), "--landing-dir", str(landing)]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "2 late day(s) (docs/runbook.md#data-did-not-arrive)" in out
    late = [line for line in out.splitlines() if line.startswith("late: ")]
    assert late[0].startswith(f"late: {before}: due {yesterday} 00:00 UTC, 1 d ")
    assert late[0].endswith(
        f"late: synthetic_{before}.csv is there but was rejected (schema mismatch: no x2)"
    )
    assert late[1].startswith(f"late: {yesterday}: due {today} 00:00 UTC, ")
    assert late[1].endswith(f"late: no file synthetic_{yesterday}.csv in {landing}")


class Daemon(DagsterProcesses):
    """dagster-daemon alone over a fresh instance whose configuration is the repository's."""

    def __init__(self, tmp_path: Path, env: dict[str, str]):
        self.env, self.cwd, self.logs, self.procs = env, REPO, tmp_path, []

    def start(self) -> None:
        # The daemon alone creates the instance's storage: no other process races it there.
        bin_dir = Path(sys.executable).parent
        self.spawn("daemon", [str(bin_dir / "dagster-daemon"), "run", "-w", "workspace.yaml"])

    def output(self) -> str:
        return (self.logs / "daemon.log").read_text()[-6000:]


@pytest.mark.integration
def test_with_a_real_daemon_a_late_day_warns_once_and_resolves_once_when_landed(
    tmp_path, monkeypatch
):
    # The deadline of yesterday's file: the minute before the last, today (UTC, the contract's).
    deadline = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    day = (deadline.date() - dt.timedelta(days=1)).isoformat()
    contract_file = late_synthetic(tmp_path, day, deadline.strftime("%H:%M"), lookback_days=1)
    platform = Platform(load_contract(contract_file), tmp_path)
    platform.landing_dir.mkdir()  # an empty zone, not a missing one
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    with webhook_server() as hook:
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "ML_PLATFORM_DATASET": str(contract_file),
            "ML_PLATFORM_LANDING_DIR": str(platform.landing_dir),
            "ML_PLATFORM_LAKE_DIR": str(platform.lake_dir),
            "ML_PLATFORM_SENSOR_INTERVAL_SECONDS": "5",
            "ML_PLATFORM_ALERT_WEBHOOK_URL": hook.url,
            # Dagster's freshness daemon evaluates policies every 30 s unless told otherwise.
            "FRESHNESS_DAEMON_INTERVAL_SECONDS": "5",
        }
        env.pop("ML_PLATFORM_LANDING_URL", None)
        env.pop("ML_PLATFORM_LAKE_URL", None)
        daemon = Daemon(tmp_path, env)

        def told(rule: str) -> list[dict]:
            alerts = [body["ml_platform_alert"] for body in hook.received]
            return [a for a in alerts if a["rule"] == rule]

        try:
            daemon.start()
            [warning] = daemon.wait_for(lambda: told("data_late"), 120, "the WARNING")
            assert (warning["severity"], warning["partition"]) == (WARNING, day)
            monkeypatch.setenv("DAGSTER_HOME", str(home))
            with dg.DagsterInstance.get() as instance:
                # Dagster holds the day as late: an observation of raw_data's day says so.
                assert freshness_seen(instance, "synthetic") == [(day, LATE)]
                raw = asset_key("synthetic", "raw_data")

                def dagster_freshness() -> str | None:
                    """raw_data's state as Dagster's freshness daemon last recorded it."""
                    record = instance.get_freshness_state_records([raw]).get(raw)
                    return record.freshness_state.value if record else None

                # Dagster's policy judges raw_data's latest materialisation, whatever its day:
                # a dataset that never delivered is UNKNOWN to it, not late.
                daemon.wait_for(lambda: dagster_freshness() == "UNKNOWN", 60, "Dagster's UNKNOWN")
                # The dataset's previous delivery, the day before, materialised before today's
                # window opened (midnight, UTC: the contract's). Dagster stamps an event with the
                # time it is written and has no public way to record one at another: the test
                # process's clock is set back for this one write; the daemon keeps the real one.
                window_opened = dt.datetime.combine(deadline.date(), dt.time(), dt.UTC)
                previous = (dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat()
                with monkeypatch.context() as clock:
                    earlier = (window_opened - dt.timedelta(hours=1)).timestamp()
                    clock.setattr(time, "time", lambda: earlier)
                    instance.report_runless_asset_event(
                        dg.AssetMaterialization(raw, partition=previous)
                    )
                # Nothing came in today's window, the day is late: Dagster's own state fails.
                daemon.wait_for(
                    lambda: dagster_freshness() == "FAIL", 60, f"Dagster's FAIL while {day} is late"
                )
                platform.instance = instance
                platform.land(day, 1)
                result = platform.materialize(day, selection=["raw_data", "validated_data"])
                assert result.success
                [resolved] = daemon.wait_for(lambda: told("data_arrived"), 120, "the RESOLVED")
                resolved_at = time.time()
                assert (resolved["severity"], resolved["partition"]) == (RESOLVED, day)
                assert freshness_seen(instance, "synthetic") == [(day, LATE), (day, FRESH)]
                # Dagster's own freshness daemon judged raw_data by the contract's policy: the
                # delivery came after midnight, inside the window that ended at the deadline.
                daemon.wait_for(lambda: dagster_freshness() == "PASS", 60, "Dagster's PASS")
                # A tick that began after the RESOLVED was sent tells nothing new.
                [state] = [
                    s
                    for s in instance.all_instigator_state()
                    if s.instigator_name == "synthetic_freshness_sensor"
                ]

                def tick_after() -> bool:
                    ticks = instance.get_ticks(
                        state.instigator_origin_id, state.selector_id, after=resolved_at
                    )
                    return any(t.status.value != "STARTED" for t in ticks)

                daemon.wait_for(tick_after, 60, "a later freshness tick")
        finally:
            daemon.stop()
        assert len(told("data_late")) == 1 and len(told("data_arrived")) == 1
