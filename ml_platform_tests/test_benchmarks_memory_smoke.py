"""The memory benchmark runs on a small day, so it never rots; no figure is asserted."""

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
