"""Speed of the vectorised KS on 20 numeric columns, 100k and 1M rows against the same.

Run: .venv/bin/python benchmarks/drift_speed.py [--rows 100000 1000000] [--repeat 5]
         [--evidently-python /tmp/evidently-venv/bin/python]

Four ways over the same reference and current frames (seeded; 5 of the 20 columns shifted by
0.05 sd, so some columns drift as in real use):
- sort: sorting every column of both frames, the floor of any exact KS;
- vectorised KS: ml_platform.drift.ks.ks_2samp_columns (statistic and p-value of every column);
- scipy: scipy.stats.ks_2samp per column (its default method, as a user would call it);
- Evidently: Report([DataDriftPreset()]).run(...), Evidently's own drift report. Evidently does
  not import on pandas 3, so it runs in a separate throwaway venv (pandas<3) through
  benchmarks/drift_speed_evidently.py; it is never a dependency of the project.
Before timing, the vectorised statistics are checked against scipy's to 1e-9.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import scipy
from scipy import stats

from ml_platform.drift.ks import ks_2samp_columns

COLUMNS = 20
SHIFTED = 5
SEED = 2013
EVIDENTLY_SCRIPT = Path(__file__).with_name("drift_speed_evidently.py")


def frames(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference and current samples, (rows, COLUMNS), column-major as pandas holds them."""
    rng = np.random.default_rng(SEED)
    reference = rng.normal(size=(COLUMNS, rows)).T
    shift = np.r_[np.full(SHIFTED, 0.05), np.zeros(COLUMNS - SHIFTED)]
    current = (rng.normal(size=(COLUMNS, rows)) + shift[:, None]).T
    return reference, current


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def sort_floor(reference: np.ndarray, current: np.ndarray) -> None:
    np.sort(reference, axis=0)
    np.sort(current, axis=0)


def scipy_per_column(reference: np.ndarray, current: np.ndarray) -> list:
    return [stats.ks_2samp(reference[:, j], current[:, j]) for j in range(COLUMNS)]


def evidently(python: str, rows: int, repeat: int) -> float:
    command = [python, str(EVIDENTLY_SCRIPT), "--rows", str(rows), "--repeat", str(repeat)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["median_seconds"])


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{cpu}, {os.cpu_count()} cores, {memory_gb:.0f} GB RAM; Python "
        f"{platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}; "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )


def measure(rows: int, args: argparse.Namespace) -> str:
    """One row of the result table: medians of every method at `rows` rows a side."""
    reference, current = frames(rows)
    ours = ks_2samp_columns(reference, current)
    theirs = scipy_per_column(reference, current)
    worst = max(abs(ours.statistic[j] - t.statistic) for j, t in enumerate(theirs))
    assert worst <= 1e-9, f"statistics differ from scipy by {worst}"
    floor = timed(lambda: sort_floor(reference, current), args.repeat)
    vectorised = timed(lambda: ks_2samp_columns(reference, current), args.repeat)
    per_column = timed(lambda: scipy_per_column(reference, current), args.scipy_repeat)
    if args.evidently_python:
        # Evidently at 1M rows takes minutes a run; one run says enough there.
        repeat = args.evidently_repeat if rows <= 100_000 else 1
        other = evidently(args.evidently_python, rows, repeat)
        other_cells = f"{other:.2f} s | {other / vectorised:.0f}x"
    else:
        other_cells = "not run | -"
    return (
        f"| {rows:,} | {floor:.3f} s | {vectorised:.3f} s | {vectorised / floor:.2f} | "
        f"{per_column:.2f} s | {other_cells} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scipy-repeat", type=int, default=3)
    parser.add_argument("--evidently-python", help="python of a venv with evidently, pandas<3")
    parser.add_argument("--evidently-repeat", type=int, default=3)
    args = parser.parse_args()

    print(machine())
    print()
    print(
        "| rows (each side) | sort (floor) | vectorised KS | x sort | scipy per column | "
        "Evidently DataDriftPreset | Evidently / vectorised |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for rows in args.rows:
        print(measure(rows, args), flush=True)
    print()
    print(f"load average {os.getloadavg()[0]:.2f} at end; command: {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
