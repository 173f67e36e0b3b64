"""model and full_model: pipelines trained in epochs on the feature window ending each day.

The daily model reads W days; the weekly full retrain reads a longer window.
"""

import math
import warnings
from collections.abc import Iterator
from typing import Any

import dagster as dg
import numpy as np
import pandas as pd

from ml_platform.automation.retries import STORAGE_RETRY_POLICY
from ml_platform.contracts import Contract
from ml_platform.observability import StepTelemetry
from ml_platform.plots import GREY, Series, line_chart
from ml_platform.runbook import check_description
from ml_platform.steps import SINGLE_RUN, daily_check_spec, each_day
from ml_platform.storage import FORMAT_KEY, WINDOW_KEY, LakeStorage, deserialise, serialise
from ml_platform.training.model import (
    Checkpoints,
    TrainedModel,
    TrainingDataError,
    TrainingState,
    train_model,
)

LOSS_PLATEAU_CHECK = "loss_plateau"
FINITE_WEIGHTS_CHECK = "finite_weights"
UTILISATION_CHECK = "cpu_utilisation"
PLATEAU_EPOCHS = 5
# Improvement of the best training loss, relative to it, below which an epoch "did not improve".
PLATEAU_TOLERANCE = 1e-4
# A model whose best loss is within this share of the untrained loss has learned nothing.
LEARNED_AT_LEAST = 0.01
# Below this CPU share a training step mostly waits (for storage, most likely); shorter steps
# are too brief to judge.
LOW_UTILISATION = 0.5
UTILISATION_MIN_SECONDS = 10.0


def window_input(window_days: int) -> dg.AssetIn:
    """The `features` input of a day: its `window_days` partitions ending that day."""
    # Without allow_nonexistent_upstream_partitions the first days, whose window reaches
    # before the first partition, could not run at all. The flag is marked beta; its behaviour
    # (drop partitions outside the definition) is what a window needs, so the warning is muted.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        mapping = dg.TimeWindowPartitionMapping(
            start_offset=-(window_days - 1),
            end_offset=0,
            allow_nonexistent_upstream_partitions=True,
        )
    return dg.AssetIn(key="features", partition_mapping=mapping, metadata={WINDOW_KEY: window_days})


class LakeCheckpoints(Checkpoints):
    """Training state of one asset partition, kept in lake storage between epochs."""

    def __init__(self, storage: LakeStorage, key: str):
        self.storage = storage
        self.key = key

    def save(self, state: TrainingState) -> None:
        """Replace the checkpoint atomically."""
        self.storage.write_bytes(self.key, serialise(state, "joblib"))

    def load(self) -> TrainingState | None:
        """The last checkpoint, if a run stopped before finishing."""
        if not self.storage.exists(self.key):
            return None
        state: TrainingState = deserialise(self.storage.read_bytes(self.key), "joblib")
        return state

    def clear(self) -> None:
        """Forget the checkpoint of a finished model."""
        self.storage.delete(self.key)


def loss_plateau_result(model: TrainedModel) -> dg.AssetCheckResult:
    """Warn when the training loss has not improved for 5 epochs while the model has not learned.

    A plateau after the loss fell well below the untrained model's is convergence (early
    stopping ends it); a plateau near the untrained loss is a stall a person should look at.
    """
    losses = [h["train_loss"] for h in model.history]
    stalled = False
    if len(losses) > PLATEAU_EPOCHS:
        best_before = min(losses[:-PLATEAU_EPOCHS])
        flat = min(losses[-PLATEAU_EPOCHS:]) > best_before * (1 - PLATEAU_TOLERANCE)
        learned = min(losses) < model.initial_loss * (1 - LEARNED_AT_LEAST)
        stalled = flat and not learned
    description = (
        f"training loss has not improved for {PLATEAU_EPOCHS} epochs and stays at "
        f"{min(losses):.5f}, next to the untrained model's {model.initial_loss:.5f}: the model "
        "is not learning; check the learning rate, the regularisation (alpha) and the features"
        if stalled
        else f"training loss fell from {model.initial_loss:.5f} (untrained) to {min(losses):.5f}"
        f" over {len(losses)} epochs."
    )
    return dg.AssetCheckResult(
        check_name=LOSS_PLATEAU_CHECK,
        passed=not stalled,
        severity=dg.AssetCheckSeverity.WARN,
        description=description,
        metadata={"train_loss": losses, "epochs": len(losses), "initial_loss": model.initial_loss},
    )


def finite_weights_result(model: TrainedModel) -> dg.AssetCheckResult:
    """Block a model whose weights hold NaN or infinity (a diverged training)."""
    estimator = model.pipeline.named_steps["estimator"]
    weights = np.concatenate([np.ravel(estimator.coef_), np.ravel(estimator.intercept_)])
    bad = int((~np.isfinite(weights)).sum())
    return dg.AssetCheckResult(
        check_name=FINITE_WEIGHTS_CHECK,
        passed=bad == 0,
        severity=dg.AssetCheckSeverity.ERROR,
        description=(
            f"{bad} of {len(weights)} weights are not finite: training diverged; lower eta0"
            if bad
            else f"all {len(weights)} weights are finite."
        ),
    )


def utilisation_result(telemetry: StepTelemetry) -> dg.AssetCheckResult:
    """Warn when a long training step kept the CPU mostly idle (an I/O bottleneck)."""
    low = (
        telemetry.wall_seconds >= UTILISATION_MIN_SECONDS
        and telemetry.cpu_utilisation < LOW_UTILISATION
    )
    return dg.AssetCheckResult(
        check_name=UTILISATION_CHECK,
        passed=not low,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            f"training used the CPU {telemetry.cpu_utilisation:.0%} of its "
            f"{telemetry.wall_seconds:.0f} s: it mostly waited, probably on storage reads"
            if low
            else f"CPU utilisation {telemetry.cpu_utilisation:.0%} over "
            f"{telemetry.wall_seconds:.1f} s."
        ),
        metadata=telemetry.metadata(),
    )


def loss_curve(model: TrainedModel) -> str:
    """Markdown plot of training and validation loss per epoch."""
    epochs = [h["epoch"] for h in model.history]
    train = [h["train_loss"] for h in model.history]
    validation = [h["validation_loss"] for h in model.history]
    losses = [v for v in train + validation if math.isfinite(v)] or [0.0]
    return line_chart(
        "Loss per epoch",
        [
            Series("training", epochs, train),
            Series("validation", epochs, validation),
            Series(
                "kept",
                [model.best_epoch] * 2,
                [min(losses), max(losses)],
                GREY,
                dashed=True,
            ),
        ],
        "epoch",
        "loss",
    )


def build_model(
    contract: Contract,
    partitions: dg.PartitionsDefinition,
    name: str = "model",
    window_days: int | None = None,
) -> dg.AssetsDefinition:
    """A model asset of a dataset, trained on `window_days` (default: the contract's W)."""
    days = window_days or contract.training.window_days
    checks = {
        LOSS_PLATEAU_CHECK: "Warns when the training loss has not improved for 5 epochs.",
        FINITE_WEIGHTS_CHECK: "Blocks a model with NaN or infinite weights.",
        UTILISATION_CHECK: "Warns when a long training step left the CPU mostly idle.",
    }

    @dg.asset(
        name=name,
        partitions_def=partitions,
        backfill_policy=SINGLE_RUN,
        group_name="training",
        kinds={"scikitlearn"},
        metadata={FORMAT_KEY: "joblib", "window_days": days},
        retry_policy=STORAGE_RETRY_POLICY,
        ins={"features": window_input(days)},
        check_specs=[
            daily_check_spec(
                check,
                name,
                partitions,
                description=check_description(check, text),
                blocking=check == FINITE_WEIGHTS_CHECK,
            )
            for check, text in checks.items()
        ],
    )
    def _model(context: dg.AssetExecutionContext, features: Any, lake: LakeStorage) -> Iterator:
        """A scikit-learn pipeline trained in epochs on the feature partitions ending day D.

        Imputation, scaling and one-hot encoding are fitted inside the pipeline, so scoring
        applies exactly what training did. An SGD estimator learns epoch by epoch with early
        stopping on a validation slice; after every epoch a checkpoint is stored, so a killed
        run resumes from the last epoch and ends with the same model. The latest rows of the
        window (by event time) are held out for evaluation.
        """

        def day_of_model(day: str, features: dict[str, pd.DataFrame]) -> Iterator:
            checkpoints = LakeCheckpoints(lake, f"{contract.name}/checkpoints/{name}/{day}.joblib")

            def log_epoch(record: dict) -> None:
                context.log.info(
                    f"{day} epoch {record['epoch']}: train loss {record['train_loss']:.5f}, "
                    f"validation loss {record['validation_loss']:.5f}"
                )

            # A one-day run logs each epoch as it ends, to watch a long training. A range's
            # days train in worker processes, which must not write to the run's event log;
            # each day's losses per epoch are in its metadata (`loss_per_epoch`).
            on_epoch = log_epoch if context.has_partition_key else None
            with StepTelemetry() as telemetry:
                try:
                    trained = train_model(features, contract, checkpoints, on_epoch=on_epoch)
                except TrainingDataError as exc:
                    # Waiting cannot add a second class or more rows: fail now, without retries.
                    raise dg.Failure(description=str(exc), allow_retries=False) from exc
            yield loss_plateau_result(trained)
            weights = finite_weights_result(trained)
            yield weights
            yield utilisation_result(telemetry)
            if not weights.passed:
                raise dg.Failure(description=weights.description, allow_retries=False)
            checkpoints.clear()
            last = trained.history[-1]
            yield dg.MaterializeResult(
                value=trained,
                metadata={
                    "window_start": trained.window[0],
                    "window_end": trained.window[-1],
                    "window_partitions": trained.window,
                    "window_days_read": len(trained.window),
                    "input_data_versions": trained.data_versions,
                    "train_rows": trained.train_rows,
                    "holdout_rows": trained.holdout_rows,
                    "holdout_start": trained.holdout_start,
                    "epochs": len(trained.history),
                    "best_epoch": trained.best_epoch,
                    "resumed_from_epoch": trained.resumed_from_epoch,
                    "final_train_loss": last["train_loss"],
                    "best_validation_loss": min(h["validation_loss"] for h in trained.history),
                    "loss_per_epoch": dg.MetadataValue.md(loss_curve(trained)),
                    "hyperparameters": {
                        k: v for k, v in trained.hyperparameters.items() if not _is_nan(v)
                    },
                    **telemetry.metadata(),
                },
            )

        yield from each_day(context, day_of_model, independent_days=True, features=features)

    return _model


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)
