"""Cost of the quality gate (Great Expectations) per partition size, against plain pandas.

Run: .venv/bin/python benchmarks/validation_speed.py [--rows 1000 100000 1000000] [--repeat 3]

Both sides check the same rules of a contract on the same typed frame: column list and types,
not-null (with tolerance), ranges, allowed values, uniqueness, row count and event dates inside
the day. The GE context and suite are built once, as the platform does. Two contracts:
`synthetic` (generated days of any size) and `flights` (54 expectations; real 2013 flights
rows, repeated and moved onto one day, flight numbers renumbered so the row key stays unique).
Wall and CPU seconds are both shown: CPU seconds hold when other work shares the machine.
"""

import argparse
import datetime as dt
import json
import platform
import statistics
import time
from functools import partial

import idle
import numpy as np
import pandas as pd
from baseline import plain_rules

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.flights import _all_flights
from ml_platform.ingestion.synthetic import file_bytes, generate_day
from ml_platform.validation.expectations import QualityGate

DAYS = {"synthetic": "2024-01-01", "synthetic+ranges": "2024-01-01", "flights": "2013-01-01"}
# Bounds no generated value reaches: four more range expectations, for a 30-expectation suite.
EXTRA_RANGES = {"x1": 100.0, "x2": 100.0, "x3": 100.0, "target": 1000.0}


def with_extra_ranges(contract: Contract) -> Contract:
    """The synthetic contract with ranges declared on x1, x2, x3 and target as well."""
    columns = [
        c.model_copy(update={"min": -EXTRA_RANGES[c.name], "max": EXTRA_RANGES[c.name]})
        if c.name in EXTRA_RANGES
        else c
        for c in contract.columns
    ]
    return contract.model_copy(update={"columns": columns})


def synthetic_day(contract: Contract, rows: int) -> pd.DataFrame:
    frame = generate_day(dt.date(2024, 1, 1), seed=7, rows=rows)
    raw = read_landed_file(file_bytes(frame), "bench.csv", DAYS["synthetic"], ["segment"])
    return type_rows(raw, contract, "bench")


def flights_day(contract: Contract, rows: int) -> pd.DataFrame:
    year = _all_flights()
    raw = year.iloc[np.arange(rows) % len(year)].reset_index(drop=True)
    raw = raw.assign(month=1, day=1, flight=np.arange(1, rows + 1))
    return type_rows(raw, contract, "bench")


def timed(fn, repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds of `repeat` calls."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def without_row_count_bounds(contract: Contract) -> Contract:
    """Row-count bounds would fail the large frames; everything else is the real contract."""
    bounds = contract.quality.row_count.model_copy(update={"min": 1, "max": None})
    quality = contract.quality.model_copy(update={"row_count": bounds})
    return contract.model_copy(update={"quality": quality})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    parser.add_argument("--datasets", nargs="+", default=list(DAYS), choices=list(DAYS))
    parser.add_argument("--repeat", type=int, default=3)
    idle.add_argument(parser)
    args = parser.parse_args()
    load = idle.before(args.loaded)
    print(
        f"machine: {platform.processor() or platform.machine()}, python "
        f"{platform.python_version()}, pandas {pd.__version__}"
    )
    print(
        "| contract | expectations | rows | GE wall (s) | GE CPU (s) | pandas (s) | GE / pandas |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.datasets:
        contract = without_row_count_bounds(load_contract(name.split("+")[0]))
        if name == "synthetic+ranges":
            contract = with_extra_ranges(contract)
        started = time.perf_counter()
        gate = QualityGate(contract)
        setup = time.perf_counter() - started
        day, make = DAYS[name], flights_day if name == "flights" else synthetic_day
        for rows in args.rows:
            typed = make(contract, rows)
            report, _ = gate.validate(typed, day)
            assert not report.failures, [f.sentence for f in report.failures]
            ge_wall, ge_cpu = timed(partial(gate.validate, typed, day), args.repeat)
            plain, _ = timed(partial(plain_rules, typed, contract, day), args.repeat)
            print(
                f"| {name} | {gate.expectation_count} | {rows:,} | {ge_wall:.3f} | {ge_cpu:.3f} "
                f"| {plain:.3f} | {ge_wall / plain:.1f} |"
            )
        print(f"<!-- {name}: GE context and suite built in {setup:.2f}s, once per process -->")
    print(f"<!-- {json.dumps(idle.after(load))} -->")


if __name__ == "__main__":
    main()
