"""Each estimator of the contract's `model` section on the bundled datasets, against plain
scikit-learn: the evidence for the default estimator of each task.

Run: .venv/bin/python benchmarks/model_quality.py [--dataset flights] [--start 2013-02-01]
     [--days 28] [--stride 3] [--per-day] [--window-days 28]

For each `--stride`-th day of the `--days` days from `--start` (by default the first month
whose 28-day windows lie inside the data), each estimator (sgd, linear, hist_gradient_boosting
with the contract's other settings and the estimator's defaults) is trained by the platform
(`train_model`) on the window of `training.window_days` days ending that day, features built
as the daily assets build them. Its held-out metric (ROC AUC for classification, r² for
regression) is measured on the window's held-out rows, the latest 20 % by event time. The plain
scikit-learn fit is the same estimator as a scikit-learn user writes it: the same
preprocessing, `fit` on all the training rows of the same split (scikit-learn's own early
stopping on a random 10 % where the estimator has it, `class_weight="balanced"`), scored on the
same held-out rows. Fit seconds are CPU seconds (the machine is shared); peak memory is the
largest traced allocation during the platform's training (tracemalloc, which numpy reports
to), measured in a second fit of the first day only, so it does not slow the timed fits.

Prints markdown: per dataset one row per estimator (means over the days, the largest gap to
plain scikit-learn), then the estimator with the best mean metric; with --per-day, every day.
"""

import argparse
import datetime as dt
import statistics
import subprocess
import sys
import time
import tracemalloc
from typing import Any

import numpy as np
import pandas as pd
from sklearn.metrics import r2_score, roc_auc_score
from sklearn.pipeline import Pipeline
from training_quality import FIRST_FULL_WINDOW, day_features

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import (
    ESTIMATORS,
    HistGradientBoostingSpec,
    LinearSpec,
    SgdSpec,
)
from ml_platform.training.model import (
    TrainedModel,
    labelled,
    make_estimator,
    make_preprocessing,
    openmp_threads,
    split_holdout,
    train_model,
    window_frame,
)

METRIC = {"classification": "roc_auc", "regression": "r2"}
SPECS = {
    "sgd": SgdSpec(estimator="sgd"),
    "linear": LinearSpec(estimator="linear"),
    "hist_gradient_boosting": HistGradientBoostingSpec(estimator="hist_gradient_boosting"),
}


def with_estimator(contract: Contract, estimator: str) -> Contract:
    """The contract with the estimator's default settings in its model section."""
    return contract.model_copy(update={"model": SPECS[estimator]})


def metric(task: str, y: np.ndarray, predicted: np.ndarray) -> float:
    """ROC AUC of the positive-class probabilities, or r² of the predicted values."""
    if task == "classification":
        return float(roc_auc_score(y, predicted))
    return float(r2_score(y, predicted))


def plain_estimator(contract: Contract) -> Any:
    """The estimator as a scikit-learn user fits it in one call, with the same settings.

    The platform's estimator without what its training loop does itself: SGD with `fit`,
    scikit-learn's early stopping and class weights; boosting in one fit, validated on a
    random 10 % of the rows it is given.
    """
    spec = contract.model
    estimator = make_estimator(contract)
    classification = contract.task == "classification"
    if isinstance(spec, SgdSpec):
        return estimator.set_params(
            max_iter=spec.max_epochs,
            early_stopping=True,
            n_iter_no_change=spec.patience,
            tol=spec.min_delta,
            shuffle=True,
            **({"class_weight": "balanced"} if classification else {}),
        )
    if isinstance(spec, HistGradientBoostingSpec):
        return estimator.set_params(
            warm_start=False,
            max_iter=spec.max_iter,
            validation_fraction=0.1,
            **({"class_weight": "balanced"} if classification else {}),
        )
    return estimator


def one_day(contract: Contract, window: dict[str, pd.DataFrame]) -> dict[str, Any]:
    """Platform and plain fits of the contract's estimator on one window."""
    frame = labelled(window_frame(window), contract)
    train, holdout = split_holdout(frame, contract.training.holdout_fraction)
    features = contract.numeric_features + contract.categorical_features
    label = contract.label_name
    classification = contract.task == "classification"
    cast = "int64" if classification else "float64"
    y_train = train[label].astype(cast).to_numpy()
    y_holdout = holdout[label].astype(cast).to_numpy()

    started = time.process_time()
    model: TrainedModel = train_model(window, contract)
    platform_seconds = time.process_time() - started
    score = model.score(holdout).to_numpy()

    plain = Pipeline([("preprocess", make_preprocessing(contract)), ("estimator", None)])
    plain.set_params(estimator=plain_estimator(contract))
    threads = getattr(contract.model, "threads", 1)
    started = time.process_time()
    with openmp_threads(threads):
        plain.fit(train[features], y_train)
    plain_seconds = time.process_time() - started
    with openmp_threads(threads):
        plain_score = (
            plain.predict_proba(holdout[features])[:, 1]
            if classification
            else plain.predict(holdout[features])
        )
    return {
        "platform": metric(contract.task, y_holdout, score),
        "plain": metric(contract.task, y_holdout, plain_score),
        "platform_seconds": platform_seconds,
        "plain_seconds": plain_seconds,
        "trained_for": model.progress,
        "steps": len(model.history)
        if model.estimator != "linear"
        else model.history[0]["iteration"],
    }


def peak_mb(contract: Contract, window: dict[str, pd.DataFrame]) -> float:
    """The largest traced allocation of the platform's training on one window, in MB."""
    tracemalloc.start()
    try:
        train_model(window, contract)
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def run(contract: Contract, start: dt.date, days: int, stride: int) -> dict[str, list[dict]]:
    """Per estimator, one row per evaluated day."""
    span = contract.training.window_days
    first = start - dt.timedelta(days=span - 1)
    features = {
        d.isoformat(): day_features(contract, d)
        for d in (first + dt.timedelta(days=i) for i in range(span - 1 + days))
    }
    rows: dict[str, list[dict]] = {}
    for estimator in ESTIMATORS:
        used = with_estimator(contract, estimator)
        rows[estimator] = []
        for i in range(0, days, stride):
            day = start + dt.timedelta(days=i)
            window = {
                k: v
                for k, v in features.items()
                if day - dt.timedelta(days=span) < dt.date.fromisoformat(k) <= day
            }
            row = {"day": day.isoformat(), **one_day(used, window)}
            if i == 0:
                row["peak_mb"] = peak_mb(used, window)
            rows[estimator].append(row)
    return rows


def report(contract: Contract, rows: dict[str, list[dict]], per_day: bool) -> str:
    """Markdown: one summary row per estimator, optionally every day."""
    name = METRIC[contract.task]
    lines = [
        f"### {contract.name} ({contract.task}, held-out {name}, "
        f"{len(next(iter(rows.values())))} windows of {contract.training.window_days} days)",
        "",
        f"| estimator | platform {name} | plain scikit-learn {name} | largest gap | "
        "platform fit CPU s | plain fit CPU s | peak MB (first day) | epochs / iterations |",
        "|---|---|---|---|---|---|---|---|",
    ]
    means = {}
    for estimator, days in rows.items():
        platform = statistics.fmean(r["platform"] for r in days)
        means[estimator] = platform
        gap = max(abs(r["platform"] - r["plain"]) for r in days)
        lines.append(
            f"| {estimator} | {platform:.4f} | {statistics.fmean(r['plain'] for r in days):.4f} "
            f"| {gap:.4f} | {statistics.fmean(r['platform_seconds'] for r in days):.2f} "
            f"| {statistics.fmean(r['plain_seconds'] for r in days):.2f} "
            f"| {days[0]['peak_mb']:.0f} | {statistics.fmean(r['steps'] for r in days):.0f} |"
        )
    best = max(means, key=means.__getitem__)
    lines += ["", f"Best mean {name}: **{best}**.", ""]
    if per_day:
        lines += [
            f"| estimator | day | platform {name} | plain {name} | platform s | trained for |",
            "|---|---|---|---|---|---|",
        ]
        for estimator, days in rows.items():
            lines += [
                f"| {estimator} | {r['day']} | {r['platform']:.4f} | {r['plain']:.4f} "
                f"| {r['platform_seconds']:.2f} | {r['trained_for']} |"
                for r in days
            ]
        lines.append("")
    return "\n".join(lines)


def uptime() -> str:
    """The machine's load, recorded with the figures (other work shares its cores)."""
    return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", action="append", help="default: flights and synthetic")
    parser.add_argument("--start", type=dt.date.fromisoformat, help="default: first full window")
    parser.add_argument("--days", type=int, default=28)
    parser.add_argument("--stride", type=int, default=3)
    parser.add_argument("--per-day", action="store_true")
    parser.add_argument("--window-days", type=int, help="default: the contract's window_days")
    args = parser.parse_args()
    print(f"uptime before: {uptime()}\n")
    for dataset in args.dataset or ["flights", "synthetic"]:
        contract = load_contract(dataset)
        if args.window_days:
            # Shorter windows: the same code on less data (the smoke test's few seconds).
            training = contract.training.model_copy(update={"window_days": args.window_days})
            contract = contract.model_copy(update={"training": training})
        start = args.start or FIRST_FULL_WINDOW[contract.name]
        print(report(contract, run(contract, start, args.days, args.stride), args.per_day))
        sys.stdout.flush()
    print(f"uptime after: {uptime()}")


if __name__ == "__main__":
    main()
