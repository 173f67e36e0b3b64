"""Drift alarms over the whole of 2013 on the real flights, with the contract's defaults.

Run: .venv/bin/python benchmarks/drift_flights_year.py

Features of all 365 days are built with the platform's own pure functions (landed CSV bytes,
typing, row-wise features), exactly as the graph builds them, without Dagster runs. Each day is
then compared with its reference (given day by day, as the check gives it) by `detect_drift`.
Besides the contract's settings, the same days are scored with weaker rules, to show what each
part of the rule removes:
- fixed gate: effect size AND corrected p-value, without the calibration by each feature's
  day-to-day movement inside the reference window;
- naive: previous day as reference, any feature with an uncorrected p < 0.05 (what users of
  drift tools report firing on most days);
- p only / effect only: the default reference, with only one of the two gates.
Prints markdown tables (the source of docs/drift-flights-2013.md).
"""

import datetime as dt
import time
from collections import Counter

import pandas as pd

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import DriftReferenceSpec
from ml_platform.contracts.reference import reference_days
from ml_platform.contracts.schema import type_rows
from ml_platform.drift.detect import FeatureVerdict, detect_drift
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.flights import flights_for_day

CONTRACT = load_contract("flights")
FIRST = CONTRACT.partitions.start_date
DAYS = [FIRST + dt.timedelta(days=i) for i in range(365)]
# For reading the table only: the US federal holidays of 2013 and the days around them.
HOLIDAYS = {
    "2013-01-01": "New Year's Day",
    "2013-01-21": "Martin Luther King Jr. Day",
    "2013-02-18": "Presidents' Day",
    "2013-05-27": "Memorial Day",
    "2013-07-04": "Independence Day",
    "2013-07-05": "day after Independence Day",
    "2013-09-02": "Labor Day",
    "2013-10-14": "Columbus Day",
    "2013-11-11": "Veterans Day",
    "2013-11-28": "Thanksgiving",
    "2013-11-29": "day after Thanksgiving",
    "2013-11-30": "Thanksgiving weekend",
    "2013-12-24": "Christmas Eve",
    "2013-12-25": "Christmas Day",
    "2013-12-31": "New Year's Eve",
}


def features_of(day: dt.date) -> pd.DataFrame:
    """The day's features as the graph makes them: CSV bytes, landed, typed, featurised."""
    name = CONTRACT.landing.file_name(day.isoformat())
    data = flights_for_day(day).to_csv(index=False).encode()
    text_columns = [c.name for c in CONTRACT.columns if c.dtype == "str"]
    raw = read_landed_file(data, name, day.isoformat(), text_columns)
    return build_features(type_rows(raw, CONTRACT, where=name), CONTRACT)


def with_reference(contract: Contract, reference: DriftReferenceSpec) -> Contract:
    drift = contract.drift.model_copy(update={"reference": reference})
    return contract.model_copy(update={"drift": drift})


def verdicts_per_day(
    frames: dict[dt.date, pd.DataFrame], contract: Contract
) -> dict[dt.date, list[FeatureVerdict]]:
    """Each evaluated day's verdicts (days without any reference day are left out)."""
    result = {}
    for day in DAYS:
        ref_days = reference_days(contract.drift.reference, day, FIRST)
        if ref_days:
            # Day by day, as the check gives it, so each feature is calibrated by its own
            # day-to-day movement inside the reference window.
            result[day] = detect_drift([frames[d] for d in ref_days], frames[day], contract)
    return result


RULES = {
    "contract rule (fixed gate AND above its day-to-day bound)": lambda v: v.status == "drift",
    "fixed gate (effect AND corrected p)": lambda v: v.fixed_gate,
    "corrected p only": lambda v: v.p_adjusted is not None and v.p_adjusted <= 0.02,
    "effect size only": lambda v: v.effect is not None and v.effect >= v.threshold,
    "any uncorrected p < 0.05": lambda v: v.p_value is not None and v.p_value < 0.05,
}


def summary_row(name: str, rule: str, verdicts: dict[dt.date, list[FeatureVerdict]]) -> str:
    fires = {day: [v for v in vs if RULES[rule](v)] for day, vs in verdicts.items()}
    days_fired = sum(1 for f in fires.values() if f)
    feature_days = sum(len(f) for f in fires.values())
    tested = sum(1 for vs in verdicts.values() for v in vs if v.status != "skipped")
    per_feature = Counter(v.feature for f in fires.values() for v in f)
    top = ", ".join(f"{feature} {count}" for feature, count in per_feature.most_common())
    return (
        f"| {name} | {rule} | {len(verdicts)} | {days_fired} ({days_fired / len(verdicts):.1%}) "
        f"| {feature_days} of {tested} ({feature_days / tested:.2%}) | {top or '-'} |"
    )


def main() -> None:
    started = time.perf_counter()
    frames = {day: features_of(day) for day in DAYS}
    built = time.perf_counter() - started
    references = {
        "contract: same weekday, 4 weeks": CONTRACT.drift.reference,
        "previous 7 days": DriftReferenceSpec(mode="previous_days", days=7),
        "previous day": DriftReferenceSpec(mode="previous_days", days=1),
    }
    scored = {
        name: verdicts_per_day(frames, with_reference(CONTRACT, spec))
        for name, spec in references.items()
    }
    scoring = time.perf_counter() - started - built
    print(
        f"{len(DAYS)} days, {sum(len(f) for f in frames.values())} flights; features built in "
        f"{built:.0f} s, {sum(len(v) for v in scored.values())} day comparisons in "
        f"{scoring:.0f} s ({scoring / sum(len(v) for v in scored.values()) * 1000:.0f} ms each)"
    )
    print()
    print("| reference | rule | days evaluated | days firing | feature-days firing | by feature |")
    print("|---|---|---:|---:|---:|---|")
    for name, verdicts in scored.items():
        rules = RULES if name.startswith("contract") else [*list(RULES)[:2], list(RULES)[-1]]
        for rule in rules:
            print(summary_row(name, rule, verdicts))
    for name, verdicts in scored.items():
        if name.startswith("contract"):
            continue
        drifting = {d: [v.feature for v in vs if v.status == "drift"] for d, vs in verdicts.items()}
        listed = [
            f"{day} {day.strftime('%a')} ({', '.join(features)})"
            for day, features in drifting.items()
            if features
        ]
        print()
        print(f"Days firing with reference '{name}' and the contract rule: {'; '.join(listed)}")
    print()
    print("Days that fire with the contract's settings:")
    print()
    print(
        "| day | weekday | flights | calendar | drifting feature: effect (threshold), corrected p;"
        " what changed |"
    )
    print("|---|---|---:|---|---|")
    defaults = scored["contract: same weekday, 4 weeks"]
    for day, verdicts in defaults.items():
        drifting = [v for v in verdicts if v.status == "drift"]
        if not drifting:
            continue
        cells = "<br>".join(
            f"{v.feature}: {v.effect:.3f} ({v.threshold:g}), p {v.p_adjusted:.1e}; {v.change}"
            for v in drifting
        )
        print(
            f"| {day} | {day.strftime('%a')} | {len(frames[day])} | "
            f"{HOLIDAYS.get(day.isoformat(), '')} | {cells} |"
        )
    print()
    print("Largest effect of each feature on days that did not fire (contract settings):")
    print()
    print("| feature | median effect | 99th percentile | max | threshold |")
    print("|---|---:|---:|---:|---:|")
    quiet = [v for vs in defaults.values() if all(x.status != "drift" for x in vs) for v in vs]
    for feature in [f.name for f in CONTRACT.features]:
        effects = pd.Series([v.effect for v in quiet if v.feature == feature and v.effect])
        if effects.empty:
            print(f"| {feature} | not tested (calendar feature) | | | |")
            continue
        threshold = next(v.threshold for v in quiet if v.feature == feature)
        print(
            f"| {feature} | {effects.median():.3f} | {effects.quantile(0.99):.3f} | "
            f"{effects.max():.3f} | {threshold:g} |"
        )


if __name__ == "__main__":
    main()
