"""How often the synthetic Done-when holds: false alarms and power over many generator seeds.

Run: .venv/bin/python benchmarks/drift_synthetic_power.py [--seeds 40] [--features x1 x3]

For each seed: 60 quiet days and, per drift feature, the same days with a 0.2 sd shift of that
feature from day 40, each day compared with the synthetic contract's reference (a fixed
baseline, given day by day so each feature is calibrated by its day-to-day movement) by
`detect_drift`. Reports, for several alphas (the corrected-p gate; the effect-size gate and the
calibration stay at the contract's settings):
- the share of quiet feature-days that fire (target <= 1 %);
- the share of shifted days on which the shifted feature fires (per-day power);
- the share of seeds on which the whole Done-when holds: the shifted feature fires on all 20
  days and nothing else fires on any of the 60 days.
The daily-moving temperature is left out of these counts (benchmarks/drift_calibration.py
measures it). Days are built without the CSV round trip (typed straight from the generated
frame), which gives the same features at a fraction of the cost.
"""

import argparse
import datetime as dt
from collections import defaultdict

import pandas as pd

from ml_platform.contracts import load_contract
from ml_platform.contracts.reference import reference_days
from ml_platform.contracts.schema import type_rows
from ml_platform.drift.detect import Calibration, FeatureVerdict, calibrate, detect_drift
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.synthetic import Drift, generate_day

CONTRACT = load_contract("synthetic")
START = CONTRACT.partitions.start_date
DAYS = [START + dt.timedelta(days=i) for i in range(60)]
SHIFTED = DAYS[40:]
ALPHAS = [0.005, 0.01, 0.02, 0.05]
# The feature that moves every day by design; benchmarks/drift_calibration.py measures it.
MOVING = "temperature"


def features_of(day: dt.date, seed: int, drift: Drift | None = None) -> pd.DataFrame:
    frame = generate_day(day, seed=seed, rows=CONTRACT.source.rows_per_day, drift=drift)
    return build_features(type_rows(frame, CONTRACT, where=str(day)), CONTRACT)


def score(frames: dict[dt.date, pd.DataFrame], days: list[dt.date]):
    """Verdicts of each day in `days` against its contract reference, built from `frames`."""
    cache: dict[tuple, Calibration] = {}
    out: dict[dt.date, list[FeatureVerdict]] = {}
    for day in days:
        ref_days = tuple(reference_days(CONTRACT.drift.reference, day, START))
        if ref_days:
            reference = [frames[d] for d in ref_days]
            if ref_days not in cache:
                cache[ref_days] = calibrate(reference, CONTRACT)
            verdicts = detect_drift(reference, frames[day], CONTRACT, cache[ref_days])
            out[day] = [v for v in verdicts if v.feature != MOVING]
    return out


def fires(verdict: FeatureVerdict, alpha: float) -> bool:
    """The contract's rule at another alpha: both fixed gates and the calibration bound."""
    return (
        verdict.effect is not None
        and verdict.effect >= verdict.threshold
        and verdict.p_adjusted is not None
        and verdict.p_adjusted <= alpha
        and (verdict.calibration_bound is None or verdict.effect > verdict.calibration_bound)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--features", nargs="+", default=["x1", "x3"])
    args = parser.parse_args()
    quiet_fires = defaultdict(int)
    quiet_tested = 0
    detected = defaultdict(int)
    others = defaultdict(int)
    holds = defaultdict(int)
    contract_seed_holds = {}
    for seed in range(args.seeds):
        quiet = {day: features_of(day, seed) for day in DAYS}
        quiet_verdicts = score(quiet, DAYS)
        quiet_tested += sum(v.status != "skipped" for vs in quiet_verdicts.values() for v in vs)
        quiet_before = {
            a: sum(fires(v, a) for d, vs in quiet_verdicts.items() if d < SHIFTED[0] for v in vs)
            for a in ALPHAS
        }
        for alpha in ALPHAS:
            quiet_fires[alpha] += sum(fires(v, alpha) for vs in quiet_verdicts.values() for v in vs)
        for feature in args.features:
            drift = Drift(feature, 0.2, SHIFTED[0])
            shifted = {**quiet, **{d: features_of(d, seed, drift) for d in SHIFTED}}
            verdicts = score(shifted, SHIFTED)
            for alpha in ALPHAS:
                hit = sum(
                    fires(v, alpha) for vs in verdicts.values() for v in vs if v.feature == feature
                )
                wrong = sum(
                    fires(v, alpha) for vs in verdicts.values() for v in vs if v.feature != feature
                )
                detected[feature, alpha] += hit
                others[feature, alpha] += wrong
                ok = hit == len(SHIFTED) and wrong == 0 and quiet_before[alpha] == 0
                holds[feature, alpha] += ok
                if seed == CONTRACT.source.seed:
                    contract_seed_holds[feature, alpha] = ok
        print(f"seed {seed} done", flush=True)
    n = args.seeds
    tested_per_day = quiet_tested // (len(DAYS) - 1) // n
    print()
    print(
        f"{n} seeds x 60 days, {CONTRACT.source.rows_per_day} rows a day, reference: "
        f"{CONTRACT.drift.reference.mode} {CONTRACT.drift.reference.days} days, "
        f"{CONTRACT.drift.correction}"
    )
    print()
    header = "| alpha | quiet feature-days firing |"
    header += "".join(
        f" {f}: days detected | {f}: other features firing | {f}: Done-when holds |"
        for f in args.features
    )
    print(header)
    print("|---:|---:|" + "---:|---:|---:|" * len(args.features))
    for alpha in ALPHAS:
        row = f"| {alpha:g} | {quiet_fires[alpha] / quiet_tested:.2%} |"
        for f in args.features:
            mark = ""
            if (f, alpha) in contract_seed_holds:
                mark = " (seed 7: " + ("yes" if contract_seed_holds[f, alpha] else "no") + ")"
            row += (
                f" {detected[f, alpha] / (n * len(SHIFTED)):.1%} |"
                f" {others[f, alpha] / (n * len(SHIFTED) * (tested_per_day - 1)):.2%} |"
                f" {holds[f, alpha] / n:.0%}{mark} |"
            )
        print(row)


if __name__ == "__main__":
    main()
