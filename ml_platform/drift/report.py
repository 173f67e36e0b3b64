"""The drift report of one day: a JSON document and a markdown page with embedded plots."""

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from ml_platform.drift.detect import NO_REFERENCE_YET, FeatureVerdict
from ml_platform.platform import plots

# Plotting every feature would make a report of a wide dataset long and slow to load in the
# UI: the report plots the features that drifted (up to MAX_PLOTTED), the ones a person has to
# look at. A quiet day's report is its table: a feature's plots cost about 80 ms of CPU and
# 40 kB of report, and the first plot of a process 0.5 s more to import matplotlib; a year
# backfill checks 365 days.
MAX_PLOTTED = 4
ECDF_POINTS = 512
HISTOGRAM_BINS = 40
BAR_CATEGORIES = 12
REFERENCE_COLOUR, CURRENT_COLOUR = "#4c72b0", "#dd8452"
# Values this large are plotted divided by the largest of them (`_plotted`); far below where
# the width of an axis or its margins overflows a float.
PLOT_SCALE_FROM = 1e300


@dataclasses.dataclass(frozen=True)
class DriftReport:
    """Everything the drift check found on one day.

    Attributes:
        dataset: the contract's name.
        partition: the day D (YYYY-MM-DD).
        reference: the reference in words (e.g. 'the 7 days before').
        reference_days: reference partitions that were read.
        missing_reference_days: reference partitions not stored or rejected (left out).
        reference_rows: rows of the reference.
        current_rows: rows of day D.
        correction: the multiple-testing correction of the day's p-values.
        alpha: the level the corrected p-values are compared with.
        verdicts: one per contract feature.
        calibration: how each feature's day-to-day movement bounded its verdict that day, or
            why the fixed gate decided alone.
        rejected_reference_days: those of `missing_reference_days` that Dagster records as
            rejected (their deliveries need correcting, not another run).
    """

    dataset: str
    partition: str
    reference: str
    reference_days: list[str]
    missing_reference_days: list[str]
    reference_rows: int
    current_rows: int
    correction: str
    alpha: float
    verdicts: list[FeatureVerdict]
    calibration: str = ""
    rejected_reference_days: list[str] = dataclasses.field(default_factory=list)

    @property
    def evaluated(self) -> bool:
        """Whether there was any reference to compare the day with."""
        return bool(self.reference_days)

    @property
    def tested(self) -> list[FeatureVerdict]:
        """Verdicts of the features judged: tested, or blocking and held as drifted."""
        return [v for v in self.verdicts if v.status != "skipped"]

    @property
    def drifting(self) -> list[FeatureVerdict]:
        """Verdicts of the features that drifted."""
        return [v for v in self.verdicts if v.status == "drift"]

    @property
    def without_reference_yet(self) -> list[FeatureVerdict]:
        """Verdicts of features the reference days were stored without (a contract change)."""
        return [
            v
            for v in self.verdicts
            if v.status == "skipped" and v.change.startswith(NO_REFERENCE_YET)
        ]

    @property
    def untested_blocking(self) -> list[FeatureVerdict]:
        """Verdicts of blocking features that could not be tested: no reference values.

        Not held as drifted (a newly added blocking feature would stop the model for a whole
        reference window), so the report names them: the model trains without their drift
        checked.
        """
        return [v for v in self.verdicts if v.status == "skipped" and v.blocking]

    @property
    def drift_share(self) -> float:
        """Share of the tested features that drifted (0.0 when none was tested)."""
        return len(self.drifting) / len(self.tested) if self.tested else 0.0

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-serialisable document."""
        return {
            "dataset": self.dataset,
            "asset": "features",
            "partition": self.partition,
            "evaluated": self.evaluated,
            "reference": {
                "description": self.reference,
                "partitions": self.reference_days,
                "missing_partitions": self.missing_reference_days,
                "rejected_partitions": self.rejected_reference_days,
                "rows": self.reference_rows,
            },
            "current_rows": self.current_rows,
            "correction": self.correction,
            "alpha": self.alpha,
            "calibration": self.calibration,
            "tested_features": len(self.tested),
            "drifting_features": [v.feature for v in self.drifting],
            "untested_blocking_features": {v.feature: v.change for v in self.untested_blocking},
            "features_without_reference_yet": [v.feature for v in self.without_reference_yet],
            "drift_share": self.drift_share,
            "features": [dataclasses.asdict(v) for v in self.verdicts],
        }


def verdict_table(report: DriftReport) -> pd.DataFrame:
    """One row per feature: test, sizes, effect, threshold, p-values, calibration and verdict.

    `day-to-day` is the range of the feature's distances between reference days, `bound` the
    quantile of them its effect must exceed ('-' where the fixed gate decided alone).
    """
    return pd.DataFrame(
        [
            {
                "feature": v.feature,
                "test": "KS" if v.kind == "numeric" else "JS + chi2",
                "n_reference": v.n_reference,
                "n_day": v.n_current,
                "effect": _number(v.effect),
                "threshold": v.threshold,
                "p": _number(v.p_value),
                f"p ({report.correction})": _number(v.p_adjusted),
                "day-to-day": _range(v.day_to_day_low, v.day_to_day_high),
                "bound": _number(v.calibration_bound),
                "verdict": v.status,
                "what changed": v.change,
            }
            for v in report.verdicts
        ]
    )


def render_markdown(
    report: DriftReport, summary: str, reference: pd.DataFrame, current: pd.DataFrame
) -> str:
    """The report page: summary, per-feature table and plots of the features that matter most."""
    lines = [
        f"# Drift of `features` on {report.partition}",
        "",
        summary,
        "",
        f"- Reference: {report.reference}: {len(report.reference_days)} day(s), "
        f"{report.reference_rows} rows"
        + (
            f" (left out, not stored or rejected: {', '.join(report.missing_reference_days)})"
            if report.missing_reference_days
            else ""
        ),
        f"- Day: {report.current_rows} rows",
        "",
    ]
    if report.evaluated:
        lines[-1:] = [
            f"- A feature drifts when its effect size reaches its threshold, its p-value "
            f"after {report.correction} correction over the "
            f"{sum(v.p_value is not None for v in report.tested)} tested "
            f"features is at most {report.alpha:g}, and its effect exceeds its bound "
            f"(calibration: {report.calibration or 'none'}). "
            f"Drift share: {report.drift_share:.0%}.",
            "",
            verdict_table(report).to_markdown(index=False),
            "",
        ]
        plotted = _features_to_plot(report)
        if plotted:
            lines += [
                "Reference (blue) and day (orange): histogram and ECDF of numeric features, "
                "category shares of categorical ones.",
                "",
                plot_features(plotted, reference, current),
                "",
            ]
    return "\n".join(lines)


def _features_to_plot(report: DriftReport) -> list[FeatureVerdict]:
    # A blocking feature held as drifted without values on the day has nothing to plot.
    measured = [v for v in report.drifting if v.effect is not None]
    ranked = sorted(measured, key=lambda v: -((v.effect or 0.0) / v.threshold))
    return ranked[:MAX_PLOTTED]


def plot_features(
    verdicts: list[FeatureVerdict], reference: pd.DataFrame, current: pd.DataFrame
) -> str:
    """A markdown image with a row per feature: histogram and ECDF, or category shares."""
    rows = len(verdicts)
    with plots.new_figure(9.0, 2.2 * rows) as figure:
        # Fixed margins: constrained layout measures every label and costs more than the plots.
        grid = figure.add_gridspec(
            rows, 2, left=0.06, right=0.98, bottom=0.3 / rows, top=1 - 0.25 / rows, hspace=0.45
        )
        for row, verdict in enumerate(verdicts):
            ref = reference[verdict.feature].dropna()
            cur = current[verdict.feature].dropna()
            title = f"{verdict.feature}: {verdict.status}, effect {_number(verdict.effect)}"
            if verdict.kind == "numeric":
                ref_values, cur_values, scale = _plotted(ref.to_numpy(), cur.to_numpy())
                _histogram(
                    figure.add_subplot(grid[row, 0]),
                    ref_values,
                    cur_values,
                    title + scale,
                    row == 0,
                )
                _ecdf(figure.add_subplot(grid[row, 1]), ref_values, cur_values, verdict)
            else:
                _shares(figure.add_subplot(grid[row, :]), ref, cur, title)
        return plots.svg_image(figure, "drift plots")


def _plotted(ref: np.ndarray, cur: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """The values as plotted, divided by the largest when they reach `PLOT_SCALE_FROM`.

    The quality gate accepts any finite float, and an axis from -1e308 to 1e308 (a source's
    "no reading" sentinel) has a width no float holds: bins and ticks cannot be computed.
    Returns the two samples and the scale to name in the title ('' when not scaled).
    """
    largest = float(np.max(np.abs(np.concatenate([ref, cur]))))
    if largest < PLOT_SCALE_FROM:
        return ref, cur, ""
    return ref / largest, cur / largest, f" (values / {largest:.3g})"


def _histogram(axes: Any, ref: np.ndarray, cur: np.ndarray, title: str, legend: bool) -> None:
    # Clip the view to the central 99 % of each sample so one outlier does not squash the
    # histogram. Of the two pooled, it held the reference only when the day is small beside it:
    # 100 values moved 4 sd against 28 000 were cut out of their own drift plot.
    low = min(np.quantile(ref, 0.005), np.quantile(cur, 0.005))
    high = max(np.quantile(ref, 0.995), np.quantile(cur, 0.995))
    if low == high:
        low, high = low - 0.5, high + 0.5
    bins = np.linspace(low, high, HISTOGRAM_BINS + 1)
    axes.hist(ref, bins=bins, density=True, histtype="step", color=REFERENCE_COLOUR, label="ref")
    axes.hist(cur, bins=bins, density=True, histtype="step", color=CURRENT_COLOUR, label="day")
    if legend:
        axes.legend(fontsize=7, loc="upper right")
    axes.set_title(title, fontsize=9)


def _ecdf(axes: Any, ref: np.ndarray, cur: np.ndarray, verdict: FeatureVerdict) -> None:
    levels = np.linspace(0.0, 1.0, ECDF_POINTS)
    for values, colour in ((ref, REFERENCE_COLOUR), (cur, CURRENT_COLOUR)):
        axes.step(np.quantile(values, levels), levels, where="post", color=colour)
    axes.set_title(f"ECDF: KS D = {_number(verdict.effect)} (threshold {verdict.threshold:g})")
    axes.title.set_fontsize(9)


def _shares(axes: Any, ref: pd.Series, cur: pd.Series, title: str) -> None:
    ref_shares = ref.astype("str").value_counts(normalize=True)
    cur_shares = cur.astype("str").value_counts(normalize=True)
    shares = pd.DataFrame({"reference": ref_shares, "day": cur_shares}).fillna(0.0)
    top = shares.max(axis=1).sort_values(ascending=False).index[:BAR_CATEGORIES]
    shares = shares.loc[top]
    positions = np.arange(len(shares))
    axes.bar(positions - 0.2, shares["reference"], width=0.4, color=REFERENCE_COLOUR, label="ref")
    axes.bar(positions + 0.2, shares["day"], width=0.4, color=CURRENT_COLOUR, label="day")
    axes.legend(fontsize=7, loc="upper right")
    axes.set_xticks(positions, [str(c) for c in shares.index], fontsize=8)
    axes.set_ylabel("share", fontsize=8)
    axes.set_title(title, fontsize=9)


def _range(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"{low:.3g} to {high:.3g}"


def _number(value: float | None) -> str:
    """A statistic for a table cell: 3 significant digits, '-' when absent."""
    return "-" if value is None else f"{value:.3g}"
