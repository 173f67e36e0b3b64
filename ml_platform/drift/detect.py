"""Which features of a day drifted from the reference: the pure computation behind the check.

Per numeric feature the two-sample KS statistic D and its p-value; per categorical feature the
Jensen-Shannon distance and a chi-square p-value. The day's p-values are corrected for the number
of features tested (Holm by default). A feature drifts only when its effect size reaches its
threshold AND its corrected p-value is at most alpha: the p-value alone fires on negligible
changes once samples are large, the effect size alone fires on noise when they are small.
"""

import dataclasses
from typing import Literal

import numpy as np
import pandas as pd

from ml_platform.contracts import Contract, FeatureSpec
from ml_platform.contracts.model import EVENT_TIME
from ml_platform.drift.categorical import CategoricalComparison, compare_categorical
from ml_platform.drift.correction import CORRECTIONS
from ml_platform.drift.ks import ks_2samp_columns

# Transforms of the event time that are the same for every row of a day: their distribution
# on day D is a single value fixed by the calendar, so comparing it with any reference tests
# the calendar, not the data.
CALENDAR_TRANSFORMS = {"day_of_week", "month", "day_of_year"}

Status = Literal["drift", "stable", "skipped"]


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
        status: 'drift', 'stable' or 'skipped'.
        blocking: whether drift of this feature fails the check at ERROR severity.
        change: what moved, in words (e.g. 'median 0.01 -> 0.21, +0.20 reference sd'),
            or why the feature was skipped.
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


def skip_reason(spec: FeatureSpec, contract: Contract) -> str | None:
    """Why a feature is never tested for drift, or None when it is."""
    override = contract.drift.features.get(spec.name)
    if override is not None and override.exclude:
        return "excluded in the contract's drift settings"
    if spec.source == EVENT_TIME and spec.transform in CALENDAR_TRANSFORMS:
        return "calendar feature: every row of a day has the same value, set by the date"
    return None


def detect_drift(
    reference: pd.DataFrame, current: pd.DataFrame, contract: Contract
) -> list[FeatureVerdict]:
    """The drift verdict of every contract feature of `current` against `reference`.

    Args:
        reference: feature rows of the reference days (the `features` asset's columns).
        current: feature rows of day D.
        contract: the dataset contract, whose `drift` section sets thresholds and the gate.

    Returns:
        One verdict per feature, in contract order.
    """
    settings = contract.drift
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
                change=changes[j],
            )
    for name in contract.categorical_features:
        if name not in skipped:
            comparison = compare_categorical(reference[name], current[name])
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
            )
    for name, numbers in list(tested.items()):
        if numbers.n_reference == 0 or numbers.n_current == 0:
            side = "the reference" if numbers.n_reference == 0 else "the day"
            skipped[name] = f"no values in {side}"
            del tested[name]
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
        status: Status = "skipped"
        if result is not None:
            drifts = result.effect >= threshold and result.p_adjusted <= settings.alpha
            status = "drift" if drifts else "stable"
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
                blocking=bool(override and override.blocking),
                change=result.change if result else skipped[spec.name],
            )
        )
    return verdicts


@dataclasses.dataclass
class _Tested:
    """A tested feature's numbers before the day's correction is known."""

    effect: float
    p_value: float
    n_reference: int
    n_current: int
    change: str
    p_adjusted: float = float("nan")


def _numeric_changes(reference: np.ndarray, current: np.ndarray) -> list[str]:
    """Where each numeric column moved: median and spread, in reference standard deviations."""
    texts = []
    for j in range(reference.shape[1]):
        ref = reference[:, j][~np.isnan(reference[:, j])]
        cur = current[:, j][~np.isnan(current[:, j])]
        if not len(ref) or not len(cur):
            texts.append("")
            continue
        ref_median, cur_median = float(np.median(ref)), float(np.median(cur))
        ref_sd = float(np.std(ref, ddof=1)) if len(ref) > 1 else 0.0
        cur_sd = float(np.std(cur, ddof=1)) if len(cur) > 1 else 0.0
        text = f"median {_number(ref_median)} -> {_number(cur_median)}"
        if ref_sd > 0:
            text += f", {(cur_median - ref_median) / ref_sd:+.2f} reference sd"
        texts.append(text + f"; sd {_number(ref_sd)} -> {_number(cur_sd)}")
    return texts


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
