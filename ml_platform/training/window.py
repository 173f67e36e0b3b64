"""A feature window read a day at a time: its row order, where it splits, its label statistics.

The window's labelled rows are ordered by day, then by event time within the day (a stable
sort: ties keep their stored order). That is the order of sorting the whole window by event
time whenever each day's event times fall inside that day, as they do for every contract whose
event time is local time. With `event_time.timezone_column` a local day's UTC event times may
sort before the previous day's last ones; the order is then still (day, event time): a day is
the unit the platform reads, stores and holds out, and only this order lets a pass read one
day at a time.

In that order the latest `holdout_fraction` of the labelled rows is held out for evaluation and
the latest 10 % of the other (training) rows are SGD's validation slice. One cheap pass counts
each day's labelled rows (`scan_window`); every boundary is then a (day, offset) pair, and a
split is a list of `Segment`s, runs of rows of one day, which later passes read a day at a time.
"""

import dataclasses
import datetime as dt
import hashlib
import math
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import TypeVar, cast

import numpy as np
import pandas as pd

from ml_platform.contracts.model import (
    EVENT_TIME,
    FEATURE_DEFINITIONS,
    described,
    redefined,
    stored_definitions,
)
from ml_platform.platform.inputs import WindowPartitions

VALIDATION_FRACTION = 0.1

T = TypeVar("T")


class TrainingDataError(ValueError):
    """The training window cannot produce a model (no labelled rows, a single class...)."""


@dataclasses.dataclass(frozen=True)
class LabelSummary:
    """Count and sum of some rows' labels: for a classifier, `total` counts the positives."""

    rows: int = 0
    total: float = 0.0
    squares: float = 0.0  # sum of squared labels: the untrained regressor's squared error

    @classmethod
    def of(cls, labels: "np.ndarray | pd.Series") -> "LabelSummary":
        """The summary of an array of labels."""
        values = np.asarray(labels, dtype="float64")
        return cls(len(values), float(values.sum()), float(values @ values))

    def __add__(self, other: "LabelSummary") -> "LabelSummary":
        return LabelSummary(
            self.rows + other.rows, self.total + other.total, self.squares + other.squares
        )

    @property
    def mean(self) -> float:
        """The mean label (a classifier's share of positives)."""
        return self.total / self.rows

    def class_counts(self) -> np.ndarray:
        """Rows of class 0 and of class 1 (classification)."""
        return np.array([self.rows - self.total, self.total], dtype="float64")


@dataclasses.dataclass(frozen=True)
class Segment:
    """Rows `start` to `stop` (exclusive) of one day's labelled rows, in event-time order."""

    day: str
    start: int
    stop: int

    @property
    def rows(self) -> int:
        """How many rows the segment holds."""
        return self.stop - self.start


def data_version(frame: pd.DataFrame) -> str:
    """Content hash of a frame: equal frames, equal versions."""
    row_hashes = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    return hashlib.sha256(row_hashes.tobytes()).hexdigest()[:16]


def day_rows(frame: pd.DataFrame, label: str) -> pd.DataFrame:
    """A day's labelled rows in event-time order (stable: ties keep their stored order)."""
    # A day is usually stored in time order already, and read many times: no sort, no filter
    # where there is nothing to reorder or drop.
    if not frame[EVENT_TIME].is_monotonic_increasing:
        frame = frame.sort_values(EVENT_TIME, kind="stable")
    present = frame[label].notna()
    if not present.all():
        frame = frame[present]
    return frame.reset_index(drop=True)


@dataclasses.dataclass(frozen=True)
class WindowScan:
    """What one pass over a window learns: each day's labelled rows, label sum and version."""

    days: list[str]
    rows: list[int]
    labels: list[LabelSummary]
    versions: dict[str, str]

    @property
    def total(self) -> int:
        """Labelled rows of the window."""
        return sum(self.rows)

    def segments(self, start: int, stop: int) -> list[Segment]:
        """Rows `start` to `stop` of the window's labelled rows, as non-empty day segments."""
        found = []
        offset = 0
        for day, rows in zip(self.days, self.rows, strict=True):
            low, high = max(start, offset), min(stop, offset + rows)
            if low < high:
                found.append(Segment(day, low - offset, high - offset))
            offset += rows
        return found


def scan_window(
    partitions: Mapping[str, pd.DataFrame],
    label: str,
    versions: bool = True,
    features: Mapping[str, Mapping[str, str]] | None = None,
) -> WindowScan:
    """Read the window once, a day at a time, oldest first: rows, label sums, data versions.

    Every day must hold the event time, the label and `features` (name: definition) as they
    are defined now: a day stored before the contract gained a feature lacks its column, and
    joining it to the other days would make the whole day's values missing, imputed without a
    word; one stored before the contract changed a feature's kind, source or transform holds
    values of the old definition, which the model would learn as if they were the new one's.
    """
    if not partitions:
        raise TrainingDataError("the training window holds no feature partitions")
    days = sorted(partitions)
    features = features or {}
    wanted = [EVENT_TIME, label, *features]
    stale = {}
    for day in days:
        columns = of_partition(partitions, day, "columns", lambda frame: set(frame.columns))
        # None recorded (a day stored before they were): taken to be the contract's.
        stored = (
            of_partition(
                partitions, day, FEATURE_DEFINITIONS, lambda frame: stored_definitions(frame.attrs)
            )
            or {}
        )
        absent = [c for c in wanted if c not in columns]
        other = redefined(stored, features)
        if absent or other:
            stale[day] = "; ".join(
                ([f"{day} lacks {', '.join(absent)}"] if absent else [])
                + [
                    f"{day} holds {name} as {described(stored[name])}, "
                    f"now {described(features[name])}"
                    for name in other
                ]
            )
    if stale:
        first, last = min(stale), days[-1]
        count = (dt.date.fromisoformat(last) - dt.date.fromisoformat(first)).days + 1
        listed = "; ".join(stale.values())
        raise TrainingDataError(
            f"features partitions of the training window {days[0]}..{last} lack columns the "
            f"contract trains on, or hold them as it defined them before ({listed}): "
            "they were stored before the contract declared them so. Rematerialise those days' "
            f"features, e.g. `ml-platform materialize --dataset <dataset> --start {first} --days "
            f"{count} --force`"
        )
    rows, labels, hashes = [], [], {}
    for day in days:
        if versions:
            hashes[day] = of_partition(partitions, day, "data_version", data_version)
        count, summary = of_partition(
            partitions, day, ("labels", label), lambda frame: day_labels(frame, label)
        )
        rows.append(count)
        labels.append(summary)
    return WindowScan(days, rows, labels, hashes)


def day_labels(frame: pd.DataFrame, label: str) -> tuple[int, LabelSummary]:
    """A day's labelled rows and their label summary."""
    present = frame[label].dropna()
    return len(present), LabelSummary.of(present)


def overflowing_features(
    partitions: Mapping[str, pd.DataFrame], days: Sequence[str], label: str, numeric: Sequence[str]
) -> dict[str, list[str]]:
    """Numeric features whose labelled rows hold infinity or values whose squares overflow.

    Each with the days that hold them (every day, when only their sum over the window
    overflows). Imputation and scaling sum squares: such a value makes the scaler's variance
    infinite or NaN, and the linear estimators then refuse every row.
    """

    def squares(frame: pd.DataFrame) -> pd.Series:
        values = frame.loc[frame[label].notna(), list(numeric)].astype("float64")
        with np.errstate(over="ignore"):
            return (values**2).sum()

    per_day = {
        day: of_partition(partitions, day, ("squares", label, tuple(numeric)), squares)
        for day in days
    }
    found = {}
    for column in numeric:
        bad = [day for day in days if not math.isfinite(per_day[day][column])]
        with np.errstate(over="ignore"):
            total = sum(float(per_day[day][column]) for day in days)
        if bad or not math.isfinite(total):
            found[column] = bad or list(days)
    return found


def of_partition(
    partitions: Mapping[str, pd.DataFrame],
    day: str,
    name: Hashable,
    compute: Callable[[pd.DataFrame], T],
) -> T:
    """`compute` of one day's frame; of a stored window, once for each load of the day.

    The days of a range step share their window's loaded partitions: a day's hash and label
    counts are computed when the day is loaded, not again for each later day whose window holds
    it (`WindowPartitions.derived`).
    """
    if isinstance(partitions, WindowPartitions):
        return cast(T, partitions.derived(day, name, compute))
    return compute(partitions[day])


def holdout_count(rows: int, fraction: float) -> int:
    """How many of `rows` time-ordered rows are held out: the latest `fraction`, rounded up."""
    # Rounded first so that float error (100 * 0.07 = 7.000000000000001) does not add a row.
    held_out = max(1, math.ceil(round(rows * fraction, 9)))
    if rows - held_out < 1:
        raise TrainingDataError(f"{rows} labelled row(s) are too few to train and evaluate")
    return held_out


@dataclasses.dataclass(frozen=True)
class WindowSplit:
    """A window's training, validation and held-out rows, as (day, offset) boundaries."""

    scan: WindowScan
    train_rows: int
    # The first row of the validation slice (the latest 10 % of the training rows); with a
    # single training row, that row is both learnt from and validated on.
    validation_start: int

    @property
    def holdout_rows(self) -> int:
        """Rows held out for evaluation."""
        return self.scan.total - self.train_rows

    @property
    def train(self) -> list[Segment]:
        """Every training row."""
        return self.scan.segments(0, self.train_rows)

    @property
    def fit(self) -> list[Segment]:
        """The training rows before the validation slice."""
        return self.scan.segments(0, max(self.validation_start, 1))

    @property
    def validation(self) -> list[Segment]:
        """The validation slice: the latest 10 % of the training rows."""
        return self.scan.segments(self.validation_start, self.train_rows)

    @property
    def holdout(self) -> list[Segment]:
        """The held-out rows: the latest `holdout_fraction` of the window's labelled rows."""
        return self.scan.segments(self.train_rows, self.scan.total)


def split_window(scan: WindowScan, holdout_fraction: float) -> WindowSplit:
    """Where the window splits, as `split_holdout` splits the window's rows in time order."""
    train = scan.total - holdout_count(scan.total, holdout_fraction)
    validation = train - holdout_count(train, VALIDATION_FRACTION) if train > 1 else 0
    return WindowSplit(scan, train, validation)


def segment_rows(
    partitions: Mapping[str, pd.DataFrame], segment: Segment, label: str
) -> pd.DataFrame:
    """The rows of one segment, read from its day."""
    return day_rows(partitions[segment.day], label).iloc[segment.start : segment.stop]


def stream(
    partitions: Mapping[str, pd.DataFrame], segments: Sequence[Segment], label: str
) -> Iterator[pd.DataFrame]:
    """Each segment's rows in turn, its day read when it is reached."""
    for segment in segments:
        yield segment_rows(partitions, segment, label)


def chunked(frames: Iterator[pd.DataFrame], rows: int) -> Iterator[pd.DataFrame]:
    """Consecutive frames joined until they hold at least `rows` rows (a bigger frame alone).

    Fitting and encoding cost milliseconds a call whatever the rows: small days are worked on
    several at a time, with memory bounded by `rows` rows or one day.
    """
    pending: list[pd.DataFrame] = []
    held = 0
    for frame in frames:
        pending.append(frame)
        held += len(frame)
        if held >= rows:
            yield pending[0] if len(pending) == 1 else pd.concat(pending, ignore_index=True)
            pending, held = [], 0
    if pending:
        yield pending[0] if len(pending) == 1 else pd.concat(pending, ignore_index=True)


def label_summary(
    partitions: Mapping[str, pd.DataFrame],
    scan: WindowScan,
    segments: Sequence[Segment],
    label: str,
) -> LabelSummary:
    """The labels of some segments: a whole day's from the scan, a part of a day read again."""
    whole = dict(zip(scan.days, zip(scan.rows, scan.labels, strict=True), strict=True))
    summary = LabelSummary()
    for segment in segments:
        rows, labels = whole[segment.day]
        if segment.start == 0 and segment.stop == rows:
            summary += labels
        else:
            summary += LabelSummary.of(segment_rows(partitions, segment, label)[label])
    return summary


def allocate(counts: np.ndarray, total: int) -> np.ndarray:
    """Whole quotas proportional to `counts` that sum to `total` (at most their sum).

    Largest remainders: each stratum gets the floor of its exact share, and the rows left go
    to the largest fractional parts, ties to the earlier strata. No quota exceeds its count.
    """
    counts = np.asarray(counts, dtype="int64")
    exact = counts * (total / counts.sum())
    quotas = np.floor(exact).astype("int64")
    left = total - int(quotas.sum())
    order = np.argsort(-(exact - quotas), kind="stable")
    quotas[order[:left]] += 1
    return np.minimum(quotas, counts)


# Rows of each class a classifier's sample keeps when the window has them: a stratified
# validation split (gradient boosting's early stopping) needs two of a class.
MIN_CLASS_ROWS = 2


def keep_each_class(quotas: np.ndarray, counts: np.ndarray, rows: int) -> np.ndarray:
    """`quotas` (segments x classes) moved so each class keeps `MIN_CLASS_ROWS` where it can.

    Proportional shares round a rare class to nothing (3 positives in 100,000 rows sampled to
    1,000 get 0.03 rows), and a classifier cannot learn from one class. The rows a class lacks
    come from the other class's largest quotas, and go to the segments holding most of the
    rare class's unsampled rows; the total stays `rows`.
    """
    quotas = quotas.copy()
    keep = MIN_CLASS_ROWS if rows >= 2 * MIN_CLASS_ROWS else 1
    for rare, other in ((0, 1), (1, 0)):
        lacking = min(keep, int(counts[:, rare].sum())) - int(quotas[:, rare].sum())
        for _ in range(max(lacking, 0)):
            quotas[int(np.argmax(counts[:, rare] - quotas[:, rare])), rare] += 1
            quotas[int(np.argmax(quotas[:, other])), other] -= 1
    return quotas


def stratified_sample(
    partitions: Mapping[str, pd.DataFrame],
    scan: WindowScan,
    segments: Sequence[Segment],
    label: str,
    rows: int,
    seed: int,
    classification: bool,
) -> pd.DataFrame:
    """`rows` of the segments' rows, drawn a day at a time and kept in the window's order.

    Each day gives its share of the rows (for a classifier, each class of each day its share,
    so the sample keeps every day's mix of classes), drawn without replacement by a generator
    seeded with `seed` and the day, so a day's draw does not depend on the other days'.
    """
    if classification:
        counts = np.array(
            [label_summary(partitions, scan, [s], label).class_counts() for s in segments]
        ).astype("int64")
    else:
        counts = np.array([[s.rows] for s in segments], dtype="int64")
    quotas = allocate(counts.ravel(), rows).reshape(counts.shape)
    if classification:
        quotas = keep_each_class(quotas, counts, rows)
    parts = []
    for segment, quota in zip(segments, quotas, strict=True):
        frame = segment_rows(partitions, segment, label)
        if classification:
            y = frame[label].astype("int64").to_numpy()
            groups = [np.flatnonzero(y == 0), np.flatnonzero(y == 1)]
        else:
            groups = [np.arange(len(frame))]
        day = dt.date.fromisoformat(segment.day).toordinal()
        rng = np.random.default_rng([seed, day])
        chosen = [
            rng.choice(group, n, replace=False) for group, n in zip(groups, quota, strict=True)
        ]
        parts.append(frame.iloc[np.sort(np.concatenate(chosen))])
    return pd.concat(parts, ignore_index=True)
