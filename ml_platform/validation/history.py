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
from ml_platform.contracts.reference import describe_reference, reference_days

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


# The least a count's bounds are widened by, either way (`count_bound`).
MIN_COUNT_MARGIN = 1.0


def _identifier(column: str) -> str:
    """A column name as ASCII letters, digits and underscores only, still telling columns apart.

    GE parses suite parameter names as ASCII identifiers: `prix_unité` must not reach it.
    """
    safe = "".join(ch if ch.isascii() and ch.isalnum() else "_" for ch in column)
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
    """Bounds of a count: the range widened by max(spread x robust sd, floor x median, 1), >= 0.

    At least one either way: a count that never moved in a small history (an optional column
    never filled, a category column of one value) would otherwise allow that count alone, and
    the first row to use the column, or one new category, would reject the whole delivery.
    The bounds are the whole counts inside: GE holds a count expectation's bounds as integers,
    truncating them, so a low bound of 10.3 would let GE pass a count of 10 that it is not.
    """
    lo, hi = min(history), max(history)
    median = float(statistics.median(history))
    margin = max(spread * robust_sd(history), floor * median, MIN_COUNT_MARGIN)
    return Bound(lo, hi, float(max(0, math.ceil(lo - margin))), float(math.floor(hi + margin)))


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

    def reference_line(self) -> str:
        """The reference days, named once in a description."""
        stored = ", ".join(self.stored) or "none"
        if self.too_short:
            return (
                f"Reference days: {len(self.stored)} of the {self.needed} needed are stored "
                f"({self.reference}: {stored}), too few to bound the statistics yet."
            )
        return f"Reference days: {len(self.stored)} ({self.reference}: {stored})."


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


# The order findings are told in: a statistic before those that follow from it (no rows: no
# null share; no label: no positive rate), so the first one named is the one to fix.
KIND_ORDER: tuple[HistoryStatistic, ...] = (
    "row_count",
    "labelled_share",
    "null_share",
    "positive_rate",
    "distinct_count",
)


@dataclasses.dataclass(frozen=True)
class Finding:
    """A history statistic of the day outside its bounds, or undefined where GE needed a value.

    `rows` is the day's row count, which says why a value is undefined. `bound` is None when
    the history gave the statistic no bounds (too short, or undefined on too many reference
    days): only an undefined value fails then.
    """

    statistic: Statistic
    today: float | None
    bound: Bound | None
    rows: int

    @property
    def undefined_because(self) -> str:
        """Why today's value is undefined (only meaningful when it is)."""
        if self.rows == 0:
            return "the day has no rows"
        if self.statistic.kind == "positive_rate":
            return "no row has a label"
        return "GE measured no value"

    def allowed(self) -> str:
        """The range today's value had to fall in, in words."""
        stat, bound = self.statistic, self.bound
        if bound is None:
            return "any defined value (the history gives it no bounds yet)"
        return f"{stat.show(bound.low)} to {stat.show(bound.high)}"

    def sort_key(self) -> tuple[int, bool, float]:
        """Kind first (see KIND_ORDER), then the farthest outside its bounds."""
        excess = 0.0
        if self.today is not None and self.bound is not None:
            width = max(self.bound.high - self.bound.low, 1e-12)
            outside = max(self.bound.low - self.today, self.today - self.bound.high, 0.0)
            excess = outside / width
        return KIND_ORDER.index(self.statistic.kind), self.today is None, -excess

    def headline(self, window: HistoryWindow) -> str:
        """The finding as the sentence a description opens with."""
        stat, bound = self.statistic, self.bound
        if self.today is None:
            return (
                f"{stat.describe()} is undefined today: {self.undefined_because}; "
                f"allowed: {self.allowed()}."
            )
        history = (
            f" (they ranged {stat.show(bound.history_min)} to {stat.show(bound.history_max)})"
            if bound is not None
            else ""
        )
        return (
            f"{stat.describe()} is {stat.show(self.today)} today, outside the {self.allowed()} "
            f"its {len(window.stored)} reference days allow{history}."
        )

    def line(self) -> str:
        """The finding as one short line after the headline."""
        why = f" ({self.undefined_because})" if self.today is None else ""
        return (
            f"{self.statistic.describe()} is {self.statistic.show(self.today)} today{why}, "
            f"allowed {self.allowed()}"
        )

    def details(self) -> dict[str, Any]:
        """The numbers behind the finding, for the check's metadata."""
        bound = self.bound
        return {
            "statistic": self.statistic.key,
            "column": self.statistic.column,
            "today": self.today,
            "history_min": None if bound is None else bound.history_min,
            "history_max": None if bound is None else bound.history_max,
            "low": None if bound is None else bound.low,
            "high": None if bound is None else bound.high,
        }


def history_finding(window: HistoryWindow, key: str, observed: float | None, rows: int) -> Finding:
    """A failed history expectation as a finding; `observed` is GE's observed value.

    Total over what GE can report: an undefined value (no rows, no labelled row) and a
    statistic the history gave no bounds (GE fails an unbounded expectation whose value it
    cannot measure) are findings like any other.
    """
    stat = window.statistics[key]
    # GE measures the share of present values of no rows as 0: no share exists without rows.
    today = None if rows == 0 and stat.is_share else stat.from_ge(observed)
    return Finding(stat, today, window.bounds.get(key), rows)


def findings_text(findings: Sequence[Finding], window: HistoryWindow) -> str:
    """The worst finding in one sentence, then one short line per further finding."""
    first, *rest = sorted(findings, key=Finding.sort_key)
    return "\n".join([first.headline(window), *(f"- {finding.line()}" for finding in rest)])


HISTORY_TABLE_COLUMNS = ("statistic", "today", "history", "allowed", "verdict")


def history_table(
    window: HistoryWindow, profile: dict[str, float | None], failed: set[str]
) -> list[dict[str, Any]]:
    """Every judged statistic of the day: today's value, its history, bounds and verdict."""
    rows = []
    for key, stat in window.statistics.items():
        bound = window.bounds.get(key)
        today = profile.get(key)
        if key in failed:
            verdict = "outside"
        elif bound is None:
            verdict = "not judged (no bounds)"
        else:
            verdict = "within"
        rows.append(
            {
                "statistic": key,
                "today": stat.show(today),
                "history": "-"
                if bound is None
                else f"{stat.show(bound.history_min)} to {stat.show(bound.history_max)}",
                "allowed": "-"
                if bound is None
                else f"{stat.show(bound.low)} to {stat.show(bound.high)}",
                "verdict": verdict,
            }
        )
    return rows


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
