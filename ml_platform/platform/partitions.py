"""Daily partitions of a dataset, from its contract."""

import datetime as dt

import dagster as dg

from ml_platform.contracts import Contract


def daily_partitions(contract: Contract) -> dg.DailyPartitionsDefinition:
    """One partition per day from the contract's first day (to its last day, if it has one)."""
    end = contract.partitions.end_date
    return dg.DailyPartitionsDefinition(
        start_date=contract.partitions.start_date.isoformat(),
        end_date=(end + dt.timedelta(days=1)).isoformat() if end else None,
        timezone=contract.event_time.timezone,
    )
