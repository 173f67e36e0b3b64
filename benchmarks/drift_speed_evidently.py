"""Evidently's DataDriftPreset on the frames of drift_speed.py; runs in its own venv.

Evidently 0.7 does not import on pandas 3, so this script runs with a separate interpreter:

    python3.11 -m venv /tmp/evidently-venv
    /tmp/evidently-venv/bin/pip install "evidently==0.7.23" "pandas<3"
    /tmp/evidently-venv/bin/python benchmarks/drift_speed_evidently.py --rows 100000

It imports nothing from ml_platform and prints one JSON line: rows, repeats, median seconds.
"""

import argparse
import json
import statistics
import time

import numpy as np
import pandas as pd
from evidently import Report
from evidently.presets import DataDriftPreset

# Same frames as drift_speed.py: 20 columns, 5 of them shifted by 0.05 sd, seed 2013.
COLUMNS, SHIFTED, SEED = 20, 5, 2013


def frames(rows: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(SEED)
    reference = rng.normal(size=(COLUMNS, rows)).T
    shift = np.r_[np.full(SHIFTED, 0.05), np.zeros(COLUMNS - SHIFTED)]
    current = (rng.normal(size=(COLUMNS, rows)) + shift[:, None]).T
    names = [f"x{j}" for j in range(COLUMNS)]
    return pd.DataFrame(reference, columns=names), pd.DataFrame(current, columns=names)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    pd.set_option("mode.copy_on_write", True)
    reference, current = frames(args.rows)
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        Report([DataDriftPreset()]).run(current_data=current, reference_data=reference)
        times.append(time.perf_counter() - started)
    result = {"rows": args.rows, "repeats": args.repeat, "median_seconds": statistics.median(times)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
