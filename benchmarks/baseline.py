"""The physical limit: the platform's daily computation as a plain pandas + scikit-learn script.

Run: .venv/bin/python benchmarks/baseline.py [--dataset flights] [--start 2013-01-01] [--days 30]

For each day it does what the daily assets do, with the same functions, in one process and
in memory, with no Dagster, no Great Expectations and no storage: parse the day's file, cast it
to the contract's types, check the gate's rules in plain pandas, build features, train on the
window of W days ending the day, score the held-out rows with bootstrap intervals (and the
previous day's model as the champion), and test drift against the reference days. Platform
figures are divided by this script's.
"""

import argparse
import datetime as dt
import json
import platform
import resource
import time
from dataclasses import dataclass, field

import pandas as pd

from ml_platform.contracts import Contract, load_contract
from ml_platform.drift.detect import detect_drift
from ml_platform.drift.reference import reference_days
from ml_platform.evaluation.metrics import holdout_of, judge, score_model
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.landing import source_day
from ml_platform.ingestion.synthetic import file_bytes
from ml_platform.training.model import TrainedModel, train_model
from ml_platform.validation.schema import expected_typed_dtypes, type_rows


def plain_rules(frame: pd.DataFrame, contract: Contract, day: str) -> dict[str, object]:
    """The quality gate's rules written directly in pandas: the floor GE is compared with."""
    failures: dict[str, object] = {}
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
        if col.unique:
            failures[f"unique:{col.name}"] = values.duplicated(keep=False).sum()
    if contract.quality.row_key:
        failures["key"] = frame.duplicated(contract.quality.row_key, keep=False).sum()
    bounds = contract.quality.row_count
    failures["rows"] = not (bounds.min <= len(frame) <= (bounds.max or len(frame)))
    start = pd.Timestamp(day)
    event = frame["event_time"]
    failures["day"] = ((event < start) | (event >= start + pd.Timedelta(days=1))).sum()
    return failures


@dataclass
class Baseline:
    """The state a run of days builds up: features by day and the latest model."""

    contract: Contract
    features: dict[str, pd.DataFrame] = field(default_factory=dict)
    champion: TrainedModel | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    def _timed(self, stage: str, started: float) -> float:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - started
        return now

    def run_day(self, day: dt.date, data: bytes) -> str:
        """The daily assets' computation for one day; returns the evaluation decision."""
        contract, key = self.contract, day.isoformat()
        t = time.perf_counter()
        text_columns = [c.name for c in contract.columns if c.dtype == "str"]
        raw = read_landed_file(data, "baseline.csv", key, text_columns)
        typed = type_rows(raw, contract, key)
        t = self._timed("read_and_type", t)
        plain_rules(typed, contract, key)
        t = self._timed("validate", t)
        self.features[key] = build_features(typed, contract)
        t = self._timed("features", t)
        first = min(self.features)
        window_days = contract.training.window_days
        window = {
            k: v
            for k, v in self.features.items()
            if dt.date.fromisoformat(k) > day - dt.timedelta(days=window_days)
        }
        model = train_model(window, contract)
        t = self._timed("train", t)
        holdout = holdout_of(model, window, contract)
        samples, seed = contract.evaluation.bootstrap_samples, contract.training.random_seed
        candidate = score_model(model, holdout, samples, seed)
        champion = score_model(self.champion, holdout, samples, seed) if self.champion else None
        verdict = judge(contract, candidate, champion)
        if verdict.decision == "promote":
            self.champion = model
        t = self._timed("evaluate", t)
        reference = [
            self.features[d.isoformat()]
            for d in reference_days(contract.drift.reference, day, dt.date.fromisoformat(first))
            if d.isoformat() in self.features
        ]
        if reference:
            detect_drift(pd.concat(reference, ignore_index=True), self.features[key], contract)
        self._timed("drift", t)
        return verdict.decision


def landed_bytes(contract: Contract, day: dt.date) -> bytes:
    """The bytes `ml-platform land` writes for `day`, made in memory."""
    return file_bytes(source_day(contract, day))


def run(contract: Contract, start: dt.date, days: int) -> dict[str, object]:
    """Run `days` days from `start`; wall seconds in all and per stage, peak memory."""
    files = [landed_bytes(contract, start + dt.timedelta(days=i)) for i in range(days)]
    baseline = Baseline(contract)
    started = time.perf_counter()
    decisions = [baseline.run_day(start + dt.timedelta(days=i), f) for i, f in enumerate(files)]
    total = time.perf_counter() - started
    return {
        "dataset": contract.name,
        "start": start.isoformat(),
        "days": days,
        "seconds": round(total, 3),
        "seconds_per_day": round(total / days, 3),
        "stage_seconds": {k: round(v, 3) for k, v in baseline.seconds.items()},
        "decisions": {d: decisions.count(d) for d in sorted(set(decisions))},
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "machine": f"{platform.machine()}, python {platform.python_version()}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="flights")
    parser.add_argument("--start", type=dt.date.fromisoformat, default=dt.date(2013, 1, 1))
    parser.add_argument("--days", type=int, default=30)
    args = parser.parse_args()
    print(json.dumps(run(load_contract(args.dataset), args.start, args.days), indent=2))


if __name__ == "__main__":
    main()
