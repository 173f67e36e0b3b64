"""The history gate: what a day's statistics are, and how far from its history they may stray.

Static contract bounds cannot see a file that is valid row by row but unlike every day before
it: a label source emptied on every row, a nullable column half empty, a third of the flights
missing. This module profiles each day that passes the gate (null share of every contract
column, the label's labelled share and, for classification, its positive rate, the row count,
the distinct count of each text column) and derives, from the profiles of the day's reference
days, the bounds Great Expectations then checks the day against.

The bounds are the history's own range [min, max], widened on each side by
max(spread x robust sd, floor): the robust sd (1.4826 x the median absolute deviation) lets a
noisy statistic move as much as it usually does, and the floor (absolute for shares, a share of
the history's median for counts) keeps a perfectly stable history from failing every tiny
wobble. Only days that passed the gate are profiled, so a failed day never becomes history.
"""

import dataclasses
import datetime as dt
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.contracts.model import HistoryStatistic
from ml_platform.drift.reference import describe_reference, reference_days

# Scales a median absolute deviation to the standard deviation of a normal distribution.
MAD_TO_SD = 1.4826
SHARES: frozenset[HistoryStatistic] = frozenset({"null_share", "labelled_share", "positive_rate"})


@dataclasses.dataclass(frozen=True)
class Statistic:
    """One statistic of a day: its kind and, for per-column kinds, the column."""

    kind: HistoryStatistic
    column: str | None = None

    @property
    def key(self) -> str:
        """The statistic's name in a profile, e.g. 'null_share(tailnum)' or 'row_count'."""
        return f"{self.kind}({self.column})" if self.column else self.kind

    @property
    def is_share(self) -> bool:
        """Shares lie in [0, 1] and take an absolute floor; counts take a relative one."""
        return self.kind in SHARES

    def parameter(self, side: str) -> str:
        """The name of the GE suite parameter holding this statistic's `min` or `max` bound.

        GE reads a parameter name as an expression, so the column's name appears in it with
        letters, digits and underscores only.
        """
        if self.column is None:
            return f"history_{self.kind}_{side}"
        return f"history_{self.kind}_{_identifier(self.column)}_{side}"

    def from_ge(self, observed: float | None) -> float | None:
        """Today's value from GE's observed value (GE measures a null share as present share)."""
        if observed is None or math.isnan(observed):
            return None
        return 1.0 - observed if self.kind == "null_share" else observed

    def describe(self) -> str:
        """The statistic in words."""
        words = {
            "null_share": f"the share of missing values of column {self.column}",
            "labelled_share": f"the share of rows with a label ({self.column})",
            "positive_rate": f"the positive rate of the label {self.column} (labelled rows)",
            "row_count": "the number of rows",
            "distinct_count": f"the number of distinct values of column {self.column}",
        }
        return words[self.kind]

    def show(self, value: float | None) -> str:
        """A value of the statistic as a person reads it."""
        if value is None:
            return "undefined"
        return f"{value:.1%}" if self.is_share else f"{value:,.0f}"


def _identifier(column: str) -> str:
    """A column name as letters, digits and underscores only, still telling columns apart."""
    safe = "".join(ch if ch.isalnum() else "_" for ch in column)
    return safe if safe == column else f"{safe}_{column.encode().hex()}"


def statistics_of(contract: Contract) -> list[Statistic]:
    """Every statistic a profile of the contract's days holds, in a fixed order."""
    stats = [Statistic("null_share", c.name) for c in contract.columns]
    stats.append(Statistic("labelled_share", contract.label_name))
    if contract.task == "classification":
        stats.append(Statistic("positive_rate", contract.label_name))
    stats.append(Statistic("row_count"))
    stats += [Statistic("distinct_count", c.name) for c in contract.columns if c.dtype == "str"]
    return stats


def gated_statistics(contract: Contract) -> list[Statistic]:
    """The statistics the contract's history gate judges (`quality.history.statistics`).

    Null shares are judged for the columns that may hold nulls.
    """
    wanted = set(contract.quality.history.statistics)
    # A column that must be full is already held to that by gx_completeness: only columns that
    # may hold nulls have a null share worth comparing with history (and each expectation
    # costs GE several milliseconds of its own bookkeeping).
    may_be_null = {c.name for c in contract.columns if c.nullable or c.max_null_fraction}
    return [
        s
        for s in statistics_of(contract)
        if s.kind in wanted and (s.kind != "null_share" or s.column in may_be_null)
    ]


def day_profile(typed: pd.DataFrame, contract: Contract) -> dict[str, float | None]:
    """Statistic key -> value of one day's typed rows (None: undefined, e.g. no labelled row)."""
    rows = len(typed)
    profile: dict[str, float | None] = {}
    for stat in statistics_of(contract):
        column = typed[stat.column] if stat.column else None
        if stat.kind == "null_share":
            assert column is not None
            profile[stat.key] = float(column.isna().sum()) / rows if rows else None
        elif stat.kind == "labelled_share":
            assert column is not None
            profile[stat.key] = float(column.notna().sum()) / rows if rows else None
        elif stat.kind == "positive_rate":
            assert column is not None
            labelled = column.dropna()
            profile[stat.key] = float(labelled.astype("float64").mean()) if len(labelled) else None
        elif stat.kind == "row_count":
            profile[stat.key] = float(rows)
        else:
            assert column is not None
            profile[stat.key] = float(column.nunique(dropna=True))
    return profile


def robust_sd(values: Sequence[float]) -> float:
    """1.4826 x the median absolute deviation: a standard deviation that ignores outliers."""
    # statistics.median, not pandas: a history holds a few values, and a range computes the
    # bounds of every day of it more than once.
    centre = statistics.median(values)
    return MAD_TO_SD * float(statistics.median([abs(v - centre) for v in values]))


@dataclasses.dataclass(frozen=True)
class Bound:
    """The history of one statistic and the interval today's value must fall in."""

    history_min: float
    history_max: float
    low: float
    high: float

    def holds(self, value: float | None) -> bool:
        """Whether a value is inside the bounds (an undefined value never is)."""
        if value is None or math.isnan(value):
            return False
        return self.low <= value <= self.high


def share_bound(history: Sequence[float], spread: float, floor: float) -> Bound:
    """Bounds of a share: the range widened by max(spread x robust sd, floor), within [0, 1]."""
    lo, hi = min(history), max(history)
    margin = max(spread * robust_sd(history), floor)
    return Bound(lo, hi, max(0.0, lo - margin), min(1.0, hi + margin))


def count_bound(history: Sequence[float], spread: float, floor: float) -> Bound:
    """Bounds of a count: the range widened by max(spread x robust sd, floor x median), >= 0."""
    lo, hi = min(history), max(history)
    median = float(statistics.median(history))
    margin = max(spread * robust_sd(history), floor * median)
    return Bound(lo, hi, max(0.0, lo - margin), hi + margin)


def bounds_of(
    stats: Sequence[Statistic], profiles: Sequence[dict[str, float | None]], contract: Contract
) -> dict[str, Bound]:
    """Statistic key -> bounds from the reference days' profiles.

    A statistic defined on fewer than `min_days` of them (a column added since, a day with no
    labelled row) gets no bounds: there is not enough history of it to judge.
    """
    spec = contract.quality.history
    bounds = {}
    for stat in stats:
        values = [p[stat.key] for p in profiles if p.get(stat.key) is not None]
        history = [float(v) for v in values if v is not None and not math.isnan(float(v))]
        if len(history) < spec.min_days:
            continue
        if stat.is_share:
            bounds[stat.key] = share_bound(history, spec.spread, spec.share_floor)
        else:
            bounds[stat.key] = count_bound(history, spec.spread, spec.count_floor)
    return bounds


def judge(profile: dict[str, float | None], bounds: dict[str, Bound]) -> list[str]:
    """The keys of the statistics of `profile` outside their bounds (pure, for measurements)."""
    return [key for key, bound in bounds.items() if not bound.holds(profile.get(key))]


@dataclasses.dataclass(frozen=True)
class HistoryWindow:
    """A day's history: the reference days asked for, those stored, and the bounds."""

    day: str
    reference: str  # the reference in words
    wanted: list[str]
    stored: list[str]
    needed: int
    bounds: dict[str, Bound]
    statistics: dict[str, Statistic]

    @property
    def too_short(self) -> bool:
        """Fewer stored reference days than the gate needs to judge."""
        return len(self.stored) < self.needed

    def note(self) -> str:
        """Why the history was not judged, or which days it was made of."""
        if self.too_short:
            return (
                f"the history is too short yet: {len(self.stored)} of the {self.needed} "
                f"reference days needed are stored ({self.reference}: "
                f"{', '.join(self.stored) or 'none'}); the history statistics were not judged, "
                f"and will be once {self.needed} reference days have passed the gate"
            )
        return f"{len(self.stored)} reference days ({self.reference}: {', '.join(self.stored)})"


def window_from_profiles(
    contract: Contract, day: str, profiles: dict[str, dict[str, float | None]]
) -> HistoryWindow:
    """The history of `day` from the profiles of the stored days (day -> profile)."""
    spec = contract.history_reference
    date = dt.date.fromisoformat(day)
    wanted = [d.isoformat() for d in reference_days(spec, date, contract.partitions.start_date)]
    stored = [d for d in wanted if d in profiles]
    needed = contract.quality.history.min_days
    bounds = (
        {}
        if len(stored) < needed
        else bounds_of(gated_statistics(contract), [profiles[d] for d in stored], contract)
    )
    return HistoryWindow(
        day=day,
        reference=describe_reference(spec, date),
        wanted=wanted,
        stored=stored,
        needed=needed,
        bounds=bounds,
        statistics={s.key: s for s in gated_statistics(contract)},
    )


def history_parameters(
    stats: Sequence[Statistic], window: HistoryWindow | None
) -> dict[str, float | None]:
    """GE suite parameters of the history expectations: each statistic's bounds.

    A statistic without bounds (no window, too short a history) gets None on both sides, which
    GE reads as unbounded: the expectation passes.
    """
    parameters: dict[str, float | None] = {}
    for stat in stats:
        bound = window.bounds.get(stat.key) if window is not None else None
        low = None if bound is None else bound.low
        high = None if bound is None else bound.high
        if stat.kind == "null_share":
            # GE checks the share of present values: 1 - null share, bounds turned around.
            low, high = (None if high is None else 1.0 - high), (None if low is None else 1.0 - low)
        parameters[stat.parameter("min")] = low
        parameters[stat.parameter("max")] = high
    return parameters


def history_sentence(
    window: HistoryWindow, key: str, observed: float | None
) -> tuple[str, dict[str, Any]]:
    """A failed history statistic in words and numbers; `observed` is GE's observed value."""
    stat = window.statistics[key]
    bound = window.bounds[key]
    today = stat.from_ge(observed)
    sentence = (
        f"{stat.describe()} is {stat.show(today)} today; over {window.note()} it ranged "
        f"{stat.show(bound.history_min)} to {stat.show(bound.history_max)}, so the gate "
        f"allowed {stat.show(bound.low)} to {stat.show(bound.high)}."
    )
    details = {
        "statistic": key,
        "column": stat.column,
        "today": today,
        "history_min": bound.history_min,
        "history_max": bound.history_max,
        "low": bound.low,
        "high": bound.high,
        "reference_days": window.stored,
    }
    return sentence, details


# The validated_data metadata entry holding the profile of a day that passed the gate: the
# statistics its later days' history gates compare with.
PROFILE_KEY = "history_profile"


def history_window(
    profile_of: Callable[[str], dict[str, float | None] | None], contract: Contract, day: str
) -> HistoryWindow:
    """The history of `day`: the profiles of its reference days that are history.

    `profile_of(reference_day)` is the profile of a day Dagster records as accepted (or that
    the running step accepted), None for any other day (validated_data's `profile_of`).
    """
    spec = contract.history_reference
    date = dt.date.fromisoformat(day)
    profiles = {}
    for reference_day in reference_days(spec, date, contract.partitions.start_date):
        profile = profile_of(reference_day.isoformat())
        if profile is not None:
            profiles[reference_day.isoformat()] = profile
    return window_from_profiles(contract, day, profiles)
