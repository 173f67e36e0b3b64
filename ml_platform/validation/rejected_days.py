"""rejected_days: every rejected day of a dataset on one page, the one a person scans.

A rejected day is recorded as a materialisation (a tombstone with its verdict), so the
partition bars of raw_data and validated_data show it green like any other day, and the Checks
tab shows each check's latest day. This asset, one per dataset and not partitioned, lists the
days whose delivery was rejected, where (raw_data or validated_data) and why, as Dagster recorded
them; its page in the UI shows them in its latest materialisation's metadata. It depends on both
assets, so every run of the daily job (one day, or the end of a backfill that selects it)
materialises it after them and it is never older than their records.
"""

from typing import Any

import dagster as dg

from ml_platform.contracts import Contract
from ml_platform.platform.datasets import asset_key, dataset_name, writer_pool
from ml_platform.platform.formats import FORMAT_KEY
from ml_platform.platform.rejected import RejectedDay, first_sentence, rejected_days
from ml_platform.platform.retries import STORAGE_RETRY_POLICY
from ml_platform.platform.sizes import step_tags

REJECTED_DAYS = "rejected_days"
# Where a delivery is rejected: its file (raw_data) or its quality gate (validated_data).
DELIVERY_ASSETS = ("raw_data", "validated_data")


def rejected_days_metadata(dataset: str, rejected: list[RejectedDay]) -> dict[str, Any]:
    """What the asset's page shows: the count, the days, and a table of where and why."""
    rows = [
        f"| {r.day} | {r.asset} | {r.verdict}{' (earlier version kept)' if r.kept else ''} | "
        f"{first_sentence(r.reason).replace('|', '/')} |"
        for r in rejected
    ]
    table = "\n".join(["| day | rejected by | verdict | reason |", "|---|---|---|---|", *rows])
    return {
        "rejected_day_count": len(rejected),
        # Plain text, shown on the page as it is: the days at a glance.
        "rejected_day_list": ", ".join(r.day for r in rejected) or "none",
        "rejected_day_reasons": dg.MetadataValue.md(
            table if rejected else f"No delivery of {dataset} is rejected."
        ),
    }


def build_rejected_days(contract: Contract) -> dg.AssetsDefinition:
    """The rejected_days asset of a dataset: its rejected deliveries, as recorded."""
    dataset = contract.name
    delivery_keys = [asset_key(dataset, name) for name in DELIVERY_ASSETS]

    @dg.asset(
        name=REJECTED_DAYS,
        key_prefix=dataset,
        pool=writer_pool(dataset, REJECTED_DAYS),
        # Every partition of both: the list covers all the days Dagster recorded.
        deps=delivery_keys,
        retry_policy=STORAGE_RETRY_POLICY,
        group_name=dataset_name(dataset, "validation"),
        kinds={"dagster", "json"},
        metadata={FORMAT_KEY: "json"},
        # Light as the gate's step whose records it reads: its worker is the small one.
        op_tags=step_tags(contract, "validated_data"),
    )
    def _rejected_days(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """The days whose delivery was rejected (by raw_data or validated_data), and why.

        Read from Dagster's latest record of each day of both assets: a day re-delivered and
        accepted leaves the list; a rejected re-delivery of an accepted day is listed with
        "earlier version kept". The metadata shows the days (`rejected_day_list`) and a table of
        where and why (`rejected_day_reasons`); the value stored is the same list as JSON.
        """
        instance = context.instance
        days = sorted(
            set().union(*(instance.get_materialized_partitions(key) for key in delivery_keys))
        )
        rejected = rejected_days(instance, dataset, days, assets=DELIVERY_ASSETS)
        context.log.info(
            f"{dataset}: {len(rejected)} of {len(days)} recorded day(s) rejected"
            + (f": {', '.join(r.day for r in rejected)}" if rejected else "")
        )
        return dg.MaterializeResult(
            value=[
                {"day": r.day, "asset": r.asset, "verdict": r.verdict, "reason": r.reason}
                | {"kept_previous_version": r.kept}
                for r in rejected
            ],
            metadata=rejected_days_metadata(dataset, rejected),
        )

    return _rejected_days
