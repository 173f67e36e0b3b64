"""Jobs of the automation and the run tags that the instance's concurrency limits key on.

`dagster.yaml` limits runs by two tags: `ml_platform/dataset_partition` (one run per day of a
dataset at a time, so two runs never write the same partition, while the same day of another
dataset runs beside it) and `ml_platform/workload` (runs that train take at most one of the run
slots, so ingestion always has one, and days train one after the other, in the order they were
queued, which the training window needs: day D's model reads the features of the days before
it).
"""

import dagster as dg

from ml_platform.platform.datasets import asset_key, dataset_name
from ml_platform.platform.writers import DATASET_PARTITION_TAG

WORKLOAD_TAG = "ml_platform/workload"
TRAINING = "training"
INGESTION = "ingestion"
TRAINING_TAGS = {WORKLOAD_TAG: TRAINING}
INGESTION_TAGS = {WORKLOAD_TAG: INGESTION}
INGESTION_JOB = "ingestion_job"
INGESTION_ASSETS = ["raw_data", "validated_data", "features"]


def day_run_tags(dataset: str, day: str) -> dict[str, str]:
    """Tags of a dataset's run of one day that sensors and schedules request.

    Backfill runs of several days (`multi_run`) carry Dagster's range tags instead; the per-day
    limit is for the runs of one day that automation requests.
    """
    return {DATASET_PARTITION_TAG: f"{dataset}:{day}"}


def build_ingestion_job(dataset: str):
    """raw_data, validated_data and features of a day: cheap, independent days, no training.

    For backfilling data over many days without training every day, two at a time.
    """
    return dg.define_asset_job(
        dataset_name(dataset, INGESTION_JOB),
        selection=dg.AssetSelection.assets(*(asset_key(dataset, n) for n in INGESTION_ASSETS)),
        tags=INGESTION_TAGS,
        description=(
            "Ingest, validate and featurise a day, without training: backfill data cheaply, "
            "then train once."
        ),
    )
