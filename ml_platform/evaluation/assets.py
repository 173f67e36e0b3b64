"""evaluation_report: each day's candidate and the current champion on the same unseen rows."""

from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
import pandas as pd

from ml_platform.automation.retries import STORAGE_RETRY_POLICY
from ml_platform.contracts import Contract
from ml_platform.evaluation.metrics import (
    BASELINE_STRATEGY,
    Verdict,
    improvement,
    judge,
    plots,
    primary_metric,
    render_report,
    score_baseline,
    score_model,
    split_of,
)
from ml_platform.platform.datasets import asset_key, dataset_name
from ml_platform.platform.steps import SINGLE_RUN, daily_check_spec, each_day
from ml_platform.platform.storage import FORMAT_KEY, LakeStorage
from ml_platform.registry.store import ModelRegistry
from ml_platform.training.assets import window_input
from ml_platform.training.model import TrainedModel
from ml_platform.troubleshooting.runbook import check_description

VERDICT_CHECK = "promotion_verdict"


def build_evaluation_report(
    contract: Contract,
    partitions: dg.PartitionsDefinition,
    name: str = "evaluation_report",
    model_name: str = "model",
    window_days: int | None = None,
    kind: str = "daily",
) -> dg.AssetsDefinition:
    """An evaluation asset of a dataset, for the model asset `model_name` (versions `kind-D`)."""
    days = window_days or contract.training.window_days

    @dg.asset(
        name=name,
        key_prefix=contract.name,
        partitions_def=partitions,
        backfill_policy=SINGLE_RUN,
        group_name=dataset_name(contract.name, "evaluation"),
        kinds={"scikitlearn", "json"},
        metadata={FORMAT_KEY: "json"},
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
        context: dg.AssetExecutionContext, model: Any, features: Any, lake: LakeStorage
    ) -> Iterator:
        """Metrics of the model of day D and of the current champion on the same held-out rows.

        The rows are the latest of the model's window, never trained on. Each metric has a
        bootstrap 95 % interval; ROC and precision-recall curves and the confusion matrix (or
        residuals) are embedded in the report. Next to them is a trivial baseline fitted on the
        labels of the model's training rows (the class prior, or the training mean), with the
        candidate's lift over it. The verdict applies the contract's value thresholds and the
        baseline, then its change thresholds to the improvement over the champion; each 95 %
        interval of a difference comes from scoring both models on the same bootstrap samples:
        `promote` only when the interval's lower bound clears the threshold, `challenger` when
        the candidate is good but not shown better, `reject` when it misses a value threshold or
        its lift over the baseline on the primary metric is not shown above 0 (a WARN outcome:
        the run succeeds and the champion stays). Classification: precision, recall, F1,
        accuracy, ROC AUC. Regression: MAE, RMSE, R².

        In a range of days the champion of a day is the registry's, or the last model promoted
        by an earlier day of the range (registered_model registers it right after), so a range
        reaches the verdicts that running its days one by one would.
        """
        spec = contract.evaluation
        seed = contract.training.random_seed
        registry = ModelRegistry(lake, contract.name)
        promoted: tuple[str, TrainedModel] | None = None

        def day_of_evaluation_report(
            day: str, model: TrainedModel, features: Mapping[str, pd.DataFrame]
        ) -> Iterator:
            nonlocal promoted
            try:
                train, holdout = split_of(model, features, contract)
            except ValueError as exc:
                # The model and its window disagree: only rematerialising the model fixes that.
                raise dg.Failure(description=str(exc), allow_retries=False) from exc
            candidate = score_model(model, holdout, spec.bootstrap_samples, seed)
            baseline = score_baseline(model, train, candidate.labels, spec.bootstrap_samples, seed)
            champion_version: str | None
            champion_model: TrainedModel | None
            if promoted is not None:
                champion_version, champion_model = promoted
            else:
                champion_version = registry.champion_to_beat(f"{kind}-{day}")
                champion_model = (
                    registry.load(champion_version) if champion_version is not None else None
                )
            champion = (
                score_model(champion_model, holdout, spec.bootstrap_samples, seed)
                if champion_model is not None
                else None
            )
            verdict = judge(contract, candidate, champion, baseline)
            if verdict.decision == "promote":
                promoted = (f"{kind}-{day}", model)
            report = render_report(
                day,
                model,
                candidate,
                champion,
                champion_version,
                verdict,
                plots(model, candidate),
                baseline,
            )
            yield verdict_check(verdict, champion_version)
            improvements = {
                metric: {
                    "improvement": gain,
                    "low": low,
                    "high": high,
                    "threshold": spec.change_thresholds[metric],
                }
                for metric, (gain, low, high) in verdict.improvements.items()
            }
            lifts = {}
            for metric in candidate.values:
                gain, low, high = improvement(metric, candidate, baseline)
                lifts[metric] = {"lift": gain, "low": low, "high": high}
            value = {
                "partition": day,
                "task": model.task,
                "metrics": candidate.values,
                "intervals": candidate.intervals,
                "champion_version": champion_version,
                "champion_metrics": champion.values if champion is not None else None,
                "improvements": improvements,
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
            }
            metadata: dict[str, dg.MetadataValue] = {
                name: dg.MetadataValue.float(v) for name, v in candidate.values.items()
            }
            if champion is not None:
                metadata.update(
                    {f"champion_{n}": dg.MetadataValue.float(v) for n, v in champion.values.items()}
                )
            for metric, lift in lifts.items():
                metadata[f"baseline_{metric}"] = dg.MetadataValue.float(baseline.values[metric])
                metadata[f"lift_{metric}"] = dg.MetadataValue.float(lift["lift"])
                metadata[f"lift_{metric}_low"] = dg.MetadataValue.float(lift["low"])
                metadata[f"lift_{metric}_high"] = dg.MetadataValue.float(lift["high"])
            for metric, (gain, low, high) in verdict.improvements.items():
                metadata[f"improvement_{metric}"] = dg.MetadataValue.float(gain)
                metadata[f"improvement_{metric}_low"] = dg.MetadataValue.float(low)
                metadata[f"improvement_{metric}_high"] = dg.MetadataValue.float(high)
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


def verdict_check(verdict: Verdict, champion_version: str | None) -> dg.AssetCheckResult:
    """The day's verdict as a WARN check: it fails only when the candidate is rejected."""
    decision = verdict.decision
    if not verdict.beats_baseline:
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
            "champion": champion_version or "none",
            "reasons": "; ".join(verdict.reasons),
        },
    )
