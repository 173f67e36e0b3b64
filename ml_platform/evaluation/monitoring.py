"""champion_performance: the serving champion scored on each day's labelled rows, and its decay.

The evaluation report compares a candidate with the champion on the candidate's held-out rows;
it says nothing about how the model users are served does on the days it serves them. This
asset answers that: the serving champion of day D is the champion D's candidate competed with
(`evaluation_report(D)["champion_version"]`), trained before D's rows came in, so its metrics on
D's labelled rows are its performance on data it never saw. Plotted across partitions in the UI,
they show when to retrain.

The `champion_decay` check fails (WARN) when the champion misses the contract's value
thresholds on `evaluation.decay_days` days in a row: one bad day is noise, a streak is decay.
A day with no champion yet, or no labelled rows, or never stored, breaks a streak; a contract
without value thresholds has nothing to decay from.
"""

import datetime as dt
import math
from collections.abc import Callable, Iterator
from typing import Any

import dagster as dg
import pandas as pd

from ml_platform.automation.retries import STORAGE_RETRY_POLICY
from ml_platform.contracts import Contract
from ml_platform.evaluation.metrics import LOWER_IS_BETTER, score_model
from ml_platform.platform.datasets import asset_key, dataset_name
from ml_platform.platform.steps import (
    chained_backfill_policy,
    daily_check_spec,
    each_day,
    previous_day_input,
)
from ml_platform.platform.storage import FORMAT_KEY, LakeIOManager, LakeStorage
from ml_platform.registry.store import ModelRegistry, RegistryError
from ml_platform.training.model import TrainedModel, labelled
from ml_platform.troubleshooting.runbook import check_description

CHAMPION_PERFORMANCE = "champion_performance"
DECAY_CHECK = "champion_decay"
# What a day's record says about its champion.
SCORED = "scored"
NO_CHAMPION = "no_champion"
NO_LABELLED_ROWS = "no_labelled_rows"


def threshold_results(
    values: dict[str, float], thresholds: dict[str, float]
) -> dict[str, dict[str, Any]]:
    """Each value threshold of the contract against the champion's metric: met or missed.

    mae and rmse are maximums, the others minimums; a metric the task lacks (or NaN, as ROC AUC
    on a day with one class) misses its bound, as in the promotion verdict.
    """
    results = {}
    for metric, bound in thresholds.items():
        value = float(values.get(metric, math.nan))
        lower = metric in LOWER_IS_BETTER
        met = value <= bound if lower else value >= bound
        results[metric] = {
            "value": value,
            "bound": bound,
            "direction": "max" if lower else "min",
            "met": bool(met),
        }
    return results


def champion_record(
    contract: Contract,
    day: str,
    champion_version: str | None,
    features: pd.DataFrame,
    load: Callable[[str], TrainedModel],
) -> dict[str, Any]:
    """The record of day D: the serving champion's metrics on D's labelled rows, if it has both."""
    rows = labelled(features, contract)
    record: dict[str, Any] = {
        "partition": day,
        "task": contract.label.task,
        "champion_version": champion_version,
        "labelled_rows": len(rows),
        "metrics": {},
        "intervals": {},
        "thresholds": {},
        "meets_thresholds": None,
    }
    if champion_version is None:
        return {
            **record,
            "status": NO_CHAMPION,
            "note": f"no champion served {day} yet (the first model): nothing to score",
        }
    if rows.empty:
        return {
            **record,
            "status": NO_LABELLED_ROWS,
            "note": f"{day} has no labelled rows yet: champion {champion_version} not scored",
        }
    spec = contract.evaluation
    scores = score_model(
        load(champion_version), rows, spec.bootstrap_samples, contract.training.random_seed
    )
    thresholds = threshold_results(scores.values, spec.value_thresholds)
    meets = all(t["met"] for t in thresholds.values())
    return {
        **record,
        "status": SCORED,
        "metrics": scores.values,
        "intervals": {name: list(bounds) for name, bounds in scores.intervals.items()},
        "thresholds": thresholds,
        "meets_thresholds": meets,
        "note": (
            f"champion {champion_version} on {len(rows)} labelled rows of {day}: "
            + ("meets" if meets else "misses")
            + " the value thresholds"
        ),
    }


def missed_thresholds(record: dict[str, Any] | None) -> bool:
    """Whether a day's record shows the champion scored and missing a value threshold."""
    return (
        record is not None
        and record.get("status") == SCORED
        and record.get("meets_thresholds") is False
    )


def previous_days(day: str, count: int) -> list[str]:
    """The `count` days before `day`, newest first."""
    first = dt.date.fromisoformat(day)
    return [(first - dt.timedelta(days=i)).isoformat() for i in range(1, count + 1)]


def _against_bounds(record: dict[str, Any]) -> str:
    """Each metric of a scored record with its bound: `rmse 1.2000 (at most 1.0)`."""
    words = {"max": "at most", "min": "at least"}
    parts = [
        f"{metric} {t['value']:.4f} ({words[t['direction']]} {t['bound']})"
        for metric, t in record["thresholds"].items()
    ]
    return ", ".join(parts)


def decay_check(
    contract: Contract,
    record: dict[str, Any],
    earlier: dict[str, dict[str, Any] | None],
) -> dg.AssetCheckResult:
    """`champion_decay` of a day: fails when the champion missed on `decay_days` days in a row.

    `earlier` holds the stored records of the `decay_days - 1` days before (None: not stored).
    """
    needed = contract.evaluation.decay_days
    day = record["partition"]
    streak = [record] if missed_thresholds(record) else []
    if streak:
        for previous in previous_days(day, needed - 1):
            found = earlier.get(previous)
            if not missed_thresholds(found):
                break
            assert found is not None
            streak.append(found)
    days = [r["partition"] for r in reversed(streak)]
    metadata: dict[str, Any] = {
        "streak_days": len(streak),
        "decay_days": needed,
        "champion_version": record["champion_version"] or "none",
        "status": record["status"],
    }
    metadata.update({f"champion_{metric}": float(v) for metric, v in record["metrics"].items()})
    if len(streak) >= needed:
        versions = sorted({r["champion_version"] for r in streak})
        detail = "; ".join(f"{r['partition']}: {_against_bounds(r)}" for r in reversed(streak))
        description = (
            f"The model is decaying: retrain or look at the data. Champion "
            f"{', '.join(versions)} missed the contract's value thresholds on {len(streak)} days "
            f"in a row ({days[0]} to {days[-1]}): {detail}."
        )
        return dg.AssetCheckResult(
            check_name=DECAY_CHECK,
            passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            description=description,
            metadata={**metadata, "days": ", ".join(days)},
        )
    if record["status"] != SCORED:
        description = f"{record['note']}; a day without a score breaks a decay streak."
    elif record["meets_thresholds"]:
        description = (
            f"Champion {record['champion_version']} meets the value thresholds on {day}: "
            f"{_against_bounds(record)}."
        )
    else:
        description = (
            f"Champion {record['champion_version']} missed the value thresholds on "
            f"{len(streak)} day(s) in a row ({days[0]} to {days[-1]}: {_against_bounds(record)} on "
            f"{day}), fewer than the {needed} that mean decay: watch the next days."
        )
    return dg.AssetCheckResult(
        check_name=DECAY_CHECK,
        passed=True,
        severity=dg.AssetCheckSeverity.WARN,
        description=description,
        metadata=metadata,
    )


def build_champion_performance(
    contract: Contract, partitions: dg.PartitionsDefinition
) -> dg.AssetsDefinition:
    """The champion_performance asset of a dataset, with its `champion_decay` check."""
    key = asset_key(contract.name, CHAMPION_PERFORMANCE)

    @dg.asset(
        name=CHAMPION_PERFORMANCE,
        key_prefix=contract.name,
        partitions_def=partitions,
        backfill_policy=chained_backfill_policy(),
        group_name=dataset_name(contract.name, "evaluation"),
        kinds={"scikitlearn", "json"},
        metadata={FORMAT_KEY: "json"},
        retry_policy=STORAGE_RETRY_POLICY,
        ins={
            "evaluation_report": dg.AssetIn(asset_key(contract.name, "evaluation_report")),
            "features": dg.AssetIn(asset_key(contract.name, "features")),
            # The decay streak reads the records of the days before: they must be stored first.
            # Without this dependency Dagster would put the days in registered_model's runs,
            # and when it registers a range in two runs (the second while the first one's
            # champion_performance still computes) a day could read its days before too early.
            "prev": previous_day_input(key),
        },
        # The champion of day D may be the model an earlier day promoted: it is in the registry
        # once registered_model has run for D (and, in order, for the days before).
        deps=[asset_key(contract.name, "registered_model")],
        check_specs=[
            daily_check_spec(
                DECAY_CHECK,
                key,
                partitions,
                description=check_description(
                    DECAY_CHECK,
                    "The serving champion meets the contract's value thresholds on the day's "
                    "labelled rows on at least one of the last "
                    f"{contract.evaluation.decay_days} days; otherwise the model is decaying.",
                ),
            )
        ],
    )
    def _champion_performance(
        context: dg.AssetExecutionContext,
        evaluation_report: Any,
        features: Any,
        lake: LakeStorage,
        io_manager: dg.ResourceParam[LakeIOManager],
    ) -> Iterator:
        """The serving champion of day D scored on D's labelled rows: metrics and intervals.

        The serving champion is the one D's candidate competed with (the evaluation report's
        `champion_version`), trained before D. Each metric has a bootstrap 95 % interval; the
        record says which value thresholds it meets. The `champion_<metric>` metadata plot the
        champion's performance across days. The first day (no champion yet) and a day without
        labelled rows are recorded as such. `champion_decay` warns when the champion misses
        the value thresholds on `evaluation.decay_days` days in a row.
        """
        registry = ModelRegistry(lake, contract.name)

        def stored(day: str) -> dict[str, Any] | None:
            if not io_manager.storage.exists(io_manager.key(key, day, "json")):
                return None
            value: dict[str, Any] = io_manager.load_partition(key, day, "json")
            return value

        def load(version: str) -> TrainedModel:
            try:
                return registry.load(version)
            except RegistryError as exc:
                raise dg.Failure(
                    description=(
                        f"champion_performance: the champion {version} named by the evaluation "
                        f"report is not in the registry ({exc}); rematerialise evaluation_report "
                        "for the day"
                    ),
                    allow_retries=False,
                ) from exc

        def day_of_champion_performance(
            day: str, evaluation_report: dict[str, Any], features: pd.DataFrame
        ) -> Iterator:
            version = evaluation_report.get("champion_version")
            record = champion_record(contract, day, version, features, load)
            earlier = {d: stored(d) for d in previous_days(day, contract.evaluation.decay_days - 1)}
            yield decay_check(contract, record, earlier)
            metadata: dict[str, Any] = {
                f"champion_{metric}": dg.MetadataValue.float(float(value))
                for metric, value in record["metrics"].items()
            }
            yield dg.MaterializeResult(
                value=record,
                metadata={
                    **metadata,
                    "champion_version": version or "none",
                    "status": record["status"],
                    "labelled_rows": record["labelled_rows"],
                    "meets_thresholds": (
                        "n/a"
                        if record["meets_thresholds"] is None
                        else str(record["meets_thresholds"]).lower()
                    ),
                },
            )

        yield from each_day(
            context,
            day_of_champion_performance,
            evaluation_report=evaluation_report,
            features=features,
        )

    return _champion_performance
