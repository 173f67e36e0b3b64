"""Every pool's limit stored in the instance before the queue meets a run of it.

dagster.yaml limits each pool to one run (`concurrency: pools: default_limit: 1`, granularity
`run`): one writer per asset (`datasets.writer_pool`). Dagster's queue (1.13) stores a pool's
default limit in the loop that first meets a queued run of it, but it read which pools are
limited before that, so every run of the new pool that this one loop dequeues starts unlimited.
Two runs writing a day of one asset, queued before that pool's first run (a backfill's chunk and
the day launched from the UI, on a new instance or for a newly added dataset), would execute at
once. With the limits stored first, the queue never meets a pool it does not limit.

`ml-platform pools` stores them where the daemon starts (`make serve`, the daemon's container),
through the storage's own `initialize_concurrency_limit_to_default`, which is what the queue
itself calls: each limit follows the instance's default and keeps following it, and a limit an
operator set (`dagster instance concurrency set`, the UI) is left as it is. A replay's pools are
the exception that needs none: its assets are new ones, written by its one backfill alone.

A dataset added while the daemon runs (a new contract, the code location reloaded) brings new
pools that command has not seen. `pool_limits_sensor` (on from the start, like the alert
sensors) stores the missing limits of the code location's pools each tick, so a new dataset's
pools are limited within one sensor interval of the reload, whoever launches its runs: the UI,
a backfill, a sensor or the command. Runs launched before that first tick (within the interval
after the reload) can still meet a pool the queue has not limited.
"""

from collections.abc import Iterable
from typing import Any

import dagster as dg

POOL_LIMITS_SENSOR = "pool_limits_sensor"


class PoolLimitError(Exception):
    """The instance cannot hold pool limits."""


def pools_of(definitions: dg.Definitions) -> set[str]:
    """The pools of the definitions' assets."""
    return pools_of_assets(definitions.assets or [])


def pools_of_assets(assets: Iterable[Any]) -> set[str]:
    """The pools of the assets definitions among `assets`."""
    return {
        asset.node_def.pool
        for asset in assets
        if isinstance(asset, dg.AssetsDefinition)
        and isinstance(asset.node_def, dg.OpDefinition)
        and asset.node_def.pool
    }


def store_pool_limits(instance: dg.DagsterInstance, pools: Iterable[str]) -> list[str]:
    """Store the instance's default limit of each pool that has no limit yet; those pools."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        raise PoolLimitError(
            "this instance's storage holds no pool limits, so the queue would start every run "
            "of a pool at once: run `dagster instance migrate` on it, then this again"
        )
    limited = storage.get_concurrency_keys()
    new = sorted(set(pools) - limited)
    default = instance.global_op_concurrency_default_limit
    named = f"{len(new)} pool(s) ({', '.join(new[:3])}{', ...' if len(new) > 3 else ''})"
    if new and default is None:
        # Dagster would store no limit (or remove one): nothing would hold a pool to one run.
        raise PoolLimitError(
            "this instance's dagster.yaml sets no `concurrency: pools: default_limit`, so no "
            f"limit can be stored for {named} and the "
            "queue would start every run of a pool at once; set it (1 keeps one writer a day, "
            "as the repository's dagster.yaml does), then run this again"
        )
    if new and default == 0:
        # Dagster takes 0 as no slot, not as no limit: no run of the pool would ever start.
        raise PoolLimitError(
            "this instance's dagster.yaml sets `concurrency: pools: default_limit: 0`, which "
            f"would hold every run of {named} in the queue forever (0 runs at once, not "
            "unlimited); set it to 1 (one writer a day, as the repository's dagster.yaml "
            "does), then run this again"
        )
    for pool in new:
        storage.initialize_concurrency_limit_to_default(pool)
    return new


def build_pool_limits_sensor(minimum_interval_seconds: int = 30) -> dg.SensorDefinition:
    """The sensor that stores the missing limit of each pool of its code location, each tick.

    It launches nothing. An instance that cannot hold the limits fails its ticks with the
    reason (`PoolLimitError`), shown on the sensor's page: the queue would start every run of a
    pool at once, which no later tick mends.
    """

    @dg.sensor(
        name=POOL_LIMITS_SENSOR,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Stores the instance's default limit for each pool of this code location that has "
            "none yet (a dataset added since `ml-platform pools` ran), before the run queue "
            "meets a run of it; see ml_platform/platform/pools.py."
        ),
    )
    def pool_limits_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        repository = context.repository_def
        pools = pools_of_assets(repository.assets_defs_by_key.values()) if repository else set()
        if not pools:
            return dg.SkipReason("no pools in this code location")
        stored = store_pool_limits(context.instance, pools)
        return dg.SkipReason(
            f"{len(pools)} pool(s): limits stored for {len(stored)}"
            + (f" ({', '.join(stored)})" if stored else "")
            + f", {len(pools) - len(stored)} had one already"
        )

    return pool_limits_sensor
