"""The memory benchmarks run on small days, so they never rot; no memory figure is asserted."""

import json

import pytest

from ml_platform_tests.test_benchmarks_smoke import run_script

pytestmark = pytest.mark.slow


def test_the_memory_benchmark_measures_every_step_of_a_day_and_the_plain_script():
    out = run_script("memory_day.py", "--rows", "3000")
    result = json.loads(out.splitlines()[-1])
    assert result["platform"]["success"]
    steps = result["platform"]["steps"]
    assert {"raw_data", "validated_data", "features", "model", "evaluation_report"} <= set(steps)
    for name, figures in [*steps.items(), ("plain", result["plain"])]:
        assert figures["peak_rss_mb"] >= figures["rss_before_mb"] > 0, name
        assert figures["wall_seconds"] > 0, name
    assert result["day_frame_mb"] > 0
    assert "| validated_data |" in out


def test_the_window_memory_benchmark_measures_both_steps_and_the_same_order_fit():
    out = run_script("memory_window.py", "--rows", "1000", "--window-days", "3", "--equivalence")
    result = json.loads(out.splitlines()[-1])
    measured = result["platform"]["sgd"]
    assert measured["success"]
    assert set(measured["steps"]) == {"model", "evaluation_report"}
    for name, figures in measured["steps"].items():
        assert figures["peak_rss_mb"] >= figures["rss_before_mb"] > 0, name
    # The streamed model is the non-streaming fit in the same order, weight for weight.
    assert result["equivalence"]["max_abs_weight_difference"] == 0.0
    assert "| sgd | model |" in out
