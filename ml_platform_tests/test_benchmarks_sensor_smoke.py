"""The sensor tick benchmark runs on a small zone (seconds): it never rots. No timing asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sensor_tick.py"


def test_the_sensor_tick_benchmark_walks_a_zone_and_finds_the_new_file():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--files", "100", "--steady-ticks", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[0])
    phases = [(t["phase"], t["requests"]) for t in result["ticks"]]
    assert phases == [
        ("first walk", 100),
        ("steady state", 0),
        ("steady state", 0),
        ("one new file", 1),
    ]
    assert "| first walk | 1 | 100 |" in done.stdout
