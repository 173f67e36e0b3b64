"""Cost per day of the quality gate (Great Expectations) in a range, against one day at a time.

Run: .venv/bin/python benchmarks/validation_range.py [--days 30 90] [--start 2013-01-01]

Real flights days of 2013 (the bundled contract as it ships: its history gate on), typed as
validated_data types them; typing is done first and not counted. One by one: each day validated
on its own, in order, its history the days before it that passed, as daily runs judge them.
Range: the range's screen (`ml_platform.validation.range_gate.screen_range`), then each day the
screen passed against the day's actual history takes the screen's verdict, any other is
validated on its own, as a range run of validated_data does. Both sides give each day the same
verdict (checked here).

Two figures a side: the gate alone, and the gate with its results stored as validated_data
stores them (GE's JSON and Data Docs page, written to a temporary lake): one result and page a
day one by one; in a range, the screen's results and pages once for the range, plus the own
result and page of each day validated alone. Wall and CPU milliseconds per day: CPU holds when
other work shares the machine.
"""

import argparse
import datetime as dt
import json
import tempfile
import time
from typing import Any

import idle
import pandas as pd

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.flights import flights_for_day
from ml_platform.platform.storage import LakeStorage, LocalStorage
from ml_platform.validation.expectations import (
    GateReport,
    quality_gate,
    render_data_docs,
    result_bytes,
)
from ml_platform.validation.history import day_profile, window_from_profiles
from ml_platform.validation.range_gate import (
    ScreenedDay,
    range_screen,
    range_validations,
    screen_range,
)

Verdicts = dict[str, tuple[GateReport, Any]]


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


def judge(
    contract: Contract,
    frames: dict[str, pd.DataFrame],
    screened: dict[str, ScreenedDay],
    profiles: dict[str, dict[str, float | None]],
) -> Verdicts:
    """Each day's report, and GE's result of its own validation (None if the screen passed it).

    A passing day's profile is the screen's when it made one (`profiles`), as validated_data
    takes it.
    """
    gate, screen = quality_gate(contract), range_screen(contract)
    passed: dict[str, dict[str, float | None]] = {}
    verdicts: Verdicts = {}
    for day, typed in frames.items():
        history = window_from_profiles(contract, day, passed)
        entry = screened.get(day)
        if entry is not None and entry.history == history:
            report, result = screen.passed_report(typed), None
        else:
            report, result = gate.validate(typed, day, history)
        if not report.failures:
            profile = profiles.get(day)
            passed[day] = day_profile(typed, contract) if profile is None else profile
        verdicts[day] = (report, result)
    return verdicts


def store(
    lake: LakeStorage, contract: Contract, verdicts: Verdicts, screened: dict[str, ScreenedDay]
) -> int:
    """Write the results and pages validated_data writes; the number of pages."""
    pages = 0
    for validation in range_validations(screened):
        key = validation.key(contract, "run")
        lake.write_bytes(f"{key}.json", result_bytes(validation.result))
        lake.write_bytes(f"{key}.html", render_data_docs(validation.result).encode())
        pages += 1
    for day, (_, result) in verdicts.items():
        if result is not None:
            prefix = f"{contract.name}/quality/validated_data/{day}/run"
            lake.write_bytes(f"{prefix}.json", result_bytes(result))
            lake.write_bytes(f"{prefix}.html", render_data_docs(result).encode())
            pages += 1
    return pages


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def per_day(started: tuple[float, float], days: int) -> tuple[float, float]:
    wall, cpu = clock()
    return 1000 * (wall - started[0]) / days, 1000 * (cpu - started[1]) / days


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, nargs="+", default=[30, 90])
    parser.add_argument("--start", default="2013-01-01")
    idle.add_argument(parser)
    args = parser.parse_args()
    load = idle.before(args.loaded)
    contract = load_contract("flights")
    # GE's context and suites are built once per process, as the platform does; not counted.
    quality_gate(contract)
    range_screen(contract)
    print(
        "| days | rows/day | one by one: gate CPU; with results and pages wall / CPU (ms/day) "
        "| range: gate CPU; with results and pages wall / CPU (ms/day) | screened days "
        "| pages written one by one / range | days validated alone in the range |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for count in args.days:
        frames = typed_days(contract, dt.date.fromisoformat(args.start), count)
        rows = sum(map(len, frames.values())) / count
        with tempfile.TemporaryDirectory() as lake_dir:
            lake = LocalStorage(base_dir=lake_dir)
            started = clock()
            alone = judge(contract, frames, {}, {})
            alone_gate = per_day(started, count)
            alone_pages = store(lake, contract, alone, {})
            alone_all = per_day(started, count)
        with tempfile.TemporaryDirectory() as lake_dir:
            lake = LocalStorage(base_dir=lake_dir)
            started = clock()
            profiles: dict[str, dict[str, float | None]] = {}
            screened = screen_range(
                lambda day: None,  # no day before the range is history
                contract,
                list(frames),
                rows_of=lambda day, days=frames: len(days[day]),
                typed_of=frames.__getitem__,
                history_on=True,
                profiles=profiles,
            )
            in_range = judge(contract, frames, screened, profiles)
            range_gate = per_day(started, count)
            range_pages = store(lake, contract, in_range, screened)
            range_all = per_day(started, count)

        def sentences(verdicts: Verdicts) -> dict[str, list[str]]:
            return {day: [f.sentence for f in r.failures] for day, (r, _) in verdicts.items()}

        assert sentences(in_range) == sentences(alone)
        print(
            f"| {count} | {rows:.0f} | {alone_gate[1]:.0f}; {alone_all[0]:.0f} / "
            f"{alone_all[1]:.0f} | {range_gate[1]:.0f}; {range_all[0]:.0f} / {range_all[1]:.0f} "
            f"| {len(screened)} | {alone_pages} / {range_pages} "
            f"| {sum(result is not None for _, result in in_range.values())} |"
        )
    print(f"<!-- {json.dumps(idle.after(load))} -->")


if __name__ == "__main__":
    main()
