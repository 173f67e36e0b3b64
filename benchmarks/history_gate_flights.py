"""False alarms of the history gate over the whole of 2013 on the real flights.

Run: .venv/bin/python benchmarks/history_gate_flights.py [--spread S --share-floor F
     --count-floor C] [--reference previous_days:7]

Each day's rows go through the platform's own pure functions, as the graph types them (landed
CSV bytes, typing), and are profiled (`validation.history.day_profile`). The days are then
judged in order, as the daily runs judge them: a day's bounds come from its reference days'
profiles (the contract's: the same weekday among the 28 days before), and a day that fails does
not become history, as it would not be stored. No Dagster run and no Great Expectations: the
bounds and the verdict are the same pure functions whose bounds the GE suite receives.
Prints the failing days with each failing statistic, its value, the history's range and bounds,
and how often the gate catches three broken deliveries injected into every judged day's profile:
the label source emptied, the tailnum column emptied on half the rows, half the rows missing.
"""

import argparse
import datetime as dt
import time
from collections import Counter

from benchmarks.drift_flights_year import HOLIDAYS
from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import DriftReferenceSpec
from ml_platform.contracts.schema import type_rows
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.flights import flights_for_day
from ml_platform.validation.history import (
    day_profile,
    gated_statistics,
    judge,
    window_from_profiles,
)

CONTRACT = load_contract("flights")
FIRST = CONTRACT.partitions.start_date
DAYS = [FIRST + dt.timedelta(days=i) for i in range(365)]


def profile_of(day: dt.date) -> dict[str, float | None]:
    """The day's profile as validated_data stores it: CSV bytes, landed, typed, profiled."""
    name = CONTRACT.landing.file_name(day.isoformat())
    data = flights_for_day(day).to_csv(index=False).encode()
    text_columns = [c.name for c in CONTRACT.columns if c.dtype == "str"]
    raw = read_landed_file(data, name, day.isoformat(), text_columns)
    return day_profile(type_rows(raw, CONTRACT, where=name), CONTRACT)


def broken(profile: dict[str, float | None]) -> dict[str, dict[str, float | None]]:
    """The profile of the same day delivered broken, in three ways."""
    label = CONTRACT.label_name
    emptied = {
        **profile,
        f"labelled_share({label})": 0.0,
        f"positive_rate({label})": None,
        f"null_share({CONTRACT.label.source})": 1.0,
    }
    tailnum = profile["null_share(tailnum)"] or 0.0
    half_empty = {**profile, "null_share(tailnum)": tailnum + 0.5 * (1.0 - tailnum)}
    half_rows = {**profile, "row_count": (profile["row_count"] or 0.0) / 2}
    return {
        "label source emptied": emptied,
        "tailnum empty on half the rows": half_empty,
        "half the rows missing": half_rows,
    }


def tuned(args: argparse.Namespace) -> Contract:
    """The flights contract with the history gate's settings of the command line."""
    history = CONTRACT.quality.history.model_copy(
        update={
            key: value
            for key, value in {
                "spread": args.spread,
                "share_floor": args.share_floor,
                "count_floor": args.count_floor,
            }.items()
            if value is not None
        }
    )
    if args.reference:
        mode, days = args.reference.split(":")
        reference = DriftReferenceSpec(mode=mode, days=int(days), same_weekday=args.same_weekday)
        history = history.model_copy(update={"reference": reference})
    quality = CONTRACT.quality.model_copy(update={"history": history})
    return CONTRACT.model_copy(update={"quality": quality})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spread", type=float)
    parser.add_argument("--share-floor", type=float)
    parser.add_argument("--count-floor", type=float)
    parser.add_argument("--reference", help="mode:days, e.g. previous_days:7")
    parser.add_argument("--same-weekday", action="store_true")
    args = parser.parse_args()
    contract = tuned(args)
    started = time.perf_counter()
    profiles = {day.isoformat(): profile_of(day) for day in DAYS}
    built = time.perf_counter() - started
    spec = contract.quality.history
    print(
        f"{len(DAYS)} days profiled in {built:.0f} s; reference: "
        f"{contract.history_reference.model_dump(exclude_none=True)}; spread {spec.spread}, "
        f"share_floor {spec.share_floor}, count_floor {spec.count_floor}, "
        f"min_days {spec.min_days}; {len(gated_statistics(contract))} statistics a day"
    )
    history: dict[str, dict[str, float | None]] = {}
    judged = short = 0
    failing: dict[str, list[str]] = {}
    by_statistic: Counter[str] = Counter()
    caught: Counter[str] = Counter()
    for day, profile in profiles.items():
        window = window_from_profiles(contract, day, history)
        if window.too_short:
            short += 1
        else:
            judged += 1
        failed = judge(profile, window.bounds)
        if not window.too_short:
            for fault, faulty in broken(profile).items():
                caught[fault] += bool(judge(faulty, window.bounds))
        if not failed:
            history[day] = profile
            continue
        by_kind = {s.key: s for s in gated_statistics(contract)}
        lines = []
        for key in failed:
            bound, stat = window.bounds[key], by_kind[key]
            by_statistic[stat.kind] += 1
            lines.append(
                f"{key} = {stat.show(profile[key])}, history {stat.show(bound.history_min)}.."
                f"{stat.show(bound.history_max)}, bounds {stat.show(bound.low)}.."
                f"{stat.show(bound.high)}"
            )
        failing[day] = lines
    print(
        f"{judged} days judged, {short} with too short a history; {len(failing)} failing "
        f"({len(failing) / max(judged, 1):.1%} of judged days); by statistic: "
        f"{dict(by_statistic.most_common()) or '-'}"
    )
    print(
        "broken deliveries caught: "
        + ", ".join(f"{fault} {n / max(judged, 1):.1%}" for fault, n in caught.items())
    )
    for day, lines in failing.items():
        weekday = dt.date.fromisoformat(day).strftime("%a")
        label = f" ({HOLIDAYS[day]})" if day in HOLIDAYS else ""
        print(f"- {day} {weekday}{label}: " + "; ".join(lines))


if __name__ == "__main__":
    main()
