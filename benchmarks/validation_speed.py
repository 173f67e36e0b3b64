"""Cost of the quality gate (Great Expectations) per partition size, against plain pandas.

Run: .venv/bin/python benchmarks/validation_speed.py [--rows 1000 100000 1000000] [--repeat 3]

Both sides check the same rules of the synthetic contract on the same typed frame: column list
and types, not-null (with tolerance), ranges, allowed values, row-key uniqueness, row count and
event dates inside the day. The GE context and suite are built once, as the platform does.
"""

import argparse
import datetime as dt
import platform
import statistics
import time

import pandas as pd

from ml_platform.contracts import load_contract
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.synthetic import file_bytes, generate_day
from ml_platform.validation.expectations import QualityGate
from ml_platform.validation.schema import expected_typed_dtypes, type_rows

DAY = "2024-01-01"


def pandas_rules(frame: pd.DataFrame, contract) -> dict:
    """The gate's rules written directly in pandas (the floor GE is compared with)."""
    failures = {}
    dtypes = expected_typed_dtypes(contract)
    failures["columns"] = list(frame.columns) != list(dtypes)
    failures["types"] = {c for c, t in dtypes.items() if str(frame[c].dtype) != t}
    for col in contract.columns:
        values = frame[col.name]
        if not col.nullable:
            failures[f"null:{col.name}"] = values.isna().mean() > (col.max_null_fraction or 0)
        if col.min is not None or col.max is not None:
            low = values < col.min if col.min is not None else False
            high = values > col.max if col.max is not None else False
            failures[f"range:{col.name}"] = (low | high).sum()
        if col.allowed_values is not None:
            failures[f"set:{col.name}"] = (~values.isin(col.allowed_values) & values.notna()).sum()
    failures["key"] = frame.duplicated(contract.quality.row_key, keep=False).sum()
    bounds = contract.quality.row_count
    failures["rows"] = not (bounds.min <= len(frame) <= (bounds.max or len(frame)))
    start = pd.Timestamp(DAY)
    event = frame["event_time"]
    failures["day"] = ((event < start) | (event >= start + pd.Timedelta(days=1))).sum()
    return failures


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    contract = load_contract("synthetic")
    # Row-count bounds would fail the large frames; everything else is the real contract.
    bounds = contract.quality.row_count.model_copy(update={"min": 1, "max": None})
    quality = contract.quality.model_copy(update={"row_count": bounds})
    contract = contract.model_copy(update={"quality": quality})
    started = time.perf_counter()
    gate = QualityGate(contract)
    setup = time.perf_counter() - started
    print(
        f"machine: {platform.processor() or platform.machine()}, python "
        f"{platform.python_version()}, pandas {pd.__version__}"
    )
    print(
        f"GE context and suite of {gate.expectation_count} expectations built in {setup:.2f}s "
        "(once per process)"
    )
    print("| rows | GE gate (s) | plain pandas (s) | GE / pandas |")
    print("|---:|---:|---:|---:|")
    for rows in args.rows:
        frame = generate_day(dt.date(2024, 1, 1), seed=7, rows=rows)
        raw = read_landed_file(file_bytes(frame), "bench.csv", DAY, ["segment"])
        typed = type_rows(raw, contract, "bench")
        report, _ = gate.validate(typed, DAY)
        assert not report.failures, [f.sentence for f in report.failures]
        ge = timed(lambda typed=typed: gate.validate(typed, DAY), args.repeat)
        plain = timed(lambda typed=typed: pandas_rules(typed, contract), args.repeat)
        print(f"| {rows:,} | {ge:.3f} | {plain:.3f} | {ge / plain:.1f} |")


if __name__ == "__main__":
    main()
