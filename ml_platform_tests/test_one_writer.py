"""One writer per day: `ml-platform materialize` of a day waits for a launched run of that day.

A real dagster-daemon works the queue of a temporary instance with the repository's
dagster.yaml; a run of the ingestion job for a landed synthetic day is launched through that
queue.
The instance's log handler sends every record to a sink that leaves the launched run's raw_data
step start unanswered, so the run is paused inside its first step. `materialize` of the same
day, started then, says it waits for that run; only after it says so is the run released. The
instance's run start and end events show the two runs did not overlap. Which runs write a day,
and what becomes of a killed command's run, on an instance of its own.
"""

import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ml_platform.automation.day_writers import cli_run_tags, other_writers, overlapping
from ml_platform.contracts import load_contract
from ml_platform.ingestion.landing import LandingZone, land_days
from ml_platform.platform.writers import (
    CLI_PROCESS_TAG,
    DATASET_PARTITION_TAG,
    earlier_writers,
    record_dead_cli_runs,
    started_by,
)
from ml_platform_tests.conftest import REPO
from ml_platform_tests.services import DagsterProcesses, held_log

DAY = "2024-01-01"
# The cheapest job that writes the day (raw_data, validated_data, features).
JOB = "synthetic_ingestion_job"
BIN = Path(sys.executable).parent
RAW_DATA_START = " - synthetic__raw_data - STEP_START - "


class Daemon(DagsterProcesses):
    """dagster-daemon over a fresh instance: the repository's dagster.yaml plus a log handler."""

    def __init__(self, tmp_path: Path, handler: dict):
        home = tmp_path / "dagster_home"
        home.mkdir()
        config = yaml.safe_load((REPO / "dagster.yaml").read_text())
        config["python_logs"]["dagster_handler_config"]["handlers"]["sink"] = handler
        (home / "dagster.yaml").write_text(yaml.safe_dump(config))
        zone = LandingZone(base_dir=str(tmp_path / "landing"))
        list(land_days(load_contract("synthetic"), zone, [dt.date.fromisoformat(DAY)]))
        self.home = home
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "ML_PLATFORM_DATASET": "synthetic",
            "ML_PLATFORM_LANDING_DIR": zone.base_dir,
            "ML_PLATFORM_LAKE_DIR": str(tmp_path / "lake"),
        }
        self.cwd = REPO
        self.logs = tmp_path
        self.port = 0  # no webserver
        self.procs: list[subprocess.Popen] = []


def launch(daemon: Daemon) -> None:
    """A run of the day through the queue, without the day's tag, as the UI launches it."""
    subprocess.run(
        [str(BIN / "dagster"), "job", "launch", "-w", "workspace.yaml", "-j", JOB]
        + ["--tags", json.dumps({"dagster/partition": DAY})],
        cwd=REPO,
        env=daemon.env,
        check=True,
        capture_output=True,
    )


def materialize(daemon: Daemon, tmp_path: Path) -> subprocess.Popen:
    """`ml-platform materialize` of the day, its output in materialize.out and .err."""
    out, err = tmp_path / "materialize.out", tmp_path / "materialize.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        return subprocess.Popen(
            [str(BIN / "ml-platform"), "materialize", "--start", DAY],
            cwd=tmp_path,
            env=daemon.env,
            stdout=stdout,
            stderr=stderr,
        )


def first_event(instance: dg.DagsterInstance, run_id: str, kind: dg.DagsterEventType) -> float:
    records = instance.get_records_for_run(run_id, of_type=kind).records
    assert len(records) == 1, (run_id, kind, records)
    return records[0].timestamp


def add_run(
    instance: dg.DagsterInstance,
    job: str,
    tags: dict,
    status: dg.DagsterRunStatus = dg.DagsterRunStatus.STARTED,
    asset_selection: set[dg.AssetKey] | None = None,
) -> dg.DagsterRun:
    run = dg.DagsterRun(
        job_name=job,
        run_id=str(uuid.uuid4()),
        tags=tags,
        status=status,
        asset_selection=asset_selection,
    )
    return instance.add_run(run)


def test_the_writers_of_a_day_are_found_by_tag_partition_or_range_and_dataset():
    with dg.DagsterInstance.ephemeral() as instance:
        sensor = add_run(
            instance,
            "synthetic_daily_pipeline_job",
            {DATASET_PARTITION_TAG: f"synthetic:{DAY}", "dagster/sensor_name": "s"},
        )
        # Created by the UI, not yet started.
        ui = add_run(
            instance,
            "__ASSET_JOB",
            {"dagster/partition": DAY},
            asset_selection={dg.AssetKey(["synthetic", "raw_data"])},
            status=dg.DagsterRunStatus.NOT_STARTED,
        )
        backfill = add_run(
            instance,
            "__ASSET_JOB",
            {
                "dagster/backfill": "abc",
                "dagster/asset_partition_range_start": "2023-12-30",
                "dagster/asset_partition_range_end": "2024-01-05",
            },
            asset_selection={dg.AssetKey(["synthetic", "model"])},
        )
        # Not writers of the day: another dataset's run of it, another day, a run that ended.
        add_run(instance, "flights_daily_pipeline_job", {DATASET_PARTITION_TAG: f"flights:{DAY}"})
        add_run(instance, "flights_daily_pipeline_job", {"dagster/partition": DAY})
        add_run(instance, "synthetic_ingestion_job", {"dagster/partition": "2024-01-02"})
        add_run(
            instance,
            "synthetic_ingestion_job",
            {"dagster/partition": DAY},
            status=dg.DagsterRunStatus.SUCCESS,
        )

        found = other_writers(instance, "synthetic", DAY, {"synthetic_daily_pipeline_job"})

    assert {run.run_id for run in found} == {r.run_id for r in (sensor, ui, backfill)}
    assert [started_by(r) for r in (sensor, ui, backfill)] == [
        "sensor s",
        "the UI or the API",
        "backfill abc",
    ]


def test_a_killed_commands_run_is_recorded_failed_and_a_living_ones_is_not():
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process
    with dg.DagsterInstance.ephemeral() as instance:
        tags = cli_run_tags("synthetic", DAY)
        living = add_run(instance, JOB, tags)
        host = tags[CLI_PROCESS_TAG].rpartition(":")[0]
        dead = add_run(instance, JOB, {**tags, CLI_PROCESS_TAG: f"{host}:{gone.pid}"})

        recorded = record_dead_cli_runs(instance)

        assert [run.run_id for run in recorded] == [dead.run_id]
        assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE
        assert instance.get_run_by_id(living.run_id).status == dg.DagsterRunStatus.STARTED
        assert [r.run_id for r in other_writers(instance, "synthetic", DAY, {JOB})] == [
            living.run_id
        ]


def test_a_run_of_the_day_in_progress_during_a_run_is_found_overlapping_it():
    # Two runs of the day on one instance: the first paused inside its step while the second
    # runs whole; a third after both.
    entered, release = threading.Event(), threading.Event()

    @dg.op
    def writes() -> None:
        if not entered.is_set():  # the first run: it stays inside its step until released
            entered.set()
            assert release.wait(30)

    job = dg.GraphDefinition(name="day", node_defs=[writes]).to_job()
    tags = {DATASET_PARTITION_TAG: f"synthetic:{DAY}"}
    with dg.DagsterInstance.ephemeral() as instance:
        since = time.time()
        results: list[dg.ExecuteInProcessResult] = []
        first = threading.Thread(
            target=lambda: results.append(job.execute_in_process(instance=instance, tags=tags))
        )
        first.start()
        assert entered.wait(30)
        second = job.execute_in_process(instance=instance, tags=tags)
        release.set()
        first.join()
        later = job.execute_in_process(instance=instance, tags=tags)
        first_id = results[0].run_id

        assert [r.run_id for r in overlapping(instance, first_id, "synthetic", DAY, {}, since)] == [
            second.run_id
        ]
        assert overlapping(instance, later.run_id, "synthetic", DAY, {}, since) == []


@pytest.mark.integration
def test_materialize_of_a_day_waits_for_the_launched_run_of_that_day(tmp_path):
    with held_log(RAW_DATA_START) as sink:
        daemon = Daemon(tmp_path, sink.handler())
        daemon.start(webserver=False)
        try:
            launch(daemon)
            # The daemon takes the run from the queue; its worker pauses inside raw_data.
            sink.wait_held(daemon.procs[0], timeout=240, output=daemon.output)
            with dg.DagsterInstance.from_config(str(daemon.home)) as instance:
                (launched,) = instance.get_runs()
            out_path = tmp_path / "materialize.out"
            cli = materialize(daemon, tmp_path)
            waiting = f"{DAY} waiting for run {launched.run_id} (the UI or the API, STARTED)"
            # It says so strictly while the launched run is paused: that run cannot end first.
            while waiting not in out_path.read_text():
                assert cli.poll() is None, out_path.read_text()
                time.sleep(0.2)
            sink.released.set()
            assert cli.wait(timeout=300) == 0, (tmp_path / "materialize.err").read_text()[-3000:]
        finally:
            daemon.stop()

    said = out_path.read_text()
    assert f"{DAY} waited for run {launched.run_id} to end, then " in said, said
    with dg.DagsterInstance.from_config(str(daemon.home)) as instance:
        runs = {run.run_id: run for run in instance.get_runs()}
        (own,) = [run for run in runs.values() if CLI_PROCESS_TAG in run.tags]
        assert runs[launched.run_id].status == own.status == dg.DagsterRunStatus.SUCCESS
        assert own.tags[DATASET_PARTITION_TAG] == f"synthetic:{DAY}"
        launched_end = first_event(instance, launched.run_id, dg.DagsterEventType.RUN_SUCCESS)
        own_start = first_event(instance, own.run_id, dg.DagsterEventType.RUN_START)
    assert launched_end <= own_start


def messages(instance: dg.DagsterInstance, run_id: str) -> list[tuple[float, str]]:
    """(timestamp, message) of each record a run logged."""
    return [
        (r.timestamp, r.event_log_entry.user_message)
        for r in instance.get_records_for_run(run_id).records
    ]


@pytest.mark.integration
def test_a_run_launched_while_materialize_runs_the_day_waits_in_its_steps(tmp_path):
    # The reverse: the command's run executes (paused inside raw_data by the log sink) when a
    # run of the day is launched without the day's tag, as the UI or a backfill's range does,
    # which the queue does not hold. Its first step waits for the command's run.
    with held_log(RAW_DATA_START) as sink:
        daemon = Daemon(tmp_path, sink.handler())
        daemon.start(webserver=False)
        err_path = tmp_path / "materialize.err"
        try:
            cli = materialize(daemon, tmp_path)
            sink.wait_held(cli, timeout=240, output=lambda: err_path.read_text()[-3000:])
            launch(daemon)
            with dg.DagsterInstance.from_config(str(daemon.home)) as instance:
                (own,) = [r for r in instance.get_runs() if CLI_PROCESS_TAG in r.tags]
                (launched,) = [r for r in instance.get_runs() if r.run_id != own.run_id]
                waiting = f"waiting for run {own.run_id} (ml-platform materialize, process "
                # Said strictly while the command's run is paused: that run cannot end first.
                deadline = time.monotonic() + 240
                while not any(waiting in m for _, m in messages(instance, launched.run_id)):
                    assert time.monotonic() < deadline, daemon.output()
                    assert cli.poll() is None, err_path.read_text()[-3000:]
                    time.sleep(0.5)
            sink.released.set()
            assert cli.wait(timeout=300) == 0, err_path.read_text()[-3000:]
            with dg.DagsterInstance.from_config(str(daemon.home)) as instance:
                deadline = time.monotonic() + 240
                while not instance.get_run_by_id(launched.run_id).is_finished:
                    assert time.monotonic() < deadline, daemon.output()
                    time.sleep(0.5)
        finally:
            daemon.stop()

    with dg.DagsterInstance.from_config(str(daemon.home)) as instance:
        assert instance.get_run_by_id(launched.run_id).status == dg.DagsterRunStatus.SUCCESS
        own_start = first_event(instance, own.run_id, dg.DagsterEventType.RUN_START)
        own_end = first_event(instance, own.run_id, dg.DagsterEventType.RUN_SUCCESS)
        launched_start = first_event(instance, launched.run_id, dg.DagsterEventType.RUN_START)
        written = instance.get_records_for_run(
            launched.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
        ).records
        said = messages(instance, launched.run_id)
    # The launched run started while the command's run executed, and wrote only after it ended.
    assert own_start < launched_start < own_end
    assert len(written) == 3 and min(r.timestamp for r in written) > own_end
    (waited,) = [m for _, m in said if f"one writer per day: waited for run {own.run_id}" in m]
    assert waited.startswith("synthetic__raw_data: "), waited
    # The command saw the launched run wait for it, not write beside it: it did not fail the day.
    assert "FAILED" not in (tmp_path / "materialize.out").read_text() + err_path.read_text()


def test_a_run_waits_only_for_runs_that_started_before_it_and_write_its_days():
    # Real runs of asset jobs on one instance, each paused inside its step: Dagster records
    # when each started and what it plans to materialise.
    release = threading.Event()
    entered = threading.Semaphore(0)
    days = dg.DailyPartitionsDefinition(start_date="2024-01-01")

    def paused(dataset: str) -> dg.AssetsDefinition:
        @dg.asset(key=[dataset, "raw_data"], partitions_def=days)
        def raw_data() -> None:
            entered.release()
            assert release.wait(60)

        return raw_data

    defs = dg.Definitions(assets=[paused("synthetic"), paused("flights")])
    job = defs.resolve_implicit_global_asset_job_def()
    # Files, not memory: the runs' threads write the instance at once.
    with dg.instance_for_test() as instance:
        threads, ids = [], []
        runs = [
            ("synthetic", DAY),
            ("flights", DAY),
            ("synthetic", "2024-01-02"),
            ("synthetic", DAY),
        ]
        for dataset, day in runs:
            subset = job.get_subset(asset_selection={dg.AssetKey([dataset, "raw_data"])})
            kwargs = {"instance": instance, "partition_key": day}
            threads.append(threading.Thread(target=subset.execute_in_process, kwargs=kwargs))
            threads[-1].start()
            assert entered.acquire(timeout=60)
            ids.append(next(r.run_id for r in instance.get_runs() if r.run_id not in ids))
        try:
            held = earlier_writers(instance, ids[3], "synthetic", [DAY, "2024-01-03"])
            first = earlier_writers(instance, ids[0], "synthetic", [DAY])
            flights = earlier_writers(instance, ids[1], "flights", [DAY])
        finally:
            release.set()
            for thread in threads:
                thread.join()

    # The earlier run of the day holds it, for that day only; another dataset's run of the day
    # and another day's run do not; and no run is held by one that started after it.
    assert {run_id: shared for run_id, (_, shared) in held.items()} == {ids[0]: [DAY]}
    assert first == flights == {}
