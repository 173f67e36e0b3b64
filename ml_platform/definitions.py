"""The code location: the asset graph of one dataset, chosen by ML_PLATFORM_DATASET."""

import os

import dagster as dg

from ml_platform.automation.alert_sensors import build_alert_sensors
from ml_platform.automation.alerts import notifier_from_env
from ml_platform.automation.jobs import TRAINING_TAGS, build_ingestion_job
from ml_platform.automation.landing_sensor import build_landing_sensor, sensor_interval_from_env
from ml_platform.automation.schedules import build_daily_schedule, build_weekly_retrain_schedule
from ml_platform.contracts import Contract, load_contract
from ml_platform.drift.checks import build_drift_checks
from ml_platform.evaluation.assets import build_evaluation_report
from ml_platform.evaluation.monitoring import build_champion_performance
from ml_platform.features.assets import build_features_asset
from ml_platform.ingestion.assets import build_raw_data
from ml_platform.ingestion.landing import landing_from_env
from ml_platform.platform.partitions import daily_partitions
from ml_platform.platform.storage import LakeIOManager, lake_from_env
from ml_platform.registry.assets import build_registered_model
from ml_platform.training.assets import build_model
from ml_platform.validation.assets import build_validated_data

DAILY_JOB = "daily_pipeline_job"
WEEKLY_RETRAIN_JOB = "weekly_retrain_job"


def build_definitions(
    contract: Contract, *, landing_dir: str | None = None, lake_dir: str | None = None
) -> dg.Definitions:
    """The whole daily graph of `contract`; directories default to their environment variables."""
    partitions = daily_partitions(contract)
    daily = [
        build(contract, partitions)
        for build in (
            build_raw_data,
            build_validated_data,
            build_features_asset,
            build_model,
            build_evaluation_report,
            build_registered_model,
            # The serving champion on each day's labelled rows: tells when to retrain.
            build_champion_performance,
        )
    ]
    full_days = contract.training.full_window_days
    # The weekly full retrain: a longer window, judged against the champion by the same rules.
    full_retrain = [
        build_model(contract, partitions, name="full_model", window_days=full_days),
        build_evaluation_report(
            contract,
            partitions,
            name="full_evaluation_report",
            model_name="full_model",
            window_days=full_days,
            kind="full",
        ),
        build_registered_model(
            contract,
            partitions,
            name="registered_full_model",
            model_name="full_model",
            evaluation_name="full_evaluation_report",
            kind="full",
        ),
    ]
    assets = daily + full_retrain
    lake = lake_from_env(lake_dir)
    return dg.Definitions(
        assets=assets,
        asset_checks=build_drift_checks(contract, partitions),
        jobs=[
            # Both train: the instance runs one training job at a time (dagster.yaml).
            dg.define_asset_job(DAILY_JOB, selection=daily, tags=TRAINING_TAGS),
            dg.define_asset_job(WEEKLY_RETRAIN_JOB, selection=full_retrain, tags=TRAINING_TAGS),
            build_ingestion_job(),
        ],
        schedules=[
            build_daily_schedule(partitions, DAILY_JOB, [a.key.to_user_string() for a in daily]),
            build_weekly_retrain_schedule(partitions, WEEKLY_RETRAIN_JOB),
        ],
        sensors=[
            build_landing_sensor(
                contract,
                partitions,
                DAILY_JOB,
                minimum_interval_seconds=sensor_interval_from_env(),
            ),
            *build_alert_sensors(minimum_interval_seconds=sensor_interval_from_env()),
        ],
        resources={
            # A local directory, or an S3 prefix when ML_PLATFORM_LANDING_URL=s3://... is set.
            "landing": landing_from_env(landing_dir),
            "notifier": notifier_from_env(),
            # A local directory, or an S3 prefix when ML_PLATFORM_LAKE_URL=s3://... is set.
            "lake": lake,
            "io_manager": LakeIOManager(storage=lake, dataset=contract.name),
        },
        # A day is ~1k rows: one process per step would spend more time importing pandas and
        # scikit-learn than computing, so steps of a run share one process.
        executor=dg.in_process_executor,
    )


@dg.definitions
def defs() -> dg.Definitions:
    """Definitions of the dataset named by ML_PLATFORM_DATASET (a bundled name or a path)."""
    return build_definitions(load_contract(os.environ.get("ML_PLATFORM_DATASET", "flights")))
