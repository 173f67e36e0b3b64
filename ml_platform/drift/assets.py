"""drift_report: how far each day's features moved from its reference days, as an asset.

The report is the drift verdict the day's model depends on (when the contract marks a feature
blocking), so it is a partition Dagster records, read by the model through its input: a day
without one is a state the model names ("no drift report"), never "no drift". The
`features_drift` check of each day is evaluated in the same step, from the same comparison.

The reference days are days before D (`contracts/reference.py`), read from Dagster's records of
`features` rather than through an input: a partition mapping of "the 28 days before" would make
every day wait for the one before, turning a backfill into a chain of one-day runs. Each day's
metadata names the reference days it read and the data version and run Dagster recorded for
each (`reference_data_versions`, `reference_runs`), so the UI shows what the day was compared
with.
"""

import datetime as dt
import functools
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.contracts.reference import reference_days
from ml_platform.drift.categorical import column_counts, summed_counts
from ml_platform.drift.checks import FEATURES_DRIFT_CHECK, drift_check_result, require_features
from ml_platform.drift.detect import Calibration, as_declared, calibrate, tested_features
from ml_platform.platform.datasets import asset_key, dataset_name, writer_pool
from ml_platform.platform.formats import FORMAT_KEY
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.records import day_records, version_metadata
from ml_platform.platform.retries import STORAGE_RETRY_POLICY
from ml_platform.platform.runbook import check_description
from ml_platform.platform.sizes import request_metadata, step_tags
from ml_platform.platform.steps import daily_backfill_policy, daily_check_spec, each_day

DRIFT_REPORT = "drift_report"


def build_drift_report(
    contract: Contract, partitions: dg.PartitionsDefinition
) -> dg.AssetsDefinition:
    """The drift_report asset of a dataset, with its `features_drift` check."""
    blocking = sorted(name for name, spec in contract.drift.features.items() if spec.blocking)
    features_key = asset_key(contract.name, "features")
    key = asset_key(contract.name, DRIFT_REPORT)
    categorical = [spec.name for spec in tested_features(contract) if spec.kind == "categorical"]
    check_text = (
        "Each feature of day D against the reference days: KS statistic (numeric) or "
        "Jensen-Shannon distance (categorical), gated by a corrected p-value and by the "
        "feature's own day-to-day movement inside the reference window. Fails (WARN) when a "
        "feature drifts; drift of "
        + (", ".join(blocking) if blocking else "a feature marked blocking in the contract")
        + " also keeps the day's model from being trained."
    )

    @dg.asset(
        name=DRIFT_REPORT,
        key_prefix=contract.name,
        pool=writer_pool(contract.name, DRIFT_REPORT),
        ins={"features": dg.AssetIn(features_key)},
        partitions_def=partitions,
        backfill_policy=daily_backfill_policy(),
        retry_policy=STORAGE_RETRY_POLICY,
        group_name=dataset_name(contract.name, "drift"),
        kinds={"pandas", "json"},
        metadata={FORMAT_KEY: "json", **request_metadata(contract, DRIFT_REPORT)},
        op_tags=step_tags(contract, DRIFT_REPORT),
        check_specs=[
            daily_check_spec(
                FEATURES_DRIFT_CHECK,
                key,
                partitions,
                description=check_description(FEATURES_DRIFT_CHECK, check_text),
            )
        ],
    )
    def drift_report(
        context: dg.AssetExecutionContext,
        features: Any,
        io_manager: dg.ResourceParam[LakeIOManager],
    ) -> Iterator:
        """How far each feature of day D moved from its reference days: the day's drift report.

        The stored JSON holds each feature's statistic (KS D for numeric features, the
        Jensen-Shannon distance for categorical ones), its corrected p-value, its usual
        day-to-day movement in the reference window and its verdict, with the reference days
        compared with. The metadata names those days and the data version and run of each
        (`reference_partitions`, `reference_data_versions`, `reference_runs`); the
        `features_drift` check says what drifted, in words. A day whose features were rejected
        has no drift to judge: it is recorded "no accepted input". A feature the reference days
        were stored without (added, renamed or of another kind in the contract since) has "no
        reference values yet" until days that have it enter the window, and the day's other
        features are tested as usual; a day whose own features lack one fails, naming the day
        to rematerialise.
        """
        instance = context.instance
        wanted_by_day = {
            day: [
                d.isoformat()
                for d in reference_days(
                    contract.drift.reference,
                    dt.date.fromisoformat(day),
                    contract.partitions.start_date,
                )
            ]
            for day in context.partition_keys
        }
        # What Dagster records of every reference day of the step, read once.
        records = day_records(
            instance, features_key, sorted({d for days in wanted_by_day.values() for d in days})
        )

        # A range of days reads each reference day once, not once per day that refers to it.
        # Days in date order each add the day their window gained and drop the one it lost, so
        # the cache holds one window: the days a single day compares with at once anyway, up
        # to the contract's bound on drift.reference.days. A smaller cache than the window
        # evicts each day before the next day asks for it: every day read its window again.
        @functools.lru_cache(maxsize=contract.drift.reference.days)
        def stored_features(day: str) -> pd.DataFrame | None:
            frame: pd.DataFrame | None = io_manager.load_of(
                records.get(day), features_key, day, "parquet"
            )
            return frame

        # Each reference day's category counts, counted once for all the days referring to it.
        @functools.lru_cache(maxsize=contract.drift.reference.days)
        def stored_counts(day: str) -> dict[str, pd.Series]:
            frame = stored_features(day)
            assert frame is not None, "only stored reference days are counted"
            # A day stored before a feature became categorical holds no categories of it.
            declared = as_declared(frame, contract)
            return {name: column_counts(declared, name) for name in categorical}

        # Days of a range share their reference window (a baseline, or most of a sliding one
        # from one day to the next): its day-to-day distances are computed once per window.
        @functools.lru_cache(maxsize=8)
        def calibration_of(days: tuple[str, ...]) -> Calibration:
            frames = [stored_features(d) for d in days]
            return calibrate(
                [f for f in frames if f is not None], contract, [stored_counts(d) for d in days]
            )

        def day_of_drift_report(day: str, features: pd.DataFrame) -> Iterator:
            wanted = wanted_by_day[day]
            found = {d: stored_features(d) for d in wanted}
            require_features(contract, day, features)
            frames = [frame for frame in found.values() if frame is not None]
            stored = [d for d, frame in found.items() if frame is not None]
            missing = [d for d in wanted if d not in stored]
            rejected = [d for d in missing if d in records and not records[d].accepted]
            counts = [stored_counts(d) for d in stored]
            outcome = drift_check_result(
                contract,
                day,
                features,
                frames,
                stored,
                missing,
                calibration_of(tuple(stored)),
                {name: summed_counts([c[name] for c in counts]) for name in categorical},
                version_metadata("reference_", {d: records[d] for d in stored if d in records}),
                rejected,
            )
            yield outcome.check
            yield dg.MaterializeResult(value=outcome.document, metadata=outcome.metadata())

        yield from each_day(context, day_of_drift_report, features=features)

    return drift_report
