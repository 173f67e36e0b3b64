"""Each training is an MLflow run of its dataset's experiment.

The run holds what a person compares trainings by: the estimator, its hyperparameters, the
window and the contract's training and model settings as params; the training and validation
loss of every epoch or boosting iteration as step metrics; the Dagster run, asset and day as
tags. registered_model adds the evaluation's metrics and the model itself (MLflow's sklearn
flavour) to the run of each candidate it registers (`ml_platform.registry.store`).
"""

import time
from typing import Any

from ml_platform.contracts import Contract
from ml_platform.platform.tracking import TAG, MlflowStores
from ml_platform.training.model import TrainedModel

# MLflow keeps at most 6000 characters of a param value.
PARAM_CHARS = 6000


def _flat(prefix: str, value: Any) -> dict[str, str]:
    """Nested settings as `prefix.key` params (lists and scalars as their text)."""
    if isinstance(value, dict):
        flat: dict[str, str] = {}
        for key, item in value.items():
            flat.update(_flat(f"{prefix}.{key}", item))
        return flat
    return {prefix: str(value)[:PARAM_CHARS]}


def training_params(contract: Contract, model: TrainedModel) -> dict[str, str]:
    """The params of a training's run."""
    return {
        "estimator": model.estimator,
        "window_start": model.window[0],
        "window_end": model.window[-1],
        "window_days_read": str(len(model.window)),
        "train_rows": str(model.train_rows),
        "rows_learnt_from": str(model.sampled_rows or model.train_rows),
        "holdout_rows": str(model.holdout_rows),
        **_flat("hyperparameters", model.hyperparameters),
        **_flat("contract.model", contract.model.model_dump(mode="json")),
        **_flat("contract.training", contract.training.model_dump(mode="json")),
    }


def log_training(
    stores: MlflowStores,
    contract: Contract,
    asset: str,
    day: str,
    model: TrainedModel,
    dagster_run_id: str,
) -> str:
    """Record a finished training as an MLflow run of the dataset's experiment; its run id."""
    from mlflow.entities import Metric, Param, RunTag

    client = stores.client()
    run = client.create_run(
        stores.experiment_id(contract.name),
        run_name=f"{asset} {day}",
        tags={
            f"{TAG}.dataset": contract.name,
            f"{TAG}.asset": asset,
            f"{TAG}.partition": day,
            f"{TAG}.dagster_run_id": dagster_run_id,
            f"{TAG}.kind": "training",
        },
    )
    run_id: str = run.info.run_id
    now = int(time.time() * 1000)
    unit = model.unit
    metrics = [
        Metric(name, float(record[name]), now, int(record[unit]))
        for record in model.history
        for name in ("train_loss", "validation_loss")
        if name in record
    ]
    metrics.append(Metric(f"best_{unit}", float(model.best_epoch), now, 0))
    params = [Param(k, v) for k, v in training_params(contract, model).items()]
    note = [RunTag("mlflow.note.content", model.progress)]
    # One write where MLflow's limits allow (1000 metrics, 100 params a call): each is a
    # transaction of the store.
    if len(metrics) + len(params) < 1000 and len(params) <= 100:
        client.log_batch(run_id, metrics=metrics, params=params, tags=note)
    else:
        for start in range(0, len(metrics), 1000):
            client.log_batch(run_id, metrics=metrics[start : start + 1000])
        for start in range(0, len(params), 100):
            client.log_batch(run_id, params=params[start : start + 100])
        client.log_batch(run_id, tags=note)
    client.set_terminated(run_id)
    return run_id
