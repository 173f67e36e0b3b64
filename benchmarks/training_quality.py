"""Model quality and training time of the platform's training, before and after the speed-up.

Run: .venv/bin/python benchmarks/training_quality.py [--dataset flights] [--start 2013-02-01]
     [--days 60] [--per-day]

For each day from --start, both trainings fit the contract's model on the full window of
`training.window_days` days ending that day (features built as the baseline script builds them)
and are scored on the window's held-out rows with `score_model`, the platform's metrics and
bootstrap intervals. Each variant also runs its own champion chain, as the baseline script does
(the previous promoted model of that variant is the champion), so the decisions can be compared.

- before: 512-row partial_fit calls, each reshuffled by scikit-learn (`shuffle=True`), the
  training as it was before calls were cut to the contract's new batch_size default;
- after: the code as it is, with the contract as it is.

Both use the same loss code; the old loss rounded probabilities before the log, which only
differs in the last bits and cannot change an early-stopping decision by more than that.
Prints markdown: one summary row per variant, the paired difference of the main metric across
days with its 95 % t-interval (consecutive windows overlap by all but one day, so the days are
not independent and the interval is optimistic), and how often the decisions agree.
"""

import argparse
import contextlib
import datetime as dt
import math
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pandas as pd
from baseline import landed_bytes
from scipy import stats

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import SgdSpec
from ml_platform.contracts.schema import type_rows
from ml_platform.evaluation.metrics import LOWER_IS_BETTER, Scores, holdout_of, judge, score_model
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.training import model as training
from ml_platform.training.model import TrainedModel, train_model

MAIN_METRIC = {"classification": "roc_auc", "regression": "rmse"}
# The first day whose 28-day window lies inside the data (flights: 2013, synthetic: from the
# start of its drift baseline), so every model is trained on a full window.
FIRST_FULL_WINDOW = {"flights": dt.date(2013, 1, 28), "synthetic": dt.date(2024, 1, 28)}


def day_features(contract: Contract, day: dt.date) -> pd.DataFrame:
    """One day's features, as the daily assets (and the baseline script) build them."""
    key = day.isoformat()
    text_columns = [c.name for c in contract.columns if c.dtype == "str"]
    raw = read_landed_file(landed_bytes(contract, day), "quality.csv", key, text_columns)
    return build_features(type_rows(raw, contract, key), contract)


@contextlib.contextmanager
def before_speedup(contract: Contract) -> Iterator[Contract]:
    """The contract and estimator of the training before the speed-up."""
    make_estimator = training.make_estimator

    def reshuffling(c: Contract) -> Any:
        return make_estimator(c).set_params(shuffle=True)

    training.make_estimator = reshuffling
    try:
        spec = contract.model.model_copy(update={"batch_size": 512})
        yield contract.model_copy(update={"model": spec})
    finally:
        training.make_estimator = make_estimator


def trained(contract: Contract, window: dict[str, pd.DataFrame], old: bool) -> tuple[Any, float]:
    """The model of one variant and the CPU seconds its training took."""
    with before_speedup(contract) if old else contextlib.nullcontext(contract) as used:
        started = time.process_time()
        model = train_model(window, used)
        return model, time.process_time() - started


def run(contract: Contract, start: dt.date, days: int) -> list[dict[str, Any]]:
    """One row per day and variant: main metric with interval, epochs, seconds, decision."""
    span = contract.training.window_days
    first = start - dt.timedelta(days=span - 1)
    features = {
        d.isoformat(): day_features(contract, d)
        for d in (first + dt.timedelta(days=i) for i in range(span - 1 + days))
    }
    metric = MAIN_METRIC[contract.task]
    samples, seed = contract.evaluation.bootstrap_samples, contract.training.random_seed
    champions: dict[str, TrainedModel | None] = {"before": None, "after": None}
    rows = []
    for i in range(days):
        day = start + dt.timedelta(days=i)
        window = {
            k: v
            for k, v in features.items()
            if day - dt.timedelta(days=span) < dt.date.fromisoformat(k) <= day
        }
        for variant in ("before", "after"):
            model, seconds = trained(contract, window, old=variant == "before")
            holdout = holdout_of(model, window, contract)
            candidate = score_model(model, holdout, samples, seed)
            champion = champions[variant]
            held: Scores | None = (
                score_model(champion, holdout, samples, seed) if champion is not None else None
            )
            decision = judge(contract, candidate, held).decision
            if decision == "promote":
                champions[variant] = model
            rows.append(
                {
                    "day": day.isoformat(),
                    "variant": variant,
                    "value": candidate.values[metric],
                    "interval": candidate.intervals[metric],
                    "epochs": len(model.history),
                    "best_epoch": model.best_epoch,
                    "seconds": seconds,
                    "decision": decision,
                }
            )
    return rows


def paired_interval(differences: list[float]) -> tuple[float, float, float]:
    """Mean of the per-day differences and its 95 % t-interval."""
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.975, len(differences) - 1) * statistics.stdev(differences)
    half /= math.sqrt(len(differences))
    return mean, mean - half, mean + half


def report(contract: Contract, rows: list[dict[str, Any]], per_day: bool) -> str:
    """Markdown tables of the comparison."""
    metric = MAIN_METRIC[contract.task]
    by = {v: [r for r in rows if r["variant"] == v] for v in ("before", "after")}
    lines = [
        f"{contract.name}: {len(by['after'])} days from {by['after'][0]['day']}, "
        f"{contract.training.window_days}-day windows, main metric {metric}",
        "",
        f"| training | mean {metric} | mean 95 % interval width | epochs (mean) | best epoch "
        "(mean) | CPU s per model (mean) | decisions (promote/challenger/reject) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for variant, days in by.items():
        decisions = [r["decision"] for r in days]
        lines.append(
            f"| {variant} | {statistics.fmean(r['value'] for r in days):.4f} "
            f"| {statistics.fmean(r['interval'][1] - r['interval'][0] for r in days):.4f} "
            f"| {statistics.fmean(r['epochs'] for r in days):.1f} "
            f"| {statistics.fmean(r['best_epoch'] for r in days):.1f} "
            f"| {statistics.fmean(r['seconds'] for r in days):.3f} "
            f"| {decisions.count('promote')} / {decisions.count('challenger')} / "
            f"{decisions.count('reject')} |"
        )
    pairs = list(zip(by["before"], by["after"], strict=True))
    mean, low, high = paired_interval([a["value"] - b["value"] for b, a in pairs])
    better = "lower" if metric in LOWER_IS_BETTER else "higher"
    outside = sum(not (b["interval"][0] <= a["value"] <= b["interval"][1]) for b, a in pairs)
    agree = sum(b["decision"] == a["decision"] for b, a in pairs)
    lines += [
        "",
        f"after - before, {metric} ({better} is better): mean {mean:+.4f}, "
        f"95 % paired t-interval [{low:+.4f}, {high:+.4f}]; after's value outside before's "
        f"bootstrap interval on {outside} of {len(pairs)} days; same decision on {agree} of "
        f"{len(pairs)} days",
    ]
    if per_day:
        lines += [
            "",
            f"| day | {metric} before | {metric} after | epochs before | epochs after "
            "| decision before | decision after |",
            "|---|---:|---:|---:|---:|---|---|",
        ]
        lines += [
            f"| {b['day']} | {b['value']:.4f} | {a['value']:.4f} | {b['epochs']} | {a['epochs']} "
            f"| {b['decision']} | {a['decision']} |"
            for b, a in pairs
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="flights")
    parser.add_argument("--start", type=dt.date.fromisoformat, help="default: first full window")
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--per-day", action="store_true")
    args = parser.parse_args()
    contract = load_contract(args.dataset)
    if not isinstance(contract.model, SgdSpec):
        # The speed-up was SGD's: compare it with SGD's default settings.
        contract = contract.model_copy(update={"model": SgdSpec(estimator="sgd")})
    start = args.start or FIRST_FULL_WINDOW[contract.name]
    print(report(contract, run(contract, start, args.days), args.per_day))


if __name__ == "__main__":
    main()
