"""The benchmark scripts run (a few seconds each), so they never rot; no timing is asserted."""

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from ml_platform.platform.rejected import DAY_ASSETS

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_script(name: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def run_main(name: str, *args: str) -> str:
    """What `python benchmarks/<name> args` prints, the script run as __main__ in this process.

    As its own process would: the benchmarks folder first on sys.path, the arguments in argv.
    The libraries a script imports (Dagster, Great Expectations, scikit-learn) are then loaded
    once for the worker rather than once per script, most of a small run's seconds. Scripts that
    start processes of their own (baseline.py's `--processes`, the memory benchmarks) keep
    run_script.
    """
    out = io.StringIO()
    with (
        mock.patch.object(sys, "argv", [str(BENCHMARKS / name), *args]),
        mock.patch.object(sys, "path", [str(BENCHMARKS), *sys.path]),
        contextlib.redirect_stdout(out),
    ):
        runpy.run_path(str(BENCHMARKS / name), run_name="__main__")
    return out.getvalue()


def test_the_baseline_script_runs_the_daily_computation_of_each_day():
    out = json.loads(run_main("baseline.py", "--dataset", "synthetic", "--days", "3"))
    assert out["days"] == 3
    assert sum(out["decisions"].values()) == 3
    assert set(out["stage_seconds"]) == {
        "read_and_type",
        "validate",
        "features",
        "train",
        "evaluate",
        "drift",
    }


def test_the_validation_benchmark_prints_a_row_per_contract_and_size():
    out = run_main("validation_speed.py", "--rows", "1000", "--repeat", "1", "--loaded")
    rows = [line.split(" | ")[0] for line in out.splitlines() if line.startswith("| ")]
    assert rows[1:] == ["| synthetic", "| synthetic+ranges", "| flights"], out


def test_the_training_quality_benchmark_compares_both_trainings_on_each_day():
    out = run_main("training_quality.py", "--dataset", "synthetic", "--days", "1", "--per-day")
    rows = [line.split(" | ")[0] for line in out.splitlines() if line.startswith("| ")]
    assert rows[:3] == ["| training", "| before", "| after"], out
    assert "| 2024-01-28 |" in out, out
    assert "paired t-interval" in out, out


def test_the_model_quality_benchmark_compares_each_estimator_with_plain_scikit_learn():
    # A 3-day window: every estimator and both fits run the same code as on 28 days.
    out = run_main(
        "model_quality.py",
        *("--dataset", "synthetic", "--days", "1", "--stride", "1", "--per-day"),
        *("--window-days", "3"),
    )
    rows = [line.split(" | ")[0] for line in out.splitlines() if line.startswith("| ")]
    assert rows[:4] == ["| estimator", "| sgd", "| linear", "| hist_gradient_boosting"], out
    assert "Best mean r2: **" in out and "| linear | 2024-01-28 |" in out, out
    assert out.startswith("uptime before: "), out


def test_the_evaluation_report_benchmark_times_each_piece():
    out = json.loads(run_main("evaluation_report.py", "--repeat", "1", "--loaded"))
    assert set(out["cpu_ms"]) == {
        "score_candidate",
        "score_champion",
        "score_baseline",
        "plots",
        "render_report",
        "evaluation_day",
        "loss_curve",
    }


def test_the_promotion_benchmark_judges_the_same_candidates_under_both_rules():
    out = json.loads(run_main("promotion_year.py", "--days", "6"))
    for rule in ("point_estimate", "paired_bootstrap"):
        # Every day's candidate gets a verdict under each rule, and each champion is scored
        # on the days after it was chosen.
        assert sum(out[rule]["decisions"].values()) == 6
        assert 0 < out[rule]["days_scored_next_day"] < 6
    assert out["paired_bootstrap"]["promotions"] <= out["point_estimate"]["promotions"]


def test_the_step_costs_benchmark_runs_each_day_asset_and_counts_dagsters_events(capsys):
    # Two days: the fewest with a champion to score (one day is refused, naming why).
    with pytest.raises(SystemExit):
        run_main("step_costs.py", "--days", "1", "--loaded")
    assert "--days must be at least 2: a day's champion is scored" in capsys.readouterr().err
    out = json.loads(run_main("step_costs.py", "--days", "2", "--loaded"))
    assert list(out["steps"]) == list(DAY_ASSETS)
    # Every range stored its materialisations and check evaluations through the timed call.
    assert all(step["events"] > 0 and step["event_s"] > 0 for step in out["steps"].values())
    # Every step reads Dagster's records of its days at least once (what it recorded before).
    assert all(step["record_queries"] > 0 for step in out["steps"].values())
    assert 0 < out["events_share"] < 1
    assert "ASSET_CHECK_EVALUATION" in out["ms_per_event"]
    assert set(out["imports_s"]) == {"great_expectations", "mlflow", "matplotlib.pyplot"}
    assert out["script_s"] > 0 and out["steps_over_script"] > 0


def test_a_timing_benchmark_refuses_a_busy_machine_unless_told_and_then_marks_its_figures(
    monkeypatch,
):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import idle

    monkeypatch.setattr(os, "getloadavg", lambda: (3.5, 2.0, 1.0))
    with pytest.raises(SystemExit, match=r"load average 3\.50 .* pass --loaded"):
        idle.before(loaded=False)
    start = idle.before(loaded=True)
    assert start == {"load_average_before": [3.5, 2.0, 1.0], "loaded": True}

    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.3, 0.4))
    quiet = idle.before(loaded=False)
    assert quiet["loaded"] is False
    assert idle.after(quiet)["load_average_after"] == [0.2, 0.3, 0.4]


# A "daemon" starts a "code server", which starts a "run" that burns a CPU second and reaps it;
# then both wait to be stopped.
RUN = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass"
CODE_SERVER = f"""
import pathlib, subprocess, sys, time
subprocess.run([sys.executable, "-c", {RUN!r}], check=True)
pathlib.Path(sys.argv[1]).write_text("ran")
time.sleep(600)
"""
DAEMON = f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {CODE_SERVER!r}, sys.argv[1]])
time.sleep(600)
"""


def test_the_stack_counts_a_runs_cpu_as_the_runs_not_the_daemons(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from backfill_year import Stack, cpu_used

    stack = Stack(tmp_path, dict(os.environ))
    before = stack.cpu_seconds()
    done = tmp_path / "done"
    stack.spawn("daemon", ["python", "-c", DAEMON, str(done)])
    try:
        stack.wait(done.exists, 60, "the run")
        used = cpu_used(before, stack.cpu_seconds())
    finally:
        stack.stop()
    assert used["runs"] >= 0.9, used
    assert used["daemon"] < 0.5, used
    assert set(used) == {"runs", "daemon", "total"}, used
    assert used["total"] == pytest.approx(sum(v for k, v in used.items() if k != "total"), abs=0.2)


def test_the_suite_cpu_benchmark_counts_a_modules_processes_in_its_own_cgroup():
    # A short module; its pytest process is counted, then its group is removed.
    out = json.loads(run_script("suite_cpu.py", "--only", "test_settings.py", "--lanes", "1"))
    module = out["modules"]["test_settings.py"]
    assert module["status"] == 0 and module["cpu_s"] > 0 and "left_running" not in module
    assert out["total_cpu_s"] == module["cpu_s"]
