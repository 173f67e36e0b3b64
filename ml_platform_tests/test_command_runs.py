"""`ml-platform materialize` runs its days through the instance, and Dagster keeps one writer.

One dagster-webserver and dagster-daemon for the module, over a fresh instance with the
repository's dagster.yaml (its queue, run tag limits and pools) and a log sink that can leave
one chosen record of a run unanswered: that run is then paused inside a step for as long as a
test needs, however fast it would otherwise end. The command is run as a user runs it, a
subprocess reaching the webserver. Each test works on days of its own.
"""

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient

from ml_platform.automation.jobs import day_run_tags
from ml_platform.automation.launch import BACKFILL_DONE, LaunchError, Webserver
from ml_platform.contracts import load_contract
from ml_platform.ingestion.landing import LandingZone, land_days
from ml_platform.platform.records import recorded_lake_keys
from ml_platform.troubleshooting.health import pipeline_health
from ml_platform_tests.conftest import days_from
from ml_platform_tests.services import DagsterServices, HeldLog, held_log

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
SYNTHETIC = load_contract("synthetic")
FLIGHTS = load_contract("flights")
STEP_START = " - synthetic__{asset} - STEP_START - "
# How long a run of a day may take on a loaded 2-core machine, from its launch to its end.
RUN_SECONDS = 300


class Services(DagsterServices):
    """The module's webserver and daemon, their log sink, and what the tests ask of them."""

    sink: HeldLog

    def land(self, contract, days: list[str], **switches) -> None:
        zone = LandingZone(base_dir=str(self.landing))
        list(land_days(contract, zone, [dt.date.fromisoformat(d) for d in days], **switches))

    def materialize(self, *args: str, name: str = "materialize") -> subprocess.Popen:
        """`ml-platform materialize ARGS`, its output in <name>.out and <name>.err."""
        with (
            (self.logs / f"{name}.out").open("w") as out,
            (self.logs / f"{name}.err").open("w") as err,
        ):
            return subprocess.Popen(
                [str(BIN / "ml-platform"), "materialize", *args],
                cwd=self.logs,
                env=self.env,
                stdout=out,
                stderr=err,
            )

    def said(self, name: str = "materialize") -> tuple[str, str]:
        return (self.logs / f"{name}.out").read_text(), (self.logs / f"{name}.err").read_text()

    def launch_as_the_ui(self, assets: list[str], day: str, dataset: str = "synthetic") -> str:
        """A run of the selected assets of `day`, as the UI's Materialize launches it."""
        client = DagsterGraphQLClient("127.0.0.1", port_number=self.port)
        keys = [dg.AssetKey([dataset, name]) for name in assets]
        return client.submit_job_execution(
            "__ASSET_JOB", asset_selection=keys, tags={"dagster/partition": day}
        )

    def runs(self, day: str | None = None) -> list[dg.DagsterRun]:
        with self.instance() as instance:
            runs = instance.get_runs()
        return [r for r in runs if day is None or r.tags.get("dagster/partition") == day]

    def finished(self, run_id: str) -> dg.DagsterRun:
        def ended():
            with self.instance() as instance:
                run = instance.get_run_by_id(run_id)
            return run if run is not None and run.is_finished else None

        return self.wait_for(ended, RUN_SECONDS, f"run {run_id} to end")

    def span(self, run_id: str) -> tuple[float, float]:
        """When the run's worker began executing it and when it ended, from its events."""
        with self.instance() as instance:
            start = instance.get_records_for_run(
                run_id, of_type=dg.DagsterEventType.RUN_START
            ).records
            ends = [
                r
                for kind in (dg.DagsterEventType.RUN_SUCCESS, dg.DagsterEventType.RUN_FAILURE)
                for r in instance.get_records_for_run(run_id, of_type=kind).records
            ]
        assert len(start) == 1 and len(ends) == 1, (run_id, start, ends)
        return start[0].timestamp, ends[0].timestamp


@pytest.fixture(scope="module")
def services(tmp_path_factory) -> Iterator[Services]:
    with held_log("nothing is held until a test arms the sink") as sink:
        services = Services(tmp_path_factory.mktemp("command_runs"), sink.handler())
        services.sink = sink
        services.start()
        try:
            yield services
        finally:
            sink.released.set()
            services.stop()


def apart(first: tuple[float, float], second: tuple[float, float]) -> bool:
    """Whether two runs' executions did not overlap."""
    return first[1] <= second[0] or second[1] <= first[0]


def test_materialize_of_a_day_queues_behind_a_run_of_the_day_launched_from_the_ui(services):
    day = "2024-02-01"
    services.land(SYNTHETIC, [day])
    services.sink.arm(STEP_START.format(asset="raw_data"))
    ui_run = services.launch_as_the_ui(["raw_data", "validated_data", "features"], day)
    services.sink.wait_held(services.daemon, timeout=RUN_SECONDS, output=services.output)

    command = services.materialize("--start", day, "--dataset", "synthetic")
    # The command's run is in the instance, and it stays in the queue while the UI's run holds
    # the day's assets: it does not start and wait in a step.
    (own,) = services.wait_for(
        lambda: [r for r in services.runs(day) if r.run_id != ui_run] or None,
        RUN_SECONDS,
        "the command's run",
    )
    time.sleep(6)  # three of the queue's turns (dequeue_interval_seconds: 2)
    assert [r.status for r in services.runs(day) if r.run_id == own.run_id] == [
        dg.DagsterRunStatus.QUEUED
    ]
    services.sink.released.set()
    assert command.wait(timeout=RUN_SECONDS) in (0, 3), services.said()

    assert services.finished(ui_run).status == dg.DagsterRunStatus.SUCCESS
    assert own.tags["ml_platform/dataset_partition"] == f"synthetic:{day}"
    # The two runs' executions, from their own events, did not overlap.
    assert services.span(ui_run)[1] <= services.span(own.run_id)[0]
    out, _ = services.said()
    assert f"[1/1] {day} " in out and f"run {own.run_id[:8]})" in out


def test_materialize_follows_the_days_run_in_flight_and_leaves_it_on_ctrl_c(services):
    day = "2024-02-05"
    services.land(SYNTHETIC, [day])
    services.sink.arm(STEP_START.format(asset="raw_data"))
    # The day's run as the landing sensor launches it, held inside its first step.
    webserver = Webserver(services.env["ML_PLATFORM_DAGSTER_URL"])
    tags = {"dagster/partition": day, **day_run_tags("synthetic", day)}
    sensor_run = webserver.launch("synthetic_daily_pipeline_job", tags)
    services.sink.wait_held(services.daemon, timeout=RUN_SECONDS, output=services.output)

    follower = services.materialize("--start", day, "--dataset", "synthetic", name="follower")
    stopped = services.materialize("--start", day, "--dataset", "synthetic", name="stopped")
    following = f"[1/1] {day} following run {sensor_run}"
    services.wait_for(lambda: following in services.said("stopped")[0], 120, "the command")
    stopped.send_signal(signal.SIGINT)
    assert stopped.wait(timeout=60) == 130, services.said("stopped")
    services.sink.released.set()
    assert follower.wait(timeout=RUN_SECONDS) in (0, 3), services.said("follower")

    # One run did the day: neither command launched its own, and Ctrl-C did not stop it.
    assert [r.run_id for r in services.runs(day)] == [sensor_run]
    assert services.finished(sensor_run).status == dg.DagsterRunStatus.SUCCESS
    out, _ = services.said("follower")
    assert following in out and f"run {sensor_run[:8]})" in out
    _, err = services.said("stopped")
    assert f"stopped by SIGINT: run {sensor_run}, not launched by this command, goes on" in err


def test_materialize_of_a_day_never_runs_beside_a_backfill_holding_it(services):
    days = ["2024-02-10", "2024-02-11", "2024-02-12"]
    services.land(SYNTHETIC, days)
    services.sink.arm(STEP_START.format(asset="raw_data"))
    # As the UI's Materialize of a range, through the client `ml-platform replay` launches by.
    webserver = Webserver(services.env["ML_PLATFORM_DAGSTER_URL"])
    backfill = webserver.backfill({dg.AssetKey(["synthetic", "raw_data"]): [(days[0], days[-1])]})
    # The backfill daemon makes one run of the range; its raw_data step is held.
    services.sink.wait_held(services.daemon, timeout=RUN_SECONDS, output=services.output)
    command = services.materialize("--start", days[1], "--dataset", "synthetic", name="inside")
    services.wait_for(lambda: services.runs(days[1]) or None, RUN_SECONDS, "the command's run")
    time.sleep(6)
    (own,) = services.runs(days[1])
    assert own.status == dg.DagsterRunStatus.QUEUED
    services.sink.released.set()
    assert command.wait(timeout=RUN_SECONDS) in (0, 3), services.said("inside")

    ranged = [r for r in services.runs() if r.tags.get("dagster/backfill") == backfill]
    assert ranged and all(services.finished(r.run_id).is_success for r in ranged)
    assert ranged[0].tags["dagster/asset_partition_range_start"] == days[0]
    for run in ranged:
        assert apart(services.span(run.run_id), services.span(own.run_id))
    assert services.wait_for(
        lambda: webserver.backfill_status(backfill) in BACKFILL_DONE, RUN_SECONDS, "its end"
    )
    # A backfill the instance does not hold is an error, not a status to wait on for ever.
    with pytest.raises(LaunchError, match="has no backfill nope \\(BackfillNotFoundError"):
        webserver.backfill_status("nope")


def test_a_killed_command_leaves_its_run_to_the_instance_and_the_day_reruns(services):
    day = "2024-02-20"
    services.land(SYNTHETIC, [day])
    services.sink.arm(STEP_START.format(asset="raw_data"))
    command = services.materialize("--start", day, "--dataset", "synthetic", name="killed")
    services.sink.wait_held(
        command, timeout=RUN_SECONDS, output=lambda: str(services.said("killed"))
    )
    command.kill()
    command.wait(timeout=30)
    services.sink.released.set()

    # The run's worker is the instance's, not the command's: it goes on to the end.
    (run,) = services.runs(day)
    assert services.finished(run.run_id).status == dg.DagsterRunStatus.SUCCESS
    rerun = services.materialize("--start", day, "--dataset", "synthetic", "--force", name="rerun")
    assert rerun.wait(timeout=RUN_SECONDS) in (0, 3), services.said("rerun")
    out, _ = services.said("rerun")
    assert f"[1/1] {day} " in out
    assert len(services.runs(day)) == 2


def test_two_runs_of_the_registry_of_a_dataset_never_execute_at_once(services):
    # Two days apart: the per-day limit does not hold them, only the registry's pool.
    first, second = "2024-02-25", "2024-02-27"
    services.sink.arm(STEP_START.format(asset="registered_model"))
    held = services.launch_as_the_ui(["registered_model"], first)
    services.sink.wait_held(services.daemon, timeout=RUN_SECONDS, output=services.output)
    other = services.launch_as_the_ui(["registered_model"], second)
    time.sleep(6)
    assert services.runs(second)[0].status == dg.DagsterRunStatus.QUEUED
    services.sink.released.set()

    # Neither day has an evaluation to register, so each run fails in its step (a day never
    # recorded upstream is no verdict): what matters is when each executed.
    assert services.finished(held).is_finished and services.finished(other).is_finished
    assert services.span(held)[1] <= services.span(other)[0]


def test_two_runs_of_a_pool_the_queue_has_not_met_never_execute_at_once(services):
    # Two runs of flights' registry, days apart (no per-day limit holds them), queued while no
    # daemon works the queue: its first look at them is its first at their pool, which no run of
    # this instance has used (the module's other tests run synthetic days). Dagster's queue would
    # start both in that look; the limit `ml-platform pools` stored before the daemon started
    # (as `make serve` runs it) holds the second from the first look on.
    first, second = "2013-03-01", "2013-03-03"
    services.stop_daemon()
    try:
        one = services.launch_as_the_ui(["registered_model"], first, dataset="flights")
        other = services.launch_as_the_ui(["registered_model"], second, dataset="flights")
        # Meanwhile `ml-platform health` names the runs waiting and what to start.
        with services.instance() as instance:
            said = pipeline_health(instance, 1).render()
        assert re.search(r"queued now: [2-9] run\(s\), the oldest for \d+s; a dagster-daemon", said)
        assert "if none runs now, start one (`ml-platform pools && dagster-daemon run" in said
    finally:
        services.start_daemon()

    # Neither day has an evaluation to register, so each run fails in its step.
    assert services.finished(one).is_finished and services.finished(other).is_finished
    assert apart(services.span(one), services.span(other))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_materialize_and_terminates_its_run(services, signum):
    start = "2024-03-01" if signum == signal.SIGINT else "2024-03-10"
    days = days_from(start, 3)
    services.land(SYNTHETIC, days)
    services.sink.arm(STEP_START.format(asset="raw_data"))
    name = signal.Signals(signum).name
    command = services.materialize(
        "--start", start, "--days", "3", "--dataset", "synthetic", name=name
    )
    services.sink.wait_held(command, timeout=RUN_SECONDS, output=lambda: str(services.said(name)))
    command.send_signal(signum)
    # The run is paused inside its step: the command terminates it, which takes effect once
    # the step goes on.
    time.sleep(2)
    services.sink.released.set()
    assert command.wait(timeout=RUN_SECONDS) == 128 + signum, services.said(name)

    out, err = services.said(name)
    (run,) = services.runs(days[0])
    assert run.status == dg.DagsterRunStatus.CANCELED
    assert (
        f"[1/3] {days[0]} stopped by {name}: run {run.run_id} terminated, recorded CANCELED" in err
    )
    assert "2 later day(s) not run" in err
    assert services.runs(days[1]) == services.runs(days[2]) == []
    # Nothing of a later day reached the lake, and what is there Dagster records.
    raw_data = services.lake / "synthetic" / "raw_data"
    stored = {str(p.relative_to(services.lake)) for p in raw_data.rglob(f"{start[:7]}*/*")}
    with services.instance() as instance:
        recorded = recorded_lake_keys(instance, dg.AssetKey(["synthetic", "raw_data"]), days)
    assert stored <= recorded


def test_the_command_tells_a_rejected_day_from_a_failed_one_and_reruns_it_once_corrected(
    services,
):
    days = days_from("2024-01-01", 3)
    faulty = days[1]
    services.land(SYNTHETIC, days)
    services.land(SYNTHETIC, [faulty], fault="null_burst")

    command = services.materialize("--start", days[0], "--days", "3", "--dataset", "synthetic")
    assert command.wait(timeout=3 * RUN_SECONDS) == 3, services.said()
    out, err = services.said()
    # One line a day says what it did; a rejected day is an outcome, not a failed day.
    outcomes = (" promoted (", " kept champion (challenger) (", " rejected: ")
    assert sum(out.count(f"{days[0]}{o}") for o in outcomes) == 1, out
    assert "FAILED" not in err
    assert f"{faulty} REJECTED by validated_data: failed quality gate" in out
    # The next day's 3-day window lost a day: its model is not trained (a verdict too).
    assert f"{days[2]} REJECTED by model: window below coverage" in out
    assert f"2 of 3 day(s) rejected: {faulty}, {days[2]}" in err

    # A corrected file reruns the rejected days without --force; accepted days are skipped.
    services.land(SYNTHETIC, [faulty])
    again = services.materialize("--start", days[0], "--days", "3", "--dataset", "synthetic")
    assert again.wait(timeout=3 * RUN_SECONDS) == 0, services.said()
    out, _ = services.said()
    assert out.count("already materialised") == 1 and "REJECTED" not in out


def test_without_a_webserver_the_command_says_what_to_start(tmp_path):
    env = {
        "DAGSTER_HOME": str(tmp_path),
        "ML_PLATFORM_LANDING_DIR": str(tmp_path / "landing"),
        "ML_PLATFORM_LAKE_DIR": str(tmp_path / "lake"),
        # A port nothing listens on.
        "ML_PLATFORM_DAGSTER_URL": "http://127.0.0.1:9",
    }
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    done = subprocess.run(
        [
            str(BIN / "ml-platform"),
            "materialize",
            "--start",
            "2024-01-01",
            "--dataset",
            "synthetic",
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "error: no Dagster webserver answers at http://127.0.0.1:9" in done.stderr
    assert "start the UI and daemon (`make serve`, or `dg dev`)" in done.stderr


def test_without_a_daemon_the_command_launches_nothing_and_says_what_to_start(tmp_path):
    services = DagsterServices(tmp_path)
    services.start(daemon=False)
    try:
        done = subprocess.run(
            [str(BIN / "ml-platform"), "materialize", "--start", "2024-01-01", "--dataset"]
            + ["synthetic"],
            env=services.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        services.stop()
    assert done.returncode == 1, done.stderr
    assert "error: no dagster-daemon works the run queue of the instance served at" in done.stderr
    # The daemon it says to start stores the pools' limits first (ml_platform/platform/pools.py).
    assert "`ml-platform pools && dagster-daemon run -w workspace.yaml`" in done.stderr
    with services.instance() as instance:
        assert instance.get_runs() == []


def test_a_command_on_another_instance_than_the_webservers_says_so(services, tmp_path):
    # The webserver's instance runs the day; the command's own DAGSTER_HOME never sees it.
    day = "2024-04-01"
    services.land(SYNTHETIC, [day])
    home = tmp_path / "other_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    done = subprocess.run(
        [str(BIN / "ml-platform"), "materialize", "--start", day, "--dataset", "synthetic"],
        env={**services.env, "DAGSTER_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    (run,) = services.runs(day)
    assert f"launched run {run.run_id}, but the instance of DAGSTER_HOME has no such run" in (
        done.stderr
    )
    services.finished(run.run_id)
