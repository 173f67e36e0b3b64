"""The platform benchmarks run on a few days (no timing is asserted), so they never rot."""

import datetime as dt
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
    timeline = figures["timeline"]
    # raw_data first, alone: validated_data waits for its day before, so it never shares a
    # run with another asset of its loop. Then validated_data to the evaluation in one run of
    # both days (the evaluation judges each candidate alone, with no day before to wait for).
    assert [run["assets"] for run in timeline[:2]] == [
        ["raw_data"],
        ["validated_data", "features", "model", "evaluation_report"],
    ]
    assert all(run["days"] == 2 for run in timeline[:2])
    assert 0 < timeline[0]["created"] <= timeline[0]["started"] < timeline[0]["ended"]
    assert timeline[0]["ended"] <= timeline[1]["created"]
    # The registry takes both evaluated days in one run, once the evaluation is recorded.
    [registry] = [run for run in timeline if run["assets"] == ["registered_model"]]
    assert registry["days"] == 2 and timeline[1]["ended"] <= registry["created"]
    # The serving champion's performance, in runs of its own: a day waits for the registry's
    # day before (the first day has none, so on a slow machine it may run before the registry).
    monitoring = [run for run in timeline if run["assets"] == ["champion_performance"]]
    assert len(timeline) == 3 + len(monitoring) == figures["runs"]
    assert sorted(
        (dt.date.fromisoformat(run["first_day"]) + dt.timedelta(days=i)).isoformat()
        for run in monitoring
        for i in range(run["days"])
    ) == ["2013-01-01", "2013-01-02"]
    assert registry["ended"] <= monitoring[-1]["created"]
    assert figures["most_days_in_a_run"] == 2
    assert figures["evaluation_reports"] == figures["days_through_the_registry"] == 2
    assert figures["rejected_days"] == []
    # The daemon's first loop and the wait for its next one are time without a run.
    assert figures["seconds_without_a_run"] >= timeline[0]["started"]


def test_the_one_day_benchmark_times_the_platform_and_the_plain_script():
    out = run_script("one_day.py", "--repeat", "1")
    assert set(out["median_seconds"]) >= {"platform_process", "baseline_process", "imports"}
    assert out["median_seconds"]["platform_run"] > 0
