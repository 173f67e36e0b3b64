"""Which features of a day drifted from the reference: the pure computation behind the check.

Per numeric feature the two-sample KS statistic D and its p-value; per categorical feature the
Jensen-Shannon distance and a chi-square p-value. The day's p-values are corrected for the number
of features tested (Holm by default). A feature passes the fixed gate when its effect size
reaches its threshold AND its corrected p-value is at most alpha: the p-value alone fires on
negligible changes once samples are large, the effect size alone fires on noise when they are
small.

A feature that really moves every day (the weather, prices) passes any fixed gate on most
days. So a feature drifts only when, besides the fixed gate, its distance today is also unusual
against its own day-to-day movement: above the `drift.calibration.quantile` of the distances of
each reference day from the other reference days (leave-one-out, same statistic). With too few
reference days to know that movement, the fixed gate decides alone and the verdict says so.
"""

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import pandas as pd

from ml_platform.contracts import Contract, FeatureSpec
from ml_platform.contracts.model import (
    CALENDAR_TRANSFORMS,
    EVENT_TIME,
    LOCAL_EVENT_TIME,
    redefined,
    stored_definitions,
)
from ml_platform.drift.categorical import (
    CategoricalComparison,
    category_counts,
    column_counts,
    compare_counts,
)
from ml_platform.drift.correction import CORRECTIONS
from ml_platform.drift.ks import ks_2samp_columns

Status = Literal["drift", "stable", "skipped"]
# A day whose categories the reference never had make at least this share of its rows is a
# change of coding, not a rare category showing up.
UNSEEN_SHARE = 0.5
# A numeric day has left the reference when at least this many of its values mostly lie beyond
# the reference's range, with its median this many reference standard deviations away.
RANGE_VALUES = 10
LEVEL_SHIFT_SD = 3.0
# A reference day holding fewer values of a feature than this share of the window's median day
# is left out of that feature's calibration. The distance of a day from the others is mostly
# its own sampling noise when it is small (about 1 / sqrt(n)): one partial delivery of 3 rows
# among days of 1000 has a distance near 0.3 where the others have 0.06, and, as the largest,
# it became the bound that hid every shift below it for as long as it stayed in the window.
# A quarter of the median day is twice the noise of the median day; the flights days (634 to
# about 1000 flights) and the synthetic ones are all kept.
CALIBRATION_DAY_SHARE = 0.25
# Why a feature the reference days were stored without (added to the contract, or renamed,
# after them) is not tested: not "no values", which would read as a broken delivery.
NO_REFERENCE_YET = "no reference values yet"
NOT_YET_IN_REFERENCE = (
    f"{NO_REFERENCE_YET}: the reference days lack the column, added to the contract after them"
)
# Stored before the contract changed how a feature is computed, a reference day holds its values
# as they were: numbers (5.0) where the day has categories ('5'), every one a category the
# reference never had, text that no number can be read from, or numbers of another source or
# transform (amounts where the day has their logarithms), a shift no delivery made.
REDEFINED = "as the contract defined it before (another kind, source or transform)"
OTHER_KIND_IN_REFERENCE = (
    f"{NO_REFERENCE_YET}: the reference days hold the column {REDEFINED}, changed in the "
    "contract after them"
)


@dataclasses.dataclass(frozen=True)
class FeatureVerdict:
    """The drift verdict of one feature on one day.

    Attributes:
        feature: the feature's name.
        kind: 'numeric' or 'categorical'.
        effect_name: 'ks_d' (KS statistic) or 'js_distance' (Jensen-Shannon distance).
        effect: the effect size, or None when the feature was not tested.
        threshold: the effect size from which the feature may drift.
        p_value: the test's p-value before correction.
        p_adjusted: the p-value corrected for the features tested that day.
        n_reference: non-null reference values.
        n_current: non-null values of the day.
        nulls_reference: missing reference values (left out of the test).
        nulls_current: missing values of the day (left out of the test).
        status: 'drift', 'stable' or 'skipped'. A blocking feature without values on the day
            is 'drift' with no effect: it cannot be checked, and unknown is not "no drift".
        blocking: whether drift of this feature keeps the day's model from being trained.
        change: what moved, in words (e.g. 'median 0.01 -> 0.21, +0.20 reference sd'),
            or why the feature was skipped.
        fixed_gate: whether the effect size and corrected p-value passed the fixed gate.
        calibration_bound: the `calibration.quantile` of the feature's day-to-day distances
            in the reference window, which the effect must exceed; None when not calibrated.
        day_to_day_low: the smallest of those day-to-day distances (None when not calibrated).
        day_to_day_high: the largest of them (None when not calibrated).
        calibration: how the calibration bound was set that day, or why there is none.
        unseen: the day lies where the reference never was: its level moved beyond the
            reference's range (`_numeric_changes`), or half its rows or more are in categories
            the reference never had. Drift of such a day opens an episode at once
            (`drift.episodes`), without waiting for more days: a sliding reference soon
            absorbs a lasting move of the level, and a unit or a coding changed does not need
            three days to be believed.
    """

    feature: str
    kind: str
    effect_name: str
    effect: float | None
    threshold: float
    p_value: float | None
    p_adjusted: float | None
    n_reference: int
    n_current: int
    nulls_reference: int
    nulls_current: int
    status: Status
    blocking: bool
    change: str
    fixed_gate: bool = False
    calibration_bound: float | None = None
    day_to_day_low: float | None = None
    day_to_day_high: float | None = None
    calibration: str = ""
    unseen: bool = False


def skip_reason(spec: FeatureSpec, contract: Contract) -> str | None:
    """Why a feature is never tested for drift, or None when it is."""
    override = contract.drift.features.get(spec.name)
    if override is not None and override.exclude:
        return "excluded in the contract's drift settings"
    # With a timezone column the event time is in UTC, and a local day spans two UTC dates.
    local = LOCAL_EVENT_TIME if contract.event_time.timezone_column else EVENT_TIME
    if spec.source == local and spec.transform in CALENDAR_TRANSFORMS:
        return "calendar feature: every row of a day has the same value, set by the date"
    if spec.constant_within_day:
        return "constant within a day (constant_within_day in the contract): one value per day"
    columns = {column.name: column for column in contract.columns}
    if spec.source in columns and columns[spec.source].constant_within_day:
        return (
            f"constant within a day: its column '{spec.source}' is marked constant_within_day "
            "in the contract (one value per day)"
        )
    return None


def undeclared(frame: pd.DataFrame, contract: Contract) -> dict[str, bool]:
    """The features a stored features frame does not hold as the contract now declares them.

    Maps each to whether the frame holds its column as the contract defined it before. Features
    are stored typed (`features.transforms.feature_column`: float64 numeric, text categorical)
    with the definition each was computed by (`FEATURE_DEFINITIONS`; frames stored before
    definitions were recorded say only their kind, by their type). A day stored before the
    contract added or renamed a feature lacks its column, one stored before it changed the
    feature's kind, source or transform holds values of the old definition. Read from the frame
    once: a day's reference days are checked on every day.
    """
    dtypes = frame.dtypes.to_dict()
    changed = set(redefined(stored_definitions(frame.attrs), contract.feature_definitions))
    found = {}
    for spec in contract.features:
        dtype = dtypes.get(spec.name)
        if dtype is None:
            found[spec.name] = False
        # A column without values (no rows, all missing) has nothing to misread.
        elif (
            spec.name in changed or pd.api.types.is_numeric_dtype(dtype) != (spec.kind == "numeric")
        ) and frame[spec.name].notna().any():
            found[spec.name] = True
    return found


def as_declared(frame: pd.DataFrame, contract: Contract) -> pd.DataFrame:
    """The frame without the feature columns it holds as another kind than the contract's.

    Such a day has no values of the feature: it is tested from the days that do.
    """
    stale = [name for name, other_kind in undeclared(frame, contract).items() if other_kind]
    return frame.drop(columns=stale) if stale else frame


def tested_features(contract: Contract) -> list[FeatureSpec]:
    """The features the drift check tests, in contract order."""
    return [spec for spec in contract.features if skip_reason(spec, contract) is None]


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Each tested feature's day-to-day distances inside one reference window.

    Attributes:
        days: the reference days the window holds.
        quantile: the quantile of the distances a feature's effect must exceed.
        distances: per feature, the distance of each reference day from the other reference
            days (KS D or Jensen-Shannon distance); empty when not applied.
        note: how the bounds were set, or why the fixed gate decides alone.
        min_days: the fewest distances a feature's bound is taken from
            (`drift.calibration.min_days`).
    """

    days: int
    quantile: float
    distances: dict[str, np.ndarray]
    note: str
    min_days: int = 1

    def bound(self, feature: str) -> float | None:
        """The `quantile` of the feature's day-to-day distances; None with fewer than min_days.

        A feature can have values on fewer reference days than the window holds (empty or
        all-missing days): its few distances would not measure its usual movement either.
        """
        values = self.distances.get(feature)
        if values is None or len(values) < self.min_days:
            return None
        return calibration_bound(values, self.quantile)


def calibration_bound(distances: np.ndarray, quantile: float) -> float:
    """The `quantile` of day-to-day distances, by the plotting position q * (n + 1).

    That position makes "today exceeds the bound" happen on a share 1 - q of ordinary days
    whatever the number n of reference days; with fewer than q / (1 - q) days (39 at 0.975)
    it is the largest distance, and the share is then 1 / (n + 1).
    """
    return float(np.quantile(np.asarray(distances, dtype="float64"), quantile, method="weibull"))


def leave_one_out_distances(
    days: Sequence[pd.DataFrame],
    contract: Contract,
    counts: Sequence[Mapping[str, pd.Series]] | None = None,
) -> dict[str, np.ndarray]:
    """Per tested feature, the distance of each day from all the other days together.

    The statistic is the one the day is tested with: the KS statistic D that `ks_2samp_columns`
    computes, or the Jensen-Shannon distance of category shares that `compare_categorical`
    computes, each obtained for every day at once from the pooled reference.
    Distances that cannot be computed (a side without values) are left out, and so are those
    of days with fewer than `CALIBRATION_DAY_SHARE` of the median day's values of the feature.
    `counts` holds each day's `category_counts` per categorical feature when already known.
    """
    days = [as_declared(frame, contract) for frame in days]
    specs = tested_features(contract)
    numeric = [s.name for s in specs if s.kind == "numeric"]
    categorical = [s.name for s in specs if s.kind == "categorical"]
    found: dict[str, np.ndarray] = {}
    sizes: dict[str, np.ndarray] = {}
    if numeric:
        # A day stored before the contract declared a feature holds no values of it.
        values = [frame.reindex(columns=numeric).to_numpy(dtype="float64") for frame in days]
        statistics = _leave_one_out_ks(values)
        found |= {name: statistics[:, j] for j, name in enumerate(numeric)}
        present = np.array([np.sum(~np.isnan(v), axis=0) for v in values]).reshape(-1, len(numeric))
        sizes |= {name: present[:, j] for j, name in enumerate(numeric)}
    for name in categorical:
        day_counts = (
            [column_counts(frame, name) for frame in days]
            if counts is None
            else [day[name] for day in counts]
        )
        found[name] = _leave_one_out_js(day_counts)
        sizes[name] = np.array([float(c.sum()) for c in day_counts])
    kept = {}
    for name, distances in found.items():
        n = sizes[name]
        typical = float(np.median(n[n > 0])) if np.any(n > 0) else 0.0
        kept[name] = distances[np.isfinite(distances) & (n >= CALIBRATION_DAY_SHARE * typical)]
    return kept


def _leave_one_out_ks(days: list[np.ndarray]) -> np.ndarray:
    """KS D of each day's values against all the other days' values, per column: (days, k).

    One sort of the pooled values per column instead of one per day: at each distinct pooled
    value, a day's count of values up to it is a running sum of its rows, and the other days'
    count is the pooled count minus it. These are the counts scipy's ECDFs are made of (right-
    continuous, ties included), so D is the statistic `ks_2samp` gives for the same samples.
    """
    labels = np.concatenate([np.full(len(values), i) for i, values in enumerate(days)])
    pooled = np.concatenate(days)
    out = np.full((len(days), pooled.shape[1]), np.nan)
    for j in range(pooled.shape[1]):
        present = ~np.isnan(pooled[:, j])
        order = np.argsort(pooled[present, j], kind="stable")
        values, owner = pooled[present, j][order], labels[present][order]
        if not len(values):
            continue
        # The ECDFs only change at the last of a run of equal values.
        last = np.append(values[1:] != values[:-1], True)
        total = np.arange(1, len(values) + 1)[last]
        for i in range(len(days)):
            mine = np.cumsum(owner == i)[last]
            n_day, n_rest = int(mine[-1]), len(values) - int(mine[-1])
            if n_day and n_rest:
                out[i, j] = float(np.max(np.abs(mine / n_day - (total - mine) / n_rest)))
    return out


def _leave_one_out_js(days: list[pd.Series]) -> np.ndarray:
    """Jensen-Shannon distance (base 2) of each day's category shares from the other days'.

    `days` holds each day's `category_counts`.
    """
    from scipy.spatial.distance import jensenshannon

    counts = pd.DataFrame(dict(enumerate(days))).fillna(0.0).to_numpy(dtype="float64").T
    rest = counts.sum(axis=0) - counts
    day_n = counts.sum(axis=1, keepdims=True)
    rest_n = rest.sum(axis=1, keepdims=True)
    distances = np.full(len(days), np.nan)
    valid = (day_n[:, 0] > 0) & (rest_n[:, 0] > 0)
    if valid.any() and counts.shape[1]:
        distances[valid] = jensenshannon(
            counts[valid] / day_n[valid], rest[valid] / rest_n[valid], base=2, axis=1
        )
    return distances


def calibrate(
    days: Sequence[pd.DataFrame],
    contract: Contract,
    counts: Sequence[Mapping[str, pd.Series]] | None = None,
) -> Calibration:
    """The calibration of a reference window given one frame per reference day.

    `counts` holds each day's category counts, as `leave_one_out_distances` takes them.
    """
    spec = contract.drift.calibration
    n = len(days)
    if not spec.enabled:
        note = "calibration disabled in the contract (drift.calibration.enabled): fixed gate only"
        return Calibration(n, spec.quantile, {}, note)
    if n < spec.min_days:
        note = (
            f"not calibrated: {n} reference day(s), fewer than drift.calibration.min_days "
            f"{spec.min_days}; the fixed gate decides alone"
        )
        return Calibration(n, spec.quantile, {}, note)
    note = (
        f"quantile {spec.quantile:g} of each feature's {n} day-to-day distances "
        "(each reference day against the other reference days)"
    )
    distances = leave_one_out_distances(days, contract, counts)
    return Calibration(n, spec.quantile, distances, note, spec.min_days)


def _note(calibration: Calibration, feature: str) -> str:
    if calibration.distances and calibration.bound(feature) is None:
        compared = len(calibration.distances.get(feature, ()))
        if compared:
            return (
                f"not calibrated: {compared} reference day(s) had values to compare with the "
                f"others, fewer than drift.calibration.min_days {calibration.min_days}; the "
                "fixed gate decides alone"
            )
        return (
            "not calibrated: no reference day had values on both sides of its comparison; "
            "the fixed gate decides alone"
        )
    return calibration.note


def _uncalibrated(contract: Contract) -> Calibration:
    note = "not calibrated: the reference was not given day by day; the fixed gate decides alone"
    return Calibration(0, contract.drift.calibration.quantile, {}, note)


def detect_drift(
    reference: pd.DataFrame | Sequence[pd.DataFrame],
    current: pd.DataFrame,
    contract: Contract,
    calibration: Calibration | None = None,
    reference_counts: Mapping[str, pd.Series] | None = None,
) -> list[FeatureVerdict]:
    """The drift verdict of every contract feature of `current` against `reference`.

    Args:
        reference: feature rows of the reference days (the `features` asset's columns), one
            frame per reference day; a single frame is the pooled reference, which cannot be
            calibrated (the fixed gate then decides alone).
        current: feature rows of day D.
        contract: the dataset contract, whose `drift` section sets thresholds and the gate.
        calibration: the reference window's calibration when already computed (a range of
            days sharing a reference); by default computed from the per-day frames.
        reference_counts: the reference's `category_counts` per categorical feature when
            already known (summed from its days'); by default counted from `reference`.

    Returns:
        One verdict per feature, in contract order.
    """
    settings = contract.drift
    if isinstance(reference, pd.DataFrame):
        calibration = calibration or _uncalibrated(contract)
        days = [reference]
    else:
        days = list(reference)
        calibration = calibration or calibrate(days, contract)
    # Reference days stored before the contract declared a feature as it is now (added,
    # renamed, or of another kind since) lack its column: it is tested from the days that
    # have it, and until one does it has no reference values yet.
    gaps = [undeclared(frame, contract) for frame in days]
    lacking = collections.Counter(name for gap in gaps for name in gap)
    other_kind = {name for gap in gaps for name, other in gap.items() if other}
    n_days = len(days)
    if other_kind:
        days = [as_declared(frame, contract) for frame in days]
    if isinstance(reference, pd.DataFrame):
        reference = days[0]
    else:
        reference = pd.concat(days, ignore_index=True) if days else current.iloc[0:0]
    if lacking:
        absent = [name for name in lacking if name not in reference.columns]
        reference = reference.reindex(columns=[*reference.columns, *absent])
    skipped: dict[str, str] = {}
    for spec in contract.features:
        reason = skip_reason(spec, contract)
        if reason is not None:
            skipped[spec.name] = reason
    tested: dict[str, _Tested] = {}
    numeric = [n for n in contract.numeric_features if n not in skipped]
    if numeric:
        ref_values = reference[numeric].to_numpy(dtype="float64")
        cur_values = current[numeric].to_numpy(dtype="float64")
        ks = ks_2samp_columns(ref_values, cur_values)
        changes = _numeric_changes(ref_values, cur_values)
        for j, name in enumerate(numeric):
            tested[name] = _Tested(
                effect=float(ks.statistic[j]),
                p_value=float(ks.pvalue[j]),
                n_reference=int(ks.n_reference[j]),
                n_current=int(ks.n_current[j]),
                change=changes[j][0],
                unseen=changes[j][1],
            )
    for name in contract.categorical_features:
        if name not in skipped:
            comparison = compare_counts(
                category_counts(reference[name])
                if reference_counts is None
                else reference_counts[name],
                category_counts(current[name]),
            )
            tested[name] = _Tested(
                effect=comparison.js_distance,
                p_value=comparison.pvalue,
                n_reference=comparison.n_reference,
                n_current=comparison.n_current,
                change=(
                    _categorical_change(comparison)
                    if comparison.n_reference and comparison.n_current
                    else ""
                ),
                unseen=bool(comparison.n_reference)
                and sum(comparison.current_shares[c] for c in comparison.new_categories)
                >= UNSEEN_SHARE,
            )
    # Features the contract tests that have no value on the day (all missing, or no rows).
    without_values = {name for name, numbers in tested.items() if numbers.n_current == 0}
    for name, numbers in list(tested.items()):
        if numbers.n_reference == 0 or numbers.n_current == 0:
            side = "the reference" if numbers.n_reference == 0 else "the day"
            skipped[name] = f"no values in {side}"
            if numbers.n_reference == 0 and name in lacking:
                skipped[name] = _not_yet(lacking[name], n_days, name in other_kind)
            del tested[name]
        elif name in lacking:
            numbers.change += (
                f"; against the {n_days - lacking[name]} of the {n_days} reference days that "
                f"have it (the others {_held_before(name in other_kind)} after them)"
            )
    names = [spec.name for spec in contract.features if spec.name in tested]
    adjusted = CORRECTIONS[settings.correction](np.array([tested[n].p_value for n in names]))
    for name, p_adjusted in zip(names, adjusted, strict=True):
        tested[name].p_adjusted = float(p_adjusted)
    verdicts = []
    for spec in contract.features:
        override = settings.features.get(spec.name)
        default = (
            settings.numeric_threshold if spec.kind == "numeric" else settings.categorical_threshold
        )
        threshold = override.threshold if override and override.threshold is not None else default
        nulls_reference = int(reference[spec.name].isna().sum())
        nulls_current = int(current[spec.name].isna().sum())
        result = tested.get(spec.name)
        blocking = bool(override and override.blocking)
        status: Status = "skipped"
        fixed_gate, bound, low, high = False, None, None, None
        change = result.change if result else skipped[spec.name]
        if result is None and blocking and spec.name in without_values:
            # Whether a blocking feature drifted is unknown without its values, and unknown is
            # never read as "no drift": the day's model, which stops on a blocking feature
            # among the drifting ones, must not train on a day whose feature went missing.
            status = "drift"
            change = (
                "no values in the day: a blocking feature that cannot be checked is held as drifted"
            )
        if result is not None:
            fixed_gate = result.effect >= threshold and result.p_adjusted <= settings.alpha
            bound = calibration.bound(spec.name)
            if bound is not None:
                distances = calibration.distances[spec.name]
                low, high = float(distances.min()), float(distances.max())
            usual = bound is not None and result.effect <= bound
            status = "drift" if fixed_gate and not usual else "stable"
            if fixed_gate and usual:
                change += (
                    f"; within its usual day-to-day movement ({result.effect:.3f} <= "
                    f"{bound:.3f}, quantile {calibration.quantile:g} of its day-to-day distances)"
                )
        verdicts.append(
            FeatureVerdict(
                feature=spec.name,
                kind=spec.kind,
                effect_name="ks_d" if spec.kind == "numeric" else "js_distance",
                effect=result.effect if result else None,
                threshold=threshold,
                p_value=result.p_value if result else None,
                p_adjusted=result.p_adjusted if result else None,
                n_reference=len(reference) - nulls_reference,
                n_current=len(current) - nulls_current,
                nulls_reference=nulls_reference,
                nulls_current=nulls_current,
                status=status,
                blocking=blocking,
                change=change,
                fixed_gate=fixed_gate,
                calibration_bound=bound,
                day_to_day_low=low,
                day_to_day_high=high,
                calibration=_note(calibration, spec.name) if result is not None else "",
                unseen=bool(result and result.unseen),
            )
        )
    return verdicts


def _not_yet(lacking: int, days: int, other_kind: bool) -> str:
    """Why a feature that `lacking` of the `days` reference days do not hold is not tested."""
    if lacking == days:
        return OTHER_KIND_IN_REFERENCE if other_kind else NOT_YET_IN_REFERENCE
    return (
        f"{NO_REFERENCE_YET}: {lacking} of the {days} reference days "
        f"{_held_before(other_kind)} after them, and the others hold no values of it"
    )


def _held_before(other_kind: bool) -> str:
    if other_kind:
        return f"hold the column {REDEFINED}, changed in the contract"
    return "lack the column, added to the contract"


@dataclasses.dataclass
class _Tested:
    """A tested feature's numbers before the day's correction is known."""

    effect: float
    p_value: float
    n_reference: int
    n_current: int
    change: str
    p_adjusted: float = float("nan")
    unseen: bool = False


def _numeric_changes(reference: np.ndarray, current: np.ndarray) -> list[tuple[str, bool]]:
    """Where each numeric column moved, and whether its level left the reference.

    What moved: the median and the spread, in reference standard deviations. The level left
    the reference when nearly all the day's values (its 5th to 95th percentiles, of at least
    `RANGE_VALUES` values) lie beyond everything the reference held AND its median moved
    `LEVEL_SHIFT_SD` reference standard deviations or more: a unit, a sign or a sensor changed,
    or the level moved. The weather's own extremes are not that: on a year of hourly weather
    at JFK against the 28 days before, the days that drifted beyond the range were single wind
    gusts or a front at most 2.55 sd away; the synthetic shift of +4 sd is 4.4 sd away on its
    first day.
    """
    found = []
    for j in range(reference.shape[1]):
        ref = reference[:, j][~np.isnan(reference[:, j])]
        cur = current[:, j][~np.isnan(current[:, j])]
        if not len(ref) or not len(cur):
            found.append(("", False))
            continue
        ref_median, cur_median = float(np.median(ref)), float(np.median(cur))
        ref_sd = float(np.std(ref, ddof=1)) if len(ref) > 1 else 0.0
        cur_sd = float(np.std(cur, ddof=1)) if len(cur) > 1 else 0.0
        text = f"median {_number(ref_median)} -> {_number(cur_median)}"
        if ref_sd > 0:
            text += f", {(cur_median - ref_median) / ref_sd:+.2f} reference sd"
        left = False
        if len(cur) >= RANGE_VALUES and abs(cur_median - ref_median) >= LEVEL_SHIFT_SD * ref_sd:
            low_day, high_day = np.percentile(cur, [5, 95])
            left = bool(low_day > ref.max() or high_day < ref.min())
        found.append((text + f"; sd {_number(ref_sd)} -> {_number(cur_sd)}", left))
    return found


def _number(value: float) -> str:
    """Three significant digits, without switching large numbers to exponents (1003, not 1e+03)."""
    return f"{value:.0f}" if 100 <= abs(value) < 1e6 else f"{value:.3g}"


def _categorical_change(comparison: CategoricalComparison) -> str:
    """The category whose share moved most, and any category the reference never had."""
    category, before, after = comparison.largest_change()
    text = f"share of '{category}' {before:.1%} -> {after:.1%}"
    new = comparison.new_categories
    if new:
        shown = ", ".join(repr(c) for c in new[:5])
        text += f"; new categor{'y' if len(new) == 1 else 'ies'} {shown}"
    return text
