"""The drift check of `features`: each day against its reference, per partition.

The check reads day D from the IO manager like any input, and the reference days itself
(partition mappings of a check's inputs are ignored by Dagster), so the days it read are
listed in its metadata and report instead of in the lineage graph.
"""

import datetime as dt
import functools
import json
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.contracts.reference import describe_reference, reference_days
from ml_platform.drift.categorical import category_counts, summed_counts
from ml_platform.drift.detect import (
    Calibration,
    FeatureVerdict,
    calibrate,
    detect_drift,
    tested_features,
)
from ml_platform.drift.report import DriftReport, render_markdown, verdict_table
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.runbook import check_description
from ml_platform.platform.steps import check_fields, partition_evaluation

FEATURES_DRIFT_CHECK = "features_drift"


def report_key(contract: Contract, partition: str, extension: str) -> str:
    """Lake key of a day's drift report; a rerun replaces it."""
    return f"{contract.name}/drift/features/{partition}.{extension}"


def build_drift_checks(
    contract: Contract, partitions: dg.PartitionsDefinition
) -> list[dg.AssetChecksDefinition]:
    """The drift check of a dataset's `features`, one evaluation per daily partition.

    Drift fails it at WARN severity. When the contract marks a feature as blocking, the check is
    a blocking one, so the day's model starts only once the day's report is stored, and the
    model records drift of a blocking feature as its day's verdict ("blocking drift", see
    `training.assets.blocking_drift`): at ERROR severity Dagster would fail the day's model and
    every later model whose window holds it, instead of recording a verdict.
    """
    blocking = sorted(name for name, spec in contract.drift.features.items() if spec.blocking)
    features_key = asset_key(contract.name, "features")
    categorical = [spec.name for spec in tested_features(contract) if spec.kind == "categorical"]

    def features_drift(
        context: dg.AssetCheckExecutionContext,
        features: Any,
        io_manager: dg.ResourceParam[LakeIOManager],
    ) -> Iterator:
        """How far each feature of day D moved from the reference days."""

        # A range of days reads each reference day once, not once per day that refers to it.
        @functools.lru_cache(maxsize=64)
        def stored_features(day: str) -> pd.DataFrame | None:
            frame: pd.DataFrame | None = io_manager.load_recorded(
                context.instance, features_key, day, "parquet"
            )
            return frame

        # Each reference day's category counts, counted once for all the days referring to it.
        @functools.lru_cache(maxsize=64)
        def stored_counts(day: str) -> dict[str, pd.Series]:
            frame = stored_features(day)
            assert frame is not None, "only stored reference days are counted"
            return {name: category_counts(frame[name]) for name in categorical}

        # Days of a range share their reference window (a baseline, or most of a sliding one
        # from one day to the next): its day-to-day distances are computed once per window.
        @functools.lru_cache(maxsize=8)
        def calibration_of(days: tuple[str, ...]) -> Calibration:
            frames = [stored_features(d) for d in days]
            return calibrate(
                [f for f in frames if f is not None], contract, [stored_counts(d) for d in days]
            )

        def result_of(day: str, current: pd.DataFrame) -> dg.AssetCheckResult:
            wanted = [
                d.isoformat()
                for d in reference_days(
                    contract.drift.reference,
                    dt.date.fromisoformat(day),
                    contract.partitions.start_date,
                )
            ]
            found = {d: stored_features(d) for d in wanted}
            frames = [frame for frame in found.values() if frame is not None]
            stored = [d for d, frame in found.items() if frame is not None]
            missing = [d for d in wanted if d not in stored]
            counts = [stored_counts(d) for d in stored]
            return drift_check_result(
                contract,
                day,
                current,
                frames,
                stored,
                missing,
                io_manager,
                calibration_of(tuple(stored)),
                {name: summed_counts([c[name] for c in counts]) for name in categorical},
            )

        # One evaluation per day, in order; a range's earlier days are references of its later
        # ones, read once for both. A day without accepted features (a rejected day) has no
        # drift to judge: its verdict is on its features' record.
        for day in context.op_execution_context.partition_keys:
            frame = stored_features(day)
            if frame is None:
                context.log.info(f"features_drift {day}: no accepted features to judge")
                continue
            fields = check_fields(result_of(day, frame))
            yield partition_evaluation(fields, features_key, day, blocking=bool(blocking))
        yield dg.Output(None)

    # Dagster 1.13 marks a partitions_def on a check as preview. It is what a daily check needs
    # (without it the check would load every partition of features), so the warning is muted.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        check = dg.asset_check(
            asset=features_key,
            name=FEATURES_DRIFT_CHECK,
            partitions_def=partitions,
            blocking=bool(blocking),
            description=check_description(
                FEATURES_DRIFT_CHECK,
                "Each feature of day D against the reference days: KS statistic (numeric) or "
                "Jensen-Shannon distance (categorical), gated by a corrected p-value and by the "
                "feature's own day-to-day movement inside the reference window. Fails (WARN) "
                "when a feature drifts; drift of "
                + (", ".join(blocking) if blocking else "a feature marked blocking in the contract")
                + " also keeps the day's model from being trained.",
            ),
            # A range of days yields an evaluation per day, which the decorator's type omits.
        )(features_drift)  # type: ignore[arg-type]
    return [check]


def drift_check_result(
    contract: Contract,
    day: str,
    current: pd.DataFrame,
    reference_frames: list[pd.DataFrame],
    reference_partitions: list[str],
    missing_partitions: list[str],
    io_manager: LakeIOManager,
    calibration: Calibration | None = None,
    reference_counts: Mapping[str, pd.Series] | None = None,
) -> dg.AssetCheckResult:
    """Compare, store the report (JSON and markdown) in the lake, and build the check result.

    `reference_frames` holds one frame per stored reference day (the days of
    `reference_partitions`), so each feature's day-to-day movement can calibrate its verdict.
    `reference_counts` holds the reference's category counts when already known.
    """
    calibration = calibration or calibrate(reference_frames, contract)
    verdicts = (
        detect_drift(reference_frames, current, contract, calibration, reference_counts)
        if reference_partitions
        else []
    )
    reference = (
        pd.concat(reference_frames, ignore_index=True) if reference_frames else current.iloc[0:0]
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
    )
    summary = describe(report, contract)
    markdown = render_markdown(report, summary, reference, current)
    storage = io_manager.storage
    json_key, markdown_key = report_key(contract, day, "json"), report_key(contract, day, "md")
    document = {**report.to_json(), "summary": summary}
    storage.write_bytes(json_key, json.dumps(document, indent=2).encode())
    storage.write_bytes(markdown_key, markdown.encode())
    metadata: dict[str, Any] = {
        "evaluated": report.evaluated,
        "drift_share": dg.MetadataValue.float(report.drift_share),
        "drifting_features": len(report.drifting),
        "tested_features": len(report.tested),
        "reference_days": len(reference_partitions),
        "reference_rows": len(reference),
        "calibration": calibration.note,
        "reference_partitions": reference_partitions,
        "missing_reference_partitions": missing_partitions,
        "report": dg.MetadataValue.md(markdown),
        "report_json": dg.MetadataValue.path(storage.uri(json_key)),
        "report_markdown": dg.MetadataValue.path(storage.uri(markdown_key)),
    }
    for verdict in report.tested:
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
    if report.evaluated:
        metadata["features"] = dg.MetadataValue.md(verdict_table(report).to_markdown(index=False))
    return dg.AssetCheckResult(
        check_name=FEATURES_DRIFT_CHECK,
        passed=not report.drifting,
        severity=dg.AssetCheckSeverity.WARN,
        description=summary,
        metadata=metadata,
    )


def describe(report: DriftReport, contract: Contract) -> str:
    """The check's description: what drifted and by how much, and what to do about it."""
    spec = contract.drift.reference
    where = (
        f"vs {report.reference} ({len(report.reference_days)} day(s), {report.reference_rows} rows)"
    )
    missing = (
        f" Reference days not stored and left out: {', '.join(report.missing_reference_days)}."
        if report.missing_reference_days
        else ""
    )
    if not report.evaluated:
        if report.missing_reference_days:
            return (
                f"Drift not evaluated for {report.partition}: none of its reference days "
                f"({report.reference}) is stored. Materialise features for "
                f"{report.missing_reference_days[0]} to {report.missing_reference_days[-1]}, "
                "then rerun this check."
            )
        return (
            f"Drift not evaluated for {report.partition}: its reference ({report.reference}) "
            f"holds no day from the first partition {contract.partitions.start_date} on."
        )
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
            f"{where}.{nearest}{held}{missing}"
        )
    # The worst first (furthest past its threshold), then one line per further feature.
    worst, *others = sorted(report.drifting, key=lambda v: -(v.effect or 0.0) / v.threshold)
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
    blocking = [v.feature for v in report.drifting if v.blocking]
    stops = (
        f" {', '.join(blocking)} {'is' if len(blocking) == 1 else 'are'} blocking: the day's "
        "model is not trained (its day is recorded with the verdict 'blocking drift')."
        if blocking
        else ""
    )
    uncalibrated = [v for v in report.drifting if v.calibration_bound is None]
    why = uncalibrated[0].calibration if uncalibrated else ""
    alone = f" {why[:1].upper()}{why[1:]}." if why else ""
    return (
        f"{len(report.drifting)} of {len(report.tested)} feature(s) drifted on "
        f"{report.partition} {where}, most {_short(worst)}, {worst.change}.{further}\n"
        f"Check the upstream source of "
        f"{'this feature' if len(report.drifting) == 1 else 'these features'} for a change; "
        f"{action}.{stops}{held}{alone}{missing}"
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
