"""Ctrl-C (SIGINT) and SIGTERM stop `ml-platform materialize`: the running day is recorded failed,
no later day runs, and the exit code is 128 + the signal's number.

A real `ml-platform materialize` subprocess over three landed synthetic days, on a real instance
in a temporary DAGSTER_HOME; the signal is sent once the first day's raw_data is in the lake,
that is while the first day's run is executing.
"""

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from ml_platform.contracts import load_contract
from ml_platform.ingestion.landing import LandingZone, land_days
from ml_platform.platform.records import recorded_lake_keys
from ml_platform_tests.conftest import day_files

pytestmark = pytest.mark.slow

DAYS = ["2024-01-01", "2024-01-02", "2024-01-03"]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_materialize_after_recording_the_running_day_failed(tmp_path, signum):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("")
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
    deadline = time.monotonic() + 120
    while (
        not day_files(lake, "synthetic", "raw_data", DAYS[0])
        and process.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert day_files(lake, "synthetic", "raw_data", DAYS[0]), "the first day never started"
    assert process.poll() is None, "the first day ended before the signal"
    process.send_signal(signum)
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
