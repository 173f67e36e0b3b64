"""Daily partitions of a dataset, from its contract."""

import datetime as dt
from collections.abc import Mapping

import dagster as dg

from ml_platform.contracts import Contract


def daily_partitions(contract: Contract) -> dg.DailyPartitionsDefinition:
    """One partition per day from the contract's first day (to its last day, if it has one)."""
    end = contract.partitions.end_date
    # The last date there is (9999-12-31, the usual "no end") has no day after it to end at.
    if end == dt.date.max:
        end = None
    return dg.DailyPartitionsDefinition(
        start_date=contract.partitions.start_date.isoformat(),
        end_date=(end + dt.timedelta(days=1)).isoformat() if end else None,
        timezone=contract.event_time.timezone,
    )


def run_days(tags: Mapping[str, str]) -> list[str]:
    """The days a run materialises: its partition, or each day of its partition range."""
    if "dagster/partition" in tags:
        return [tags["dagster/partition"]]
    first = tags.get("dagster/asset_partition_range_start")
    last = tags.get("dagster/asset_partition_range_end")
    if not (first and last):
        return []
    start, end = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]
