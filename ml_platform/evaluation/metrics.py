"""Metrics of a candidate and the champion on the same held-out rows, and the verdicts.

Every metric has a bootstrap 95 % interval (resampling the held-out rows with a fixed seed), so
a reader sees whether a difference between two models is more than noise. A candidate is judged
in two steps. Alone (`judge_candidate`, in evaluation_report): the contract's value thresholds
(absolute bounds) and a trivial baseline; it is `reject`ed or `eligible`. Against the serving
champion (`compare_with_champion`, in registered_model, which takes the days in date order):
a paired bootstrap, both models scored on the same resampled rows (same seed, same hold-out),
so each sample gives one improvement of the candidate over the champion, and the spread of those
improvements is the noise of the comparison. The candidate is promoted only when the lower bound
of the improvement's 95 % interval is above the contract's change threshold: a tie, or a gain the
resampling cannot tell from zero, keeps the champion and makes the candidate challenger. A first
model, with no champion, is promoted when eligible. `judge` applies both at once.

Every candidate, first or not, must also beat a trivial baseline fitted on the labels of its
training rows: the class prior (`DummyClassifier(strategy="prior")`, whose ROC AUC is exactly
0.5) or the training mean (`DummyRegressor(strategy="mean")`). The baseline is scored on the same
bootstrap samples, and the candidate beats it when the lower bound of the paired 95 % interval of
its lift on the primary metric is above 0: the rule that promotes over a champion, with no margin.
A candidate that cannot be told from the baseline has learned nothing the label's distribution
alone does not give, whatever its value thresholds say, and is rejected.
"""

import dataclasses
import functools
import hashlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.platform.plots import GREY, Series, confusion_matrix, line_chart, scatter
from ml_platform.platform.threads import thread_pools
from ml_platform.training.model import CHUNK_ROWS, TrainedModel
from ml_platform.training.window import (
    LabelSummary,
    Segment,
    chunked,
    label_summary,
    scan_window,
    split_window,
    stream,
)

LOWER_IS_BETTER = {"mae", "rmse"}
# A little beyond [0, 1], so curves along the edges stay visible.
UNIT_RANGE = (-0.02, 1.02)


@dataclasses.dataclass(frozen=True)
class HeldOutRows:
    """The rows a model held out, read a day at a time from its window when scored."""

    partitions: Mapping[str, pd.DataFrame]
    segments: list[Segment]
    label: str

    def __len__(self) -> int:
        return sum(segment.rows for segment in self.segments)

    def frames(self) -> Iterator[pd.DataFrame]:
        """Each held-out day's rows in turn, in the window's order."""
        return stream(self.partitions, self.segments, self.label)

    def frame(self) -> pd.DataFrame:
        """All the held-out rows as one frame (for small windows: tests, benchmarks)."""
        return pd.concat(list(self.frames()), ignore_index=True)

    def chunks(self) -> Iterator[pd.DataFrame]:
        """The held-out rows in order, days joined up to `CHUNK_ROWS` rows (or one larger day).

        A model predicts a chunk in one call, and a call costs milliseconds whatever its rows
        (a flights hold-out is six days of 900 rows). A hold-out that fits in one chunk is read
        once and kept, so the candidate and the champion are scored on rows read once.
        """
        if len(self) <= CHUNK_ROWS:
            return iter([self._one_chunk])
        return chunked(self.frames(), CHUNK_ROWS)

    @functools.cached_property
    def _one_chunk(self) -> pd.DataFrame:
        return self.frame()


def split_of(
    model: TrainedModel, partitions: Mapping[str, pd.DataFrame], contract: Contract
) -> tuple[LabelSummary, HeldOutRows]:
    """(labels of the training rows, held-out rows) of `model`, recomputed from its window.

    One pass counts each day's labelled rows; only the held-out days are read again, when
    scored, so memory holds one day whatever the window.
    """
    if sorted(partitions) != model.window:
        raise ValueError(
            f"evaluation window {sorted(partitions)} differs from the model's training window "
            f"{model.window}; rematerialise the model for this partition"
        )
    label = contract.label_name
    scan = scan_window(partitions, label, versions=False)
    split = split_window(scan, contract.training.holdout_fraction)
    if (split.train_rows, split.holdout_rows) != (model.train_rows, model.holdout_rows):
        raise ValueError(
            f"the window now holds {split.train_rows} training and {split.holdout_rows} "
            f"hold-out rows but the model recorded {model.train_rows} and "
            f"{model.holdout_rows}: its feature partitions changed after training; "
            "rematerialise the model"
        )
    train = label_summary(partitions, scan, split.train, label)
    return train, HeldOutRows(partitions, split.holdout, label)


def holdout_of(
    model: TrainedModel, partitions: Mapping[str, pd.DataFrame], contract: Contract
) -> pd.DataFrame:
    """The rows `model` held out, recomputed from the same window, as one frame."""
    return split_of(model, partitions, contract)[1].frame()


@dataclasses.dataclass(frozen=True)
class Scores:
    """One model's metrics on the hold-out, each with its bootstrap interval.

    `draws[metric][s]` is the metric on bootstrap sample s; `pairing` identifies the samples
    (seed, sample count and the hold-out's labels), so two Scores with the same `pairing` were
    computed on the same resampled rows and their draws can be subtracted sample by sample.
    """

    values: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    predicted: np.ndarray
    score: np.ndarray
    draws: dict[str, np.ndarray]
    pairing: str
    labels: np.ndarray  # the hold-out's labels, in the order of `predicted`


@dataclasses.dataclass(frozen=True)
class RecordedScores:
    """A candidate's scores as its evaluation stored them: enough to pair it with a champion.

    evaluation_report already scored the candidate on its held-out rows; registered_model scores
    only the champion on them, and pairs it with these draws when the pairing says the samples
    are the same (`recorded_scores`).
    """

    values: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    draws: dict[str, np.ndarray]
    pairing: str


# What a paired comparison reads of a model's scores: metrics, intervals, draws and pairing.
Paired = Scores | RecordedScores


def stored_draws(scores: Scores) -> dict[str, Any]:
    """The bootstrap draws of `scores` and their pairing, as an evaluation stores them."""
    return {
        "pairing": scores.pairing,
        # The metrics in their order (the stored JSON sorts its keys): reports list them so.
        "metrics": list(scores.values),
        "draws": {name: draws.tolist() for name, draws in scores.draws.items()},
    }


def recorded_scores(evaluation: Mapping[str, Any]) -> RecordedScores | None:
    """The candidate's scores an evaluation stored, or None when it stored no draws."""
    paired = evaluation.get("paired")
    if not paired:
        return None
    names = paired["metrics"]
    return RecordedScores(
        {name: evaluation["metrics"][name] for name in names},
        {
            name: (low, high)
            for name in names
            if name in evaluation["intervals"]
            for low, high in [evaluation["intervals"][name]]
        },
        {name: np.asarray(paired["draws"][name], dtype="float64") for name in names},
        str(paired["pairing"]),
    )


def _per_sample_counts(codes: np.ndarray, rows: np.ndarray, kinds: int) -> np.ndarray:
    """counts[s, k]: how many rows of code k (0 <= k < kinds) sample s drew."""
    samples = len(rows)
    keys = codes[rows]
    keys += kinds * np.arange(samples)[:, None]
    return np.bincount(keys.ravel(), minlength=samples * kinds).reshape(samples, kinds)


# Row indices drawn per block of bootstrap samples (16 MB of int64).
BOOTSTRAP_BLOCK_ELEMENTS = 2_000_000


def _bootstrap(
    task: str, y: np.ndarray, predicted: np.ndarray, score: np.ndarray, rows: np.ndarray
) -> dict[str, np.ndarray]:
    """Every metric on every bootstrap sample at once (`rows` is samples x n row indices).

    Classification metrics depend on a sample only through how many rows of each kind it drew,
    so they count kinds per sample rather than gather labels and rank every sample's scores
    (sorting 200 samples took most of an evaluation's scoring).
    """
    if task != "classification":
        yb, pb = y[rows], predicted[rows]
        error = yb - pb
        total = ((yb - yb.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            r2 = 1.0 - (error**2).sum(axis=1) / total
        return {
            "mae": np.abs(error).mean(axis=1),
            "rmse": np.sqrt((error**2).mean(axis=1)),
            "r2": r2,
        }
    samples, size = rows.shape
    facts = np.column_stack(
        [
            (predicted == 1) & (y == 1),
            (predicted == 1) & (y == 0),
            (predicted == 0) & (y == 1),
            y == 1,
            predicted == y,
        ]
    )
    # Rows are counted per cell, a score level and a class: a level's negative cell (when it has
    # one) comes just before its positive cell, and most levels hold one row, so there are
    # about as many cells as rows, half the bins of counting both classes at every level.
    levels, level = np.unique(score, return_inverse=True)
    cells, cell = np.unique(2 * level + (y == 1), return_inverse=True)
    by_cell = _per_sample_counts(cell, rows, len(cells))
    # A row's kind: its five facts as the bits of a number; table[k] are the facts of kind k.
    bits = 1 << np.arange(facts.shape[1])
    table = (np.arange(2 ** facts.shape[1])[:, None] & bits) > 0
    kind = facts @ bits
    kind_of_cell = np.zeros(len(cells), dtype=kind.dtype)
    kind_of_cell[cell] = kind
    if np.array_equal(kind_of_cell[cell], kind):
        # The rows of a cell share their score and label and, as a model predicts from its
        # score, their prediction: the cells' counts give the facts' without counting again
        # (exactly: the products are of whole numbers far below 2**53).
        by_fact = by_cell @ table[kind_of_cell].astype("float64")
    else:
        by_fact = _per_sample_counts(kind, rows, len(table)) @ table
    tp, fp, fn, positives, correct = by_fact.T
    negatives = size - positives
    # ROC AUC as the Mann-Whitney statistic: the share of positive-negative pairs the score
    # orders right, a tie counting half (as average ranks, and roc_auc_score, count it).
    positive = np.flatnonzero(cells & 1)
    tied = (positive > 0) & (cells[positive - 1] == cells[positive] - 1)
    # Negatives up to each cell, the same level's included.
    negatives_to = by_cell.copy()
    negatives_to[:, positive] = 0
    np.cumsum(negatives_to, axis=1, out=negatives_to)
    drawn = by_cell[:, positive]
    # Twice the pair count is an integer; halving it last keeps the sum exact. Each positive
    # counts twice the negatives below its level, plus once those of its level.
    twice = 2 * np.einsum("ij,ij->i", drawn, negatives_to[:, positive])
    if tied.any():
        twice -= np.einsum("ij,ij->i", drawn[:, tied], by_cell[:, positive[tied] - 1])
    pairs = twice / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(tp + fp > 0, tp / (tp + fp), 0.0)
        recall = np.where(tp + fn > 0, tp / (tp + fn), 0.0)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
        auc = pairs / (positives * negatives)
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "accuracy": correct / size,
        "roc_auc": np.where((positives > 0) & (negatives > 0), auc, np.nan),
    }


def _values(task: str, y: np.ndarray, predicted: np.ndarray, score: np.ndarray) -> dict[str, float]:
    """Metrics on the whole hold-out."""
    if task == "classification":
        # The hold-out as one more sample: scikit-learn's classification metrics spend about
        # 30 ms validating their inputs, for the same numbers.
        whole = _bootstrap(task, y, predicted, score, np.arange(len(y))[None, :])
        return {name: float(value[0]) for name, value in whole.items()}
    from sklearn import metrics as skm

    # scikit-learn's R² is finite (1 or 0) on a constant label, where the ratio is not.
    return {
        "mae": float(skm.mean_absolute_error(y, predicted)),
        "rmse": math.sqrt(skm.mean_squared_error(y, predicted)),
        "r2": float(skm.r2_score(y, predicted)),
    }


@dataclasses.dataclass(frozen=True)
class Predictions:
    """A model's predictions on held-out rows, with their labels: what every metric is made of."""

    task: str
    labels: np.ndarray
    predicted: np.ndarray
    score: np.ndarray

    @property
    def non_finite(self) -> int:
        """How many rows have an infinite or NaN prediction or score (no metric can take them)."""
        finite = np.isfinite(self.predicted.astype("float64")) & np.isfinite(self.score)
        return int((~finite).sum())

    def overflowing_labels(self) -> str:
        """What makes a regression's squared errors overflow on finite predictions; '' if none.

        A finite but extreme label (1e308 in a label the contract leaves unbounded) has an
        infinite squared error: RMSE and R² would be inf and NaN, and a bootstrap would judge
        on the few draws that miss it.
        """
        if self.task != "regression":
            return ""
        with np.errstate(over="ignore", invalid="ignore"):
            errors = np.square(self.labels.astype("float64") - self.predicted.astype("float64"))
        rows = ~np.isfinite(errors)
        if not rows.any():
            return ""
        largest = float(np.abs(self.labels[rows].astype("float64")).max())
        return (
            f"its squared errors on {int(rows.sum())} of {len(rows)} labelled rows overflow "
            f"(largest label: |{largest:.3g}|)"
        )


def predict_holdout(model: TrainedModel, holdout: pd.DataFrame | HeldOutRows) -> Predictions:
    """The model's predictions on the hold-out, predicted once for every use of them.

    Held-out rows read a day at a time (`HeldOutRows`) are predicted a bounded chunk at a time
    (one call for a hold-out of fewer than `CHUNK_ROWS` rows): only the labels, predictions and
    scores are kept.
    """
    frames = holdout.chunks() if isinstance(holdout, HeldOutRows) else iter([holdout])
    dtype = "int64" if model.task == "classification" else "float64"
    labels, predicted, score = [], [], []
    # A linear model's prediction multiplies the rows by its weights in BLAS, whose threads spin
    # waiting for each other on products this small: 9 ms of CPU on 4,800 flights rows, against
    # 1 ms on one thread, so prediction uses one.
    with thread_pools().limit(limits=1, user_api="blas"):
        for frame in frames:
            labels.append(frame[model.label].astype(dtype).to_numpy())
            chunk_predicted, chunk_score = model.predictions(frame)
            predicted.append(chunk_predicted)
            score.append(chunk_score)
    return Predictions(
        model.task, np.concatenate(labels), np.concatenate(predicted), np.concatenate(score)
    )


def score_model(
    model: TrainedModel, holdout: pd.DataFrame | HeldOutRows, samples: int, seed: int
) -> Scores:
    """Metrics of a model on the hold-out with bootstrap 95 % intervals (`score_of`)."""
    return score_of(predict_holdout(model, holdout), samples, seed)


def score_of(predictions: Predictions, samples: int, seed: int) -> Scores:
    """Metrics of predictions on a hold-out with bootstrap 95 % intervals.

    The metrics, bootstrap intervals and curves all use the predictions. Every model scored on
    the same hold-out with the same `samples` and `seed` is scored on the same bootstrap samples,
    which is what lets `judge` pair a candidate with its champion.
    """
    p = predictions
    return score_predictions(p.task, p.labels, p.predicted, p.score, samples, seed)


def pairing_of(y: np.ndarray, samples: int, seed: int) -> str:
    """What fixes the bootstrap samples: the seed, their number and the hold-out's labels.

    Equal for two models scored on the same hold-out; the labels guard against pairing scores
    of different hold-outs (they cannot prove two hold-outs with equal labels are the same rows).
    """
    digest = hashlib.blake2b(f"{seed}/{samples}/{len(y)}/{y.dtype}/".encode(), digest_size=8)
    digest.update(np.ascontiguousarray(y).tobytes())
    return digest.hexdigest()


def score_predictions(
    task: str, y: np.ndarray, predicted: np.ndarray, score: np.ndarray, samples: int, seed: int
) -> Scores:
    """Metrics of predictions (and, for classification, scores) of the labels `y`."""
    values = _values(task, y, predicted, score)
    with thread_pools().limit(limits=1, user_api="blas"):
        blocks = [
            _bootstrap(task, y, predicted, score, rows)
            for rows in _row_blocks(seed, samples, len(y))
        ]
    draws = {name: np.concatenate([b[name] for b in blocks]) for name in blocks[0]}
    return Scores(
        values,
        _intervals(draws),
        predicted,
        score,
        draws,
        pairing_of(y, samples, seed),
        y,
    )


def _row_blocks(seed: int, samples: int, rows: int) -> Iterator[np.ndarray]:
    """The bootstrap samples' row indices, a block of samples at a time.

    Samples are drawn and scored a block at a time: all of them at once would hold
    samples x rows indices (1.6 GB at 1M held-out rows). Drawing in blocks from one generator
    gives the same indices as one draw.
    """
    block = max(1, BOOTSTRAP_BLOCK_ELEMENTS // max(1, rows))
    if block >= samples:
        yield _one_block(seed, samples, rows)
        return
    rng = np.random.default_rng(seed)
    for start in range(0, samples, block):
        yield rng.integers(0, rows, (min(block, samples - start), rows))


@functools.lru_cache(maxsize=1)
def _one_block(seed: int, samples: int, rows: int) -> np.ndarray:
    """All the samples' row indices when they fit in one block (at most 16 MB), kept.

    The candidate, the champion and the baseline of a day are scored on the same samples:
    drawing them once saves two draws of samples x rows numbers.
    """
    drawn = np.random.default_rng(seed).integers(0, rows, (samples, rows))
    drawn.flags.writeable = False
    return drawn


# The share of bootstrap draws a 95 % interval needs defined. A draw where the metric is
# undefined (ROC AUC of a sample with one class) is left out; past a few of them, the draws
# left are those of samples unlike the hold-out (both classes where it barely has two), and
# their percentiles are no interval of it.
MIN_DEFINED_DRAWS = 0.95


def _percentiles(draws: np.ndarray) -> tuple[float, float] | None:
    """The 2.5 and 97.5 percentiles of the finite draws; None when too few are finite."""
    finite = draws[np.isfinite(draws)]
    if not len(draws) or len(finite) < MIN_DEFINED_DRAWS * len(draws):
        return None
    return float(np.percentile(finite, 2.5)), float(np.percentile(finite, 97.5))


def _intervals(draws: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """Each metric's 95 % interval from its draws, for those with enough draws defined."""
    return {name: bounds for name, d in draws.items() if (bounds := _percentiles(d)) is not None}


def improvement(metric: str, candidate: Paired, reference: Paired) -> tuple[float, float, float]:
    """The candidate's improvement over a reference model: (point, 95 % low, 95 % high).

    The reference is the champion, or the trivial baseline (the improvement is then its lift).
    Positive is better whatever the metric's direction (for mae and rmse it is the reference's
    error minus the candidate's). The interval comes from the paired draws: each bootstrap
    sample's difference of the two models on the same rows. A sample where the metric is
    undefined (ROC AUC of a sample with one class) is left out; with fewer than
    `MIN_DEFINED_DRAWS` of them defined the interval is NaN, which clears no threshold.
    """
    if candidate.pairing != reference.pairing:
        raise ValueError(
            "the candidate and the model it is compared with were not scored on the same "
            "bootstrap samples (different hold-out rows, seed or sample count): their "
            "difference is not paired"
        )
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
    point = sign * (candidate.values[metric] - reference.values[metric])
    with np.errstate(invalid="ignore"):
        diffs = sign * (candidate.draws[metric] - reference.draws[metric])
    bounds = _percentiles(diffs)
    if bounds is None:
        return point, math.nan, math.nan
    return point, *bounds


# The metric a trivial baseline is beaten on when the contract names none to promote on: the
# ranking (ROC AUC) of a classifier, the error (RMSE) of a regressor.
DEFAULT_PRIMARY_METRIC = {"classification": "roc_auc", "regression": "rmse"}
BASELINE_STRATEGY = {"classification": "prior", "regression": "mean"}


def primary_metric(contract: Contract) -> str:
    """The metric a candidate must beat the trivial baseline on.

    The contract's first change-threshold metric (the one it promotes on), else its first
    value-threshold metric, else the task's default (ROC AUC, RMSE).
    """
    spec = contract.evaluation
    named = [*spec.change_thresholds, *spec.value_thresholds]
    return named[0] if named else DEFAULT_PRIMARY_METRIC[contract.task]


def importance_shares(
    model: TrainedModel, rows: pd.DataFrame, metric: str, seed: int, repeats: int = 3
) -> dict[str, float] | None:
    """How much the model leans on each feature: its share of the permutation importance.

    Each feature's values are shuffled among `rows` (`repeats` times, seeded) and the model
    scored again; the feature's importance is the mean loss on `metric` (a drop of ROC AUC, a
    rise of RMSE), floored at 0, and its share that over the features' total (all 0 when
    shuffling changes nothing). The model's own evidence of what it uses, whatever the
    estimator, on the rows it serves. None when `metric` is undefined on the rows (ROC AUC on
    a day of one class, recall with no positive row, R² of a constant label: `undefined_why`):
    no loss can be measured, which is not "uses nothing".
    """
    lower = metric in LOWER_IS_BETTER

    def value(frame: pd.DataFrame) -> float:
        p = predict_holdout(model, frame)
        return _values(p.task, p.labels, p.predicted, p.score)[metric]

    p = predict_holdout(model, rows)
    base = _values(p.task, p.labels, p.predicted, p.score)[metric]
    # A convention's figure (recall 0 with no positive row) moves with no shuffle: every
    # feature would look unused.
    if not math.isfinite(base) or undefined_why(metric, p.labels):
        return None
    rng = np.random.default_rng(seed)
    losses: dict[str, float] = {}
    for feature in model.features:
        drops = []
        for _ in range(repeats):
            shuffled = rows.copy()
            shuffled[feature] = rng.permutation(rows[feature].to_numpy())
            after = value(shuffled)
            drops.append(after - base if lower else base - after)
        mean = float(np.nanmean(drops)) if not np.all(np.isnan(drops)) else 0.0
        losses[feature] = max(0.0, mean)
    total = sum(losses.values())
    return {f: (loss / total if total > 0 else 0.0) for f, loss in losses.items()}


def baseline_predictions(
    task: str, train_labels: LabelSummary, rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, score) of the trivial baseline fitted on the training labels, for `rows` rows.

    The class prior (`DummyClassifier(strategy="prior")`: the majority class, scored with the
    share of positives, the same for every row) or the training mean
    (`DummyRegressor(strategy="mean")`). Neither reads a feature, so the rows are zero columns;
    both depend on the labels only through their count and sum, so they are fitted on one row
    per class weighted by its count, or on the mean.
    """
    from sklearn.dummy import DummyClassifier, DummyRegressor

    if train_labels.rows == 0:
        raise ValueError("the trivial baseline needs at least one training label")
    x = np.zeros((rows, 1))
    if task == "classification":
        counts = train_labels.class_counts()
        present = np.flatnonzero(counts)
        prior = DummyClassifier(strategy="prior").fit(
            np.zeros((len(present), 1)), present, sample_weight=counts[present]
        )
        classes = list(prior.classes_)
        proba = prior.predict_proba(x)
        score = proba[:, classes.index(1)] if 1 in classes else np.zeros(rows)
        return prior.predict(x), score
    mean = DummyRegressor(strategy="mean").fit(np.zeros((1, 1)), [train_labels.mean])
    predicted = mean.predict(x)
    return predicted, predicted


def score_baseline(
    model: TrainedModel, train: LabelSummary, holdout_labels: np.ndarray, samples: int, seed: int
) -> Scores:
    """The trivial baseline, fitted on the labels of `model`'s training rows, on the hold-out.

    With the same `samples` and `seed` as the candidate it is scored on the same bootstrap
    samples, so `improvement` pairs the two.
    """
    predicted, score = baseline_predictions(model.task, train, len(holdout_labels))
    return score_predictions(model.task, holdout_labels, predicted, score, samples, seed)


# The decision of a candidate judged alone (evaluation_report) that may be registered: the
# registry then compares it with the serving champion (`compare_with_champion`).
ELIGIBLE = "eligible"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether the candidate may be registered, and whether it becomes champion.

    `improvements[metric]` is (improvement, 95 % low, 95 % high) over the champion for each
    change-threshold metric (empty without a champion); `lift` is the same over the trivial
    baseline for the primary metric (empty when judged without a baseline); `cause` is the reason
    for the decision in one line, for the run's summary and the registry. `compared` is False for
    a candidate judged alone (`judge_candidate`), whose decision is then `eligible` or `reject`.
    """

    passes_values: bool
    beats_champion: bool
    reasons: list[str]
    improvements: dict[str, tuple[float, float, float]] = dataclasses.field(default_factory=dict)
    cause: str = ""
    beats_baseline: bool = True
    lift: dict[str, tuple[float, float, float]] = dataclasses.field(default_factory=dict)
    compared: bool = True
    enough_rows: bool = True

    @property
    def eligible(self) -> bool:
        """Whether the candidate meets the value thresholds and beats the trivial baseline.

        On enough held-out rows (the contract's `evaluation.min_holdout_rows`) for either to mean
        anything.
        """
        return self.enough_rows and self.passes_values and self.beats_baseline

    @property
    def decision(self) -> str:
        """'promote', 'challenger' (good, but not better than the champion) or 'reject'.

        'eligible' instead of 'promote' or 'challenger' for a candidate judged alone.
        """
        if not self.eligible:
            return "reject"
        if not self.compared:
            return ELIGIBLE
        return "promote" if self.beats_champion else "challenger"


CLASSIFICATION_METRICS = {"precision", "recall", "f1", "accuracy", "roc_auc"}


def undefined_why(metric: str, labels: np.ndarray, rows: str = "held-out rows") -> str:
    """Why `metric` has no value on rows of these labels; '' when it has one.

    ROC AUC needs rows of both classes, recall and F1 a positive row, R² two different labels.
    Without them the figures computed (NaN, 0, scikit-learn's 0 or 1) are conventions, not the
    model's: a candidate's held-out rows and the champion's labelled rows of a day alike
    (`registry.monitoring.undefined_metrics`). `rows` names them in the reason.
    """
    count = len(labels)
    if metric in ("roc_auc", "recall", "f1"):
        positives = int(np.count_nonzero(labels))
        if positives and (metric != "roc_auc" or positives < count):
            return ""
        return f"all {count} {rows} are " + ("positive" if positives else "negative")
    if metric == "r2" and (count < 2 or float(np.ptp(labels)) == 0.0):
        return f"the label is the same on all {count} {rows.removesuffix('s')}(s)"
    return ""


def judge_baseline(
    metric: str, candidate: Scores, baseline: Scores
) -> tuple[bool, tuple[float, float, float], str]:
    """(beats, (lift, 95 % low, 95 % high), reason): the candidate against the trivial baseline.

    It beats the baseline when the lower bound of the paired interval of its lift on `metric`
    is strictly above 0 (False for a NaN bound): a lift the resampling cannot tell from zero is
    no evidence the model learned anything. A metric the held-out rows cannot define, or whose
    interval they cannot measure (too many bootstrap samples of a rare class's few rows draw
    none of them), says so: the reason is the rows, not the features.
    """
    lift, low, high = improvement(metric, candidate, baseline)
    value = candidate.values[metric]
    if math.isnan(value):
        return (
            False,
            (lift, low, high),
            f"{metric} is undefined on the held-out rows (roc_auc, for one, on rows of a single "
            "class): nothing shows the candidate beats the trivial baseline",
        )
    undefined = undefined_why(metric, candidate.labels)
    if undefined:
        # Its lift is one convention minus another (0 recall against 0): no lift at all.
        return (
            False,
            (math.nan, math.nan, math.nan),
            f"{metric} is undefined on the held-out rows ({undefined}; its {value:.4f} is a "
            "convention): nothing shows the candidate beats the trivial baseline",
        )
    if math.isnan(low):
        with np.errstate(invalid="ignore"):
            diffs = candidate.draws[metric] - baseline.draws[metric]
        missing = int((~np.isfinite(diffs)).sum())
        labels = candidate.labels
        held = (
            f"{int(np.count_nonzero(labels))} positive of {len(labels)} held-out rows"
            if metric in CLASSIFICATION_METRICS
            else f"{len(labels)} held-out rows"
        )
        return (
            False,
            (lift, low, high),
            f"{metric} {value:.4f} vs {baseline.values[metric]:.4f}: lift {lift:+.4f}, whose "
            f"95 % interval cannot be measured: {metric} is undefined on {missing} of the "
            f"{len(diffs)} bootstrap samples of the held-out rows ({held}), so nothing shows "
            "the candidate beats the trivial baseline",
        )
    beats = low > 0
    comparison = (
        f"{metric} {candidate.values[metric]:.4f} vs {baseline.values[metric]:.4f}: lift "
        f"{lift:+.4f} (95 % interval {low:+.4f} to {high:+.4f})"
    )
    if beats:
        reason = f"beats the trivial baseline: {comparison}"
    else:
        reason = (
            f"does not beat the trivial baseline: {comparison}, whose lower bound is not above 0"
        )
    return beats, (lift, low, high), reason


def judge_candidate(
    contract: Contract, candidate: Scores, baseline: Scores | None = None
) -> Verdict:
    """The candidate alone: the contract's value thresholds, then the trivial baseline.

    Its decision is `reject` when it was scored on fewer held-out rows than
    `evaluation.min_holdout_rows`,
    misses a value threshold or its lift over the baseline (`score_baseline`) on the primary
    metric is not shown above 0, else `eligible`: whether it becomes champion is the registry's
    comparison with the serving champion (`compare_with_champion`). Without a baseline only the
    rows and the thresholds apply.
    """
    spec = contract.evaluation
    reasons = []
    misses = []
    rows = len(candidate.labels)
    enough_rows = rows >= spec.min_holdout_rows
    if not enough_rows:
        counted = "1 held-out row is" if rows == 1 else f"{rows} held-out rows are"
        reason = (
            f"{counted} too few to judge a model on (at least {spec.min_holdout_rows}, contract "
            "evaluation.min_holdout_rows): their "
            "bootstrap intervals cannot tell the candidate from the baseline or a champion"
        )
        reasons.append(reason)
        misses.append(reason)
    passes_values = True
    for metric, bound in spec.value_thresholds.items():
        value = candidate.values.get(metric, math.nan)
        lower = metric in LOWER_IS_BETTER
        word = "at most" if lower else "at least"
        undefined = undefined_why(metric, candidate.labels)
        if undefined:
            # A convention (0 recall with no positive row, R² 1 of a constant label) neither
            # meets nor misses a bound: nothing shows the candidate meets it.
            ok = False
            reason = (
                f"{metric} is undefined on the held-out rows ({undefined}), so nothing shows "
                f"it meets the bound ({word} {bound})"
            )
        else:
            ok = value <= bound if lower else value >= bound
            reason = (
                f"{metric} {value:.4f} {'meets' if ok else 'misses'} the bound ({word} {bound})"
            )
        passes_values &= ok
        reasons.append(reason)
        if not ok:
            misses.append(reason)
    beats_baseline = True
    lift: dict[str, tuple[float, float, float]] = {}
    if baseline is not None:
        metric = primary_metric(contract)
        beats_baseline, lift[metric], reason = judge_baseline(metric, candidate, baseline)
        reasons.append(reason)
        if not beats_baseline:
            # Said first (after too few rows, which no other figure overrules): with no lift
            # over the baseline, the thresholds' misses follow.
            misses.insert(0 if enough_rows else 1, reason)
    if misses:
        cause = "; ".join(misses)
    elif baseline is not None:
        cause = "meets the value thresholds and beats the trivial baseline"
    else:
        cause = "meets the value thresholds"
    return Verdict(
        passes_values,
        False,
        reasons,
        {},
        cause,
        beats_baseline,
        lift,
        compared=False,
        enough_rows=enough_rows,
    )


@dataclasses.dataclass(frozen=True)
class Comparison:
    """An eligible candidate against the champion, both scored on the candidate's hold-out.

    `improvements[metric]` is (improvement, 95 % low, 95 % high) for each change-threshold
    metric, from the paired bootstrap; `reasons` say, per metric, whether it clears the
    contract's change threshold; `cause` is the decision's reason in one line.
    """

    beats_champion: bool
    improvements: dict[str, tuple[float, float, float]]
    reasons: list[str]
    cause: str

    @property
    def decision(self) -> str:
        """'promote' when the improvement is shown on every change-threshold metric."""
        return "promote" if self.beats_champion else "challenger"


def compare_with_champion(
    contract: Contract, candidate: Paired, champion: Paired | None
) -> Comparison:
    """The contract's change thresholds applied to the candidate's improvement over the champion.

    A change-threshold metric clears its threshold when the lower bound of the improvement's
    95 % interval (`improvement`, paired: both models scored on the same bootstrap samples of
    the same held-out rows) is strictly above it; the candidate beats the champion when every
    one does. With no champion (the first model) it is promoted.
    """
    if champion is None:
        return Comparison(True, {}, [], "first model, no champion to beat")
    beats = True
    improvements = {}
    reasons: list[str] = []
    short_of: list[str] = []
    cleared: list[str] = []
    for metric, least in contract.evaluation.change_thresholds.items():
        gain, low, high = improvement(metric, candidate, champion)
        improvements[metric] = (gain, low, high)
        ok = low > least  # False for a NaN bound
        beats &= ok
        reason = (
            f"{metric} {candidate.values[metric]:.4f} vs champion {champion.values[metric]:.4f}:"
            f" improvement {gain:+.4f} (95 % interval {low:+.4f} to {high:+.4f}),"
            f" {'clears' if ok else 'does not clear'} the least of {least:+}"
        )
        reasons.append(reason)
        (cleared if ok else short_of).append(reason)
    if not beats:
        cause = "; ".join(short_of)
    else:
        cause = "; ".join(cleared) or "no change thresholds: a good candidate is promoted"
    return Comparison(beats, improvements, reasons, cause)


def judge(
    contract: Contract,
    candidate: Scores,
    champion: Scores | None,
    baseline: Scores | None = None,
) -> Verdict:
    """The whole verdict: the candidate alone (`judge_candidate`), then against the champion.

    The value thresholds and the trivial baseline first: a candidate that misses them is
    rejected, first model or not. Then `compare_with_champion`: `promote` when every
    change-threshold metric's improvement clears its threshold, else `challenger`. The platform
    splits the two (evaluation_report judges the candidate alone, registered_model compares it
    with the serving champion in date order); benchmarks and tests judge both at once.
    """
    alone = judge_candidate(contract, candidate, baseline)
    reasons = list(alone.reasons)
    if champion is None:
        judged_on = "value thresholds" if baseline is None else "value thresholds and baseline"
        reasons.append(f"there is no champion yet: judged on {judged_on} only")
    comparison = compare_with_champion(contract, candidate, champion)
    reasons += comparison.reasons
    cause = comparison.cause if alone.eligible else alone.cause
    return Verdict(
        alone.passes_values,
        comparison.beats_champion,
        reasons,
        comparison.improvements,
        cause,
        alone.beats_baseline,
        alone.lift,
        enough_rows=alone.enough_rows,
    )


def plots(model: TrainedModel, scores: Scores) -> list[str]:
    """Markdown images: ROC and precision-recall curves and confusion matrix, or residuals."""
    from sklearn import metrics as skm

    y = scores.labels
    images = []
    if model.task == "classification":
        y = y.astype("int64")
        if len(np.unique(y)) == 2:
            fpr, tpr, _ = skm.roc_curve(y, scores.score)
            images.append(
                line_chart(
                    "ROC curve",
                    [
                        Series(f"candidate (AUC = {skm.auc(fpr, tpr):.2f})", fpr, tpr),
                        Series("chance level (AUC = 0.5)", [0, 1], [0, 1], GREY, dashed=True),
                    ],
                    "false positive rate",
                    "true positive rate",
                    UNIT_RANGE,
                    UNIT_RANGE,
                )
            )
            precision, recall, _ = skm.precision_recall_curve(y, scores.score)
            # Average precision as scikit-learn defines it, from the same curve.
            average = -np.sum(np.diff(recall) * precision[:-1])
            prevalence = y.mean()
            images.append(
                line_chart(
                    "Precision-recall curve",
                    [
                        Series(f"candidate (AP = {average:.2f})", recall, precision, steps=True),
                        Series(
                            f"chance level (AP = {prevalence:.2f})",
                            [0, 1],
                            [prevalence, prevalence],
                            GREY,
                            dashed=True,
                        ),
                    ],
                    "recall",
                    "precision",
                    UNIT_RANGE,
                    UNIT_RANGE,
                )
            )
        counts = np.bincount(2 * y + scores.predicted.astype("int64"), minlength=4)
        images.append(confusion_matrix("Confusion matrix", counts.reshape(2, 2), ["0", "1"]))
    else:
        images.append(
            scatter(
                "Residuals",
                scores.predicted,
                y.astype("float64") - scores.predicted,
                "predicted",
                "actual - predicted",
            )
        )
    return images


def render_report(
    partition: str,
    model: TrainedModel,
    candidate: Scores,
    champion: Scores | None,
    champion_version: str | None,
    verdict: Verdict,
    images: list[str],
    baseline: Scores | None = None,
) -> str:
    """Markdown report of one evaluation (with the trivial baseline's columns when given)."""
    header = "| metric | candidate (95 % interval) |"
    rule = "|---|---|"
    if champion is not None:
        header += f" champion {champion_version} (95 % interval) |"
        header += " improvement (paired 95 % interval) |"
        rule += "---|---|"
    if baseline is not None:
        header += f" trivial baseline, {BASELINE_STRATEGY[model.task]} (95 % interval) |"
        header += " lift over baseline (paired 95 % interval) |"
        rule += "---|---|"
    rows = []
    for name, value in candidate.values.items():
        low, high = candidate.intervals.get(name, (math.nan, math.nan))
        row = f"| {name} | {value:.4f} ({low:.4f} – {high:.4f}) |"
        for reference in (champion, baseline):
            if reference is None:
                continue
            r_low, r_high = reference.intervals.get(name, (math.nan, math.nan))
            row += f" {reference.values[name]:.4f} ({r_low:.4f} – {r_high:.4f}) |"
            gain, g_low, g_high = improvement(name, candidate, reference)
            row += f" {gain:+.4f} ({g_low:+.4f} – {g_high:+.4f}) |"
        rows.append(row)
    explained = []
    if champion is not None:
        explained += [
            "Improvement: candidate minus champion (champion minus candidate for errors), each "
            "bootstrap sample scoring both models on the same held-out rows. The candidate is "
            "promoted only when the lower bound of that interval is above the contract's change "
            "threshold for every change-threshold metric.",
            "",
        ]
    if baseline is not None:
        what = (
            "the class prior of the training rows: the majority class for every row, each "
            "scored with the share of positives, so its ROC AUC is exactly 0.5"
            if model.task == "classification"
            else "the mean label of the training rows, predicted for every row"
        )
        metric = ", ".join(verdict.lift) or "the primary metric"
        explained += [
            f"Trivial baseline: {what}. Lift: candidate minus baseline (baseline minus candidate "
            "for errors) on the same bootstrap samples. The candidate must beat it: the lower "
            f"bound of the lift's interval on {metric} must be above 0, or it is rejected.",
            "",
        ]
    if verdict.decision == ELIGIBLE:
        explained += [
            "Eligible: the candidate may be registered. Whether it becomes champion is "
            "registered_model's decision, which takes the days in date order: it scores the "
            "serving champion on these held-out rows with the same bootstrap samples and promotes "
            "the candidate only when the improvement's interval clears the contract's change "
            "thresholds; otherwise the candidate becomes challenger.",
            "",
        ]
    lines = [
        f"# Evaluation of the model of {partition}",
        "",
        f"Task: **{model.task}**; label `{model.label}`. Trained on {model.train_rows} rows of "
        f"{len(model.window)} day(s) ({model.window[0]} to {model.window[-1]}) for "
        f"{model.progress}; evaluated on the "
        f"{model.holdout_rows} latest rows (from {model.holdout_start}), never trained on.",
        "",
        f"**Verdict: {verdict.decision}.** " + "; ".join(verdict.reasons) + ".",
        "",
        *explained,
        header,
        rule,
        *rows,
        "",
        *images,
    ]
    return "\n".join(lines) + "\n"


def render_comparison(
    version: str,
    candidate: Paired,
    champion: Paired,
    champion_version: str,
    comparison: Comparison,
) -> str:
    """Markdown of the registry's comparison of a candidate with the champion it met."""
    rows = []
    for name, value in candidate.values.items():
        low, high = candidate.intervals.get(name, (math.nan, math.nan))
        c_low, c_high = champion.intervals.get(name, (math.nan, math.nan))
        gain, g_low, g_high = improvement(name, candidate, champion)
        rows.append(
            f"| {name} | {value:.4f} ({low:.4f} – {high:.4f}) "
            f"| {champion.values[name]:.4f} ({c_low:.4f} – {c_high:.4f}) "
            f"| {gain:+.4f} ({g_low:+.4f} – {g_high:+.4f}) |"
        )
    lines = [
        f"# {version} against champion {champion_version}",
        "",
        f"**{comparison.decision}.** " + ("; ".join(comparison.reasons) or comparison.cause) + ".",
        "",
        "Both models scored on the candidate's held-out rows, which neither trained on, with the "
        "same bootstrap samples. Improvement: candidate minus champion (champion minus candidate "
        "for errors), sample by sample. The candidate is promoted only when the lower bound of "
        "that interval is above the contract's change threshold for every change-threshold metric.",
        "",
        f"| metric | {version} (95 % interval) | champion {champion_version} (95 % interval) "
        "| improvement (paired 95 % interval) |",
        "|---|---|---|---|",
        *rows,
    ]
    return "\n".join(lines) + "\n"
