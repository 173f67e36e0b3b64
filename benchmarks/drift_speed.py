"""Speed of the vectorised KS on 20 numeric columns, and of the daily drift step, 1k to 1M rows.

Run: .venv/bin/python benchmarks/drift_speed.py [--rows 1000 100000 1000000] [--repeat 5]
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

A second table times the platform's drift step on features frames of the synthetic contract
(6 numeric features, one categorical; x1 shifted by 0.05 sd): `detect_drift`, the decision the
`features_drift` check makes, and `drift_check_result`, the whole check after loading its
inputs (decision, the JSON and markdown report built, check metadata),
against the plain baseline: scipy's `ks_2samp` per numeric feature and `chi2_contingency` on the
category counts. Sizes are rows a side, plus the check's real shape at 1k rows a day: one day
against the synthetic contract's 28-day baseline.
"""

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy
from scipy import stats

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.drift.checks import drift_check_result
from ml_platform.drift.detect import detect_drift
from ml_platform.drift.ks import ks_2samp_columns
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.synthetic import Drift, generate_day

COLUMNS = 20
SHIFTED = 5
SEED = 2013
EVIDENTLY_SCRIPT = Path(__file__).with_name("drift_speed_evidently.py")
BASELINE_DAY = dt.date(2024, 1, 1)
CURRENT_DAY = dt.date(2024, 3, 1)
# A 1k-row call takes milliseconds: a median of 5 would mostly measure the machine's noise.
SMALL_ROWS, SMALL_REPEAT_FACTOR = 10_000, 20


def frames(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference and current samples, (rows, COLUMNS), column-major as pandas holds them."""
    rng = np.random.default_rng(SEED)
    reference = rng.normal(size=(COLUMNS, rows)).T
    shift = np.r_[np.full(SHIFTED, 0.05), np.zeros(COLUMNS - SHIFTED)]
    current = (rng.normal(size=(COLUMNS, rows)) + shift[:, None]).T
    return reference, current


def timed(fn, repeat: int, rows: int = 0) -> float:
    if rows and rows <= SMALL_ROWS:
        repeat *= SMALL_REPEAT_FACTOR
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


def seconds(value: float) -> str:
    return f"{value:.3f} s" if value >= 0.01 else f"{value * 1000:.2f} ms"


def measure(rows: int, args: argparse.Namespace) -> str:
    """One row of the result table: medians of every method at `rows` rows a side."""
    reference, current = frames(rows)
    ours = ks_2samp_columns(reference, current)
    theirs = scipy_per_column(reference, current)
    worst = max(abs(ours.statistic[j] - t.statistic) for j, t in enumerate(theirs))
    assert worst <= 1e-9, f"statistics differ from scipy by {worst}"
    floor = timed(lambda: sort_floor(reference, current), args.repeat, rows)
    vectorised = timed(lambda: ks_2samp_columns(reference, current), args.repeat, rows)
    per_column = timed(lambda: scipy_per_column(reference, current), args.scipy_repeat, rows)
    if args.evidently_python:
        # Evidently at 1M rows takes minutes a run; one run says enough there.
        repeat = args.evidently_repeat if rows <= 100_000 else 1
        other = evidently(args.evidently_python, rows, repeat)
        other_cells = f"{other:.2f} s | {other / vectorised:.0f}x"
    else:
        other_cells = "not run | -"
    return (
        f"| {rows:,} | {seconds(floor)} | {seconds(vectorised)} | {vectorised / floor:.2f} | "
        f"{seconds(per_column)} | {other_cells} |"
    )


def features_day(contract: Contract, day: dt.date, rows: int) -> pd.DataFrame:
    """The `features` partition of a synthetic day of `rows` rows; x1 shifted on CURRENT_DAY."""
    shift = Drift(feature="x1", shift_sd=0.05, start=CURRENT_DAY)
    raw = generate_day(day, seed=contract.source.seed, rows=rows, drift=shift)
    return build_features(type_rows(raw, contract, f"bench {day}"), contract)


def scipy_step(reference: pd.DataFrame, current: pd.DataFrame, contract: Contract) -> list:
    """The same tests the plain way: scipy per numeric column, chi-square per categorical."""
    results = [
        stats.ks_2samp(reference[name].dropna(), current[name].dropna())
        for name in contract.numeric_features
    ]
    for name in contract.categorical_features:
        counts = pd.concat(
            [reference[name].value_counts(), current[name].value_counts()], axis=1
        ).fillna(0)
        results.append(stats.chi2_contingency(counts.to_numpy().T))
    return results


def measure_step(
    contract: Contract, label: str, reference: pd.DataFrame, current: pd.DataFrame, repeat: int
) -> str:
    """One row of the drift-step table."""
    days = [BASELINE_DAY.isoformat()]
    rows = len(current)
    decision = timed(lambda: detect_drift([reference], current, contract), repeat, rows)
    check = timed(
        lambda: drift_check_result(
            contract, CURRENT_DAY.isoformat(), current, [reference], days, []
        ),
        repeat,
        rows,
    )
    baseline = timed(lambda: scipy_step(reference, current, contract), repeat, rows)
    return (
        f"| {label} | {decision * 1000:.1f} ms | {check * 1000:.1f} ms | "
        f"{baseline * 1000:.1f} ms | {decision / baseline:.2f} | {check / baseline:.2f} |"
    )


def step_table(rows_list: list[int], repeat: int) -> None:
    contract = load_contract("synthetic")
    window = contract.drift.reference.days
    print(
        "| rows | detect_drift | drift check (with report) | scipy per column | "
        "detect_drift / scipy | check / scipy |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for rows in rows_list:
        reference = features_day(contract, BASELINE_DAY, rows)
        current = features_day(contract, CURRENT_DAY, rows)
        print(measure_step(contract, f"{rows:,} each side", reference, current, repeat), flush=True)
    per_day = contract.source.rows_per_day
    baseline = pd.concat(
        [
            features_day(contract, BASELINE_DAY + dt.timedelta(days=i), per_day)
            for i in range(window)
        ],
        ignore_index=True,
    )
    current = features_day(contract, CURRENT_DAY, per_day)
    label = f"{per_day:,} vs {window}-day baseline ({len(baseline):,})"
    print(measure_step(contract, label, baseline, current, repeat), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
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
    step_table(args.rows, args.repeat)
    print()
    print(f"load average {os.getloadavg()[0]:.2f} at end; command: {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
