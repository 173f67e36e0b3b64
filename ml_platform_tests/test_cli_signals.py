"""Ctrl-C (SIGINT) and SIGTERM stop `ml-platform materialize`: the running day is recorded failed,
no later day runs, and the exit code is 128 + the signal's number.

A real `ml-platform materialize` subprocess over three landed synthetic days, on a real instance
in a temporary DAGSTER_HOME whose log handler sends each record to a sink the test serves. The
sink holds the first day's raw_data step start unanswered, so the run is paused inside its first
step when the signal is sent, and released only after: however fast the day runs, it cannot end
before the signal arrives.
"""

import datetime as dt
import os
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ml_platform.contracts import load_contract
from ml_platform.ingestion.landing import LandingZone, land_days
from ml_platform.platform.records import recorded_lake_keys
from ml_platform_tests.conftest import day_files
from ml_platform_tests.services import HeldLog, held_log

pytestmark = pytest.mark.slow

DAYS = ["2024-01-01", "2024-01-02", "2024-01-03"]
BIN = Path(sys.executable).parent
# The first step of the first day beginning (Dagster's message for the event it records).
RAW_DATA_START = " - synthetic__raw_data - STEP_START - "


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_materialize_after_recording_the_running_day_failed(tmp_path, signum):
    with held_log(RAW_DATA_START) as sink:
        process, lake, home = start_materialize(tmp_path, sink)
        sink.wait_held(process, timeout=240)
        assert day_files(lake, "synthetic", "raw_data", DAYS[0]) == []  # paused before writing
        process.send_signal(signum)
        sink.released.set()
        out, err = process.communicate(timeout=120)

    assert process.returncode == 128 + signum, (out, err[-3000:])
    name = signal.Signals(signum).name
    assert f"[1/3] {DAYS[0]} stopped by {name}" in err
    assert "2 later day(s) not run" in err
    assert DAYS[1] not in out + err  # no later day was announced, run or skipped
    raw_data = lake / "synthetic" / "raw_data"
    stored = {str(p.relative_to(lake)) for p in raw_data.rglob("*") if p.is_file()}
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        recorded = recorded_lake_keys(instance, dg.AssetKey(["synthetic", "raw_data"]), DAYS)
    # No later day stored anything, and every file in the lake is one Dagster records.
    assert stored == recorded
    assert all(key.startswith(f"synthetic/raw_data/{DAYS[0]}/") for key in stored)
    assert [r.tags.get("dagster/partition") for r in runs] == [DAYS[0]]
    assert runs[0].status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
    assert f"is recorded {runs[0].status.value}" in err


def start_materialize(tmp_path: Path, sink: HeldLog) -> tuple[subprocess.Popen, Path, Path]:
    """`ml-platform materialize` of the three landed days on an instance logging to `sink`."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    config = {
        "telemetry": {"enabled": False},
        "python_logs": {"dagster_handler_config": {"handlers": {"sink": sink.handler()}}},
    }
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    lake = tmp_path / "lake"
    zone = LandingZone(base_dir=str(tmp_path / "landing"))
    contract = load_contract("synthetic")
    list(land_days(contract, zone, [dt.date.fromisoformat(d) for d in DAYS]))
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "ML_PLATFORM_DATASET": "synthetic",
        "ML_PLATFORM_LANDING_DIR": zone.base_dir,
        "ML_PLATFORM_LAKE_DIR": str(lake),
    }
    command = [str(BIN / "ml-platform"), "materialize", "--start", DAYS[0], "--days", "3"]
    process = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return process, lake, home
