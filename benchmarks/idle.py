"""A timing counts only on an idle machine: the load average before and after every measurement.

A busy machine slows a CPU-bound plain script more than a platform that spends part of its time
waiting for daemon loops, so a ratio taken under load flatters the platform. Every timing
benchmark calls `before()` first: with a 1-minute load average above `IDLE_LOAD` it stops and
says so, unless `--loaded` is given, in which case its figures are marked `"loaded": true` and do
not belong under "Current figures" in docs/benchmarks.md. `after()` adds the load at the end.
"""

import argparse
import os
import sys

# Two cores: the benchmark itself brings the load to about 1 to 2 while it runs, so what matters
# is that nothing else was running when it started.
IDLE_LOAD = 1.0


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--loaded",
        action="store_true",
        help=f"measure even with a load average above {IDLE_LOAD} at the start; the figures are "
        "marked loaded (they do not count as current)",
    )


def before(loaded: bool) -> dict:
    """The load at the start; exits with a message when the machine is busy and not `loaded`."""
    load = [round(x, 2) for x in os.getloadavg()]
    if load[0] > IDLE_LOAD and not loaded:
        sys.exit(
            f"load average {load[0]:.2f} (1 min) is above {IDLE_LOAD}: something else is running, "
            "and a figure taken now would not count. Wait for the machine to be idle, or pass "
            "--loaded to measure anyway with the figures marked loaded."
        )
    return {"load_average_before": load, "loaded": load[0] > IDLE_LOAD}


def after(start: dict) -> dict:
    """The start's record with the load at the end."""
    return {**start, "load_average_after": [round(x, 2) for x in os.getloadavg()]}
