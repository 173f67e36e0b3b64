"""The production instance end to end on 127.0.0.1: real PostgreSQL, an S3 API server (moto),
the image's code server, dagster-webserver and dagster-daemon with deploy/local/dagster.yaml.

Days landed in the bucket run the whole daily graph through the landing sensor; runs and events
are in PostgreSQL; data, models, reports and compute logs are in the bucket; nothing is written
to local disk outside the test's temporary directories; no secret shows up in any log. And a
PostgreSQL outage in the middle of a run ends that run cleanly, the day's rerun succeeds, and no
stored object is left half-written.
"""

import datetime as dt
import io
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from ml_platform.contracts import load_contract
from ml_platform.ingestion.landing import source_day
from ml_platform.ingestion.synthetic import file_bytes
from ml_platform_tests.conftest import REPO, free_port
from ml_platform_tests.services import HeldLog, held_log, moto_s3, s3_test_client
from ml_platform_tests.test_automation_integration import Stack, created
from ml_platform_tests.test_security import secret_findings

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent
SYNTHETIC = load_contract("synthetic")
BUCKET = "ml-platform-data"
HOLD_NOTHING = "\0"  # no record holds this
# How long PostgreSQL is down in the middle of a run: three times Dagster's retries.
OUTAGE_SECONDS = 30
# The second step of a day beginning (Dagster's message for the event it records).
VALIDATED_DATA_START = " - synthetic__validated_data - STEP_START - "
# The prefixes of deploy/iam-policy.json.
LANDING, LAKE, COMPUTE_LOGS = "landing/", "lake/", "compute-logs"
DAILY_JOB = "synthetic_daily_pipeline_job"
DAILY_ASSETS = [
    "raw_data",
    "validated_data",
    "features",
    "drift_report",
    "model",
    "evaluation_report",
]


def day(offset: int) -> str:
    return (dt.date(2024, 1, 1) + dt.timedelta(days=offset)).isoformat()


def image_command() -> list[str]:
    """The CMD of the Dockerfile, the code server the image runs."""
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.startswith("CMD "):
            return json.loads(line[len("CMD ") :])
    raise AssertionError("the Dockerfile has no CMD")


def local_command(command: list[str], port: int) -> list[str]:
    """The image's command as this machine runs it: venv executable, a free loopback port."""
    args = [str(BIN / command[0]), *command[1:]]
    args[args.index("-h") + 1] = "127.0.0.1"
    args[args.index("-p") + 1] = str(port)
    return args


# The environment, the test tools' own stores (the unit layer, running beside, writes
# .pytest_cache when it ends and Hypothesis's .hypothesis database whenever one of its tests
# runs), the test interpreter's own bytecode and the tests' artifacts (test_ui's screenshots,
# which it may take while this module runs: integration modules run three at a time) are not
# the platform's writes; everything else in the working tree, ignored files included, is
# compared.
NOT_PLATFORM = [
    ":!.venv",
    ":!.tools",
    ":!.*_cache/*",
    ":!.hypothesis/*",
    ":!**/__pycache__/**",
    ":!test-output",
]


def git_state() -> str:
    return subprocess.run(
        [
            "git",
            "status",
            "--porcelain",
            "--ignored",
            "--untracked-files=all",
            "--",
            ".",
            *NOT_PLATFORM,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


class ProductionStack(Stack):
    """Code server, webserver and daemon on the production instance config (one machine)."""

    def __init__(self, tmp_path: Path, s3_endpoint: str, postgres, mlflow, sink: HeldLog):
        self.tmp = tmp_path
        self.sink = sink
        home = tmp_path / "dagster_home"
        home.mkdir()
        # The production config, whose runs also send their records to `sink`: a test holds a
        # run at a chosen event there.
        config = yaml.safe_load((REPO / "deploy/local/dagster.yaml").read_text())
        config["python_logs"]["dagster_handler_config"]["handlers"]["sink"] = sink.handler()
        (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (tmp_path / "tmp").mkdir()
        self.home = home
        self.postgres = postgres
        self.mlflow = mlflow
        self.port = free_port()
        self.code_port = free_port()
        # moto accepts any credentials: a fresh random secret per test, to look for in the logs.
        self.aws_secret = secrets.token_urlsafe(30)
        self.env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("ML_PLATFORM_", "AWS_", "DAGSTER_"))
        }
        self.env.update(
            {
                **postgres.env(),
                "DAGSTER_HOME": str(home),
                # Whatever the processes stage locally (compute logs before upload) goes here.
                "TMPDIR": str(tmp_path / "tmp"),
                "PYTHONDONTWRITEBYTECODE": "1",
                "ML_PLATFORM_DATASET": "synthetic",
                "ML_PLATFORM_LANDING_URL": f"s3://{BUCKET}/{LANDING}",
                "ML_PLATFORM_LAKE_URL": f"s3://{BUCKET}/{LAKE}",
                "ML_PLATFORM_S3_ENDPOINT_URL": s3_endpoint,
                "ML_PLATFORM_S3_REGION": "us-east-1",
                "ML_PLATFORM_COMPUTE_LOGS_BUCKET": BUCKET,
                "ML_PLATFORM_COMPUTE_LOGS_PREFIX": COMPUTE_LOGS,
                "ML_PLATFORM_CODE_SERVER_HOST": "127.0.0.1",
                "ML_PLATFORM_CODE_SERVER_PORT": str(self.code_port),
                "ML_PLATFORM_SENSOR_INTERVAL_SECONDS": "5",
                "AWS_ACCESS_KEY_ID": "production-test",
                "AWS_SECRET_ACCESS_KEY": self.aws_secret,
                "AWS_DEFAULT_REGION": "us-east-1",
                # MLflow's runs and registry in PostgreSQL, its artifacts in the lake's bucket.
                "MLFLOW_TRACKING_URI": mlflow.url(),
                "MLFLOW_S3_ENDPOINT_URL": s3_endpoint,
            }
        )
        self.s3 = s3_test_client(s3_endpoint)
        self.s3.create_bucket(Bucket=BUCKET)
        self.cwd = REPO
        self.logs = tmp_path
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        workspace = str(REPO / "deploy/workspace.yaml")
        self.spawn("code-server", local_command(image_command(), self.code_port))
        self.wait_for(self.code_server_healthy, 120, "the code server")
        # As the compose stack's daemon command, every pool's limit first (and before the
        # webserver, which would create the storage's tables at the same time).
        subprocess.run(
            [str(BIN / "ml-platform"), "pools"],
            env=self.env,
            cwd=self.cwd,
            check=True,
            capture_output=True,
            timeout=180,
        )
        self.spawn(
            "webserver",
            [
                str(BIN / "dagster-webserver"),
                *("-h", "127.0.0.1", "-p", str(self.port), "-w", workspace),
            ],
        )
        self.spawn("daemon", [str(BIN / "dagster-daemon"), "run", "-w", workspace])

    def code_server_healthy(self) -> bool:
        check = subprocess.run(
            [str(BIN / "dagster"), "api", "grpc-health-check", "-p", str(self.code_port)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return check.returncode == 0

    def output(self) -> str:
        return "\n".join(
            f"--- {name} (last lines)\n" + (self.logs / f"{name}.log").read_text()[-4000:]
            for name in ("code-server", "webserver", "daemon")
            if (self.logs / f"{name}.log").exists()
        )

    def land(self, partition: str, corrected: bool = False) -> None:
        frame = source_day(SYNTHETIC, dt.date.fromisoformat(partition))
        if corrected:
            frame = frame.iloc[:-1]
        self.s3.put_object(
            Bucket=BUCKET,
            Key=LANDING + SYNTHETIC.landing.file_name(partition),
            Body=file_bytes(frame, None),
        )

    def keys(self, prefix: str) -> list[str]:
        paginator = self.s3.get_paginator("list_objects_v2")
        return [
            item["Key"]
            for page in paginator.paginate(Bucket=BUCKET, Prefix=prefix)
            for item in page.get("Contents", [])
        ]

    def read(self, key: str) -> bytes:
        return self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()

    def all_logs(self) -> str:
        """Everything a run leaves to read: process logs, the event log, compute logs."""
        texts = [
            (self.logs / f"{n}.log").read_text() for n in ("code-server", "webserver", "daemon")
        ]
        rows = self.postgres.query("SELECT event FROM event_logs")
        texts.extend(event for (event,) in rows)
        texts.extend(self.read(key).decode(errors="replace") for key in self.keys(COMPUTE_LOGS))
        return "\n".join(texts)


@pytest.fixture(scope="module")
def production(tmp_path_factory, postgres):
    """One stack for the module: starting it costs a minute, the tests below share it."""
    tmp_path = tmp_path_factory.mktemp("production")
    before = git_state()
    # Holds nothing until a test names the record to hold.
    with moto_s3() as endpoint, held_log(HOLD_NOTHING) as sink:
        database = postgres.database(f"dagster_{secrets.token_hex(4)}")
        mlflow = postgres.database(f"mlflow_{secrets.token_hex(4)}")
        stack = ProductionStack(tmp_path, endpoint, database, mlflow, sink)
        try:
            stack.start()
            stack.wait_for(lambda: stack.graphql("{ version }"), 180, "the webserver")
            stack.sensor("start")
            yield stack
        finally:
            stack.stop()
    assert git_state() == before, "files in the working tree changed or appeared"


def succeeded_runs(stack: ProductionStack, expected: int) -> list[dict] | None:
    runs = created(stack.runs(pipelineName=DAILY_JOB), 0)
    done = [r for r in runs if r["status"] == "SUCCESS"]
    return done if len(done) >= expected else None


def test_the_production_config_runs_three_days_with_state_in_postgres_and_s3(production):
    stack = production
    started = time.monotonic()
    days = [day(offset) for offset in range(3)]
    for partition in days:
        stack.land(partition)

    runs = stack.wait_for(lambda: succeeded_runs(stack, 3), 420, "3 daily runs to succeed")
    assert sorted(r["tags"]["dagster/partition"] for r in runs) == days
    elapsed = time.monotonic() - started

    # Runs, events and the sensor's state are in PostgreSQL, not in DAGSTER_HOME.
    run_rows = stack.postgres.query(
        f"SELECT run_id, status FROM runs WHERE pipeline_name = '{DAILY_JOB}'"
    )
    assert {status for _, status in run_rows} == {"SUCCESS"} and len(run_rows) == 3
    materialized = stack.postgres.query(
        "SELECT asset_key, partition, count(*) FROM event_logs "
        "WHERE dagster_event_type = 'ASSET_MATERIALIZATION' GROUP BY asset_key, partition"
    )
    stored = {(json.loads(key)[-1], partition) for key, partition, _ in materialized}
    for partition in days:
        for asset in [*DAILY_ASSETS, "registered_model"]:
            assert (asset, partition) in stored, f"no materialization of {asset} {partition}"
    assert stack.postgres.query("SELECT count(*) FROM job_ticks")[0][0] > 0
    assert not list(stack.home.rglob("*.db")), "an SQLite storage appeared in DAGSTER_HOME"

    # Data, models, reports and compute logs are in the bucket.
    lake = set(stack.keys(LAKE))
    for partition in days:
        for asset, ext in [
            ("raw_data", "parquet"),
            ("validated_data", "parquet"),
            ("features", "parquet"),
            # The drift report is a partition of its own, recorded like the data.
            ("drift_report", "json"),
            ("model", "joblib"),
            ("evaluation_report", "json"),
        ]:
            folder = f"{LAKE}synthetic/{asset}/{partition}/"
            assert any(k.startswith(folder) and k.endswith(f".{ext}") for k in lake)
    # Models in MLflow: versions and aliases in its PostgreSQL database, files in the bucket.
    versions = stack.mlflow.query("SELECT name, version, source FROM model_versions")
    assert versions and {name for name, _, _ in versions} == {"synthetic"}
    assert all(source.startswith(f"s3://{BUCKET}/{LAKE}mlflow/") for _, _, source in versions)
    assert ("champion",) in stack.mlflow.query("SELECT alias FROM registered_model_aliases")
    assert any(k.startswith(f"{LAKE}mlflow/artifacts/synthetic/") for k in lake)
    trainings = stack.mlflow.query("SELECT count(*) FROM runs WHERE name LIKE 'model %'")
    assert trainings[0][0] >= len(days)
    # Great Expectations' results and Data Docs pages.
    assert any(k.startswith(f"{LAKE}synthetic/quality/validated_data/") for k in lake)
    logs = stack.keys(COMPUTE_LOGS)
    run_ids = {r["runId"] for r in runs}
    assert {rid for rid in run_ids if any(rid in key for key in logs)} == run_ids, logs[:10]
    assert any(key.endswith(".err") for key in logs)

    # Nothing secret in the logs, the event log or the compute logs.
    found = secret_findings(stack.all_logs(), [stack.aws_secret, stack.postgres.password])
    assert found == [], found
    print(f"3 days through the production stack in {elapsed:.0f}s")


def parses(key: str, data: bytes) -> None:
    """Every stored object is complete: it parses in its format."""
    if key.endswith(".parquet"):
        pd.read_parquet(io.BytesIO(data))
    elif key.endswith(".json"):
        json.loads(data)
    elif key.endswith(".joblib"):
        import joblib

        joblib.load(io.BytesIO(data))


def test_a_postgres_outage_mid_run_ends_the_run_and_the_rerun_succeeds(production):
    stack = production
    partition = day(3)
    earlier = {r["runId"] for r in stack.runs(pipelineName=DAILY_JOB)}
    stack.land(partition)

    def started() -> dict | None:
        new = [r for r in stack.runs(pipelineName=DAILY_JOB) if r["runId"] not in earlier]
        return new[0] if new and new[0]["status"] == "STARTED" else None

    # The run is held inside its steps (raw_data stored, validated_data starting) while the
    # database goes down, so the outage is certain to meet it.
    stack.sink.hold = VALIDATED_DATA_START
    interrupted = stack.wait_for(started, 120, "the run of the new day to start")
    stack.sink.wait_held(stack.procs[-1], 240, stack.output)
    stopped_at = time.time()
    stack.postgres.stop("fast")
    stack.sink.released.set()
    # The run writes events and lake objects meanwhile. dagster-postgres retries a failed
    # connection 5 times with exponential backoff from 0.2 s, about 11 s in all: a 10 s outage
    # is ridden out (or not, by a second), this one never is.
    time.sleep(OUTAGE_SECONDS)
    stack.postgres.start()

    def ended() -> str | None:
        [run] = [
            r for r in stack.runs(pipelineName=DAILY_JOB) if r["runId"] == interrupted["runId"]
        ]
        return run["status"] if run["status"] in ("SUCCESS", "FAILURE", "CANCELED") else None

    outcome = stack.wait_for(ended, 240, "the interrupted run to end")
    [run] = [r for r in stack.runs(pipelineName=DAILY_JOB) if r["runId"] == interrupted["runId"]]
    assert run["endTime"] > stopped_at, "the run ended before the outage: nothing was tested"
    # docs/production.md: a database outage during a run ends the run as failed (run
    # monitoring), so its day is free to run again; it neither hangs STARTED nor passes.
    assert outcome == "FAILURE", f"the run interrupted by the outage ended {outcome}"
    # Every stored object is whole: the outage left no partial write in the lake.
    for key in stack.keys(LAKE):
        parses(key, stack.read(key))

    # The upstream delivers the day again: a new version of the file, a new run, which succeeds.
    stack.land(partition, corrected=True)
    done = {r["runId"] for r in stack.runs(pipelineName=DAILY_JOB)}

    def rerun() -> dict | None:
        new = [r for r in stack.runs(pipelineName=DAILY_JOB) if r["runId"] not in done]
        assert all(r["status"] not in ("FAILURE", "CANCELED") for r in new), new
        return new[0] if new and new[0]["status"] == "SUCCESS" else None

    succeeded = stack.wait_for(rerun, 300, "the day's rerun to succeed")
    assert succeeded["tags"]["dagster/partition"] == partition
    [stored] = [
        k for k in stack.keys(f"{LAKE}synthetic/raw_data/{partition}/") if succeeded["runId"] in k
    ]
    raw = deserialise_key(stack, stored)
    assert len(raw) == SYNTHETIC.source.rows_per_day - 1, "the rerun's version is stored whole"
    for key in stack.keys(LAKE):
        parses(key, stack.read(key))


def deserialise_key(stack: ProductionStack, key: str) -> pd.DataFrame:
    return pd.read_parquet(io.BytesIO(stack.read(key)))


def test_the_image_command_serves_the_code_location_over_grpc(production):
    # The stack's code server is the Dockerfile's CMD run from the venv (see start()); the
    # webserver loaded the location from it, and the gRPC health check answers.
    assert production.procs[0].args == local_command(image_command(), production.code_port)
    assert image_command()[:3] == ["dagster", "code-server", "start"]
    assert production.code_server_healthy()
    locations = production.graphql(
        "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"
    )["workspaceOrError"]["locationEntries"]
    assert locations == [{"name": "ml_platform", "loadStatus": "LOADED"}]
