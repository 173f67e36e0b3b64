"""registered_model: the day's model in the registry, as champion or challenger."""

from collections.abc import Iterator
from typing import Any

import dagster as dg

from ml_platform.automation.retries import STORAGE_RETRY_POLICY
from ml_platform.contracts import Contract
from ml_platform.registry.store import ModelRegistry, environment_manifest
from ml_platform.steps import SINGLE_RUN, each_day
from ml_platform.storage import FORMAT_KEY, LakeStorage
from ml_platform.training.model import TrainedModel


def build_registered_model(
    contract: Contract,
    partitions: dg.PartitionsDefinition,
    name: str = "registered_model",
    model_name: str = "model",
    evaluation_name: str = "evaluation_report",
    kind: str = "daily",
) -> dg.AssetsDefinition:
    """A registry asset of a dataset, for one model/evaluation pair."""

    @dg.asset(
        name=name,
        partitions_def=partitions,
        backfill_policy=SINGLE_RUN,
        group_name="registry",
        kinds={"scikitlearn"},
        metadata={FORMAT_KEY: "json"},
        retry_policy=STORAGE_RETRY_POLICY,
        ins={"model": dg.AssetIn(key=model_name), "evaluation": dg.AssetIn(key=evaluation_name)},
        # Alias moves read and write one small file: two runs must not interleave them.
        pool="model_registry",
    )
    def _registered_model(
        context: dg.AssetExecutionContext, model: Any, evaluation: Any, lake: LakeStorage
    ) -> Iterator:
        """The model of day D registered with its lineage manifest, and where its aliases point.

        Registering the same day again replaces its version (`daily-<day>`) instead of adding
        one. A `promote` verdict moves `champion` to it; a good model that does not beat the
        champion becomes `challenger`. Every alias move is appended to the registry's history.
        A rejected model is never registered: a one-day run stops at the evaluation's blocking
        verdict; in a range of days, the day is recorded as not registered and the registry is
        left as it was.
        """
        registry = ModelRegistry(lake, contract.name)

        def day_of_registered_model(day: str, model: TrainedModel, evaluation: dict) -> Iterator:
            version = f"{kind}-{day}"
            if evaluation["decision"] == "reject":
                yield dg.MaterializeResult(
                    value={"version": None, "alias": None, "decision": "reject"},
                    metadata={
                        "version": "none: rejected, not registered",
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
                "hyperparameters": model.hyperparameters,
                "epochs": len(model.history),
                "metrics": evaluation["metrics"],
                "decision": evaluation["decision"],
                **environment,
            }
            registry.upsert(version, model, manifest)
            alias = "champion" if evaluation["decision"] == "promote" else "challenger"
            registry.set_alias(
                alias,
                version,
                partition=day,
                run_id=context.run.run_id,
                reason="; ".join(evaluation["reasons"]),
            )
            yield dg.MaterializeResult(
                value={"version": version, "alias": alias, "manifest": manifest},
                metadata={
                    "version": version,
                    "alias": alias,
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
