"""The command's own run when the webserver it launched through stops answering.

A real instance with Dagster's queued run coordinator holds the run; the webserver's address is
one nothing listens on, as after the UI was stopped or crashed. (A queued run needs the code
location's origin: its case runs against the daemon's queue in test_automation_integration.)
"""

import socket

import dagster as dg
import pytest

from ml_platform.automation.launch import Webserver
from ml_platform.cli import terminated


@pytest.fixture
def instance(tmp_path):
    with dg.DagsterInstance.local_temp(
        str(tmp_path),
        overrides={
            "run_coordinator": {
                "module": "dagster.core.run_coordinator",
                "class": "QueuedRunCoordinator",
            }
        },
    ) as instance:
        yield instance


@pytest.fixture
def gone() -> Webserver:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return Webserver(url=f"http://127.0.0.1:{port}")


def run_in(instance: dg.DagsterInstance, status: dg.DagsterRunStatus) -> dg.DagsterRun:
    return instance.add_run(dg.DagsterRun(job_name="daily_pipeline_job", status=status))


def test_a_started_run_the_webserver_cannot_terminate_is_said_so_without_the_query(instance, gone):
    run = run_in(instance, dg.DagsterRunStatus.STARTED)

    status = terminated(instance, gone, run.run_id)

    assert status.startswith(f"not terminated: the webserver at {gone.url} did not terminate"), (
        status
    )
    assert "Connection refused" in status and "mutation" not in status, status
    recorded = instance.get_run_by_id(run.run_id)
    assert recorded is not None and recorded.status == dg.DagsterRunStatus.STARTED
