"""registered_model: the day's model in the registry, or the day recorded as not registered.

A rejected candidate is an outcome of the day, not a failure of the run: the day is stored as
not registered with the reason, the champion stays, and the check `rejection_streak` warns once
several candidates in a row were rejected.
"""

import datetime as dt
from collections.abc import Iterator
from typing import Any

import dagster as dg

from ml_platform.automation.retries import STORAGE_RETRY_POLICY
from ml_platform.contracts import Contract
from ml_platform.platform.datasets import asset_key, dataset_name
from ml_platform.platform.steps import (
    chained_backfill_policy,
    daily_check_spec,
    each_day,
    previous_day_input,
)
from ml_platform.platform.storage import FORMAT_KEY, LakeIOManager, LakeStorage
from ml_platform.registry.store import ModelRegistry, environment_manifest
from ml_platform.training.model import TrainedModel
from ml_platform.troubleshooting.runbook import check_description

REJECTION_STREAK_CHECK = "rejection_streak"
# Days between two evaluations of a model kind: the daily model, and the weekly full retrain
# (every Monday), whose previous evaluation is a week before.
CADENCE_DAYS = {"daily": 1, "full": 7}
# The model asset whose partition `<kind>-<day>` registers.
MODEL_OF_KIND = {"daily": "model", "full": "full_model"}


def outcome_line(decision: str, cause: str) -> str:
    """What a day's verdict did to the registry, in the words `ml-platform materialize` prints."""
    if decision == "promote":
        return "promoted"
    if decision == "challenger":
        return "kept champion (challenger)"
    return f"rejected: {cause}"


def rejected_in_a_row(
    store: LakeIOManager,
    evaluation: dg.AssetKey,
    day: str,
    decision: str,
    limit: int,
    cadence_days: int = 1,
) -> list[str]:
    """The evaluations ending `day` that rejected their candidate in a row, at most `limit`.

    Earlier evaluations are read from the lake, `cadence_days` apart; an evaluation that was
    never stored ends the run of rejections, as an accepted one does.
    """
    if decision != "reject":
        return []
    streak = [day]
    current = dt.date.fromisoformat(day)
    while len(streak) < limit:
        current -= dt.timedelta(days=cadence_days)
        earlier = current.isoformat()
        if not store.storage.exists(store.key(evaluation, earlier, "json")):
            break
        if store.load_partition(evaluation, earlier, "json")["decision"] != "reject":
            break
        streak.append(earlier)
    return sorted(streak)


def streak_check(
    streak: list[str], limit: int, champion: str | None, cause: str
) -> dg.AssetCheckResult:
    """The rejections in a row as a WARN check: it fails once there are `limit` of them."""
    metadata: dict[str, Any] = {
        "rejected_in_a_row": len(streak),
        "alert_at": limit,
        "days": ", ".join(streak),
    }
    if len(streak) < limit:
        return dg.AssetCheckResult(
            check_name=REJECTION_STREAK_CHECK,
            passed=True,
            severity=dg.AssetCheckSeverity.WARN,
            description=f"{len(streak)} candidate(s) rejected in a row; the alert is at {limit}.",
            metadata=metadata,
        )
    serving = f"champion {champion} has served all along" if champion else "there is no champion"
    return dg.AssetCheckResult(
        check_name=REJECTION_STREAK_CHECK,
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            f"{len(streak)} candidates in a row were rejected ({streak[0]} to {streak[-1]}), so "
            f"{serving}; the last one: {cause}. Read "
            "these days' data checks and evaluation reports: if their data is sound, the model no "
            "longer meets the contract's value thresholds; retrain on a longer window "
            "(weekly_retrain_job), revisit the features, or revise the thresholds."
        ),
        metadata=metadata,
    )


def build_registered_model(
    contract: Contract,
    partitions: dg.PartitionsDefinition,
    name: str = "registered_model",
    model_name: str = "model",
    evaluation_name: str = "evaluation_report",
    kind: str = "daily",
) -> dg.AssetsDefinition:
    """A registry asset of a dataset, for one model/evaluation pair.

    Registering a day moves the aliases the day before left: each day depends on its own
    previous evaluation day (`CADENCE_DAYS` earlier), so a backfill registers its days in order:
    in one run once every evaluation of the range is done, and when the daemon requests an
    earlier part of the range first, the later part only once that part is recorded.
    """

    @dg.asset(
        name=name,
        key_prefix=contract.name,
        partitions_def=partitions,
        backfill_policy=chained_backfill_policy(),
        group_name=dataset_name(contract.name, "registry"),
        kinds={"scikitlearn"},
        metadata={FORMAT_KEY: "json"},
        retry_policy=STORAGE_RETRY_POLICY,
        ins={
            "model": dg.AssetIn(key=asset_key(contract.name, model_name)),
            "evaluation": dg.AssetIn(key=asset_key(contract.name, evaluation_name)),
            "prev": previous_day_input(asset_key(contract.name, name), CADENCE_DAYS[kind]),
        },
        check_specs=[
            daily_check_spec(
                REJECTION_STREAK_CHECK,
                asset_key(contract.name, name),
                partitions,
                description=check_description(
                    REJECTION_STREAK_CHECK,
                    f"Fewer than {contract.evaluation.rejection_streak} candidates in a row were "
                    "rejected (contract evaluation.rejection_streak).",
                ),
            )
        ],
        # Alias moves read and write one small file: two runs must not interleave them.
        pool=dataset_name(contract.name, "model_registry"),
    )
    def _registered_model(
        context: dg.AssetExecutionContext, model: Any, evaluation: Any, lake: LakeStorage
    ) -> Iterator:
        """The model of day D registered with its lineage manifest, and where its aliases point.

        Registering the same day again replaces its version (`daily-<day>`) instead of adding
        one. A `promote` verdict moves `champion` to it; a good model that does not beat the
        champion becomes `challenger`. Every alias move is appended to the registry's history.
        A rejected model is never registered: the day is recorded as not registered, with the
        reason, and the registry is left as it was, in a one-day run as in a range. The check
        `rejection_streak` fails once the contract's `evaluation.rejection_streak` candidates in
        a row were rejected.
        """
        registry = ModelRegistry(lake, contract.name)
        store: LakeIOManager = context.resources.io_manager
        limit = contract.evaluation.rejection_streak

        def day_of_registered_model(day: str, model: TrainedModel, evaluation: dict) -> Iterator:
            version = f"{kind}-{day}"
            decision = evaluation["decision"]
            # Reports stored before the verdict had a one-line cause fall back to its reasons.
            cause = evaluation.get("cause") or "; ".join(evaluation["reasons"])
            streak = rejected_in_a_row(
                store,
                asset_key(contract.name, evaluation_name),
                day,
                decision,
                limit,
                CADENCE_DAYS[kind],
            )
            yield streak_check(streak, limit, registry.alias("champion"), cause)
            outcome = outcome_line(decision, cause)
            if decision == "reject":
                yield dg.MaterializeResult(
                    value={
                        "version": None,
                        "alias": None,
                        "decision": "reject",
                        "registered": False,
                        "outcome": outcome,
                        "reason": cause,
                    },
                    metadata={
                        "version": "none: rejected, not registered",
                        "outcome": outcome,
                        "rejected_in_a_row": len(streak),
                        "champion": registry.alias("champion") or "none",
                        "challenger": registry.alias("challenger") or "none",
                    },
                )
                return
            manifest = {
                "dataset": contract.name,
                "partition": day,
                "asset": name,
                "run_id": context.run.run_id,
                "input_partitions": model.window,
                "input_data_versions": model.data_versions,
                "estimator": model.estimator,
                # The contract's model section as it applied (defaults filled in).
                "model_settings": contract.model.model_dump(),
                "hyperparameters": model.hyperparameters,
                "trained_for": model.progress,
                "metrics": evaluation["metrics"],
                "decision": decision,
                **environment,
            }
            registry.upsert(version, model, manifest)
            alias = "champion" if decision == "promote" else "challenger"
            registry.set_alias(
                alias,
                version,
                partition=day,
                run_id=context.run.run_id,
                reason="; ".join(evaluation["reasons"]),
            )
            yield dg.MaterializeResult(
                value={
                    "version": version,
                    "alias": alias,
                    "decision": decision,
                    "registered": True,
                    "outcome": outcome,
                    "manifest": manifest,
                },
                metadata={
                    "version": version,
                    "alias": alias,
                    "outcome": outcome,
                    "champion": registry.alias("champion") or "none",
                    "challenger": registry.alias("challenger") or "none",
                    "registered_versions": len(registry.versions()),
                    "git_commit": manifest["git_commit"],
                },
            )

        # Once per step: it runs git and reads the lock file.
        environment = environment_manifest()
        yield from each_day(context, day_of_registered_model, model=model, evaluation=evaluation)

    return _registered_model
