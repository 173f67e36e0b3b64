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
"""

from collections.abc import Iterable

import dagster as dg


class PoolLimitError(Exception):
    """The instance cannot hold pool limits."""


def pools_of(definitions: dg.Definitions) -> set[str]:
    """The pools of the definitions' assets."""
    return {
        asset.node_def.pool
        for asset in definitions.assets or []
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
    if new and instance.global_op_concurrency_default_limit is None:
        # Dagster would store no limit (or remove one): nothing would hold a pool to one run.
        raise PoolLimitError(
            "this instance's dagster.yaml sets no `concurrency: pools: default_limit`, so no "
            f"limit can be stored for {len(new)} pool(s) ({', '.join(new[:3])}"
            f"{', ...' if len(new) > 3 else ''}) and the "
            "queue would start every run of a pool at once; set it (1 keeps one writer a day, "
            "as the repository's dagster.yaml does), then run this again"
        )
    for pool in new:
        storage.initialize_concurrency_limit_to_default(pool)
    return new
