"""End to end on 127.0.0.1: real dagster-webserver, dagster-daemon and an S3 API server (moto).

Files landed in the bucket run their days through the running landing sensor, a corrected
file reruns exactly its day, and a 7-day backfill launched through GraphQL completes while the
sensor's runs train, under the run queue and concurrency limits of the repository's
dagster.yaml: never two training runs at once, never two runs of one day at once, at most two.
On a local landing zone, files moved or copied in with a week-old mtime get their days requested
and a link to /etc/os-release gets nothing.
"""

import datetime as dt
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

import boto3
import dagster as dg
import pytest
import yaml
from moto.server import ThreadedMotoServer

from ml_platform.automation.alert_sensors import (
    ALERT_DELIVERY_SENSOR,
    RUN_FAILURE_ALERTS_SENSOR,
    RUN_SUCCESS_ALERTS_SENSOR,
)
from ml_platform.automation.launch import LAUNCH_BACKFILL, LaunchError, Webserver
from ml_platform.cli import follow
from ml_platform.contracts import load_contract
from ml_platform.ingestion.landing import source_day
from ml_platform.ingestion.synthetic import file_bytes
from ml_platform_tests.conftest import REPO, day_files, free_port
from ml_platform_tests.services import BACKFILL_QUERY, DagsterProcesses

pytestmark = pytest.mark.integration
SYNTHETIC = load_contract("synthetic")
BUCKET = "landing"
PREFIX = "incoming/"
LOCATION = {"repositoryLocationName": "ml_platform", "repositoryName": "__repository__"}
DAILY_JOB = "synthetic_daily_pipeline_job"
INGESTION_JOB = "synthetic_ingestion_job"
LANDING_SENSOR = "synthetic_landing_sensor"


def day(offset: int) -> str:
    return (dt.date(2024, 1, 1) + dt.timedelta(days=offset)).isoformat()


@pytest.fixture
def s3_endpoint():
    """A real S3 API on 127.0.0.1 that the run processes reach over HTTP."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


class Stack(DagsterProcesses):
    """dagster-webserver and dagster-daemon over a fresh instance, and a GraphQL client."""

    def __init__(self, tmp_path: Path, s3_endpoint: str):
        home = tmp_path / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
        self.home = home
        self.lake = tmp_path / "lake"
        self.port = free_port()
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "ML_PLATFORM_DATASET": "synthetic",
            "ML_PLATFORM_LANDING_URL": f"s3://{BUCKET}/{PREFIX}",
            "ML_PLATFORM_S3_ENDPOINT_URL": s3_endpoint,
            "ML_PLATFORM_LAKE_DIR": str(self.lake),
            # The daemon evaluates sensors at most every 5 s whatever the interval says.
            "ML_PLATFORM_SENSOR_INTERVAL_SECONDS": "5",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        self.env.pop("ML_PLATFORM_LANDING_DIR", None)
        self.s3 = boto3.client(
            "s3",
            endpoint_url=s3_endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        self.s3.create_bucket(Bucket=BUCKET)
        self.cwd = REPO
        self.logs = tmp_path
        self.procs: list[subprocess.Popen] = []

    def land(self, partition: str, corrected: bool = False) -> None:
        frame = source_day(SYNTHETIC, dt.date.fromisoformat(partition))
        if corrected:
            frame = frame.iloc[:-1]  # the upstream withdrew a bad row: a new, valid file
        self.s3.put_object(
            Bucket=BUCKET,
            Key=PREFIX + SYNTHETIC.landing.file_name(partition),
            Body=file_bytes(frame, None),
        )

    def runs(self, **run_filter) -> list[dict]:
        data = self.graphql(RUNS_QUERY, {"filter": run_filter})["runsOrError"]
        return [
            {**run, "tags": {t["key"]: t["value"] for t in run["tags"]}} for run in data["results"]
        ]

    def sensor(self, mutation: str) -> None:
        selector = {**LOCATION, "sensorName": LANDING_SENSOR}
        if mutation == "start":
            result = self.graphql(START_SENSOR, {"selector": selector})["startSensor"]
            assert result["sensorState"]["status"] == "RUNNING", result
        else:
            state = self.graphql(SENSOR_QUERY, {"selector": selector})["sensorOrError"]
            result = self.graphql(STOP_SENSOR, {"id": state["sensorState"]["id"]})["stopSensor"]
            assert result["instigationState"]["status"] == "STOPPED", result

    def ticks(self, sensor: str) -> list[dict]:
        selector = {**LOCATION, "sensorName": sensor}
        return self.graphql(SENSOR_QUERY, {"selector": selector})["sensorOrError"]["sensorState"][
            "ticks"
        ]

    def reacted_runs(self, sensor: str) -> set[str]:
        """The runs a run-status sensor was handed; fails on a tick that errored."""
        selector = {**LOCATION, "sensorName": sensor}
        data = self.graphql(REACTION_TICKS_QUERY, {"selector": selector})["sensorOrError"]
        ticks = data["sensorState"]["ticks"]
        errors = [t["error"]["message"] for t in ticks if t["status"] == "FAILURE" and t["error"]]
        assert not errors, errors
        return {run_id for t in ticks for run_id in t["originRunIds"]}

    def sensor_ticks_since(self, timestamp: float) -> int:
        return sum(1 for t in self.ticks(LANDING_SENSOR) if t["timestamp"] > timestamp)

    def daemon_passed(self, timestamp: float) -> bool:
        """Whether the sensor daemon has run two loops since `timestamp`, none still in flight.

        A loop reads the sensors' states when it begins, so a loop that began before a sensor
        was stopped may still evaluate it; the second loop after the stop cannot.
        """
        selector = {**LOCATION, "sensorName": LANDING_SENSOR}
        state = self.graphql(SENSOR_QUERY, {"selector": selector})["sensorOrError"]["sensorState"]
        if state["status"] != "STOPPED":
            # A tick that was running when the sensor was stopped stores its cursor with the
            # state it read, which can undo the stop: stop it again.
            self.sensor("stop")
            return False
        alerts = [t for t in self.ticks(ALERT_DELIVERY_SENSOR) if t["timestamp"] > timestamp]
        landing = state["ticks"]
        landing_busy = any(t["status"] == "STARTED" for t in landing)
        # A running sensor ticks every 5 s: 15 s without a landing tick means none is pending.
        latest = max([timestamp, *(t["timestamp"] for t in landing)])
        quiet = time.time() - latest >= 15
        return len(alerts) >= 2 and not landing_busy and quiet


RUNS_QUERY = """
query Runs($filter: RunsFilter) {
  runsOrError(filter: $filter) {
    ... on Runs {
      results { runId status jobName startTime endTime tags { key value } }
    }
  }
}
"""
START_SENSOR = """
mutation Start($selector: SensorSelector!) {
  startSensor(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { status } }
    ... on PythonError { message }
  }
}
"""
SENSOR_QUERY = """
query Sensor($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    ... on Sensor { sensorState { id status ticks(limit: 20) { timestamp status } } }
  }
}
"""
REACTION_TICKS_QUERY = """
query Ticks($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    ... on Sensor {
      sensorState { ticks(limit: 100) { status originRunIds error { message } } }
    }
  }
}
"""
STOP_SENSOR = """
mutation Stop($id: String) {
  stopSensor(id: $id) {
    __typename
    ... on StopSensorMutationResult { instigationState { status } }
    ... on PythonError { message }
  }
}
"""


@pytest.fixture
def stack(tmp_path, s3_endpoint):
    running = Stack(tmp_path, s3_endpoint)
    running.start()
    try:
        running.wait_for(lambda: running.graphql("{ version }"), 180, "the webserver")
        yield running
    finally:
        running.stop()


def created(runs: list[dict], expected: int) -> list[dict] | None:
    """The runs once there are `expected` of them, in any state; fails on a failed run."""
    failed = [r for r in runs if r["status"] in ("FAILURE", "CANCELED")]
    assert not failed, f"runs did not succeed: {failed}"
    return runs if len(runs) >= expected else None


def succeeded(runs: list[dict], expected: int) -> list[dict] | None:
    """The runs once `expected` of them succeeded; fails at once on a failed run."""
    created(runs, 0)
    done = [r for r in runs if r["status"] == "SUCCESS"]
    return done if len(done) >= expected else None


def overlapping(runs: list[dict]) -> list[tuple[str, str]]:
    """Pairs of runs whose executions overlapped in time."""
    pairs = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if a["startTime"] < b["endTime"] and b["startTime"] < a["endTime"]:
                pairs.append((a["runId"], b["runId"]))
    return pairs


def test_sensor_runs_landed_days_reruns_a_corrected_day_and_a_backfill_completes(stack):
    # The sensor's runs train, so they run one at a time (dagster.yaml); the steps below are
    # arranged to overlap with them, and the backfill (of ingestion_job, which does not train)
    # runs in the other slot: waiting for each run in turn would add minutes.
    stack.sensor("start")
    for offset in range(3):
        stack.land(day(offset))
    first = stack.wait_for(
        lambda: created(stack.runs(pipelineName=DAILY_JOB), 3), 120, "3 sensor requests"
    )
    assert sorted(r["tags"]["dagster/partition"] for r in first) == [day(0), day(1), day(2)]
    for run in first:
        assert run["tags"]["dagster/sensor_name"] == LANDING_SENSOR
        expected = f"s3://{BUCKET}/{PREFIX}synthetic_{run['tags']['dagster/partition']}.csv"
        assert run["tags"]["ml_platform/landed_file"] == expected

    # A corrected file for the second day: exactly that day runs again, nothing else.
    stack.land(day(1), corrected=True)
    relanded_at = time.time()
    runs = stack.wait_for(
        lambda: created(stack.runs(pipelineName=DAILY_JOB), 4), 120, "the rerun request"
    )
    [rerun] = [r for r in runs if r["runId"] not in {f["runId"] for f in first}]
    assert rerun["tags"]["dagster/partition"] == day(1)
    before = next(r for r in first if r["tags"]["dagster/partition"] == day(1))
    assert (
        rerun["tags"]["ml_platform/landed_version"] != before["tags"]["ml_platform/landed_version"]
    )
    stack.wait_for(lambda: stack.sensor_ticks_since(relanded_at) >= 3, 120, "3 more sensor ticks")
    assert len(stack.runs(pipelineName=DAILY_JOB)) == 4

    # With the sensor off, land a week and backfill it through GraphQL.
    stack.sensor("stop")
    stopped_at = time.time()
    stack.wait_for(lambda: stack.daemon_passed(stopped_at), 120, "the daemon to see the stop")
    week = [day(offset) for offset in range(3, 10)]
    for partition in week:
        stack.land(partition)
    launched = stack.graphql(
        LAUNCH_BACKFILL,
        {
            "params": {
                "selector": {
                    "partitionSetName": f"{INGESTION_JOB}_partition_set",
                    "repositorySelector": LOCATION,
                },
                "partitionNames": week,
            }
        },
    )["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    backfill_id = launched["backfillId"]

    sensor_runs = stack.wait_for(
        lambda: succeeded(stack.runs(pipelineName=DAILY_JOB), 4),
        600,
        "the 4 sensor runs to succeed",
    )
    assert sorted(r["tags"]["dagster/partition"] for r in sensor_runs) == sorted(
        [day(0), day(1), day(1), day(2)]
    )
    # A week is fewer days than a backfill run holds (ML_PLATFORM_BACKFILL_DAYS_PER_RUN): one run.
    backfill_runs = stack.wait_for(
        lambda: succeeded(stack.runs(tags=[{"key": "dagster/backfill", "value": backfill_id}]), 1),
        600,
        "the 7-day backfill",
    )
    assert len(backfill_runs) == 1
    assert backfill_runs[0]["tags"]["dagster/asset_partition_range_start"] == week[0]
    assert backfill_runs[0]["tags"]["dagster/asset_partition_range_end"] == week[-1]
    assert {r["jobName"] for r in backfill_runs} == {INGESTION_JOB}
    stack.wait_for(
        lambda: (
            stack.graphql(BACKFILL_QUERY, {"id": backfill_id})["partitionBackfillOrError"]["status"]
            in ("COMPLETED", "COMPLETED_SUCCESS")
        ),
        120,
        "the backfill to be marked complete",
    )
    for offset in range(3):
        assert day_files(stack.lake, "synthetic", "evaluation_report", day(offset))
    for partition in week:
        assert day_files(stack.lake, "synthetic", "features", partition)

    # The sensor was off: only the backfill ran the week. And the queue kept its limits.
    everything = stack.runs()
    assert len(everything) == 4 + 1
    assert overlapping(sensor_runs) == [], "two training runs ran at once"
    for partition in {r["tags"]["dagster/partition"] for r in sensor_runs}:
        same_day = [r for r in sensor_runs if r["tags"]["dagster/partition"] == partition]
        assert overlapping(same_day) == [], f"two runs of {partition} ran at once"
    for run in everything:
        at_once = [r for r in everything if r["startTime"] <= run["startTime"] < r["endTime"]]
        assert len(at_once) <= 2, "more than 2 runs at once"
    # The daemon hands every finished run to the success alerts sensor, which runs without error.
    finished = {r["runId"] for r in everything}
    stack.wait_for(
        lambda: stack.reacted_runs(RUN_SUCCESS_ALERTS_SENSOR) >= finished,
        120,
        "the success alerts sensor to handle every run",
    )
    assert stack.reacted_runs(RUN_FAILURE_ALERTS_SENSOR) == set()


class LocalZoneStack(Stack):
    """The same processes with the landing zone a local directory instead of the bucket."""

    def __init__(self, tmp_path: Path, s3_endpoint: str):
        super().__init__(tmp_path, s3_endpoint)
        self.zone = tmp_path / "landing"
        self.zone.mkdir()
        self.env.pop("ML_PLATFORM_LANDING_URL")
        self.env["ML_PLATFORM_LANDING_DIR"] = str(self.zone)
        # What is asked of this stack is the sensor's requests, not their days: the queue keeps
        # them (Dagster's "0 stops any runs from launching") instead of spending minutes of CPU
        # on three daily runs no assertion reads.
        config = yaml.safe_load((self.home / "dagster.yaml").read_text())
        config["concurrency"]["runs"]["max_concurrent_runs"] = 0
        (self.home / "dagster.yaml").write_text(yaml.safe_dump(config))


def test_the_running_sensor_sees_files_moved_or_copied_in_with_an_old_mtime_not_links(
    tmp_path, s3_endpoint, monkeypatch
):
    stack = LocalZoneStack(tmp_path, s3_endpoint)
    outbox = tmp_path / "outbox"
    outbox.mkdir()
    week_ago = time.time() - 7 * 86_400

    def prepared(partition: str) -> Path:
        """A day's file finished a week ago outside the zone, as an upstream job leaves it."""
        path = outbox / SYNTHETIC.landing.file_name(partition)
        path.write_bytes(file_bytes(source_day(SYNTHETIC, dt.date.fromisoformat(partition)), None))
        os.utime(path, (week_ago, week_ago))
        return path

    def in_zone(partition: str) -> Path:
        return stack.zone / SYNTHETIC.landing.file_name(partition)

    stack.start()
    try:
        stack.wait_for(lambda: stack.graphql("{ version }"), 180, "the webserver")
        shutil.copy(prepared(day(0)), in_zone(day(0)))
        stack.sensor("start")
        stack.wait_for(
            lambda: created(stack.runs(pipelineName=DAILY_JOB), 1), 120, "the first request"
        )

        # The atomic way to land (rename a finished file into place) and `cp -p`: both keep
        # the week-old mtime, older than anything the sensor has seen. A link is never read.
        os.rename(prepared(day(1)), in_zone(day(1)))
        shutil.copy2(prepared(day(2)), in_zone(day(2)))
        in_zone(day(3)).symlink_to("/etc/os-release")
        landed_at = time.time()
        stack.wait_for(
            lambda: created(stack.runs(pipelineName=DAILY_JOB), 3), 120, "2 more requests"
        )
        stack.wait_for(lambda: stack.sensor_ticks_since(landed_at) >= 3, 120, "3 more ticks")

        runs = stack.runs(pipelineName=DAILY_JOB)
        assert sorted(r["tags"]["dagster/partition"] for r in runs) == [day(0), day(1), day(2)]
        for run in runs:
            partition = run["tags"]["dagster/partition"]
            assert run["tags"]["ml_platform/landed_file"] == str(in_zone(partition))

        # A run the queue holds, followed by a command whose webserver stopped answering (the
        # UI shut down): the user reads that the webserver is gone, and the run leaves the
        # queue through the instance's own run coordinator instead of waiting there unseen.
        monkeypatch.setattr("ml_platform.cli.QUEUE_CHECK_SECONDS", 0.0)
        gone = Webserver(url=f"http://127.0.0.1:{free_port()}")
        queued = runs[0]["runId"]
        with dg.DagsterInstance.from_config(str(stack.home)) as instance:
            with pytest.raises(LaunchError) as raised:
                follow(instance, gone, queued)
            canceled = instance.get_run_by_id(queued)
        message = str(raised.value)
        assert message.startswith(f"no Dagster webserver answers at {gone.url}"), message
        assert message.endswith(f"Run {queued} was canceled"), message
        assert canceled is not None and canceled.status == dg.DagsterRunStatus.CANCELED
    finally:
        stack.stop()
    first_line = Path("/etc/os-release").read_text().splitlines()[0]
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("*.log"))
    assert first_line not in logs
