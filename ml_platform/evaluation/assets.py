"""evaluation_report: each day's candidate and the current champion on the same unseen rows.

The champion a day's candidate competes with is the one the previous evaluation day left
(`CADENCE_DAYS` before: the day before for the daily model). A backfill orders the days of the
asset through a dependency on that day, in runs of at most N days, and registers them after
(registered_model takes the evaluated days in a run of its own, see `platform.steps`), so each
report also stores the champion after its verdict (`champion_after`), and `champion_before`
reads it when the registry does not reflect the previous day yet.
"""

import datetime as dt
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
from ml_platform.platform.steps import (
    daily_backfill_policy,
    daily_check_spec,
    each_day,
    previous_day_input,
)
from ml_platform.platform.storage import FORMAT_KEY, LakeIOManager, LakeStorage
from ml_platform.registry.assets import CADENCE_DAYS, MODEL_OF_KIND
from ml_platform.registry.store import ModelRegistry, RegistryError
from ml_platform.training.assets import window_input
from ml_platform.training.model import TrainedModel
from ml_platform.troubleshooting.runbook import check_description

VERDICT_CHECK = "promotion_verdict"
Champion = tuple[str | None, TrainedModel | None]


def champion_after(report: dict[str, Any], kind: str) -> str | None:
    """The champion a stored report left: its own version when promoted, else the one it met.

    Reports stored before `champion_after` was recorded give it through their decision.
    """
    if "champion_after" in report:
        return report["champion_after"]
    if report["decision"] == "promote":
        return f"{kind}-{report['partition']}"
    return report.get("champion_version")


def latest_record(instance: dg.DagsterInstance, key: dg.AssetKey, day: str) -> int | None:
    """The storage id of the latest recorded materialisation of `key` for `day`, if any."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[day]), limit=1
    ).records
    return records[0].storage_id if records else None


def champion_before(
    context: dg.AssetExecutionContext,
    registry: ModelRegistry,
    store: LakeIOManager,
    dataset: str,
    evaluation_name: str,
    registered_name: str,
    kind: str,
    day: str,
) -> Champion:
    """The champion `kind-day` competes with: what the previous evaluation day left.

    When registered_model of that day is recorded after its evaluation, the registry reflects
    it and everything since (alias moves by a person included): `champion_to_beat`. Otherwise
    (a backfill evaluates day D before registering the day before) the previous report's
    `champion_after`, loaded from the registry when registered, else from the model asset's
    partition of its day in the lake; with no previous report, the registry's.
    """
    previous = (dt.date.fromisoformat(day) - dt.timedelta(days=CADENCE_DAYS[kind])).isoformat()
    evaluation = asset_key(dataset, evaluation_name)
    registered = latest_record(context.instance, asset_key(dataset, registered_name), previous)
    evaluated = latest_record(context.instance, evaluation, previous)
    reflected = registered is not None and (evaluated is None or registered > evaluated)
    stored = store.storage.exists(store.key(evaluation, previous, "json"))
    if reflected or not stored:
        version = registry.champion_to_beat(f"{kind}-{day}")
        return version, registry.load(version) if version is not None else None
    version = champion_after(store.load_partition(evaluation, previous, "json"), kind)
    if version is None:
        return None, None
    try:
        if version in registry.versions():
            return version, registry.load(version)
        # Promoted by a day whose registered_model has not run yet: its model is in the lake.
        version_kind, version_day = version.split("-", 1)
        model_key = asset_key(dataset, MODEL_OF_KIND[version_kind])
    except (RegistryError, KeyError, ValueError) as exc:
        raise dg.Failure(
            description=(
                f"{evaluation_name} {day}: the champion {version} that the report of {previous} "
                f"left cannot be loaded ({exc!r}); rematerialise {evaluation_name} {previous} "
                "or fix the registry (docs/runbook.md)"
            ),
            allow_retries=False,
        ) from exc
    # A missing partition raises MissingPartitionError, a failure that names it.
    model: TrainedModel = store.load_partition(model_key, version_day, "joblib")
    return version, model


def build_evaluation_report(
    contract: Contract,
    partitions: dg.PartitionsDefinition,
    name: str = "evaluation_report",
    model_name: str = "model",
    window_days: int | None = None,
    kind: str = "daily",
    registered_name: str = "registered_model",
) -> dg.AssetsDefinition:
    """An evaluation asset of a dataset for the model asset `model_name` (versions `kind-D`).

    `registered_name` is the registry asset that registers its days.
    """
    days = window_days or contract.training.window_days

    @dg.asset(
        name=name,
        key_prefix=contract.name,
        partitions_def=partitions,
        backfill_policy=daily_backfill_policy(),
        group_name=dataset_name(contract.name, "evaluation"),
        kinds={"scikitlearn", "json"},
        metadata={FORMAT_KEY: "json"},
        retry_policy=STORAGE_RETRY_POLICY,
        ins={
            "model": dg.AssetIn(key=asset_key(contract.name, model_name)),
            "features": window_input(contract.name, days),
            "prev": previous_day_input(asset_key(contract.name, name), CADENCE_DAYS[kind]),
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

        The champion is the one the previous evaluation day left (`champion_before`); in a run
        of several days, the one the run's latest earlier day left (registered_model registers
        them after), so a backfill reaches the verdicts that running its days one by one would.
        The report stores the champion after its verdict (`champion_after`).
        """
        spec = contract.evaluation
        seed = contract.training.random_seed
        registry = ModelRegistry(lake, contract.name)
        store: LakeIOManager = context.resources.io_manager
        # The champion the run's latest earlier day left, as the registry would hold it had
        # that day been run and registered on its own; None before the run's first day.
        left: Champion | None = None

        def day_of_evaluation_report(
            day: str, model: TrainedModel, features: Mapping[str, pd.DataFrame]
        ) -> Iterator:
            nonlocal left
            try:
                train, holdout = split_of(model, features, contract)
            except ValueError as exc:
                # The model and its window disagree: only rematerialising the model fixes that.
                raise dg.Failure(description=str(exc), allow_retries=False) from exc
            candidate = score_model(model, holdout, spec.bootstrap_samples, seed)
            baseline = score_baseline(model, train, candidate.labels, spec.bootstrap_samples, seed)
            champion_version, champion_model = left or champion_before(
                context, registry, store, contract.name, name, registered_name, kind, day
            )
            champion = (
                score_model(champion_model, holdout, spec.bootstrap_samples, seed)
                if champion_model is not None
                else None
            )
            verdict = judge(contract, candidate, champion, baseline)
            left = (
                (f"{kind}-{day}", model)
                if verdict.decision == "promote"
                else (champion_version, champion_model)
            )
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
                "champion_after": left[0],
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
