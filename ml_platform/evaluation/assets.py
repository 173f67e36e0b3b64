"""evaluation_report: each day's candidate judged alone on the rows it never trained on.

The report holds the candidate's hold-out metrics with bootstrap intervals, the trivial
baseline and the candidate's lift over it, and the verdict of the contract's value thresholds:
`reject`, or `eligible` for registration. It reads no champion and no registry: whether an
eligible candidate becomes champion is registered_model's decision, the one step that walks the
days in date order and moves the registry's aliases. A day's report therefore depends on its
model and feature window only, so a backfill evaluates its chunks of days side by side, in any
order (`daily_backfill_policy`, no dependency on the day before).
"""

import math
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
import numpy as np
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.evaluation.metrics import (
    BASELINE_STRATEGY,
    ELIGIBLE,
    HeldOutRows,
    Verdict,
    improvement,
    judge_candidate,
    plots,
    predict_holdout,
    primary_metric,
    render_report,
    score_baseline,
    score_of,
    split_of,
    stored_draws,
)
from ml_platform.platform.datasets import asset_key, dataset_name, writer_pool
from ml_platform.platform.formats import FORMAT_KEY
from ml_platform.platform.retries import STORAGE_RETRY_POLICY
from ml_platform.platform.runbook import check_description
from ml_platform.platform.sizes import request_metadata, step_tags
from ml_platform.platform.steps import (
    DataVerdict,
    daily_backfill_policy,
    daily_check_spec,
    each_day,
)
from ml_platform.platform.steps import Verdict as DayVerdict
from ml_platform.training.assets import window_input
from ml_platform.training.model import TrainedModel

VERDICT_CHECK = "promotion_verdict"


def build_evaluation_report(
    contract: Contract,
    partitions: dg.PartitionsDefinition,
    name: str = "evaluation_report",
    model_name: str = "model",
    window_days: int | None = None,
    kind: str = "daily",
) -> dg.AssetsDefinition:
    """An evaluation asset of a dataset for the model asset `model_name` (versions `kind-D`)."""
    days = window_days or contract.training.window_days

    @dg.asset(
        name=name,
        key_prefix=contract.name,
        pool=writer_pool(contract.name, name),
        partitions_def=partitions,
        backfill_policy=daily_backfill_policy(),
        group_name=dataset_name(contract.name, "evaluation"),
        kinds={"scikitlearn", "json"},
        metadata={FORMAT_KEY: "json", **request_metadata(contract, name)},
        op_tags=step_tags(contract, name),
        retry_policy=STORAGE_RETRY_POLICY,
        ins={
            "model": dg.AssetIn(key=asset_key(contract.name, model_name)),
            "features": window_input(contract.name, days),
        },
        check_specs=[
            # A rejected candidate is an outcome, not a failure: the run goes on, registered_model
            # records the day as not registered and the champion stays.
            daily_check_spec(
                VERDICT_CHECK,
                asset_key(contract.name, name),
                partitions,
                blocking=False,
                description=check_description(
                    VERDICT_CHECK,
                    "The candidate meets the contract's value thresholds and beats the "
                    "trivial baseline; otherwise it is rejected, not registered, and the "
                    "champion stays.",
                ),
            )
        ],
    )
    def _evaluation_report(
        context: dg.AssetExecutionContext, model: Any, features: Any
    ) -> Iterator:
        """The model of day D judged alone on the held-out rows of its window: eligible or not.

        The rows are the latest of the model's window, never trained on. Each metric has a
        bootstrap 95 % interval; ROC and precision-recall curves and the confusion matrix (or
        residuals) are embedded in the report. Next to them is a trivial baseline fitted on the
        labels of the model's training rows (the class prior, or the training mean), with the
        candidate's lift over it on the same bootstrap samples. The verdict: `reject` when the
        candidate misses one of the contract's value thresholds or its lift over the baseline on
        the primary metric is not shown above 0 (a WARN outcome: the run succeeds, the day is not
        registered and the champion stays), else `eligible`. Classification: precision, recall,
        F1, accuracy, ROC AUC. Regression: MAE, RMSE, R².

        No champion is read here: registered_model, which takes the days in date order, scores
        an eligible candidate against the serving champion on these held-out rows and decides
        promote or challenger.
        """
        spec = contract.evaluation
        seed = contract.training.random_seed

        def day_of_evaluation_report(
            day: str, model: TrainedModel, features: Mapping[str, pd.DataFrame]
        ) -> Iterator:
            try:
                train, holdout = split_of(model, features, contract)
            except ValueError as exc:
                # The model and its window disagree: only rematerialising the model fixes that.
                raise dg.Failure(description=str(exc), allow_retries=False) from exc
            predictions = predict_holdout(model, holdout)
            if predictions.non_finite:
                unscorable = non_finite_predictions(model, holdout)
                # No metric exists for an infinite prediction, and waiting will not change it.
                raise DataVerdict(
                    DayVerdict.TRAINING_DATA,
                    f"{name} {day}: the candidate cannot be scored: {unscorable}. Such values "
                    "are far outside anything the model learnt from: bound the column in the "
                    "contract (columns[].min / max) so the gate rejects them, fix the file "
                    "upstream and re-land the day.",
                )
            overflowing = predictions.overflowing_labels()
            if overflowing:
                raise DataVerdict(
                    DayVerdict.TRAINING_DATA,
                    f"{name} {day}: the candidate cannot be scored: {overflowing}. Bound "
                    f"{contract.label.source} in the contract (columns[].min / max) so the gate "
                    "rejects such values, fix the file upstream and re-land the day.",
                )
            candidate = score_of(predictions, spec.bootstrap_samples, seed)
            baseline = score_baseline(model, train, candidate.labels, spec.bootstrap_samples, seed)
            verdict = judge_candidate(contract, candidate, baseline)
            version = f"{kind}-{day}"
            report = render_report(
                day, model, candidate, None, None, verdict, plots(model, candidate), baseline
            )
            yield verdict_check(verdict, version)
            lifts = {}
            for metric in candidate.values:
                gain, low, high = improvement(metric, candidate, baseline)
                lifts[metric] = {"lift": gain, "low": low, "high": high}
            value = {
                "partition": day,
                "version": version,
                "task": model.task,
                "metrics": candidate.values,
                "intervals": candidate.intervals,
                "baseline": {
                    "strategy": BASELINE_STRATEGY[model.task],
                    "metrics": baseline.values,
                    "intervals": baseline.intervals,
                    "lifts": lifts,
                    "primary_metric": primary_metric(contract),
                    "beats": verdict.beats_baseline,
                },
                "decision": verdict.decision,
                "cause": verdict.cause,
                "reasons": verdict.reasons,
                "window": model.window,
                "holdout_rows": model.holdout_rows,
                "report_markdown": report,
                # registered_model pairs these draws with the champion's on the same rows.
                "paired": stored_draws(candidate),
            }
            metadata: dict[str, dg.MetadataValue] = {
                name: dg.MetadataValue.float(v) for name, v in candidate.values.items()
            }
            for metric, lift in lifts.items():
                metadata[f"baseline_{metric}"] = dg.MetadataValue.float(baseline.values[metric])
                metadata[f"lift_{metric}"] = dg.MetadataValue.float(lift["lift"])
                metadata[f"lift_{metric}_low"] = dg.MetadataValue.float(lift["low"])
                metadata[f"lift_{metric}_high"] = dg.MetadataValue.float(lift["high"])
            yield dg.MaterializeResult(
                value=value,
                metadata={
                    **metadata,
                    "decision": verdict.decision,
                    "cause": verdict.cause,
                    "beats_baseline": verdict.beats_baseline,
                    "holdout_rows": model.holdout_rows,
                    "report": dg.MetadataValue.md(report),
                },
            )

        yield from each_day(context, day_of_evaluation_report, model=model, features=features)

    return _evaluation_report


def non_finite_predictions(model: TrainedModel, holdout: pd.DataFrame | HeldOutRows) -> str:
    """What makes the model's predictions on held-out rows infinite or NaN; '' when none is.

    A finite but extreme input (1e308 in a column the contract leaves unbounded) overflows a
    prediction, which no metric can score: named here, with the input that caused it. Called
    only once `Predictions.non_finite` found such rows, so it predicts again only then.
    """
    frames = holdout.chunks() if isinstance(holdout, HeldOutRows) else iter([holdout])
    bad, total, worst = 0, 0, (0.0, "")
    for frame in frames:
        predicted, score = model.predictions(frame)
        rows = ~(np.isfinite(predicted.astype("float64")) & np.isfinite(score))
        bad, total = bad + int(rows.sum()), total + len(frame)
        if rows.any():
            inputs = frame.loc[rows, model.features].select_dtypes("number").abs()
            if not inputs.empty:
                feature = str(inputs.max().idxmax())
                value = float(frame.loc[rows, feature].abs().max())
                worst = max(worst, (value, feature))
    if not bad:
        return ""
    value, feature = worst
    largest = f" (largest input: |{feature}| = {value:.3g})" if feature else ""
    return f"its predictions on {bad} of {total} held-out rows are not finite{largest}"


def verdict_check(verdict: Verdict, version: str | None = None) -> dg.AssetCheckResult:
    """The candidate's verdict as a WARN check: it fails only when the candidate is rejected.

    `version` names the candidate (`daily-D`) in the check's metadata.
    """
    decision = verdict.decision
    if not verdict.enough_rows:
        advice = (
            " Not registered; the champion stays. Nothing is known of the model either way: "
            "land days with more rows, or give it a longer training window "
            "(training.window_days) or a larger hold-out (training.holdout_fraction)."
        )
    elif not verdict.beats_baseline and any(math.isnan(low) for _, low, _ in verdict.lift.values()):
        # A NaN lower bound: the metric, or its interval, is undefined on these rows.
        advice = (
            " Not registered; the champion stays. The day's held-out rows cannot measure the "
            "metric (a rare label's day whose held-out rows hold one class, or so few rows of "
            "it that most resamples draw none; a label the same on every row): nothing to fix "
            "in the features or the data. A larger hold-out (training.holdout_fraction) holds "
            "more rows of a rare class."
        )
    elif not verdict.beats_baseline:
        advice = (
            " Not registered; the champion stays. The model predicts no better than the label's "
            "distribution alone: check that the features still carry the label's signal (a "
            "broken join or source column, a label shifted in time) before retraining."
        )
    elif decision == "reject":
        advice = (
            " Not registered; the champion stays. Read the day's evaluation report and its data "
            "checks: a bad window or a real decline; several days in a row raise rejection_streak."
        )
    elif decision == ELIGIBLE:
        advice = (
            " registered_model compares it with the serving champion on the same held-out rows "
            "and promotes it, or registers it as challenger."
        )
    elif decision == "challenger":
        advice = " Registered as challenger; the champion stays."
    else:
        advice = " Registered as champion."
    return dg.AssetCheckResult(
        check_name=VERDICT_CHECK,
        passed=decision != "reject",
        severity=dg.AssetCheckSeverity.WARN,
        description=f"{decision}: {verdict.cause}.{advice}",
        metadata={
            "decision": decision,
            "candidate": version or "unnamed",
            "reasons": "; ".join(verdict.reasons),
        },
    )
