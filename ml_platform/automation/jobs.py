"""Jobs of the automation and the run tags that the instance's concurrency limits key on.

`dagster.yaml` limits runs by two tags: `dagster/partition` (one run per day at a time, so two
runs never write the same partition) and `ml_platform/workload` (runs that train take at most
one of the run slots, so ingestion always has one, and days train one after the other, in the
order they were queued, which the training window needs: day D's model reads the features of
the days before it).
"""

import dagster as dg

WORKLOAD_TAG = "ml_platform/workload"
TRAINING = "training"
INGESTION = "ingestion"
TRAINING_TAGS = {WORKLOAD_TAG: TRAINING}
INGESTION_TAGS = {WORKLOAD_TAG: INGESTION}

INGESTION_JOB = "ingestion_job"
INGESTION_ASSETS = ["raw_data", "validated_data", "features"]


def build_ingestion_job():
    """raw_data, validated_data and features of a day: cheap, independent days, no training.

    For backfilling data over many days without training every day, two at a time.
    """
    return dg.define_asset_job(
        INGESTION_JOB,
        selection=dg.AssetSelection.assets(*INGESTION_ASSETS),
        tags=INGESTION_TAGS,
        description=(
            "Ingest, validate and featurise a day, without training: backfill data cheaply, "
            "then train once."
        ),
    )
