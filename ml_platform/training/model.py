"""The trained model: a scikit-learn pipeline, checkpointed while it learns.

The window's rows are split in time: the latest `holdout_fraction` of rows (by event time) is
held out for evaluation and never trained on. The contract's `model` section picks the
estimator:

- `sgd`: imputation, scaling and one-hot encoding fitted once, then SGD learns epoch by epoch
  with `partial_fit`, in an order drawn from a seeded generator, with early stopping on the
  validation slice, the latest 10 % of the training rows, which it does not learn from;
- `hist_gradient_boosting`: numeric features as they are (missing values handled natively) and
  categorical ones ordinal-encoded and split natively; boosting iterations are added `step` at
  a time with `warm_start`, with scikit-learn's early stopping on its own random 10 % of the
  training rows;
- `linear`: the SGD preprocessing, then `LogisticRegression` or `Ridge` solved in one fit of at
  most seconds on all training rows, so it has no checkpoint: a killed run fits again, which
  ends with the same model. Its validation loss, on the latest 10 %, is in-sample.

After an epoch or boosting step that ends at least `checkpoint_seconds` after the last
checkpoint (or the start), the whole state (preprocessing, estimator, best estimator, generator
state, loss history) is written atomically, so a killed run resumes from there and ends with
the model an uninterrupted run would have produced.
"""

import contextlib
import copy
import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.contracts.model import (
    EVENT_TIME,
    HistGradientBoostingSpec,
    LinearSpec,
    SgdSpec,
)

if TYPE_CHECKING:
    from sklearn.pipeline import Pipeline

VALIDATION_FRACTION = 0.1


class TrainingDataError(ValueError):
    """The training window cannot produce a model (no labelled rows, a single class...)."""


@contextlib.contextmanager
def openmp_threads(threads: int) -> Iterator[None]:
    """Run gradient boosting's OpenMP loops on at most `threads` threads.

    scikit-learn's boosting uses every core by default. Where the cores are shared (the
    platform's steps run side by side) its threads wait on each other: on a loaded 2-core
    machine a 2,000-row fit took 19 s of wall time on all threads and 0.6 s on one. Predicting
    a day's rows is too short to gain from threads, so prediction uses one.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads, user_api="openmp"):
        yield


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    """A fitted pipeline and what it was trained on."""

    pipeline: "Pipeline"
    task: str
    features: list[str]
    label: str
    window: list[str]  # feature partitions read, oldest first
    train_rows: int
    holdout_rows: int
    holdout_start: str  # event time of the first held-out row
    data_versions: dict[str, str] = dataclasses.field(default_factory=dict)
    # Loss per epoch (sgd) or boosting iteration (hist_gradient_boosting), under the key
    # `unit`; one record of the solver's iterations for `linear`.
    history: list[dict] = dataclasses.field(default_factory=list)
    best_epoch: int = 0  # the epoch or boosting iteration kept
    resumed_from_epoch: int = 0  # epochs or boosting iterations done before a resume
    # Training loss of the untrained estimator (all weights zero, or boosting's constant
    # prediction), the yardstick of learning.
    initial_loss: float = math.nan
    # The contract's `model.estimator`; models stored before it was recorded were SGD.
    estimator: str = "sgd"

    @property
    def converged(self) -> bool:
        """Whether the solver stopped before its iteration limit (`linear`; others: True)."""
        return bool(self.history[-1].get("converged", True)) if self.history else True

    @property
    def unit(self) -> str:
        """What a history record counts: 'epoch' (sgd) or 'iteration' (the others)."""
        return "epoch" if self.estimator == "sgd" else "iteration"

    @property
    def progress(self) -> str:
        """How long the model trained, in words, e.g. '12 epoch(s) (best: 7)'."""
        last = self.history[-1][self.unit] if self.history else 0
        if self.estimator == "linear":
            state = "converged" if self.converged else "stopped at its iteration limit"
            return f"one fit of {last} solver iteration(s), {state}"
        noun = "epoch(s)" if self.unit == "epoch" else "boosting iteration(s)"
        return f"{last} {noun} (best: {self.best_epoch})"

    def predict(self, frame: pd.DataFrame) -> pd.Series:
        """Predicted label (class or value) for each row of a features frame."""
        with openmp_threads(1):
            return pd.Series(self.pipeline.predict(frame[self.features]), index=frame.index)

    def score(self, frame: pd.DataFrame) -> pd.Series:
        """Probability of the positive class (classification) or the predicted value."""
        if self.task == "classification":
            with openmp_threads(1):
                proba = self.pipeline.predict_proba(frame[self.features])[:, 1]
            return pd.Series(proba, index=frame.index)
        return self.predict(frame)

    def predictions(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """`predict` and `score` of a features frame, preprocessing its rows once, not twice."""
        x = self.pipeline.named_steps["preprocess"].transform(frame[self.features])
        estimator = self.pipeline.named_steps["estimator"]
        with openmp_threads(1):
            predicted = estimator.predict(x)
            if self.task == "classification":
                return predicted, estimator.predict_proba(x)[:, 1]
        return predicted, predicted

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """Parameters of the estimator, for the registry's manifest (NaN ones left out)."""
        params = self.pipeline.named_steps["estimator"].get_params()
        return {
            k: v
            for k, v in params.items()
            if isinstance(v, (int, float, str, bool))
            and not (isinstance(v, float) and math.isnan(v))
        }


@dataclasses.dataclass
class TrainingState:
    """Everything needed to continue training after the last finished epoch or boosting step."""

    fingerprint: str
    epoch: int  # epochs (sgd) or boosting iterations (hist_gradient_boosting) finished
    preprocess: Any
    estimator: Any
    best_estimator: Any
    best_epoch: int
    best_loss: float
    rng_state: dict
    history: list[dict]


class Checkpoints:
    """Where training state goes between epochs (any object with save/load/clear)."""

    def save(self, state: TrainingState) -> None:
        """Persist the state atomically."""

    def load(self) -> TrainingState | None:
        """The last saved state, if any."""
        return None

    def clear(self) -> None:
        """Remove the state once the model is stored."""


def window_frame(partitions: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The window's feature partitions as one frame in time order, ties kept in partition order."""
    if not partitions:
        raise TrainingDataError("the training window holds no feature partitions")
    frames = [partitions[key] for key in sorted(partitions)]
    frame = pd.concat(frames, ignore_index=True)
    return frame.sort_values(EVENT_TIME, kind="stable").reset_index(drop=True)


def labelled(frame: pd.DataFrame, contract: Contract) -> pd.DataFrame:
    """Rows whose label is known."""
    return frame[frame[contract.label_name].notna()]


def split_holdout(frame: pd.DataFrame, fraction: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, holdout): the latest `fraction` of time-ordered rows is held out."""
    # Rounded first so that float error (100 * 0.07 = 7.000000000000001) does not add a row.
    n_holdout = max(1, math.ceil(round(len(frame) * fraction, 9)))
    if len(frame) - n_holdout < 1:
        raise TrainingDataError(f"{len(frame)} labelled row(s) are too few to train and evaluate")
    return frame.iloc[:-n_holdout], frame.iloc[-n_holdout:]


def data_version(frame: pd.DataFrame) -> str:
    """Content hash of a frame: equal frames, equal versions."""
    return _digest(pd.util.hash_pandas_object(frame, index=False).to_numpy())


def _digest(row_hashes: np.ndarray) -> str:
    return hashlib.sha256(row_hashes.tobytes()).hexdigest()[:16]


def data_versions(partitions: dict[str, pd.DataFrame]) -> dict[str, str]:
    """`data_version` of each partition, by key in order.

    A row's hash depends on that row alone, so partitions with the same columns and types are
    hashed in one call on their concatenation and the hashes cut back per partition: hashing
    costs about 0.4 ms a column whatever the rows, 28 times over for a 28-day window.
    """
    keys = sorted(partitions)
    layouts = {tuple(partitions[key].dtypes.items()) for key in keys}
    if len(layouts) != 1:
        return {key: data_version(partitions[key]) for key in keys}
    frame = pd.concat([partitions[key] for key in keys], ignore_index=True)
    hashed = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    ends = np.cumsum([len(partitions[key]) for key in keys])
    return {key: _digest(part) for key, part in zip(keys, np.split(hashed, ends[:-1]), strict=True)}


def make_preprocessing(contract: Contract) -> Any:
    """The unfitted preprocessing of the contract's features for its estimator.

    Gradient boosting takes numeric features as they are (it bins them and learns where missing
    values go) and categories as ordinal codes it splits on natively (measured faster and
    better than one-hot columns on flights). The linear estimators need imputation, scaling and
    one-hot encoding.
    """
    # scikit-learn is imported here, not at module level: loading the code location (webserver,
    # daemon, sensors) should not pay the seconds it takes to import.
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

    if isinstance(contract.model, HistGradientBoostingSpec):
        return ColumnTransformer(
            [
                ("numeric", "passthrough", contract.numeric_features),
                (
                    "categorical",
                    OrdinalEncoder(
                        handle_unknown="use_encoded_value",
                        unknown_value=np.nan,
                        encoded_missing_value=np.nan,
                    ),
                    contract.categorical_features,
                ),
            ],
            sparse_threshold=0.0,
        )
    return ColumnTransformer(
        [
            (
                "numeric",
                Pipeline(
                    [("impute", SimpleImputer(strategy="median")), ("scale", StandardScaler())]
                ),
                contract.numeric_features,
            ),
            (
                "categorical",
                Pipeline(
                    [
                        ("impute", SimpleImputer(strategy="constant", fill_value="missing")),
                        ("encode", OneHotEncoder(handle_unknown="ignore", min_frequency=5)),
                    ]
                ),
                contract.categorical_features,
            ),
        ],
        sparse_threshold=0.0,
    )


def make_estimator(contract: Contract) -> Any:
    """The contract's estimator for its task, unfitted, with the contract's settings."""
    spec = contract.model
    seed = contract.training.random_seed
    classification = contract.task == "classification"
    if isinstance(spec, SgdSpec):
        from sklearn.linear_model import SGDClassifier, SGDRegressor

        # No shuffling inside partial_fit: train_model feeds the rows in the order its seeded
        # generator draws, so the model does not depend on how an epoch is cut into calls.
        common = {
            "alpha": spec.alpha,
            "learning_rate": "invscaling",
            "eta0": spec.eta0,
            "shuffle": False,
            "random_state": seed,
        }
        return (
            SGDClassifier(loss="log_loss", **common) if classification else SGDRegressor(**common)
        )
    if isinstance(spec, LinearSpec):
        from sklearn.linear_model import LogisticRegression, Ridge

        if classification:
            return LogisticRegression(
                C=spec.C if spec.C is not None else 1.0,
                class_weight="balanced",
                max_iter=spec.max_iter,
            )
        return Ridge(alpha=spec.alpha if spec.alpha is not None else 1.0)
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    numeric = len(contract.numeric_features)
    categorical = [False] * numeric + [True] * len(contract.categorical_features)
    cls = HistGradientBoostingClassifier if classification else HistGradientBoostingRegressor
    # Early stopping on scikit-learn's stratified random 10 % of the training rows, the same
    # split at every warm-start call. On flights this did better than the latest 10 % of
    # rows, held out of the fit (AUC 0.612 against 0.605, benchmarks/model_quality.py).
    return cls(
        learning_rate=spec.learning_rate,
        max_iter=spec.step,
        max_leaf_nodes=spec.max_leaf_nodes,
        min_samples_leaf=spec.min_samples_leaf,
        l2_regularization=spec.l2_regularization,
        categorical_features=categorical if any(categorical) else None,
        early_stopping=True,
        scoring="loss",
        validation_fraction=VALIDATION_FRACTION,
        n_iter_no_change=spec.patience,
        tol=spec.min_delta,
        warm_start=True,
        random_state=seed,
    )


def _loss(estimator: Any, x: Any, y: np.ndarray, weights: np.ndarray | None, task: str) -> float:
    """Weighted log loss (classification) or mean squared error, as scikit-learn defines them.

    Written out in numpy on the linear score: it runs twice an epoch, and scikit-learn's
    predict and metric functions spend more time validating their inputs than computing.
    `x` comes from `loss_rows`: sparse where one-hot rows are mostly zeros.
    """
    score = x @ estimator.coef_.ravel() + np.ravel(estimator.intercept_)[0]
    if task == "classification":
        # -log(sigmoid(score)) for positives, -log(1 - sigmoid(score)) for negatives, without
        # forming the probability (which rounds to 0 or 1 for large scores).
        losses = np.logaddexp(0.0, score) - y * score
        return float(np.average(losses, weights=weights))
    return float(np.mean((y - score) ** 2))


def loss_rows(x: Any) -> Any:
    """The encoded rows the losses are computed on: sparse when mostly zeros, else as they are.

    One-hot columns make most encoded rows zeros (flights: 116 columns), where the sparse
    product costs a fraction of the dense one; rows of mostly numeric features would only
    grow, by half, as a sparse copy.
    """
    x = np.asarray(x)
    mostly_zeros = x.size > 0 and np.count_nonzero(x) < x.size / 2
    return sparse_rows(x) if mostly_zeros else x


def sparse_rows(x: np.ndarray, block_rows: int = 65_536) -> Any:
    """`scipy.sparse.csr_array(x)` of a dense 2-D array, built a block of rows at a time.

    scipy converts a dense array through index arrays of every element, a temporary of twice
    the result (150 MB for a 1M-row day); here the temporaries are one block's.
    """
    from scipy.sparse import csr_array

    x = np.asarray(x)
    blocks = range(0, len(x), block_rows)
    counts = np.concatenate(
        [np.count_nonzero(x[start : start + block_rows], axis=1) for start in blocks]
        or [np.zeros(0, dtype=np.int64)]
    )
    indptr = np.zeros(len(x) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = np.empty(indptr[-1], dtype=np.int32)
    data = np.empty(indptr[-1], dtype=x.dtype)
    for start in blocks:
        part = x[start : start + block_rows]
        rows, columns = np.nonzero(part)  # row-major: each row's columns in order
        low, high = indptr[start], indptr[start + len(part)]
        indices[low:high] = columns
        data[low:high] = part[rows, columns]
    return csr_array((data, indices, indptr), shape=x.shape)


def _balanced_weights(y: np.ndarray) -> np.ndarray:
    """Per-row weights that give both classes equal total weight (class_weight='balanced')."""
    counts = np.bincount(y, minlength=2).astype("float64")
    return (len(y) / (2.0 * counts))[y]


def fingerprint_of(contract: Contract, data_versions: dict[str, str]) -> str:
    """Identity of a training job: a checkpoint resumes only the same data and settings."""
    # How often checkpoints are written does not change the model: a checkpoint taken at one
    # cadence resumes under another.
    settings = contract.training.model_dump_json(exclude={"checkpoint_seconds"})
    settings += contract.model.model_dump_json()
    text = settings + repr(sorted(data_versions.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass
class _Rows:
    """The encoded rows an estimator learns from and is validated on, with their weights."""

    x_fit: np.ndarray
    y_fit: np.ndarray
    w_fit: np.ndarray | None
    x_val: np.ndarray
    y_val: np.ndarray
    w_val: np.ndarray | None


class _Saver:
    """Saves a state when `checkpoint_seconds` of wall time have passed since the last save."""

    def __init__(self, checkpoints: Checkpoints, seconds: float):
        # Work since this moment is what a kill would lose; it includes fitting the
        # preprocessing.
        self.checkpoints = checkpoints
        self.seconds = seconds
        self.last = time.monotonic()

    def maybe_save(self, state: TrainingState) -> None:
        # Wall time, not CPU time: a kill loses the wall time since the last checkpoint. Every
        # finished epoch or step is a consistent state to resume from, so skipping some keeps
        # resume exact.
        if time.monotonic() - self.last >= self.seconds:
            self.checkpoints.save(state)
            self.last = time.monotonic()


def train_model(
    partitions: dict[str, pd.DataFrame],
    contract: Contract,
    checkpoints: Checkpoints | None = None,
    on_epoch: Callable[[dict], None] | None = None,
) -> TrainedModel:
    """Train the contract's pipeline on a window of feature partitions, checkpointing as it goes.

    `on_epoch` is called with each history record (an epoch, a boosting step, or the one fit).
    """
    from sklearn.pipeline import Pipeline

    t = contract.training
    saver = _Saver(checkpoints or Checkpoints(), t.checkpoint_seconds)
    versions = data_versions(partitions)
    fingerprint = fingerprint_of(contract, versions)
    frame = labelled(window_frame(partitions), contract)
    train, holdout = split_holdout(frame, t.holdout_fraction)
    label = contract.label_name
    classification = contract.task == "classification"
    y_all = train[label].astype("int64" if classification else "float64").to_numpy()
    if classification and len(np.unique(y_all)) < 2:
        raise TrainingDataError(
            f"the training rows of window {min(partitions)}..{max(partitions)} hold a single "
            f"class ({y_all[0]}); a classifier needs both"
        )
    fit_part, val_part = (
        split_holdout(train, VALIDATION_FRACTION) if len(train) > 1 else (train, train)
    )
    spec = contract.model
    if not isinstance(spec, SgdSpec):
        # Boosting validates on scikit-learn's own split of the rows it is given, and a
        # linear fit has no early stopping: both learn from every training row, the latest
        # included (leaving out the latest 10 % cost up to 0.04 of flights AUC against a plain
        # scikit-learn fit).
        fit_part = train
    features = contract.numeric_features + contract.categorical_features
    y_fit, y_val = y_all[: len(fit_part)], y_all[len(y_all) - len(val_part) :]
    w_fit = _balanced_weights(y_fit) if classification and len(np.unique(y_fit)) == 2 else None
    w_val = _balanced_weights(y_val) if classification and len(np.unique(y_val)) == 2 else None

    state = saver.checkpoints.load()
    if state is not None and state.fingerprint != fingerprint:
        state = None  # inputs or settings changed since that checkpoint: start afresh
    resumed_from = state.epoch if state is not None else 0
    if state is None:
        preprocess = make_preprocessing(contract)
        # The same rows as fit then transform, without encoding the training rows twice.
        x_fit = preprocess.fit_transform(fit_part[features])
        state = TrainingState(
            fingerprint=fingerprint,
            epoch=0,
            preprocess=preprocess,
            estimator=make_estimator(contract),
            best_estimator=None,
            best_epoch=0,
            best_loss=math.inf,
            rng_state=dict(np.random.default_rng(t.random_seed).bit_generator.state),
            history=[],
        )
    else:
        x_fit = state.preprocess.transform(fit_part[features])
    # Float64 in C order is what the estimators work on: they then check rows without copying.
    rows = _Rows(
        np.ascontiguousarray(x_fit, dtype=np.float64),
        y_fit,
        w_fit,
        np.ascontiguousarray(state.preprocess.transform(val_part[features]), dtype=np.float64),
        y_val,
        w_val,
    )
    notify = on_epoch or (lambda record: None)
    if isinstance(spec, SgdSpec):
        _train_sgd(state, rows, spec, contract.task, saver, notify)
        initial_loss = math.log(2.0) if classification else float(np.mean(y_fit**2))
    elif isinstance(spec, HistGradientBoostingSpec):
        _train_boosting(state, rows, spec, saver, notify)
        initial_loss = -float(state.estimator.train_score_[0])
    else:
        _train_linear(state, rows, spec, contract.task, notify)
        initial_loss = math.log(2.0) if classification else float(np.mean(y_fit**2))

    pipeline = Pipeline([("preprocess", state.preprocess), ("estimator", state.best_estimator)])
    return TrainedModel(
        pipeline=pipeline,
        task=contract.task,
        features=features,
        label=label,
        window=sorted(partitions),
        train_rows=len(train),
        holdout_rows=len(holdout),
        holdout_start=str(holdout[EVENT_TIME].iloc[0]),
        data_versions=versions,
        history=state.history,
        best_epoch=state.best_epoch,
        resumed_from_epoch=resumed_from,
        initial_loss=initial_loss,
        estimator=spec.estimator,
    )


def _train_sgd(
    state: TrainingState,
    rows: _Rows,
    spec: SgdSpec,
    task: str,
    saver: _Saver,
    notify: Callable[[dict], None],
) -> None:
    """Epochs of partial_fit in seeded orders, keeping the estimator of the best epoch."""
    loss_fit, loss_val = loss_rows(rows.x_fit), loss_rows(rows.x_val)
    rng = np.random.default_rng()
    rng.bit_generator.state = state.rng_state
    classes = np.array([0, 1]) if task == "classification" else None
    y_fit, w_fit = rows.y_fit, rows.w_fit
    while state.epoch < spec.max_epochs and state.epoch - state.best_epoch < spec.patience:
        order = rng.permutation(len(y_fit))
        # SGD updates the weights row by row in `order` whatever the batch: a batch only bounds
        # the rows copied for one partial_fit call, which costs milliseconds of validation.
        for start in range(0, len(order), spec.batch_size):
            batch = order[start : start + spec.batch_size]
            weights = w_fit[batch] if w_fit is not None else None
            if classes is not None:
                state.estimator.partial_fit(
                    rows.x_fit[batch], y_fit[batch], classes=classes, sample_weight=weights
                )
            else:
                state.estimator.partial_fit(rows.x_fit[batch], y_fit[batch])
        state.epoch += 1
        record = {
            "epoch": state.epoch,
            "train_loss": _loss(state.estimator, loss_fit, y_fit, w_fit, task),
            "validation_loss": _loss(state.estimator, loss_val, rows.y_val, rows.w_val, task),
        }
        state.history.append(record)
        if record["validation_loss"] < state.best_loss - spec.min_delta:
            state.best_loss = record["validation_loss"]
            state.best_epoch = state.epoch
            state.best_estimator = copy.deepcopy(state.estimator)
        state.rng_state = dict(rng.bit_generator.state)
        # No save is forced after the last epoch: the model is stored right after it.
        saver.maybe_save(state)
        notify(record)


def _boosting_done(estimator: Any, max_iter: int) -> bool:
    """Whether boosting reached max_iter or its early stopping ended it."""
    if not hasattr(estimator, "n_iter_"):
        return False
    return estimator.n_iter_ >= max_iter or estimator.n_iter_ < estimator.max_iter


def _train_boosting(
    state: TrainingState,
    rows: _Rows,
    spec: HistGradientBoostingSpec,
    saver: _Saver,
    notify: Callable[[dict], None],
) -> None:
    """Boosting iterations `step` at a time (warm_start), until early stopping or max_iter.

    scikit-learn records the loss of every iteration on the training rows and its validation
    split (`train_score_`, `validation_score_`, negated losses), and its early stopping ends
    the fit when the validation loss has not improved by `min_delta` for `patience`
    iterations; the model is the last iteration's, as a plain fit's.
    """
    estimator = state.estimator
    while not _boosting_done(estimator, spec.max_iter):
        estimator.set_params(max_iter=min(state.epoch + spec.step, spec.max_iter))
        with openmp_threads(spec.threads):
            estimator.fit(
                rows.x_fit,
                rows.y_fit,
                sample_weight=rows.w_fit,
            )
        done = state.epoch
        state.epoch = int(estimator.n_iter_)
        # Index 0 of the scores is the constant prediction before the first iteration.
        for iteration in range(done + 1, state.epoch + 1):
            record = {
                "iteration": iteration,
                "train_loss": -float(estimator.train_score_[iteration]),
                "validation_loss": -float(estimator.validation_score_[iteration]),
            }
            state.history.append(record)
            notify(record)
        best = min(state.history, key=lambda h: h["validation_loss"])
        state.best_epoch, state.best_loss = best["iteration"], best["validation_loss"]
        state.best_estimator = estimator
        if not _boosting_done(estimator, spec.max_iter):
            saver.maybe_save(state)


def _train_linear(
    state: TrainingState,
    rows: _Rows,
    spec: LinearSpec,
    task: str,
    notify: Callable[[dict], None],
) -> None:
    """One fit: Ridge solves exactly, LogisticRegression (class_weight balanced) with lbfgs."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    estimator = state.estimator
    with warnings.catch_warnings():
        # Not converging is reported by the loss_plateau check, with what to change.
        warnings.simplefilter("ignore", ConvergenceWarning)
        estimator.fit(rows.x_fit, rows.y_fit)
    # Ridge's direct solvers report no iterations: one exact solve.
    n_iter = getattr(estimator, "n_iter_", None)
    iterations = int(np.max(n_iter)) if n_iter is not None else 1
    converged = task != "classification" or iterations < spec.max_iter
    record = {
        "iteration": iterations,
        "train_loss": _loss(estimator, loss_rows(rows.x_fit), rows.y_fit, rows.w_fit, task),
        "validation_loss": _loss(estimator, loss_rows(rows.x_val), rows.y_val, rows.w_val, task),
        "converged": converged,
    }
    state.history.append(record)
    state.epoch = state.best_epoch = iterations
    state.best_loss = record["validation_loss"]
    state.best_estimator = estimator
    notify(record)
