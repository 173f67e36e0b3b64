"""model and full_model: pipelines trained in epochs on the feature window ending each day.

The daily model reads W days; the weekly full retrain reads a longer window. A window may have
holes: a day whose data was rejected has no accepted features (nor does a day not materialised
yet). The model trains on the accepted days when they cover at least the contract's
`training.min_window_coverage` of the window, and lists the missing ones in its metadata; below
that share the day is recorded with the verdict "window below coverage" (a data verdict, not a
run failure), naming every missing day and the command that fills them.
"""

import dataclasses
import datetime as dt
import math
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import dagster as dg
import numpy as np
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.platform.datasets import asset_key, dataset_name, writer_pool
from ml_platform.platform.formats import FORMAT_KEY, deserialise, serialise
from ml_platform.platform.inputs import WINDOW_KEY, DailyInput
from ml_platform.platform.observability import STEP_PREFIX, StepTelemetry
from ml_platform.platform.plots import GREY, Series, line_chart
from ml_platform.platform.records import day_records
from ml_platform.platform.rejected import rerun_command
from ml_platform.platform.retries import STORAGE_RETRY_POLICY
from ml_platform.platform.runbook import check_description
from ml_platform.platform.sizes import request_metadata, step_tags
from ml_platform.platform.steps import (
    DataVerdict,
    Verdict,
    daily_backfill_policy,
    daily_check_spec,
    each_day,
)
from ml_platform.platform.storage import LakeStorage
from ml_platform.platform.storage_errors import MissingPartitionError
from ml_platform.platform.tracking import MlflowStores
from ml_platform.training.model import (
    Checkpoints,
    TrainedModel,
    TrainingDataError,
    TrainingState,
    train_model,
)
from ml_platform.training.processes import WORKER_WINDOW_BYTES, RangeTrainer, Trained
from ml_platform.training.tracking import log_training

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
# Each log line is an event the run stores: one per epoch cost more than a day's storage and
# metadata on real flights days (17 epochs a day). A training is watched through one line per
# this many seconds.
EPOCH_LOG_SECONDS = 5.0
# What a killed run of each estimator resumes from, for the model's metadata.
CHECKPOINTS = {
    "sgd": "after an epoch, every training.checkpoint_seconds",
    "hist_gradient_boosting": "after a step of model.step boosting iterations, every "
    "training.checkpoint_seconds",
    "linear": "none: one fit of seconds at most, so a killed run fits again from the start, "
    "which ends with the same model",
}


def every(
    seconds: float, call: Callable[[dict], None], clock: Callable[[], float] = time.monotonic
) -> Callable[[dict], None]:
    """`call` for its first record, then for a record only once `seconds` passed since the last."""
    last = -math.inf

    def throttled(record: dict) -> None:
        nonlocal last
        now = clock()
        if now - last >= seconds:
            last = now
            call(record)

    return throttled


def window_input(dataset: str, window_days: int, reach_days: int | None = None) -> dg.AssetIn:
    """The `features` input of a day: its `window_days` partitions ending that day.

    `reach_days`, when larger, maps that many days ending the day instead (a step that reads
    a longer window of its own besides, as the registry does); each day still reads the last
    `window_days` of them through `DailyInput.for_day`.
    """
    # Without allow_nonexistent_upstream_partitions the first days, whose window reaches
    # before the first partition, could not run at all. The flag is marked beta; its behaviour
    # (drop partitions outside the definition) is what a window needs, so the warning is muted.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        mapping = dg.TimeWindowPartitionMapping(
            start_offset=-(max(window_days, reach_days or 0) - 1),
            end_offset=0,
            allow_nonexistent_upstream_partitions=True,
        )
    return dg.AssetIn(
        key=asset_key(dataset, "features"),
        partition_mapping=mapping,
        metadata={WINDOW_KEY: window_days},
    )


class WindowCoverageError(DataVerdict):
    """Too few of a model's window days are accepted to train on: a verdict of the day."""

    def __init__(self, description: str, metadata: dict[str, Any]):
        super().__init__(Verdict.WINDOW_BELOW_COVERAGE, description, metadata)


@dataclasses.dataclass(frozen=True)
class WindowCoverage:
    """Which days of the feature window ending `day` a model expects, and which are stored."""

    day: str
    expected: list[str]  # the window's days inside the partitions definition, oldest first
    stored: list[str]  # the expected days whose features are in storage, oldest first

    @property
    def missing(self) -> list[str]:
        """The expected days without stored features, oldest first."""
        stored = set(self.stored)
        return [d for d in self.expected if d not in stored]

    @property
    def share(self) -> float:
        """Stored days over expected days (1.0 for a window without holes)."""
        return len(self.stored) / len(self.expected)


def window_coverage(
    day: str, window_days: int, first_day: str, stored: Iterable[str]
) -> WindowCoverage:
    """The coverage of the window ending `day`, given the stored feature partitions.

    The window's days before the dataset's first partition (`first_day`) are not expected: the
    first days of a dataset are fully covered by the days that exist.
    """
    end = dt.date.fromisoformat(day)
    start = max(end - dt.timedelta(days=window_days - 1), dt.date.fromisoformat(first_day))
    expected = [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]
    have = set(stored)
    return WindowCoverage(day, expected, [d for d in expected if d in have])


def fill_command(dataset: str, first_missing: str, day: str) -> str:
    """The command that materialises the missing days through `day` (done days are skipped)."""
    return rerun_command(dataset, [first_missing, day])


def require_coverage(
    coverage: WindowCoverage,
    min_coverage: float,
    name: str,
    dataset: str,
    own_day_required: bool = True,
) -> None:
    """Raise WindowCoverageError unless the day's own features and enough of its window exist.

    Days whose features are rejected or not materialised are holes alike.

    The daily model of day D holds out D's latest rows for its evaluation, so D itself must be
    accepted (`own_day_required`); the weekly retrain holds out its window's latest accepted
    rows, so a rejected Sunday is one more hole of its window. The other days may have holes
    while they cover at least `min_coverage` of the window.
    """
    missing = coverage.missing
    day = coverage.day
    own_day = own_day_required and day in missing
    if not own_day and coverage.share >= min_coverage:
        return
    window = f"{coverage.expected[0]}..{day}"
    # The IO manager's words for a partition that is not stored, for one day or several.
    if len(missing) == 1:
        absent = f"features partition {missing[0]} is not in storage"
    else:
        absent = f"features partitions {', '.join(missing)} are not in storage"
    if own_day:
        why = f"and a model is trained and evaluated on the rows of its own day, {day}"
    else:
        why = (
            f"so only {len(coverage.stored)} of the {len(coverage.expected)} days of its feature "
            f"window {window} are stored ({coverage.share:.0%}), below the contract's "
            f"training.min_window_coverage of {min_coverage:.0%}"
        )
    picked = ", ".join(dict.fromkeys([*missing, day]))
    raise WindowCoverageError(
        description=(
            f"{name} {day} was not trained: {absent} (a day is missing when its data failed "
            f"its gates or it was never materialised), {why}. Fix or land those days' files, "
            f"then run `{fill_command(dataset, missing[0], day)}` (it skips the days already "
            "materialised; add --force for a day whose stored features were removed), or in "
            "the Dagster UI under Assets select the daily assets (raw_data to registered_model), "
            f"click Materialize and pick the partitions {picked}."
        ),
        metadata={
            "missing_window_days": missing,
            "window_coverage": coverage.share,
            "min_window_coverage": min_coverage,
            "fill_command": fill_command(dataset, missing[0], day),
        },
    )


# The model's input of its day's drift verdict (`ml_platform.drift.assets`).
DRIFT_INPUT = "drift_report"


def drift_ins(contract: Contract) -> dict[str, dg.AssetIn]:
    """The drift_report input of a model, when the contract marks a feature blocking.

    Only then does the day's drift decide whether the model trains, so only then is the report
    an input: the model waits for it and the lineage shows it.
    """
    if not any(spec.blocking for spec in contract.drift.features.values()):
        return {}
    return {DRIFT_INPUT: dg.AssetIn(asset_key(contract.name, DRIFT_INPUT))}


def blocking_drift(
    reports: DailyInput | None,
    instance: dg.DagsterInstance,
    contract: Contract,
    day: str,
    own_features: bool,
    name: str,
) -> list[str]:
    """The features the contract marks blocking that drifted on `day`, from its drift report.

    `reports` is the model's drift_report input (None when nothing is blocking). A day whose
    own features are not stored has no drift to judge, and is a hole of the window the
    coverage rule judges. A day with features but no accepted report is the verdict "no drift
    report": whether a blocking feature drifted is unknown, which is never read as "no drift".
    Drift stops the day's model as a verdict, not a failed step: Dagster would fail every later
    window with it.
    """
    if reports is None or not own_features:
        return []
    try:
        report = reports.for_day(day)
    except MissingPartitionError as exc:
        blocking = sorted(n for n, spec in contract.drift.features.items() if spec.blocking)
        key = reports.asset_key or asset_key(contract.name, DRIFT_INPUT)
        record = day_records(instance, key, [day]).get(day)
        state = (
            "was never materialised"
            if record is None
            else f"is recorded without a report ({record.verdict}: {record.reason})"
        )
        raise DataVerdict(
            Verdict.NO_DRIFT_REPORT,
            f"{name} {day} was not trained: the contract marks {', '.join(blocking)} blocking, "
            f"and {key.to_user_string()} {day} {state}, so whether they drifted is unknown. "
            f"Materialise drift_report for {day}, then the model (the daily job does both).",
            {
                "blocking_features": blocking,
                "drift_report": "none" if record is None else record.verdict,
            },
        ) from exc
    drifting = set(report["drifting_features"])
    return [f["feature"] for f in report["features"] if f["blocking"] and f["feature"] in drifting]


def untested_blocking(reports: DailyInput | None, day: str, own_features: bool) -> dict[str, str]:
    """The blocking features the day's drift report could not test, each with why.

    They do not stop the model (`drift.checks.describe`: a blocking feature added to the
    contract would stop it for a whole reference window), so its metadata names them: a
    model trained without a blocking feature's drift checked is not read as checked. A
    report stored before the report named them names none.
    """
    if reports is None or not own_features:
        return {}
    try:
        report = reports.for_day(day)
    except MissingPartitionError:
        return {}  # `blocking_drift` has stopped the day: "no drift report"
    return dict(report.get("untested_blocking_features", {}))


class LakeCheckpoints(Checkpoints):
    """Training state of one asset partition, kept in lake storage between epochs."""

    def __init__(
        self, storage: LakeStorage, key: str, warn: Callable[[str], object] = warnings.warn
    ):
        self.storage = storage
        self.key = key
        self.warn = warn

    def save(self, state: TrainingState) -> None:
        """Replace the checkpoint atomically."""
        self.storage.write_bytes(self.key, serialise(state, "joblib"))

    def load(self) -> TrainingState | None:
        """The last checkpoint, if a run stopped before finishing."""
        if not self.storage.exists(self.key):
            return None
        # Read outside the `try`: a storage error is the retry policy's to judge.
        data = self.storage.read_bytes(self.key)
        try:
            state = deserialise(data, "joblib")
        except Exception as exc:  # whatever unpickling bytes cut short raises
            state, why = None, f"{type(exc).__name__}: {exc}"
        else:
            why = f"it holds a {type(state).__name__}, not a TrainingState"
        if isinstance(state, TrainingState):
            return state
        # A checkpoint only saves time: one that cannot be read (cut short, or written by
        # another release) would fail every rerun of the day, while training afresh ends
        # with the same model. The next checkpoint replaces it.
        self.warn(
            f"checkpoint {self.key} ({len(data)} bytes) cannot be resumed ({why}); training "
            "starts afresh"
        )
        return None

    def clear(self) -> None:
        """Forget the checkpoint of a finished model."""
        self.storage.delete(self.key)


def loss_plateau_result(model: TrainedModel) -> dg.AssetCheckResult:
    """Warn when training stalled: a flat loss near the untrained one, or an unconverged solver.

    For SGD and gradient boosting, a plateau of the training loss over the last 5 epochs or
    iterations after it fell well below the untrained model's is convergence (early stopping
    ends it); a plateau near the untrained loss is a stall a person should look at. A linear
    model is one fit: it passes when its solver converged within `max_iter`.
    """
    if model.estimator == "linear":
        return _linear_convergence(model)
    unit = model.unit
    losses = [h["train_loss"] for h in model.history]
    stalled = False
    if len(losses) > PLATEAU_EPOCHS:
        best_before = min(losses[:-PLATEAU_EPOCHS])
        flat = min(losses[-PLATEAU_EPOCHS:]) > best_before * (1 - PLATEAU_TOLERANCE)
        learned = min(losses) < model.initial_loss * (1 - LEARNED_AT_LEAST)
        stalled = flat and not learned
    settings = (
        "the learning rate (eta0), the regularisation (alpha)"
        if model.estimator == "sgd"
        else "the learning_rate, min_samples_leaf"
    )
    description = (
        f"training loss has not improved for {PLATEAU_EPOCHS} {unit}s and stays at "
        f"{min(losses):.5f}, next to the untrained model's {model.initial_loss:.5f}: the model "
        f"is not learning; check {settings} and the features"
        if stalled
        else f"training loss fell from {model.initial_loss:.5f} (untrained) to {min(losses):.5f}"
        f" over {len(losses)} {unit}s."
    )
    return dg.AssetCheckResult(
        check_name=LOSS_PLATEAU_CHECK,
        passed=not stalled,
        severity=dg.AssetCheckSeverity.WARN,
        description=description,
        metadata={
            "train_loss": losses,
            f"{unit}s": len(losses),
            "initial_loss": model.initial_loss,
        },
    )


def _linear_convergence(model: TrainedModel) -> dg.AssetCheckResult:
    """The loss_plateau verdict of a one-fit linear model: did its solver converge?"""
    record = model.history[-1]
    iterations = record["iteration"]
    if model.task == "regression":
        text = "Ridge solved the least-squares problem exactly (no iterations to converge)"
    elif model.converged:
        text = f"LogisticRegression's solver converged in {iterations} iteration(s)"
    else:
        text = (
            f"LogisticRegression's solver stopped at its limit of {iterations} iterations "
            "without converging: raise model.max_iter in the contract, or regularise more "
            "(a smaller model.C)"
        )
    return dg.AssetCheckResult(
        check_name=LOSS_PLATEAU_CHECK,
        passed=model.converged,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            f"{text}; training loss {record['train_loss']:.5f} against the untrained model's "
            f"{model.initial_loss:.5f}."
        ),
        metadata={
            "solver_iterations": iterations,
            "converged": model.converged,
            "train_loss": record["train_loss"],
            "initial_loss": model.initial_loss,
        },
    )


def finite_weights_result(model: TrainedModel) -> dg.AssetCheckResult:
    """Block a model whose weights (linear) or losses (boosting) hold NaN or infinity."""
    if model.estimator == "hist_gradient_boosting":
        # Tree leaves are bounded by the targets' gradients and have no weights to inspect
        # publicly: a diverged ensemble shows as non-finite losses on its rows.
        values = np.array([[h["train_loss"], h["validation_loss"]] for h in model.history])
        what, fix = "losses per iteration", "lower learning_rate"
    else:
        estimator = model.pipeline.named_steps["estimator"]
        values = np.concatenate([np.ravel(estimator.coef_), np.ravel(estimator.intercept_)])
        what, fix = "weights", "lower eta0" if model.estimator == "sgd" else "check the features"
    bad = int((~np.isfinite(values)).sum())
    return dg.AssetCheckResult(
        check_name=FINITE_WEIGHTS_CHECK,
        passed=bad == 0,
        severity=dg.AssetCheckSeverity.ERROR,
        description=(
            f"{bad} of {values.size} {what} are not finite: training diverged; {fix}"
            if bad
            else f"all {values.size} {what} are finite."
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


def trained_where(done: Trained) -> dict[str, Any]:
    """Which process trained a day's model; a worker's figures are the day's step figures.

    A day a worker trained spent its step time waiting for it: what sizes a training step
    (`step_peak_rss_mb`, `step_cpu_seconds`) is what the worker used.
    """
    if not done.in_worker:
        return {"trained_in": "the step's process"}
    return {"trained_in": "a worker process", **done.telemetry.metadata(prefix=STEP_PREFIX)}


def loss_curve(model: TrainedModel) -> str:
    """Markdown plot of training and validation loss per epoch or boosting iteration."""
    unit = model.unit
    steps = [h[unit] for h in model.history]
    train = [h["train_loss"] for h in model.history]
    validation = [h["validation_loss"] for h in model.history]
    losses = [v for v in train + validation if math.isfinite(v)] or [0.0]
    return line_chart(
        f"Loss per {unit}",
        [
            Series("training", steps, train),
            Series("validation", steps, validation),
            Series(
                "kept" if model.estimator == "sgd" else "best validation",
                [model.best_epoch] * 2,
                [min(losses), max(losses)],
                GREY,
                dashed=True,
            ),
        ],
        unit,
        "loss",
    )


def build_model(
    contract: Contract,
    partitions: dg.PartitionsDefinition,
    name: str = "model",
    window_days: int | None = None,
    own_day_required: bool = True,
) -> dg.AssetsDefinition:
    """A model asset of a dataset, trained on `window_days` (default: the contract's W).

    `own_day_required`: whether the day's own features must be accepted (see
    `require_coverage`); the weekly retrain trains on its window without them.
    """
    days = window_days or contract.training.window_days
    checks = {
        LOSS_PLATEAU_CHECK: (
            "Warns when the training loss has not improved for 5 epochs or iterations while "
            "the model has not learned, or when a linear solver did not converge."
        ),
        FINITE_WEIGHTS_CHECK: (
            "Fails for a model with NaN or infinite weights or losses, which is not stored."
        ),
        UTILISATION_CHECK: "Warns when a long training step left the CPU mostly idle.",
    }

    @dg.asset(
        name=name,
        key_prefix=contract.name,
        pool=writer_pool(contract.name, name),
        partitions_def=partitions,
        backfill_policy=daily_backfill_policy(),
        group_name=dataset_name(contract.name, "training"),
        kinds={"scikitlearn"},
        metadata={FORMAT_KEY: "joblib", "window_days": days, **request_metadata(contract, name)},
        op_tags=step_tags(contract, name),
        retry_policy=STORAGE_RETRY_POLICY,
        ins={"features": window_input(contract.name, days), **drift_ins(contract)},
        check_specs=[
            daily_check_spec(
                check,
                asset_key(contract.name, name),
                partitions,
                description=check_description(check, text),
            )
            for check, text in checks.items()
        ],
    )
    def _model(
        context: dg.AssetExecutionContext,
        features: Any,
        lake: LakeStorage,
        mlflow: MlflowStores,
        **drift: Any,
    ) -> Iterator:
        """A scikit-learn pipeline trained on the feature partitions ending day D.

        The preprocessing is fitted inside the pipeline, so scoring applies exactly what
        training did. The contract's `model.estimator` learns with early stopping on a
        validation slice: SGD epoch by epoch, gradient boosting a step of iterations at a time,
        each with a checkpoint stored between them (every `checkpoint_seconds`), so a killed
        run resumes from the last one and ends with the same model. A linear model is one fit
        of seconds with no checkpoint: a killed run fits again. The latest rows of the
        window (by day, then event time) are held out for evaluation. The window is read a day
        at a time, so the step's memory does not grow with it; a linear model or gradient
        boosting learns from at most the contract's `training.max_training_rows` rows (a
        sample stratified by day above it: `rows_learnt_from`). Days of the window whose features
        are not stored are left out while the stored ones cover the contract's
        `min_window_coverage`; the metadata lists them (`missing_window_days`).
        """
        first_day = partitions.get_first_partition_key() or context.partition_keys[0]
        min_coverage = contract.training.min_window_coverage
        # Handed to `each_day` as it is: its missing day is this asset's "no drift report".
        reports: DailyInput | None = drift.get(DRIFT_INPUT)

        def day_of_model(day: str, features: Mapping[str, pd.DataFrame]) -> Iterator:
            coverage = window_coverage(day, days, first_day, features)
            own = day not in coverage.missing
            drifted = blocking_drift(reports, context.instance, contract, day, own, name)
            if drifted:
                raise DataVerdict(
                    Verdict.BLOCKING_DRIFT,
                    f"{name} {day} was not trained: the features of {day} drifted on "
                    f"{', '.join(drifted)}, which the contract marks blocking (drift.features); "
                    "read the day's drift_report (its features_drift check).",
                    {"blocking_drift": drifted},
                )
            require_coverage(coverage, min_coverage, name, contract.name, own_day_required)
            unchecked = untested_blocking(reports, day, own)
            if unchecked:
                context.log.warning(
                    f"{name} {day} trains with the drift of blocking feature(s) unchecked: "
                    + "; ".join(f"{feature} ({why})" for feature, why in unchecked.items())
                )
            if coverage.missing:
                context.log.warning(
                    f"{name} {day} trains on {len(coverage.stored)} of "
                    f"{len(coverage.expected)} window days; missing: "
                    f"{', '.join(coverage.missing)}"
                )
            checkpoints = checkpoints_of(day)

            def log_epoch(record: dict) -> None:
                unit = "epoch" if "epoch" in record else "iteration"
                context.log.info(
                    f"{day} {unit} {record[unit]}: train loss {record['train_loss']:.5f}, "
                    f"validation loss {record['validation_loss']:.5f}"
                )

            def in_process() -> tuple[TrainedModel, StepTelemetry]:
                # The first epoch and then one every EPOCH_LOG_SECONDS are logged as they end,
                # to watch a long training; each day's losses per epoch or iteration are all in
                # its metadata (`loss_per_epoch`, `loss_per_iteration`).
                with StepTelemetry() as telemetry:
                    watch = every(EPOCH_LOG_SECONDS, log_epoch)
                    return train_model(features, contract, checkpoints, on_epoch=watch), telemetry

            try:
                done = trainer.train(day, in_process)
            except TrainingDataError as exc:
                # Waiting cannot add a second class or more rows: a verdict of the day.
                raise DataVerdict(Verdict.TRAINING_DATA, str(exc)) from exc
            trained, telemetry = done.model, done.telemetry
            yield loss_plateau_result(trained)
            weights = finite_weights_result(trained)
            yield weights
            yield utilisation_result(telemetry)
            if not weights.passed:
                raise DataVerdict(Verdict.NON_FINITE_WEIGHTS, weights.description or "")
            checkpoints.clear()
            run_id = log_training(mlflow, contract, name, day, trained, context.run.run_id)
            trained = dataclasses.replace(trained, mlflow_run_id=run_id)
            last = trained.history[-1]
            unit = trained.unit
            yield dg.MaterializeResult(
                value=trained,
                metadata={
                    "window_start": trained.window[0],
                    "window_end": trained.window[-1],
                    "window_partitions": trained.window,
                    "window_days_read": len(trained.window),
                    "window_days_expected": len(coverage.expected),
                    "window_coverage": coverage.share,
                    "missing_window_days": coverage.missing,
                    "input_data_versions": trained.data_versions,
                    "train_rows": trained.train_rows,
                    # Rows learnt from: fewer than train_rows when `linear` or boosting sampled
                    # the window down to the contract's training.max_training_rows.
                    "rows_learnt_from": trained.sampled_rows or trained.train_rows,
                    "holdout_rows": trained.holdout_rows,
                    "holdout_start": trained.holdout_start,
                    "estimator": trained.estimator,
                    "trained_for": trained.progress,
                    # Epochs for SGD, boosting iterations for the others.
                    f"{unit}s": len(trained.history),
                    f"best_{unit}": trained.best_epoch,
                    f"resumed_from_{unit}": trained.resumed_from_epoch,
                    "checkpoint": CHECKPOINTS[trained.estimator],
                    **trained_where(done),
                    "final_train_loss": last["train_loss"],
                    "best_validation_loss": min(h["validation_loss"] for h in trained.history),
                    f"loss_per_{unit}": dg.MetadataValue.md(loss_curve(trained)),
                    "hyperparameters": trained.hyperparameters,
                    # Blocking features the day's drift report could not test, with why.
                    **({"untested_blocking_features": unchecked} if unchecked else {}),
                    **mlflow.run_link(contract.name, run_id),
                    **telemetry.metadata(),
                },
            )

        def checkpoints_of(day: str) -> LakeCheckpoints:
            return LakeCheckpoints(
                lake, f"{contract.name}/checkpoints/{name}/{day}.joblib", context.log.warning
            )

        def worker_window(day: str) -> Mapping[str, pd.DataFrame] | None:
            """A later day's window, when a worker may train it (`training.processes`)."""
            window = features.for_day(day)
            coverage = window_coverage(day, days, first_day, window)
            try:
                own = day not in coverage.missing
                if blocking_drift(reports, context.instance, contract, day, own, name):
                    return None
                require_coverage(coverage, min_coverage, name, contract.name, own_day_required)
            except DataVerdict:
                return None  # the step records the day's verdict when it reaches it
            if lake.exists(checkpoints_of(day).key):
                return None  # a killed run's training resumes in the step's process
            # Held whole only while it fits: a window of big days is given up at its first day
            # over the budget, not loaded whole to be measured.
            frames: dict[str, pd.DataFrame] = {}
            size = 0.0
            for window_day in window:
                # The size the cache measured when it loaded the day: measuring a frame of
                # strings again costs about a millisecond, 28 times a day.
                frames[window_day], day_bytes = window.value_and_size(window_day)
                size += day_bytes
                if size > WORKER_WINDOW_BYTES:
                    return None
            return frames

        with RangeTrainer(
            contract, list(context.partition_keys), worker_window, context.log.info
        ) as trainer:
            yield from each_day(context, day_of_model, features=features)

    return _model
