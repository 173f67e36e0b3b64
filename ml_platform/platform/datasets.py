"""Names of one dataset's definitions in a code location that serves several datasets.

Every dataset has the same graph, so each name carries the dataset: asset keys are prefixed
by it (`flights/raw_data`), which also makes the lake folder of a partition
`<lake>/<dataset>/<asset>/<day>/` (the IO manager stores by asset key), and groups, jobs,
sensors, schedules and pools start with it (`flights_daily_pipeline_job`).
"""

import dagster as dg


def asset_key(dataset: str, name: str) -> dg.AssetKey:
    """The key of the dataset's asset `name`."""
    return dg.AssetKey([dataset, name])


def dataset_name(dataset: str, name: str) -> str:
    """A group, job, sensor, schedule or pool name of the dataset."""
    return f"{dataset}_{name}"


def op_name(dataset: str, name: str) -> str:
    """The op Dagster names for the dataset's asset `name`: the key's path joined by `__`."""
    return f"{dataset}__{name}"
