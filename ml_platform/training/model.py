"""The trained model: a scikit-learn pipeline, checkpointed while it learns.

The window is read a day at a time (`training.window`), so training holds about one day's
frame plus the model (and bounded caches) however long the window. Its labelled rows, ordered
by day then event time, are split in time: the latest `holdout_fraction` of them is held out for
evaluation and never trained on. The contract's `model` section picks the estimator:

- `sgd`: imputation (the mean), scaling and one-hot encoding fitted from per-day statistics,
  then SGD learns epoch by epoch with `partial_fit`, visiting the days in an order drawn from a
  seeded generator and each day's rows in an order drawn next, with early stopping on the
  validation slice, the latest 10 % of the training rows, which it does not learn from;
- `hist_gradient_boosting`: numeric features as they are (missing values handled natively) and
  categorical ones ordinal-encoded and split natively; boosting iterations are added `step` at
  a time with `warm_start`, with scikit-learn's early stopping on its own random 10 % of the
  training rows;
- `linear`: imputation (the median), scaling and one-hot encoding, then `LogisticRegression`
  or `Ridge` solved in one fit of at most seconds, so it has no checkpoint: a killed run fits
  again, which ends with the same model. Its validation loss, on the latest 10 %, is in-sample.

Boosting and `linear` need their rows at once: they learn from every training row up to the
contract's `training.max_training_rows`, else from a sample of that many, stratified by day
(and class), drawn a day at a time.

After an epoch or boosting step that ends at least `checkpoint_seconds` after the last
checkpoint (or the start), the whole state (preprocessing, estimator, best estimator, generator
state, loss history) is written atomically, so a killed run resumes from there and ends with
the model an uninterrupted run would have produced.
"""

import collections
import contextlib
import copy
import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from ml_platform.platform.threads import thread_pools
from ml_platform.training.window import (
    MIN_CLASS_ROWS,
    VALIDATION_FRACTION,
    LabelSummary,
    Segment,
    TrainingDataError,
    WindowSplit,
    chunked,
    holdout_count,
    label_summary,
    overflowing_features,
    scan_window,
    segment_rows,
    split_window,
    stratified_sample,
    stream,
)

if TYPE_CHECKING:
    from sklearn.compose import ColumnTransformer
    from sklearn.pipeline import Pipeline

# What a missing category becomes before encoding.
MISSING_CATEGORY = "missing"
# A category seen in fewer training rows than this is one-hot encoded as "infrequent".
MIN_CATEGORY_ROWS = 5
# Categories of a feature gradient boosting splits on natively: scikit-learn refuses a feature
# with more than its `max_bins` (255). Above it, the rarest categories share one code, as
# "infrequent" ones do in one-hot encoding.
BOOSTING_CATEGORIES = 255
# Encoded rows SGD keeps in memory between epochs. Rows beyond it are read and encoded again
# each epoch (the same values: the encoding is fixed once fitted), so training holds at most
# this plus one day. A 28-day flights window (sparse one-hot rows) and a 28-day window of 20k
# synthetic rows a day fit; a window of 1M-row days re-reads most of its days every epoch.
ENCODED_CACHE_BYTES = 128 * 1024 * 1024
# Rows fitted or encoded in one call: each call costs about 15 ms whatever its rows (a flights
# day is 900), so small days go several at a time.
CHUNK_ROWS = 65_536


@contextlib.contextmanager
def openmp_threads(threads: int) -> Iterator[None]:
    """Run gradient boosting's OpenMP loops on at most `threads` threads.

    scikit-learn's boosting uses every core by default. Where the cores are shared (the
    platform's steps run side by side) its threads wait on each other: on a loaded 2-core
    machine a 2,000-row fit took 19 s of wall time on all threads and 0.6 s on one. Predicting
    a day's rows is too short to gain from threads, so prediction uses one.
    """
    with thread_pools().limit(limits=threads, user_api="openmp"):
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
    # Training rows `linear` or boosting learnt from when the window held more than the
    # contract's `training.max_training_rows` (a stratified sample); None: every one.
    sampled_rows: int | None = None
    # The MLflow run of this training (params, losses per epoch); None: not tracked.
    mlflow_run_id: str | None = None
    # How each feature was computed when the model trained (`Contract.feature_definitions`):
    # a later contract computing one otherwise cannot feed it. None: trained before they were
    # recorded (only the kinds its preprocessing treats them as are known).
    feature_definitions: dict[str, dict[str, str]] | None = None

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


def window_frame(partitions: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The window as one frame in the order training reads it: by day, then event time.

    For small windows (tests, benchmarks); the platform's steps read the window a day at a
    time (`training.window`).
    """
    if not partitions:
        raise TrainingDataError("the training window holds no feature partitions")
    frames = [partitions[key].sort_values(EVENT_TIME, kind="stable") for key in sorted(partitions)]
    return pd.concat(frames, ignore_index=True)


def labelled(frame: pd.DataFrame, contract: Contract) -> pd.DataFrame:
    """Rows whose label is known."""
    return frame[frame[contract.label_name].notna()]


def split_holdout(frame: pd.DataFrame, fraction: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, holdout): the latest `fraction` of time-ordered rows is held out."""
    n_holdout = holdout_count(len(frame), fraction)
    return frame.iloc[:-n_holdout], frame.iloc[-n_holdout:]


def make_preprocessing(contract: Contract) -> Any:
    """The unfitted preprocessing of the contract's features for its estimator.

    Gradient boosting takes numeric features as they are (it bins them and learns where missing
    values go) and categories as ordinal codes it splits on natively (measured faster and
    better than one-hot columns on flights). The linear estimators need imputation, scaling and
    one-hot encoding. SGD's is fitted a day at a time (`fit_streamed_preprocessing`), so a
    missing value becomes the training rows' mean: a median has no exact form from per-day
    statistics. `linear` fits on the rows it holds, and imputes the median.
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
                        max_categories=BOOSTING_CATEGORIES,
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
                    [
                        (
                            "impute",
                            SimpleImputer(
                                strategy="mean" if isinstance(contract.model, SgdSpec) else "median"
                            ),
                        ),
                        ("scale", StandardScaler()),
                    ]
                ),
                contract.numeric_features,
            ),
            (
                "categorical",
                Pipeline(
                    [
                        (
                            "impute",
                            SimpleImputer(strategy="constant", fill_value=MISSING_CATEGORY),
                        ),
                        (
                            "encode",
                            OneHotEncoder(handle_unknown="ignore", min_frequency=MIN_CATEGORY_ROWS),
                        ),
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


def _loss_sum(
    estimator: Any, x: Any, y: np.ndarray, weights: np.ndarray | None, task: str
) -> tuple[float, float]:
    """(weighted sum of losses, sum of weights) of some rows: log loss or squared error.

    Their ratio over all rows is scikit-learn's weighted log loss or mean squared error; sums
    let the rows come a day at a time. Written out in numpy on the linear score: it runs twice
    an epoch, and scikit-learn's predict and metric functions spend more time validating their
    inputs than computing. `x` comes from `loss_rows`: sparse where one-hot rows are mostly
    zeros.
    """
    score = x @ estimator.coef_.ravel() + np.ravel(estimator.intercept_)[0]
    # -log(sigmoid(score)) for positives, -log(1 - sigmoid(score)) for negatives, without
    # forming the probability (which rounds to 0 or 1 for large scores).
    losses = np.logaddexp(0.0, score) - y * score if task == "classification" else (y - score) ** 2
    if weights is None:
        return float(losses.sum()), float(len(losses))
    return float(losses @ weights), float(weights.sum())


def _loss(estimator: Any, x: Any, y: np.ndarray, weights: np.ndarray | None, task: str) -> float:
    """Weighted log loss (classification) or mean squared error of rows held at once."""
    total, weight = _loss_sum(estimator, x, y, weights, task)
    return total / weight


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


def class_weights(labels: LabelSummary) -> np.ndarray | None:
    """The weight of a row of class 0 and of class 1 that gives both classes equal total weight.

    scikit-learn's class_weight='balanced'; None when a class is absent from the rows.
    """
    counts = labels.class_counts()
    return None if (counts == 0).any() else labels.rows / (2.0 * counts)


def _balanced_weights(y: np.ndarray) -> np.ndarray | None:
    """Per-row `class_weights` of labels held at once (None when a class is absent)."""
    weights = class_weights(LabelSummary.of(y))
    return weights[y] if weights is not None else None


# Changed whenever training visits rows or fits preprocessing differently.
CHECKPOINT_FORMAT = "streamed-days-1"


def fingerprint_of(contract: Contract, data_versions: dict[str, str]) -> str:
    """Identity of a training job: a checkpoint resumes only the same data and settings."""
    # How often checkpoints are written does not change the model: a checkpoint taken at one
    # cadence resumes under another.
    settings = contract.training.model_dump_json(exclude={"checkpoint_seconds"})
    settings += contract.model.model_dump_json()
    # What the model reads and predicts: a feature added, dropped or turned categorical, or
    # another label, leaves the stored days (so their versions) unchanged, while the saved
    # preprocessing and estimator were fitted on the earlier columns.
    read = (contract.numeric_features, contract.categorical_features, contract.label_name)
    settings += repr((*read, contract.task))
    # The training algorithm itself: a checkpoint of an earlier release (another row order or
    # imputer) must not be resumed by this one.
    text = CHECKPOINT_FORMAT + settings + repr(sorted(data_versions.items()))
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


def fit_streamed_preprocessing(
    contract: Contract, frames: Callable[[], Iterator[pd.DataFrame]]
) -> "ColumnTransformer":
    """SGD's preprocessing, fitted from the training rows a day at a time (`frames()`).

    Equal, up to rounding, to `make_preprocessing(contract).fit` on all the rows at once. A
    first pass sums each numeric column's present values and counts them (the mean imputer's
    statistics) and counts each category (a missing value as the category 'missing', as the
    imputer fills it). The ColumnTransformer is then fitted on a summary frame with exactly
    those statistics: each numeric column's mean in one row, and each category as often as
    its count, up to `MIN_CATEGORY_ROWS` (which decides the same frequent and infrequent
    categories as the full count). A second pass fits the scaler on each day's imputed rows
    with `StandardScaler.partial_fit`.
    """
    from sklearn.preprocessing import StandardScaler

    numeric, categorical = contract.numeric_features, contract.categorical_features
    sums = pd.Series(0.0, index=numeric)
    present = pd.Series(0, index=numeric)
    counts: dict[str, collections.Counter] = {c: collections.Counter() for c in categorical}
    dtypes: dict[str, Any] = {}
    for frame in frames():
        values = frame[numeric].astype("float64")
        sums += values.sum()
        present += values.count()
        for column in categorical:
            dtypes[column] = frame[column].dtype
            filled = frame[column].fillna(MISSING_CATEGORY)
            counts[column].update(filled.value_counts().to_dict())
    summary = _summary_frame(contract, sums / present.where(present > 0), counts, dtypes)
    preprocess = make_preprocessing(contract).fit(summary)
    if numeric:
        steps = preprocess.named_transformers_["numeric"]
        imputer = steps.named_steps["impute"]
        scaler = StandardScaler()
        for frame in frames():
            scaler.partial_fit(imputer.transform(frame[numeric]))
        steps.steps[-1] = ("scale", scaler)
    return preprocess


def _summary_frame(
    contract: Contract,
    means: pd.Series,
    counts: dict[str, collections.Counter],
    dtypes: dict[str, Any],
) -> pd.DataFrame:
    """A small frame the imputers and encoder fit to the statistics of all the training rows.

    Each category appears min(count, MIN_CATEGORY_ROWS) times. Columns are made as long as
    the longest by repeating a frequent category, which stays frequent: a column needing rows
    has one, since a column of infrequent categories only lists every row of the training
    rows, which is the most any column lists. A numeric column holds its mean in its first row
    (NaN below, which the imputer skips), or only NaN when no row had a value, which the
    imputer then drops as fitting on the rows would.
    """
    repeats = {
        column: {value: min(n, MIN_CATEGORY_ROWS) for value, n in counter.items()}
        for column, counter in counts.items()
    }
    length = max([sum(r.values()) for r in repeats.values()], default=1)
    columns: dict[str, Any] = {}
    for column in contract.numeric_features:
        values = np.full(length, np.nan)
        values[0] = means[column]
        columns[column] = values
    for column, kept in repeats.items():
        short = length - sum(kept.values())
        if short:
            frequent = next(v for v, n in counts[column].items() if n >= MIN_CATEGORY_ROWS)
            kept[frequent] += short
        listed = [value for value, n in kept.items() for _ in range(n)]
        columns[column] = pd.Series(listed, dtype=dtypes[column])
    return pd.DataFrame(columns)[contract.numeric_features + contract.categorical_features]


class _Budget:
    """Bytes of encoded rows that may still be kept in memory, and whether some did not fit."""

    def __init__(self, left: int):
        self.left = left
        self.spent = False


class _EncodedRows:
    """Segments' encoded rows, labels and weights, encoded when first read, kept within a budget.

    Kept segments are encoded once; the others are read from their day and encoded again when
    asked for, to the same values. Rows are kept as `loss_rows` makes them (sparse when mostly
    zeros): a batch is made dense again before scikit-learn learns from it, since SGD treats
    sparse input differently (it damps the intercept's updates).
    """

    def __init__(
        self,
        partitions: Mapping[str, pd.DataFrame],
        segments: Sequence[Segment],
        preprocess: Any,
        contract: Contract,
        weights: np.ndarray | None,
        budget: _Budget,
    ):
        self.partitions = partitions
        self.segments = list(segments)
        self.preprocess = preprocess
        self.contract = contract
        self.weights = weights
        self.budget = budget
        self.kept: dict[int, tuple[Any, np.ndarray, np.ndarray | None]] = {}

    def __len__(self) -> int:
        return len(self.segments)

    def get(self, index: int) -> tuple[Any, np.ndarray, np.ndarray | None]:
        """(encoded rows, labels, weights or None) of segment `index`.

        Encoded with the segments after it up to `CHUNK_ROWS` rows while the budget keeps
        them; once it cannot, one segment at a time.
        """
        if index in self.kept:
            return self.kept[index]
        run = [index]
        rows = self.segments[index].rows
        while (
            not self.budget.spent
            and rows < CHUNK_ROWS
            and run[-1] + 1 < len(self.segments)
            and run[-1] + 1 not in self.kept
        ):
            run.append(run[-1] + 1)
            rows += self.segments[run[-1]].rows
        contract = self.contract
        label = contract.label_name
        frames = [segment_rows(self.partitions, self.segments[i], label) for i in run]
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        features = contract.numeric_features + contract.categorical_features
        encoded = self.preprocess.transform(frame[features])
        x = loss_rows(np.ascontiguousarray(encoded, dtype=np.float64))
        dtype = "int64" if contract.task == "classification" else "float64"
        y = frame[label].astype(dtype).to_numpy()
        w = self.weights[y] if self.weights is not None else None
        size = sum(_nbytes(part) for part in (x, y, w))
        ends = np.cumsum([len(f) for f in frames])
        found = {}
        for i, start, stop in zip(run, ends - [len(f) for f in frames], ends, strict=True):
            found[i] = (x[start:stop], y[start:stop], w[start:stop] if w is not None else None)
        if size <= self.budget.left:
            self.kept.update(found)
            self.budget.left -= size
        else:
            self.budget.spent = True
        return found[index]

    def loss(self, estimator: Any, task: str) -> float:
        """The estimator's mean (weighted) loss over every segment's rows."""
        total = weight = 0.0
        for index in range(len(self)):
            x, y, w = self.get(index)
            part, part_weight = _loss_sum(estimator, x, y, w, task)
            total += part
            weight += part_weight
        return total / weight


def _nbytes(value: Any) -> int:
    """Memory held by an array, a sparse array or None."""
    if value is None:
        return 0
    if hasattr(value, "indptr"):
        return int(value.data.nbytes + value.indices.nbytes + value.indptr.nbytes)
    return int(value.nbytes)


def _new_state(fingerprint: str, preprocess: Any, contract: Contract) -> TrainingState:
    """The state of a training that has not learnt yet."""
    return TrainingState(
        fingerprint=fingerprint,
        epoch=0,
        preprocess=preprocess,
        estimator=make_estimator(contract),
        best_estimator=None,
        best_epoch=0,
        best_loss=math.inf,
        rng_state=dict(np.random.default_rng(contract.training.random_seed).bit_generator.state),
        history=[],
    )


def label_rule(contract: Contract) -> str:
    """The label's rule in words, e.g. 'arr_delay > 15' (a bool source: 'churned == true')."""
    rule, source = contract.label.rule, contract.label.source
    return f"{source} == true" if rule is None else f"{source} {rule.op} {rule.value:g}"


def train_model(
    partitions: Mapping[str, pd.DataFrame],
    contract: Contract,
    checkpoints: Checkpoints | None = None,
    on_epoch: Callable[[dict], None] | None = None,
) -> TrainedModel:
    """Train the contract's pipeline on a window of feature partitions, checkpointing as it goes.

    The window is read a day at a time (`training.window`), so memory holds about one day
    however long the window. SGD learns in passes over the days. `linear` and boosting learn
    from training rows held at once: all of them up to the contract's
    `training.max_training_rows`, else a sample of that many, stratified by day (and class).
    `on_epoch` is called with each history record (an epoch, a boosting step, or the one fit).
    """
    from sklearn.pipeline import Pipeline

    t = contract.training
    saver = _Saver(checkpoints or Checkpoints(), t.checkpoint_seconds)
    label = contract.label_name
    scan = scan_window(partitions, label, features=contract.feature_definitions)
    fingerprint = fingerprint_of(contract, scan.versions)
    try:
        split = split_window(scan, t.holdout_fraction)
    except TrainingDataError as exc:
        # Which window and column: a label column all missing (not yet known, or its source
        # column empty) reads as "0 labelled row(s)".
        raise TrainingDataError(
            f"window {scan.days[0]}..{scan.days[-1]} ({len(scan.days)} feature partition(s)): "
            f"{exc}; its rows with a {label} value per day: "
            f"{dict(zip(scan.days, scan.rows, strict=True))}"
        ) from exc
    classification = contract.task == "classification"
    train_labels = label_summary(partitions, scan, split.train, label)
    if classification and (train_labels.class_counts() == 0).any():
        present = int(train_labels.total > 0)
        # A rule whose threshold no value reaches reads the same as a window of one class.
        checked = (
            "the label's rule (label.rule) against the values"
            if contract.label.rule is not None
            else "the values"
        )
        raise TrainingDataError(
            f"the {train_labels.rows} training rows of window {scan.days[0]}..{scan.days[-1]} "
            f"hold a single class ({present}): {label} is {present} on every one "
            f"({label_rule(contract)} {'holds on all' if present else 'holds on none'} of "
            f"them); a classifier needs both. Check {checked} of {contract.label.source}, or "
            "lengthen the window (training.window_days) to take in rows of the other class"
        )
    if not math.isfinite(train_labels.squares):
        # A finite but extreme label (1e308) overflows every fit's squared loss.
        raise TrainingDataError(
            f"the training labels of window {scan.days[0]}..{scan.days[-1]} are too large to "
            f"fit: their squares overflow. Bound {contract.label.source} in the contract "
            "(columns[].min / max) so the gate rejects such values, fix the file upstream and "
            "re-land the day"
        )
    spec = contract.model
    if not isinstance(spec, HistGradientBoostingSpec):
        # Boosting bins values, infinity included; the linear estimators scale them.
        numeric = contract.numeric_features
        if overflowing := overflowing_features(partitions, scan.days, label, numeric):
            sources = {f.name: f.source for f in contract.features}
            listed = "; ".join(
                f"{column} (from {sources[column]}) on {', '.join(days)}"
                for column, days in overflowing.items()
            )
            raise TrainingDataError(
                f"numeric features of window {scan.days[0]}..{scan.days[-1]} hold infinite "
                f"values or values whose squares overflow, which {spec.estimator} cannot scale: "
                f"{listed}. Bound those columns in the contract (columns[].min / max) so the "
                "gate rejects such values, fix the files upstream and re-land the days"
            )
    state = saver.checkpoints.load()
    if state is not None and state.fingerprint != fingerprint:
        state = None  # inputs or settings changed since that checkpoint: start afresh
    resumed_from = state.epoch if state is not None else 0
    notify = on_epoch or (lambda record: None)
    sampled: int | None = None
    if isinstance(spec, SgdSpec):
        state, initial_loss = _train_sgd(
            partitions, split, contract, state, fingerprint, saver, notify
        )
    else:
        if split.train_rows > t.max_training_rows:
            sampled = t.max_training_rows
            train = stratified_sample(
                partitions, scan, split.train, label, sampled, t.random_seed, classification
            )
        else:
            train = pd.concat(list(stream(partitions, split.train, label)), ignore_index=True)
        state, initial_loss = _train_held_rows(train, contract, state, fingerprint, saver, notify)
    holdout_start = segment_rows(partitions, split.holdout[0], label)[EVENT_TIME].iloc[0]
    pipeline = Pipeline([("preprocess", state.preprocess), ("estimator", state.best_estimator)])
    return TrainedModel(
        pipeline=pipeline,
        task=contract.task,
        features=contract.numeric_features + contract.categorical_features,
        label=label,
        window=scan.days,
        train_rows=split.train_rows,
        holdout_rows=split.holdout_rows,
        holdout_start=str(holdout_start),
        data_versions=scan.versions,
        history=state.history,
        best_epoch=state.best_epoch,
        resumed_from_epoch=resumed_from,
        initial_loss=initial_loss,
        estimator=spec.estimator,
        sampled_rows=sampled,
        feature_definitions=contract.feature_definitions,
    )


def _train_held_rows(
    train: pd.DataFrame,
    contract: Contract,
    state: TrainingState | None,
    fingerprint: str,
    saver: _Saver,
    notify: Callable[[dict], None],
) -> tuple[TrainingState, float]:
    """`linear` or boosting on training rows held at once; (final state, untrained loss).

    Boosting validates on scikit-learn's own split of the rows it is given, and a linear fit
    has no early stopping: both learn from every training row, the latest included (leaving
    out the latest 10 % cost up to 0.04 of flights AUC against a plain scikit-learn fit). The
    linear model's validation loss is on the latest 10 % of them, in-sample.
    """
    spec = contract.model
    classification = contract.task == "classification"
    features = contract.numeric_features + contract.categorical_features
    y_fit = train[contract.label_name].astype("int64" if classification else "float64").to_numpy()
    if classification and isinstance(spec, HistGradientBoostingSpec):
        # Boosting's early stopping draws a stratified validation split of
        # ceil(VALIDATION_FRACTION * rows) rows, which scikit-learn refuses unless it holds a
        # row of each class and leaves one of each to train on.
        rows_of_class = np.bincount(y_fit, minlength=2)
        validation_rows = math.ceil(VALIDATION_FRACTION * len(y_fit))
        if rows_of_class.min() < MIN_CLASS_ROWS or validation_rows < 2:
            raise TrainingDataError(
                f"the {len(y_fit)} training rows gradient boosting learns from "
                f"({rows_of_class[0]} of class 0, {rows_of_class[1]} of class 1) are too few "
                "for its early stopping, which splits off a validation share holding each "
                f"class: it needs {MIN_CLASS_ROWS} rows of each class and "
                f"{int(1 / VALIDATION_FRACTION) + 1} rows. Lengthen the window (training."
                "window_days), raise training.max_training_rows if it sampled them, or use "
                "model.estimator linear or sgd"
            )
    if isinstance(spec, HistGradientBoostingSpec) and len(y_fit) < 2:
        # A regressor's early stopping splits off a validation row too: scikit-learn refuses
        # one row (its train set would be empty), which retrying cannot change.
        raise TrainingDataError(
            f"the {len(y_fit)} training row gradient boosting learns from is too few for its "
            "early stopping, which splits off a validation row and needs one more to learn "
            "from: it needs 2 rows. Lengthen the window (training.window_days), wait for more "
            "labelled rows, or use model.estimator linear or sgd"
        )
    validation = 0
    if len(train) > 1:
        validation = len(train) - holdout_count(len(train), VALIDATION_FRACTION)
    y_val = y_fit[validation:]
    if state is None:
        preprocess = make_preprocessing(contract)
        # The same rows as fit then transform, without encoding the training rows twice.
        x_fit = preprocess.fit_transform(train[features])
        state = _new_state(fingerprint, preprocess, contract)
    else:
        x_fit = state.preprocess.transform(train[features])
    # Float64 in C order is what the estimators work on: they then check rows without copying.
    x_fit = np.ascontiguousarray(x_fit, dtype=np.float64)
    rows = _Rows(
        x_fit,
        y_fit,
        _balanced_weights(y_fit) if classification else None,
        x_fit[validation:],
        y_val,
        _balanced_weights(y_val) if classification else None,
    )
    if isinstance(spec, HistGradientBoostingSpec):
        _train_boosting(state, rows, spec, saver, notify)
        return state, -float(state.estimator.train_score_[0])
    assert isinstance(spec, LinearSpec)
    _train_linear(state, rows, spec, contract.task, notify)
    return state, math.log(2.0) if classification else float(np.mean(y_fit**2))


def _train_sgd(
    partitions: Mapping[str, pd.DataFrame],
    split: WindowSplit,
    contract: Contract,
    state: TrainingState | None,
    fingerprint: str,
    saver: _Saver,
    notify: Callable[[dict], None],
) -> tuple[TrainingState, float]:
    """Epochs of partial_fit over the days, keeping the estimator of the best epoch.

    An epoch visits the training days in an order drawn from the run's seeded generator and,
    within each day, its rows in an order drawn next; the train and validation losses are
    summed over the days. The generator's state is saved with each epoch, so a resumed run
    draws what an uninterrupted one would. Returns the final state and the untrained loss.
    """
    from scipy.sparse import issparse

    spec = contract.model
    assert isinstance(spec, SgdSpec)
    task, label = contract.task, contract.label_name
    classification = task == "classification"
    fit_labels = label_summary(partitions, split.scan, split.fit, label)
    val_labels = label_summary(partitions, split.scan, split.validation, label)
    if classification and (fit_labels.class_counts() == 0).any():
        days = split.scan.days
        raise TrainingDataError(
            f"the {fit_labels.rows} training rows SGD learns from in window {days[0]}.."
            f"{days[-1]} hold a single class ({int(fit_labels.total > 0)}): the other class is "
            "only in its validation slice (the latest 10 % of the training rows), and a "
            "classifier needs both. Lengthen the window (training.window_days) or use "
            "model.estimator linear or hist_gradient_boosting, which learn from every training row"
        )
    if state is None:
        preprocess = fit_streamed_preprocessing(
            contract, lambda: chunked(stream(partitions, split.fit, label), CHUNK_ROWS)
        )
        state = _new_state(fingerprint, preprocess, contract)
    budget = _Budget(ENCODED_CACHE_BYTES)
    fit, val = (
        _EncodedRows(
            partitions,
            segments,
            state.preprocess,
            contract,
            class_weights(labels) if classification else None,
            budget,
        )
        for segments, labels in ((split.fit, fit_labels), (split.validation, val_labels))
    )
    rng = np.random.default_rng()
    rng.bit_generator.state = state.rng_state
    classes = np.array([0, 1]) if classification else None

    def learn(batch: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]) -> None:
        rows = np.concatenate([part[0] for part in batch])
        y = np.concatenate([part[1] for part in batch])
        if classes is None:
            state.estimator.partial_fit(rows, y)
            return
        weights = [part[2] for part in batch if part[2] is not None]
        w = np.concatenate(weights) if weights else None
        state.estimator.partial_fit(rows, y, classes=classes, sample_weight=w)

    while state.epoch < spec.max_epochs and state.epoch - state.best_epoch < spec.patience:
        # SGD updates the weights row by row in the epoch's order whatever the batch: a batch
        # only bounds the rows copied for one partial_fit call, which costs milliseconds of
        # validation, so a batch gathers `batch_size` rows across days, as a batch of the
        # whole epoch's rows in the same order would.
        batch: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
        room = spec.batch_size
        for day in rng.permutation(len(fit)):
            x, y, w = fit.get(int(day))
            order = rng.permutation(len(y))
            start = 0
            while start < len(order):
                part = order[start : start + room]
                rows = x[part].toarray() if issparse(x) else x[part]
                batch.append((rows, y[part], w[part] if w is not None else None))
                start += len(part)
                room -= len(part)
                if room == 0:
                    learn(batch)
                    batch, room = [], spec.batch_size
        if batch:
            learn(batch)
        state.epoch += 1
        record = {
            "epoch": state.epoch,
            "train_loss": fit.loss(state.estimator, task),
            "validation_loss": val.loss(state.estimator, task),
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
    initial_loss = math.log(2.0) if classification else fit_labels.squares / fit_labels.rows
    return state, initial_loss


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
