"""The drift check: each day's features against its reference days, and the report it makes.

`drift_check_result` compares, describes and builds the `features_drift` check result and the
day's report; the `drift_report` asset (`ml_platform.drift.assets`) computes it for each day and
stores the report as its partition, which the model reads as an input.
"""

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.contracts.model import described
from ml_platform.contracts.reference import describe_reference
from ml_platform.drift.detect import (
    REDEFINED,
    Calibration,
    FeatureVerdict,
    as_declared,
    calibrate,
    detect_drift,
    tested_features,
    undeclared,
)
from ml_platform.drift.report import DriftReport, render_markdown, verdict_table

FEATURES_DRIFT_CHECK = "features_drift"


@dataclasses.dataclass(frozen=True)
class DriftOutcome:
    """A day's drift verdict: the `features_drift` check result and the report to store."""

    check: dg.AssetCheckResult
    # The report as JSON: every feature's verdict, the reference days and the summary.
    document: dict[str, Any]

    def metadata(self) -> dict[str, Any]:
        """The numbers of the report for the drift_report materialisation, the UI plots them."""
        keep = (
            "evaluated",
            "drift_share",
            "drifting_features",
            "tested_features",
            "untested_blocking_features",
            "features_without_reference_yet",
            *REFERENCE_KEYS,
            "reference_rows",
        )
        return {key: self.check.metadata[key] for key in keep if key in self.check.metadata}


# The metadata naming what a day was compared with: its reference days, the data version and
# run Dagster recorded for each, and the reference days that were not there to compare with.
REFERENCE_KEYS = (
    "reference_days",
    "reference_partitions",
    "reference_data_versions",
    "reference_runs",
    "missing_reference_partitions",
    "rejected_reference_partitions",
)


def require_features(contract: Contract, day: str, current: pd.DataFrame) -> None:
    """Fail the day when its own features lack a feature of the contract, or hold it otherwise.

    Its features were stored before the contract declared the feature so (added, renamed, or
    of another kind, source or transform since), and nothing rematerialises them by itself: the
    error names the day and what to do, where comparing would only raise a KeyError (or a
    ValueError reading text as numbers, or call numbers stored as 5.0 categories the reference
    never had, or values of the old definition drift). The step names the day that failed
    (`steps.each_day`). Not retried: waiting does not rebuild the features. Reference days
    stored before the change are no error: the feature has no reference values yet there
    (`detect.NOT_YET_IN_REFERENCE`), and the day's other features are tested as usual.
    """
    stale = undeclared(current, contract)
    if not stale:
        return
    definitions = contract.feature_definitions
    absent = [name for name, other in stale.items() if not other]
    other = [f"{name}, now {described(definitions[name])}," for name, o in stale.items() if o]
    found = ([f"lack {', '.join(absent)}, which the contract declares"] if absent else []) + (
        [f"hold {' '.join(other)} {REDEFINED}"] if other else []
    )
    raise dg.Failure(
        description=(
            f"the features of the day {'; and '.join(found)}: they were stored before the "
            f"contract declared them so. Rematerialise features for {day}, then this day's "
            "drift_report"
        ),
        allow_retries=False,
    )


def drift_check_result(
    contract: Contract,
    day: str,
    current: pd.DataFrame,
    reference_frames: list[pd.DataFrame],
    reference_partitions: list[str],
    missing_partitions: list[str],
    calibration: Calibration | None = None,
    reference_counts: Mapping[str, pd.Series] | None = None,
    reference_versions: Mapping[str, Any] | None = None,
    rejected_partitions: Sequence[str] = (),
) -> DriftOutcome:
    """Compare, describe, and build the check result and the day's report.

    `reference_frames` holds one frame per stored reference day (the days of
    `reference_partitions`), so each feature's day-to-day movement can calibrate its verdict.
    `reference_counts` holds the reference's category counts when already known.
    `reference_versions` is the metadata naming the version of each reference day that was
    read (`records.version_metadata`), merged into the check's. `rejected_partitions` are
    those of `missing_partitions` that Dagster records as rejected.
    """
    calibration = calibration or calibrate(reference_frames, contract)
    verdicts = (
        detect_drift(reference_frames, current, contract, calibration, reference_counts)
        if reference_partitions
        else []
    )
    # Plotted as tested: a day stored before a feature changed kind holds none of it.
    reference = (
        pd.concat([as_declared(f, contract) for f in reference_frames], ignore_index=True)
        if reference_frames
        else current.iloc[0:0]
    )
    report = DriftReport(
        dataset=contract.name,
        partition=day,
        reference=describe_reference(contract.drift.reference, dt.date.fromisoformat(day)),
        reference_days=reference_partitions,
        missing_reference_days=missing_partitions,
        reference_rows=len(reference),
        current_rows=len(current),
        correction=contract.drift.correction,
        alpha=contract.drift.alpha,
        verdicts=verdicts,
        calibration=calibration.note,
        rejected_reference_days=[d for d in missing_partitions if d in rejected_partitions],
    )
    summary = describe(report, contract)
    markdown = render_markdown(report, summary, reference, current)
    document = {**report.to_json(), "summary": summary}
    # The stored report names the versions it was judged against too: `data_versions`, `runs`.
    document["reference"].update(
        {k.removeprefix("reference_"): v for k, v in (reference_versions or {}).items()}
    )
    metadata: dict[str, Any] = {
        "evaluated": report.evaluated,
        "drift_share": dg.MetadataValue.float(report.drift_share),
        "drifting_features": len(report.drifting),
        "tested_features": len(report.tested),
        "reference_days": len(reference_partitions),
        "reference_rows": len(reference),
        "calibration": calibration.note,
        "reference_partitions": reference_partitions,
        **(reference_versions or {}),
        "missing_reference_partitions": missing_partitions,
        "rejected_reference_partitions": report.rejected_reference_days,
        "report": dg.MetadataValue.md(markdown),
    }
    # A blocking feature held as drifted without values has no statistic to plot.
    for verdict in (v for v in report.tested if v.effect is not None):
        metadata[f"{verdict.feature}/{verdict.effect_name}"] = dg.MetadataValue.float(
            float(verdict.effect or 0.0)
        )
        metadata[f"{verdict.feature}/p_adjusted"] = dg.MetadataValue.float(
            float(verdict.p_adjusted or 0.0)
        )
        if verdict.calibration_bound is not None:
            metadata[f"{verdict.feature}/calibration_bound"] = dg.MetadataValue.float(
                verdict.calibration_bound
            )
    if report.untested_blocking:
        metadata["untested_blocking_features"] = [v.feature for v in report.untested_blocking]
    # Features added to the contract (or renamed, or of another kind) since the reference days.
    if report.without_reference_yet:
        metadata["features_without_reference_yet"] = [
            v.feature for v in report.without_reference_yet
        ]
    if report.evaluated:
        metadata["features"] = dg.MetadataValue.md(verdict_table(report).to_markdown(index=False))
    check = dg.AssetCheckResult(
        check_name=FEATURES_DRIFT_CHECK,
        passed=not report.drifting,
        severity=dg.AssetCheckSeverity.WARN,
        description=summary,
        metadata=metadata,
    )
    return DriftOutcome(check, document)


def describe(report: DriftReport, contract: Contract) -> str:
    """The check's description: what drifted and by how much, and what to do about it."""
    spec = contract.drift.reference
    where = (
        f"vs {report.reference} ({len(report.reference_days)} day(s), {report.reference_rows} rows)"
    )
    # A rejected day is run again in vain: its delivery needs correcting first.
    rejected = report.rejected_reference_days
    absent = [d for d in report.missing_reference_days if d not in rejected]
    left_out = [f"{', '.join(rejected)} (rejected)"] if rejected else []
    left_out += [f"{', '.join(absent)} (not stored)"] if absent else []
    missing = f" Reference days left out: {'; '.join(left_out)}." if left_out else ""
    if not report.evaluated:
        if report.missing_reference_days:
            todo = (
                [
                    f"Rejected: {', '.join(rejected)}: correct and re-deliver their files "
                    f"(`ml-platform rejected --dataset {contract.name}` lists them)"
                ]
                if rejected
                else []
            )
            if absent:
                todo.append(
                    f"{'not' if rejected else 'Not'} stored: {', '.join(absent)}: "
                    "materialise features for them"
                )
            return (
                f"Drift not evaluated for {report.partition}: none of its reference days "
                f"({report.reference}) has accepted features. {'; '.join(todo)}. Then rerun "
                "this check."
            )
        return (
            f"Drift not evaluated for {report.partition}: its reference ({report.reference}) "
            f"holds no day from the first partition {contract.partitions.start_date} on."
        )
    # Features the contract tests that the day could not: no values on one side.
    meant = {spec.name for spec in tested_features(contract)}
    untested = [v for v in report.verdicts if v.status == "skipped" and v.feature in meant]
    named = "; ".join(
        f"{v.feature} ({v.change}{', blocking' if v.blocking else ''})" for v in untested
    )
    # A blocking feature that could not be tested does not stop the model: held as drifted,
    # a blocking feature added to the contract would stop it for a whole reference window.
    # Said apart from the others (and in `untested_blocking_features`), so that nobody reads
    # the day's model as checked against it.
    unknown = report.untested_blocking
    blocking_untested = (
        " Blocking, not tested: "
        + "; ".join(f"{v.feature} ({v.change})" for v in unknown)
        + f". The day's model is trained without {'its' if len(unknown) == 1 else 'their'} "
        "drift checked: a blocking feature stops it only when it drifts or has no values on "
        "the day."
        if unknown
        else ""
    )
    if not report.tested and untested:
        return (
            f"Drift not tested on {report.partition}: none of its {len(untested)} feature(s) "
            f"had values to compare {where}: {named}. Check the day's rows and its reference "
            f"days' upstream.{blocking_untested}{missing}"
        )
    quiet_named = "; ".join(f"{v.feature} ({v.change})" for v in untested if not v.blocking)
    not_tested = (
        f" Not tested, without values to compare: {quiet_named}.{blocking_untested}"
        if quiet_named
        else blocking_untested
    ) + _until_reference_has(report, contract)
    usual = [v for v in report.tested if v.fixed_gate and v.status != "drift"]
    held = (
        " Moved, but no more than on an ordinary day of the reference window: "
        + "; ".join(_short(v) for v in usual)
        + "."
        if usual
        else ""
    )
    if not report.drifting:
        closest = max(report.tested, key=lambda v: (v.effect or 0.0) / v.threshold, default=None)
        nearest = f" Closest to its threshold: {_short(closest)}." if closest and not usual else ""
        return (
            f"No drift on {report.partition} in {len(report.tested)} tested feature(s) "
            f"{where}.{nearest}{held}{not_tested}{missing}"
        )
    # Blocking features without values on the day: held as drifted, with nothing measured.
    unchecked = [v for v in report.drifting if v.effect is None]
    measured = [v for v in report.drifting if v.effect is not None]
    held_blocking = (
        (
            f" {', '.join(v.feature for v in unchecked)} "
            f"{'has' if len(unchecked) == 1 else 'have'} no values in the day and "
            f"{'is' if len(unchecked) == 1 else 'are'} blocking: whether "
            f"{'it' if len(unchecked) == 1 else 'they'} drifted cannot be checked, which is "
            "not 'no drift', so the day's model is not trained (its day is recorded with the "
            "verdict 'blocking drift'). Check the day's rows upstream."
        )
        if unchecked
        else ""
    )
    if not measured:
        judged = len(report.tested) - len(unchecked)
        quiet = f" No drift in the {judged} other tested feature(s)." if judged else ""
        return (
            f"Drift of blocking feature(s) not checked on {report.partition} "
            f"{where}:{held_blocking}{quiet}{held}{not_tested}{missing}"
        )
    # The worst first (furthest past its threshold), then one line per further feature.
    worst, *others = sorted(measured, key=lambda v: -(v.effect or 0.0) / v.threshold)
    further = "".join(f"\n- {_short(v)}, {v.change}" for v in others)
    if spec.mode == "baseline":
        action = (
            "if the change is expected and lasting, retrain the model on data that has it and "
            "move the baseline (drift.reference.start in the contract)"
        )
    else:
        action = (
            "if the change is expected and lasting, it stops firing once it fills the "
            "reference window; check that the model still performs on it"
        )
    blocking = [v.feature for v in measured if v.blocking]
    stops = (
        f" {', '.join(blocking)} {'is' if len(blocking) == 1 else 'are'} blocking: the day's "
        "model is not trained (its day is recorded with the verdict 'blocking drift')."
        if blocking
        else ""
    )
    uncalibrated = [v for v in measured if v.calibration_bound is None]
    why = uncalibrated[0].calibration if uncalibrated else ""
    alone = f" {why[:1].upper()}{why[1:]}." if why else ""
    return (
        f"{len(measured)} of {len(report.tested) - len(unchecked)} feature(s) drifted on "
        f"{report.partition} {where}, most {_short(worst)}, {worst.change}.{further}\n"
        f"Check the upstream source of "
        f"{'this feature' if len(measured) == 1 else 'these features'} for a change; "
        f"{action}.{stops}{held_blocking}{held}{alone}{not_tested}{missing}"
    )


def _until_reference_has(report: DriftReport, contract: Contract) -> str:
    """When features the reference days were stored without get tested, and how to sooner."""
    new = [v.feature for v in report.without_reference_yet]
    if not new:
        return ""
    them = "it" if len(new) == 1 else "them"
    days = f"{report.reference_days[0]} to {report.reference_days[-1]}"
    if contract.drift.reference.mode == "baseline":
        # The baseline days never change by themselves: without a word it would stay untested.
        return (
            f" {', '.join(new)} {'stays' if len(new) == 1 else 'stay'} untested until the "
            f"baseline days hold {them}: rematerialise features for {days}, or move the "
            "baseline (drift.reference.start in the contract)."
        )
    return (
        f" {', '.join(new)} {'is' if len(new) == 1 else 'are'} tested from the days stored "
        f"with {them} as they enter the reference window (by the fixed gate alone until "
        f"drift.calibration.min_days of them have values); rematerialising features for "
        f"{days} tests {them} sooner."
    )


def _short(verdict: FeatureVerdict) -> str:
    label = "KS D" if verdict.effect_name == "ks_d" else "JS distance"
    if verdict.calibration_bound is None:
        usual = ", not calibrated" if verdict.fixed_gate else ""
    else:
        usual = (
            f", usual day-to-day {verdict.day_to_day_low:.3f} to {verdict.day_to_day_high:.3f}"
            f" (bound {verdict.calibration_bound:.3f})"
        )
    return (
        f"{verdict.feature} ({label} {verdict.effect:.3f}, threshold {verdict.threshold:g}, "
        f"corrected p {verdict.p_adjusted:.2g}{usual})"
    )
