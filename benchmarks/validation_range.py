"""Cost per day of the quality gate (Great Expectations) in a range, against one day at a time.

Run: .venv/bin/python benchmarks/validation_range.py [--days 30 90] [--start 2013-01-01]

Real flights days of 2013 (the bundled contract, its history gate on), typed as validated_data
types them; typing is done first and not counted. One by one: each day validated on its own,
in order, its history the days before it that passed, as daily runs judge them. Range: the
range's screen (`ml_platform.validation.range_gate.screen_range`), then each day's result from
the screen when it passed against the day's actual history, else its own validation, as a range
run of validated_data does. Both sides give each day the same verdict (checked here). Rendering
the Data Docs page, the same for both, is shown apart. Wall and CPU milliseconds per day: CPU
holds when other work shares the machine.
"""

import argparse
import datetime as dt
import os
import tempfile
import time

import pandas as pd

from ml_platform.contracts import Contract, load_contract
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.flights import flights_for_day
from ml_platform.platform.storage import LocalStorage
from ml_platform.validation.expectations import quality_gate, render_data_docs
from ml_platform.validation.history import day_profile, window_from_profiles
from ml_platform.validation.range_gate import range_screen, screen_range
from ml_platform.validation.schema import type_rows


def typed_days(contract: Contract, start: dt.date, count: int) -> dict[str, pd.DataFrame]:
    text = [c.name for c in contract.columns if c.dtype == "str"]
    frames = {}
    for offset in range(count):
        day = start + dt.timedelta(days=offset)
        name = contract.landing.file_name(day.isoformat())
        data = flights_for_day(day).to_csv(index=False).encode()
        raw = read_landed_file(data, name, day.isoformat(), text)
        frames[day.isoformat()] = type_rows(raw, contract, where=name).reset_index(drop=True)
    return frames


def judge(contract: Contract, frames: dict[str, pd.DataFrame], screened: dict) -> dict:
    """Each day's verdict (failed expectations) and GE result, in order."""
    gate, screen = quality_gate(contract), range_screen(contract)
    passed: dict[str, dict[str, float | None]] = {}
    verdicts = {}
    for day, typed in frames.items():
        history = window_from_profiles(contract, day, passed)
        if day in screened and screened[day] == history:
            report, result = screen.passing_result(typed, day, history)
        else:
            report, result = gate.validate(typed, day, history)
        if not report.failures:
            passed[day] = day_profile(typed, contract)
        verdicts[day] = ([f.sentence for f in report.failures], result)
    return verdicts


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def per_day(started: tuple[float, float], days: int) -> tuple[float, float]:
    wall, cpu = clock()
    return 1000 * (wall - started[0]) / days, 1000 * (cpu - started[1]) / days


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, nargs="+", default=[30, 90])
    parser.add_argument("--start", default="2013-01-01")
    args = parser.parse_args()
    contract = load_contract("flights")
    print(f"load average: {os.getloadavg()}")
    # GE's context and suites are built once per process, as the platform does; not counted.
    quality_gate(contract)
    range_screen(contract)
    print(
        "| days | rows/day | one by one wall / CPU (ms/day) | range wall / CPU (ms/day) | "
        "screened days | Data Docs CPU (ms/day) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for count in args.days:
        frames = typed_days(contract, dt.date.fromisoformat(args.start), count)
        rows = sum(map(len, frames.values())) / count
        started = clock()
        alone = judge(contract, frames, {})
        alone_ms = per_day(started, count)
        with tempfile.TemporaryDirectory() as lake_dir:
            lake = LocalStorage(base_dir=lake_dir)
            started = clock()
            screened = screen_range(
                lake,
                contract,
                list(frames),
                rows_of=lambda day, days=frames: len(days[day]),
                typed_of=frames.__getitem__,
                history_on=True,
            )
            in_range = judge(contract, frames, screened)
            range_ms = per_day(started, count)
        assert {d: v[0] for d, v in in_range.items()} == {d: v[0] for d, v in alone.items()}
        started = clock()
        for _, result in in_range.values():
            render_data_docs(result)
        docs = per_day(started, count)[1]
        print(
            f"| {count} | {rows:.0f} | {alone_ms[0]:.0f} / {alone_ms[1]:.0f} | "
            f"{range_ms[0]:.0f} / {range_ms[1]:.0f} | {len(screened)} | {docs:.0f} |"
        )


if __name__ == "__main__":
    main()
