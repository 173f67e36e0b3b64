"""The code location: the asset graph of one dataset, chosen by ML_PLATFORM_DATASET."""

import os

import dagster as dg

from ml_platform.contracts import Contract, load_contract
from ml_platform.evaluation.assets import build_evaluation_report
from ml_platform.features.assets import build_features_asset
from ml_platform.ingestion.assets import build_raw_data
from ml_platform.ingestion.landing import LandingZone
from ml_platform.partitions import daily_partitions
from ml_platform.storage import LakeIOManager, LocalStorage
from ml_platform.training.assets import build_model
from ml_platform.validation.assets import build_validated_data

DAILY_JOB = "daily_pipeline_job"


def build_definitions(
    contract: Contract, *, landing_dir: str | None = None, lake_dir: str | None = None
) -> dg.Definitions:
    """The whole daily graph of `contract`; directories default to their environment variables."""
    partitions = daily_partitions(contract)
    assets = [
        build(contract, partitions)
        for build in (
            build_raw_data,
            build_validated_data,
            build_features_asset,
            build_model,
            build_evaluation_report,
        )
    ]
    landing = landing_dir or dg.EnvVar("ML_PLATFORM_LANDING_DIR")
    lake = LocalStorage(base_dir=lake_dir or dg.EnvVar("ML_PLATFORM_LAKE_DIR"))
    return dg.Definitions(
        assets=assets,
        jobs=[dg.define_asset_job(DAILY_JOB, selection=assets)],
        resources={
            "landing": LandingZone(base_dir=landing),
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
