"""The physical limit: the platform's daily computation as a plain pandas + scikit-learn script.

Run: .venv/bin/python benchmarks/baseline.py [--dataset flights] [--start 2013-01-01] [--days 30]
     [--processes 2]

For each day it does what the daily assets do, with the same functions, in one process and
in memory, with no Dagster, no Great Expectations and no storage: parse the day's file, cast it
to the contract's types, check the gate's rules in plain pandas, build features, train on the
window of W days ending the day, score the held-out rows with bootstrap intervals (and the
previous day's model as the champion), and test drift against the reference days. Platform
figures are divided by this script's.

With `--processes P` the days are cut into P contiguous parts computed by P processes at once,
as a backfill's runs share the machine's cores. A part after the first first reads, types and
builds the features of the W - 1 days before it (its first models' windows; counted in its
time), and starts without a champion, so its first day is judged on values alone.
"""

import argparse
import datetime as dt
import json
import multiprocessing
import platform
import resource
import time
from dataclasses import dataclass, field

import pandas as pd

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.reference import reference_days
from ml_platform.contracts.schema import expected_typed_dtypes, type_rows
from ml_platform.drift.detect import detect_drift
from ml_platform.evaluation.metrics import holdout_of, judge, score_model
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.landing import source_day
from ml_platform.ingestion.synthetic import file_bytes
from ml_platform.training.model import TrainedModel, train_model


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

    def add_features(self, day: dt.date, data: bytes) -> None:
        """Read, type and build the features of a day before the part: a window's history."""
        contract, key = self.contract, day.isoformat()
        t = time.perf_counter()
        text_columns = [c.name for c in contract.columns if c.dtype == "str"]
        typed = type_rows(read_landed_file(data, "baseline.csv", key, text_columns), contract, key)
        self.features[key] = build_features(typed, contract)
        self._timed("window_history", t)

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


Part = tuple[list[str], dict[str, float], float, float]


def run_part(contract: Contract, start: dt.date, days: int, history_from: dt.date) -> Part:
    """The decisions of `days` days from `start`, the seconds per stage, and when the
    computation began and ended (epoch seconds), in this process.

    The days from `history_from` to the day before `start` only get their features.
    """
    history = [history_from + dt.timedelta(days=i) for i in range((start - history_from).days)]
    wanted = [start + dt.timedelta(days=i) for i in range(days)]
    files = {day: landed_bytes(contract, day) for day in [*history, *wanted]}
    baseline = Baseline(contract)
    began = time.time()
    for day in history:
        baseline.add_features(day, files[day])
    decisions = [baseline.run_day(day, files[day]) for day in wanted]
    return decisions, baseline.seconds, began, time.time()


def _run_part(args: tuple[str, dt.date, int, dt.date]) -> Part:
    name, start, days, history_from = args
    return run_part(load_contract(name), start, days, history_from)


def run(contract: Contract, start: dt.date, days: int, processes: int = 1) -> dict[str, object]:
    """Run `days` days from `start` in `processes` processes at once; wall seconds in all and
    per stage (summed over the processes), peak memory."""
    size = -(-days // processes)
    parts = []
    for first in range(0, days, size):
        part_start = start + dt.timedelta(days=first)
        window = dt.timedelta(days=contract.training.window_days - 1)
        history_from = max(start, part_start - window)
        parts.append((contract.name, part_start, min(size, days - first), history_from))
    if len(parts) == 1:
        results = [run_part(contract, *parts[0][1:])]
    else:
        # Each process imports the libraries first, as this one did: timed from the first
        # part's start of computation to the last part's end.
        with multiprocessing.get_context("spawn").Pool(len(parts)) as pool:
            results = pool.map(_run_part, parts)
    total = max(r[3] for r in results) - min(r[2] for r in results)
    decisions = [d for part, *_ in results for d in part]
    seconds: dict[str, float] = {}
    for _, stages, *_ in results:
        for stage, value in stages.items():
            seconds[stage] = seconds.get(stage, 0.0) + value
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "dataset": contract.name,
        "start": start.isoformat(),
        "days": days,
        "processes": len(parts),
        "seconds": round(total, 3),
        "seconds_per_day": round(total / days, 3),
        "stage_seconds": {k: round(v, 3) for k, v in seconds.items()},
        "decisions": {d: decisions.count(d) for d in sorted(set(decisions))},
        "peak_rss_mb": round(
            max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, children) / 1024, 1
        ),
        "machine": f"{platform.machine()}, python {platform.python_version()}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="flights")
    parser.add_argument("--start", type=dt.date.fromisoformat, default=dt.date(2013, 1, 1))
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--processes", type=int, default=1, help="parts computed at once")
    args = parser.parse_args()
    contract = load_contract(args.dataset)
    print(json.dumps(run(contract, args.start, args.days, args.processes), indent=2))


if __name__ == "__main__":
    main()
