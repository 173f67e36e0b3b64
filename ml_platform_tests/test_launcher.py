"""The forking run launcher under a real dagster-webserver and dagster-daemon on 127.0.0.1.

Runs queued through GraphQL are launched by the daemon in children forked from one warm
process; a change to the code on disk makes the next run use the new code; terminating a run
stops its process group; a run worker killed from outside is detected by run monitoring.
Each test serves a copy of the code location, so changing its code touches nothing shared.
"""

import contextlib
import datetime as dt
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ml_platform.contracts import load_contract
from ml_platform.ingestion.landing import LandingZone, land_days
from ml_platform.launcher import (
    CODE_SERVER,
    FORKED,
    PID_TAG,
    REASON_TAG,
    WARM_TAG,
    WORKER_TAG,
)
from ml_platform.warm_process import process_start_ticks
from ml_platform_tests.conftest import REPO, free_port
from ml_platform_tests.services import DagsterProcesses
from ml_platform_tests.test_integration import living_in_group

pytestmark = pytest.mark.integration
LOCATION = {"repositoryLocationName": "ml_platform", "repositoryName": "__repository__"}
FIRST_DAY = dt.date(2024, 1, 1)
LAUNCHER = """
run_launcher:
  module: ml_platform.launcher
  class: ForkingRunLauncher
"""
# Test-only additions to the copy of the code: a job that runs until it is stopped, and a
# definitions function that records which version of the code built the run's definitions.
SLEEP_JOB = """

import os as _os
import pathlib as _pathlib
import time as _time

from ml_platform.contracts import load_contracts as _load_contracts


@dg.op
def _sleep() -> None:
    _time.sleep(600)


@dg.job(executor_def=dg.in_process_executor)
def sleep_job() -> None:
    _sleep()


@dg.definitions
def defs() -> dg.Definitions:
    marker = _os.environ.get("TEST_CODE_MARKER")
    if marker:
        _pathlib.Path(marker).write_text(CODE_VERSION)
    contracts = _load_contracts(None, _os.environ.get("ML_PLATFORM_DATASET"))
    return dg.Definitions.merge(build_definitions(contracts), dg.Definitions(jobs=[sleep_job]))


CODE_VERSION = "v1"
"""


class Stack(DagsterProcesses):
    """dagster-webserver and dagster-daemon serving a copy of the code with the launcher."""

    def __init__(self, tmp_path: Path, launcher_config: str = ""):
        self.code = tmp_path / "code"
        self.code.mkdir()
        shutil.copytree(
            REPO / "ml_platform",
            self.code / "ml_platform",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        shutil.copy(REPO / "workspace.yaml", self.code / "workspace.yaml")
        with (self.code / "ml_platform" / "definitions.py").open("a") as definitions:
            definitions.write(SLEEP_JOB)
        home = tmp_path / "dagster_home"
        home.mkdir()
        config = (REPO / "dagster.yaml").read_text()
        if "ForkingRunLauncher" not in config:
            config += LAUNCHER
        config = config.replace(
            "class: ForkingRunLauncher\n", f"class: ForkingRunLauncher\n{launcher_config}"
        )
        # Look at running runs every 5 s instead of every 2 minutes, for the killed worker.
        config = config.replace(
            "run_monitoring:\n  enabled: true\n",
            "run_monitoring:\n  enabled: true\n  poll_interval_seconds: 5\n",
        )
        (home / "dagster.yaml").write_text(config)
        self.landing = tmp_path / "landing"
        self.marker = tmp_path / "code_version"
        self.port = free_port()
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            # The copy, not the repository, is the code the processes import.
            "PYTHONPATH": str(self.code),
            "ML_PLATFORM_DATASET": "synthetic",
            "ML_PLATFORM_LANDING_DIR": str(self.landing),
            "ML_PLATFORM_LAKE_DIR": str(tmp_path / "lake"),
            "TEST_CODE_MARKER": str(self.marker),
        }
        for variable in ("ML_PLATFORM_LANDING_URL", "ML_PLATFORM_LAKE_URL"):
            self.env.pop(variable, None)
        self.cwd = self.code
        self.logs = tmp_path
        self.procs: list[subprocess.Popen] = []

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        # Run workers have process groups of their own within the session: end them too.
        for proc in self.procs:
            for line in living_in_group(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(line.split()[0]), signal.SIGKILL)

    def land(self, days: int) -> None:
        dates = [FIRST_DAY + dt.timedelta(days=i) for i in range(days)]
        list(land_days(load_contract("synthetic"), LandingZone(base_dir=str(self.landing)), dates))

    def launch(self, job: str, partition: str | None = None) -> str:
        tags = [{"key": "dagster/partition", "value": partition}] if partition else []
        params = {
            "selector": {**LOCATION, "jobName": job},
            "executionMetadata": {"tags": tags},
        }
        result = self.graphql(LAUNCH_RUN, {"params": params})["launchRun"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return result["run"]["runId"]

    def run(self, run_id: str) -> dict:
        run = self.graphql(RUN_QUERY, {"runId": run_id})["runOrError"]
        return {**run, "tags": {t["key"]: t["value"] for t in run["tags"]}}

    def finished(self, run_id: str, daemon_alive: bool = True) -> dict:
        return self.wait_for(
            lambda: (
                (run := self.run(run_id))["status"] in ("SUCCESS", "FAILURE", "CANCELED") and run
            ),
            600,
            f"run {run_id} to finish",
            daemon_alive,
        )

    def messages(self, run_id: str) -> list[str]:
        events = self.graphql(EVENTS_QUERY, {"runId": run_id})["logsForRun"]["events"]
        return [e.get("message") or "" for e in events]

    def worker_pid(self, run_id: str) -> int:
        """The run worker's pid as Dagster's own engine event reports it."""
        for message in self.messages(run_id):
            if found := re.match(r"Started process for run \(pid: (\d+)\)", message):
                return int(found.group(1))
        raise AssertionError(f"no process start in the events of {run_id}")


LAUNCH_RUN = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message stack }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
RUN_QUERY = """
query Run($runId: ID!) {
  runOrError(runId: $runId) {
    ... on Run { runId status tags { key value } }
  }
}
"""
EVENTS_QUERY = """
query Events($runId: ID!) {
  logsForRun(runId: $runId) {
    ... on EventConnection { events { __typename ... on MessageEvent { message } } }
  }
}
"""
TERMINATE = """
mutation Terminate($runId: String!) {
  terminateRun(runId: $runId) {
    __typename
    ... on PythonError { message }
  }
}
"""


@pytest.fixture
def stack(tmp_path, request):
    running = Stack(tmp_path, getattr(request, "param", ""))
    running.start()
    try:
        running.wait_for(lambda: running.graphql("{ version }"), 180, "the webserver")
        yield running
    finally:
        running.stop()


def assert_forked(stack: Stack, run: dict) -> None:
    """The run's worker is the child the launcher forked (by Dagster's own account of its pid)."""
    assert run["tags"].get(WORKER_TAG) == FORKED, run["tags"]
    assert stack.worker_pid(run["runId"]) == int(run["tags"][PID_TAG])


def test_runs_fork_from_one_warm_process_and_new_code_restarts_it(stack):
    stack.land(3)
    first = stack.finished(stack.launch("synthetic_daily_pipeline_job", FIRST_DAY.isoformat()))
    assert first["status"] == "SUCCESS", stack.messages(first["runId"])[-20:]
    assert_forked(stack, first)
    assert stack.marker.read_text() == "v1"

    # The second run is forked from the same warm process: no new imports.
    second = stack.finished(stack.launch("synthetic_daily_pipeline_job", "2024-01-02"))
    assert second["status"] == "SUCCESS", stack.messages(second["runId"])[-20:]
    assert_forked(stack, second)
    assert second["tags"][WARM_TAG] == first["tags"][WARM_TAG]

    # New code on disk: the next run is forked from a new warm process that imported it.
    definitions = stack.code / "ml_platform" / "definitions.py"
    definitions.write_text(
        definitions.read_text().replace('CODE_VERSION = "v1"', 'CODE_VERSION = "v2"')
    )
    third = stack.finished(stack.launch("synthetic_daily_pipeline_job", "2024-01-03"))
    assert third["status"] == "SUCCESS", stack.messages(third["runId"])[-20:]
    assert_forked(stack, third)
    assert third["tags"][WARM_TAG] != first["tags"][WARM_TAG]
    assert stack.marker.read_text() == "v2"
    # The stale warm process is gone; the new one still serves.
    assert process_start_ticks(int(first["tags"][WARM_TAG])) is None
    warm = int(third["tags"][WARM_TAG])
    assert process_start_ticks(warm) is not None

    # The warm process ends with the daemon that started it, however the daemon ends.
    daemon = stack.procs[1]
    daemon.kill()
    daemon.wait(timeout=30)
    deadline = time.monotonic() + 30
    while process_start_ticks(warm) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert process_start_ticks(warm) is None, "the warm process outlived its daemon"


def started(stack: Stack, run_id: str) -> dict | None:
    run = stack.run(run_id)
    assert run["status"] not in ("SUCCESS", "FAILURE", "CANCELED"), run
    return run if run["status"] == "STARTED" and PID_TAG in run["tags"] else None


def test_terminate_stops_a_forked_run_and_monitoring_fails_a_killed_one(stack):
    run_id = stack.launch("sleep_job")
    run = stack.wait_for(lambda: started(stack, run_id), 300, "the sleeping run to start")
    assert_forked(stack, run)
    pid = int(run["tags"][PID_TAG])
    result = stack.graphql(TERMINATE, {"runId": run_id})["terminateRun"]
    assert result["__typename"] == "TerminateRunSuccess", result
    assert stack.finished(run_id)["status"] == "CANCELED"
    # Cancelled by the run worker itself on the interrupt, as with the default launcher; not
    # marked so by the launcher after killing it.
    messages = stack.messages(run_id)
    assert 'Execution of run for "sleep_job" canceled.' in messages, messages
    assert not any("did not stop within" in m for m in messages)
    stack.wait_for(lambda: process_start_ticks(pid) is None, 60, "the run worker to exit")

    # A worker killed from outside (out of memory, a lost machine) never reports its end:
    # run monitoring asks the launcher, which finds the process gone.
    run_id = stack.launch("sleep_job")
    run = stack.wait_for(lambda: started(stack, run_id), 300, "the second sleeping run")
    assert_forked(stack, run)
    os.kill(int(run["tags"][PID_TAG]), signal.SIGKILL)
    failed = stack.finished(run_id)
    assert failed["status"] == "FAILURE"
    assert any("exited without finishing the run" in m for m in stack.messages(run_id))

    # A signal to the daemon's process group (Ctrl-C on `dagster dev`, a service stop)
    # reaches the default launcher's run workers, which share the group; the warm process
    # passes it on to the forked ones, which have groups of their own. With no termination
    # requested, Dagster ends an interrupted run as failed.
    run_id = stack.launch("sleep_job")
    run = stack.wait_for(lambda: started(stack, run_id), 300, "the third sleeping run")
    assert_forked(stack, run)
    os.killpg(stack.procs[1].pid, signal.SIGTERM)
    assert stack.finished(run_id, daemon_alive=False)["status"] == "FAILURE"
    messages = stack.messages(run_id)
    assert any("Execution was interrupted unexpectedly" in m for m in messages), messages


# A warm process that cannot start (here: it is told to import a module that does not exist).
BROKEN_WARM_PROCESS = "  config:\n    preload_modules: [ml_platform_no_such_module]\n"


@pytest.mark.parametrize("stack", [BROKEN_WARM_PROCESS], indirect=True)
def test_a_run_the_warm_process_cannot_take_runs_through_the_code_server(stack):
    stack.land(1)
    run = stack.finished(stack.launch("synthetic_daily_pipeline_job", FIRST_DAY.isoformat()))
    assert run["status"] == "SUCCESS", stack.messages(run["runId"])[-20:]
    assert run["tags"][WORKER_TAG] == CODE_SERVER
    assert "ml_platform_no_such_module" in run["tags"][REASON_TAG]
    assert PID_TAG not in run["tags"]
