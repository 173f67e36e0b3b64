"""Jobs of the automation and the run tags that the instance's concurrency limits key on.

`dagster.yaml` limits runs by two tags: `ml_platform/dataset_partition` (one single-day run per
day of a dataset at a time, while the same day of another dataset runs beside it) and
`ml_platform/workload` (runs that train take at most one of the run slots, so ingestion always
has one). Ranges are kept apart by the assets' pools (`platform/datasets.py` `writer_pool`).
"""

import dagster as dg

from ml_platform.platform.datasets import asset_key, dataset_name

# `<dataset>:<day>`: the tag the queue's one-run-per-day limit keys on (dagster.yaml).
# `dagster/partition` holds the day only, the same for every dataset: a limit per unique value
# of it would make one dataset's run of a day wait for another dataset's run of that day.
DATASET_PARTITION_TAG = "ml_platform/dataset_partition"
WORKLOAD_TAG = "ml_platform/workload"
TRAINING = "training"
INGESTION = "ingestion"
TRAINING_TAGS = {WORKLOAD_TAG: TRAINING}
INGESTION_TAGS = {WORKLOAD_TAG: INGESTION}
INGESTION_JOB = "ingestion_job"
DAILY_JOB = "daily_pipeline_job"
WEEKLY_RETRAIN_JOB = "weekly_retrain_job"
# Every job a dataset has, named `<dataset>_<job>` (`platform.datasets.dataset_name`).
DATASET_JOBS = (DAILY_JOB, WEEKLY_RETRAIN_JOB, INGESTION_JOB)
INGESTION_ASSETS = ["raw_data", "validated_data", "features"]


def day_run_tags(dataset: str, day: str) -> dict[str, str]:
    """Tags of a dataset's run of one day: sensors, schedules and `ml-platform materialize`.

    Backfill runs of several days (`multi_run`) carry Dagster's range tags instead; the assets'
    pools keep them apart from the runs of one day.
    """
    return {DATASET_PARTITION_TAG: f"{dataset}:{day}"}


# A run in one of these will still do its day.
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def day_runs_in_flight(instance: dg.DagsterInstance, dataset: str, day: str) -> list[dg.DagsterRun]:
    """The single-day runs of a dataset's day that are queued or running (`day_run_tags`)."""
    return list(
        instance.get_runs(
            filters=dg.RunsFilter(tags=day_run_tags(dataset, day), statuses=IN_FLIGHT)
        )
    )


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
