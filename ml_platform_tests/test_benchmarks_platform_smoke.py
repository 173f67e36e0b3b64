"""The platform benchmarks run on a few days (no timing is asserted), so they never rot."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_script(name: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


def test_the_backfill_benchmark_runs_a_range_of_days_through_the_daemon():
    out = run_script("backfill_year.py", "--days", "2", "--no-baseline")
    figures = out["platform"]
    assert figures["status"] == "COMPLETED_SUCCESS"
    # raw_data to model in one run; then, each waiting for the day before and so never in a
    # run with other assets of its loop, the evaluation, the registry and the serving
    # champion's performance in a run each.
    assert [run["assets"] for run in figures["timeline"]] == [
        ["raw_data", "validated_data", "features", "model"],
        ["evaluation_report"],
        ["registered_model"],
        ["champion_performance"],
    ]
    assert (figures["runs"], figures["most_days_in_a_run"]) == (4, 2)
    assert figures["evaluation_reports"] == 2
    first, evaluation = figures["timeline"][:2]
    assert 0 < first["created"] <= first["started"] < first["ended"] <= evaluation["created"]
    # The daemon's first loop and the wait for its next one are time without a run.
    assert figures["seconds_without_a_run"] >= first["started"]


def test_the_one_day_benchmark_times_the_platform_and_the_plain_script():
    out = run_script("one_day.py", "--repeat", "1")
    assert set(out["median_seconds"]) >= {"platform_process", "baseline_process", "imports"}
    assert out["median_seconds"]["platform_run"] > 0
