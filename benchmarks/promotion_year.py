"""How often the champion changes over a year, and what the serving champion scores the next day.

Run: .venv/bin/python benchmarks/promotion_year.py [--dataset flights] [--start 2013-01-01]
     [--days 365] [--output result.json]

Each day's model is trained once, with the platform's own functions, on the contract's window
(28 days for flights) and scored on its held-out rows, as the daily assets do. Two champions
are then kept side by side, one per promotion rule, so both judge the very same candidates:

- `point_estimate`: the rule the platform had before, promote when the metric's point
  improvement over the champion is at least the change threshold (a tie promotes), with the
  threshold flights had then (`--former-threshold`, 0);
- `paired_bootstrap`: the platform's verdict (`evaluation.metrics.judge`), promote only when the
  lower bound of the paired bootstrap interval of the improvement clears the threshold.

For each rule: promotions per year, and the mean ROC AUC (classification) or RMSE (regression)
of the serving champion on the next day's labelled rows, which no champion has seen: what the
users of the champion actually got.
"""

import argparse
import dataclasses
import datetime as dt
import json
import math
import time

import numpy as np
import pandas as pd

from benchmarks.baseline import landed_bytes
from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.evaluation.metrics import (
    LOWER_IS_BETTER,
    Scores,
    holdout_of,
    judge,
    score_model,
)
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.training.model import TrainedModel, TrainingDataError, labelled, train_model


def point_estimate_decision(
    contract: Contract, candidate: Scores, champion: Scores | None, threshold: float
) -> str:
    """The former verdict: value thresholds, then point improvement >= `threshold`."""
    spec = contract.evaluation
    for metric, bound in spec.value_thresholds.items():
        value = candidate.values.get(metric, math.nan)
        if not (value <= bound if metric in LOWER_IS_BETTER else value >= bound):
            return "reject"
    if champion is None:
        return "promote"
    for metric in spec.change_thresholds:
        gain = candidate.values[metric] - champion.values[metric]
        if metric in LOWER_IS_BETTER:
            gain = -gain
        if not gain >= threshold:
            return "challenger"
    return "promote"


def next_day_metric(model: TrainedModel, rows: pd.DataFrame) -> float | None:
    """ROC AUC (classification) or RMSE (regression) of `model` on a day's labelled rows."""
    from sklearn import metrics as skm

    if rows.empty:
        return None
    y = rows[model.label].to_numpy()
    if model.task == "classification":
        y = y.astype("int64")
        if len(np.unique(y)) < 2:
            return None
        return float(skm.roc_auc_score(y, model.score(rows)))
    return math.sqrt(float(skm.mean_squared_error(y.astype("float64"), model.predict(rows))))


@dataclasses.dataclass
class Track:
    """One promotion rule's champion over the year."""

    name: str
    champion: TrainedModel | None = None
    promotions: list[str] = dataclasses.field(default_factory=list)
    decisions: dict[str, int] = dataclasses.field(default_factory=dict)
    next_day: list[float] = dataclasses.field(default_factory=list)

    def summary(self, task: str) -> dict[str, object]:
        metric = "roc_auc" if task == "classification" else "rmse"
        return {
            "promotions": len(self.promotions),
            "decisions": dict(sorted(self.decisions.items())),
            f"mean_next_day_{metric}": round(float(np.mean(self.next_day)), 4)
            if self.next_day
            else None,
            "days_scored_next_day": len(self.next_day),
            "promoted_days": self.promotions,
        }


def run(
    contract: Contract, start: dt.date, days: int, former_threshold: float = 0.0
) -> dict[str, object]:
    """Train every day once; keep a champion per rule; score each on the following day."""
    text_columns = [c.name for c in contract.columns if c.dtype == "str"]
    samples, seed = contract.evaluation.bootstrap_samples, contract.training.random_seed
    features: dict[str, pd.DataFrame] = {}
    tracks = [Track("point_estimate"), Track("paired_bootstrap")]
    started = time.perf_counter()
    for i in range(days):
        day = start + dt.timedelta(days=i)
        key = day.isoformat()
        raw = read_landed_file(landed_bytes(contract, day), f"{key}.csv", key, text_columns)
        features[key] = build_features(type_rows(raw, contract, key), contract)
        today = labelled(features[key], contract)
        # The champion that served day D is the one chosen by the end of day D-1.
        for track in tracks:
            if track.champion is not None:
                value = next_day_metric(track.champion, today)
                if value is not None:
                    track.next_day.append(value)
        first = day - dt.timedelta(days=contract.training.window_days - 1)
        window = {k: v for k, v in features.items() if k >= first.isoformat()}
        try:
            model = train_model(window, contract)
        except TrainingDataError:
            continue
        holdout = holdout_of(model, window, contract)
        candidate = score_model(model, holdout, samples, seed)
        for track in tracks:
            champion = (
                score_model(track.champion, holdout, samples, seed) if track.champion else None
            )
            if track.name == "point_estimate":
                decision = point_estimate_decision(contract, candidate, champion, former_threshold)
            else:
                decision = judge(contract, candidate, champion).decision
            track.decisions[decision] = track.decisions.get(decision, 0) + 1
            if decision == "promote":
                track.champion = model
                track.promotions.append(key)
        for old in [k for k in features if k < first.isoformat()]:
            del features[old]
    return {
        "dataset": contract.name,
        "start": start.isoformat(),
        "days": days,
        "window_days": contract.training.window_days,
        "change_thresholds": contract.evaluation.change_thresholds,
        "former_threshold": former_threshold,
        "seconds": round(time.perf_counter() - started, 1),
        **{track.name: track.summary(contract.task) for track in tracks},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="flights")
    parser.add_argument("--start", type=dt.date.fromisoformat, default=dt.date(2013, 1, 1))
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--former-threshold", type=float, default=0.0)
    parser.add_argument("--output", help="also write the JSON result to this file")
    args = parser.parse_args()
    contract = load_contract(args.dataset)
    result = json.dumps(run(contract, args.start, args.days, args.former_threshold), indent=2)
    print(result)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(result + "\n")


if __name__ == "__main__":
    main()
