"""The real Dagster CLI, webserver and daemon against the code location, as a user runs them."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ml_platform.contracts import load_contract
from ml_platform_tests.conftest import (
    ALL_ASSETS,
    DAILY_ASSETS,
    REPO,
    day_files,
    free_port,
)
from ml_platform_tests.services import living_in_group

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent
FLIGHTS = load_contract("flights")


@pytest.fixture
def user_env(tmp_path):
    """Environment of a user with a fresh instance, landing zone and lake."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "ML_PLATFORM_DATASET": "flights",
        "ML_PLATFORM_LANDING_DIR": str(tmp_path / "landing"),
        "ML_PLATFORM_LAKE_DIR": str(tmp_path / "lake"),
    }
    return env


def run(args: list[str], env: dict, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_one_code_location_lists_both_datasets_under_their_names(user_env):
    # The default: every bundled contract, each dataset's definitions under its own names, as
    # `dg` lists them from the project (one load of the code location; `make lint`'s
    # `dg check defs` validates it, and test_automation_schedules.py the default statuses).
    env = {k: v for k, v in user_env.items() if k != "ML_PLATFORM_DATASET"}
    listed = run(
        [str(BIN / "dg"), "list", "defs", "--json"], {**env, "VIRTUAL_ENV": str(BIN.parent)}
    )
    assert listed.returncode == 0, listed.stderr[-3000:]
    defs = json.loads(listed.stdout)
    names = {kind: {d["name"] for d in defs[kind]} for kind in ("jobs", "sensors", "schedules")}
    assets = {d["asset_key"] for d in defs["assets"]}
    for dataset in ("flights", "synthetic"):
        assert {f"{dataset}/{name}" for name in DAILY_ASSETS} <= assets
        for job in ("daily_pipeline_job", "weekly_retrain_job", "ingestion_job"):
            assert f"{dataset}_{job}" in names["jobs"]
        assert f"{dataset}_landing_sensor" in names["sensors"]
        for schedule in ("daily_pipeline_schedule", "weekly_retrain_schedule"):
            assert f"{dataset}_{schedule}" in names["schedules"]


def test_cli_materialises_a_landed_day_and_records_a_day_without_its_file_rejected(user_env):
    landed = run(
        [str(BIN / "ml-platform"), "land", "--dataset", "flights", "--start", "2013-01-01"],
        user_env,
    )
    assert landed.returncode == 0, landed.stderr
    assert "2013-01-01 flights_2013-01-01.csv: 842 rows written" in landed.stdout

    def materialize(day: str) -> subprocess.CompletedProcess:
        return run(
            [
                str(BIN / "dagster"),
                "asset",
                "materialize",
                "-m",
                "ml_platform.definitions",
                "--select",
                "*",
                "--partition",
                day,
            ],
            user_env,
        )

    good = materialize("2013-01-01")
    lake = Path(user_env["ML_PLATFORM_LAKE_DIR"]) / "flights"
    assert set(ALL_ASSETS) <= {p.name for p in lake.iterdir()}
    # The day's one-day model (167 held-out rows) may be rejected: an outcome, not a failure,
    # so the command succeeds either way and the registry records the day.
    assert good.returncode == 0, good.stderr[-3000:]
    assert day_files(lake.parent, "flights", "registered_model", "2013-01-01")

    # A day without its file is a verdict of the day, not a failed run: the run succeeds, the
    # day is recorded rejected naming the file, and nothing of it reaches the lake.
    missing = materialize("2013-01-05")
    assert missing.returncode == 0, missing.stderr[-3000:]
    expected = Path(user_env["ML_PLATFORM_LANDING_DIR"]) / "flights_2013-01-05.csv"
    assert f"No landed file for partition 2013-01-05: expected {expected}" in missing.stderr
    assert not [
        asset for asset in ALL_ASSETS if day_files(lake.parent, "flights", asset, "2013-01-05")
    ]
    listed = run(
        [str(BIN / "ml-platform"), "rejected", "--start", "2013-01-01", "--days", "5"], user_env
    )
    assert listed.returncode == 3, listed.stderr[-3000:]
    assert "flights: 1 rejected day(s)" in listed.stdout
    assert "  2013-01-05  raw_data: missing file: No landed file for partition 2013-01-05" in (
        listed.stdout
    )


def graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["data"]


ASSETS_QUERY = """
{ assetNodes { assetKey { path } partitionDefinition { type }
               partitionStats { numMaterialized } assetMaterializations(limit: 1) { runId } } }
"""
DAEMONS_QUERY = """
{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }
"""


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run command exited while waiting for {what}"
        try:
            value = predicate()
            if value:
                return value
        # A webserver busy answering the daemon's runs may let one poll time out; the deadline,
        # not a single slow answer, decides.
        except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError, TypeError):
            pass
        time.sleep(1)
    # What the command printed tells why (a launch refused, a webserver not answering).
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what}:\n{log.read_text()[-3000:]}"
    )


def test_run_command_serves_the_materialised_graph_and_stops_on_ctrl_c(user_env, tmp_path):
    port = free_port()
    log_path = tmp_path / "run.log"
    log = log_path.open("w")
    # `make run` serves every bundled dataset: flights and the synthetic one side by side.
    env = {k: v for k, v in user_env.items() if k != "ML_PLATFORM_DATASET"}
    proc = subprocess.Popen(
        ["make", "run", "DAYS=2", "SYNTHETIC_DAYS=1", f"PORT={port}"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # A terminal delivers Ctrl-C as SIGINT; make sure it is not inherited as ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # The UI answers first; the demo days are launched through it and fill in after.
        wait_for(lambda: graphql(port, ASSETS_QUERY)["assetNodes"], 240, "the UI", proc, log_path)
        # Each dataset's daily graph is materialised for its landed days (a rejected model's
        # day records it as not registered); the weekly retrain waits for Monday.
        days = {"flights": 2, "synthetic": 1}

        def materialised():
            nodes = graphql(port, ASSETS_QUERY)["assetNodes"]
            by_key = {tuple(n["assetKey"]["path"]): n for n in nodes}
            counts = {
                key: node["partitionStats"]["numMaterialized"]
                for key, node in by_key.items()
                if node["partitionStats"] is not None
            }
            daily = {(dataset, name) for dataset in days for name in DAILY_ASSETS}
            done = all(counts.get(key) == days[key[0]] for key in daily)
            # Each dataset's page of rejected days, recomputed by every run of a day.
            listed = all(
                by_key[(dataset, "rejected_days")]["assetMaterializations"] for dataset in days
            )
            return by_key if done and listed else None

        by_key = wait_for(
            materialised, 600, "the demo days through the UI's daemon", proc, log_path
        )
        assert {
            (dataset, name)
            for dataset in days
            for name in [*DAILY_ASSETS, "full_model", "full_evaluation_report"]
        } <= set(by_key)
        for (dataset, name), node in by_key.items():
            if name == "rejected_days":
                assert node["partitionDefinition"] is None
                continue
            assert node["partitionDefinition"]["type"] == "TIME_WINDOW"
            expected = days[dataset] if name in DAILY_ASSETS else 0
            assert node["partitionStats"]["numMaterialized"] == expected, (dataset, name)

        def daemons_healthy():
            statuses = graphql(port, DAEMONS_QUERY)["instance"]["daemonHealth"]
            required = [d for d in statuses["allDaemonStatuses"] if d["required"]]
            return required and all(d["healthy"] for d in required)

        wait_for(daemons_healthy, 120, "a healthy daemon", proc, log_path)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(timeout=90)
            leftover = wait_for_group_exit(proc.pid, timeout=30)
        finally:
            log.close()
            if proc.poll() is None or living_in_group(proc.pid):
                os.killpg(proc.pid, signal.SIGKILL)
    output = log_path.read_text()
    # The UI is served by `dg dev`, and Dagster warns of nothing before it: no superseded
    # command, no instance configuration found beside the one DAGSTER_HOME names.
    ui = output.index(f"Serving dagster-webserver on http://127.0.0.1:{port}")
    assert '/.venv/bin/dg" dev' in output[:ui]
    assert "SupersessionWarning" not in output[:ui], output[:ui][-3000:]
    assert "Found a dagster instance configuration" not in output[:ui], output[:ui][-3000:]
    assert "2013-01-02 flights_2013-01-02.csv: 943 rows written" in output
    assert "landing 1 day(s) of synthetic" in output
    assert "Dagster services shut down" in output
    assert not leftover, f"processes left after Ctrl-C: {leftover}"
    assert code in (0, 130, -signal.SIGINT, 2), output[-3000:]


def wait_for_group_exit(pgid: int, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while (living := living_in_group(pgid)) and time.monotonic() < deadline:
        time.sleep(1)
    return living
