"""What Dagster records of each day of a daily asset: its verdict, and whether it was accepted.

Dagster is the record: a day's data file exists only when its latest materialisation says
`accepted`, and every reader (a window, a history reference, a streak) asks the record. Each
stored version of a day is its own file (`LakeIOManager.version_key`), which the materialisation
that made it names (`lake_key`): a reader reads the file the latest record names, never a file
a run wrote without recording it.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

ACCEPTED = "accepted"
# The verdict of a day recorded again as it was: its inputs kept their accepted version.
UNCHANGED = "unchanged"
# The metadata entry naming the lake file of the day's accepted version.
LAKE_KEY = "lake_key"
# The tag in which Dagster records a materialization's data version (the UI's "Data version").
# Dagster's own name for it is in a private module; the tag itself is what its records carry.
DATA_VERSION_TAG = "dagster/data_version"


@dataclasses.dataclass(frozen=True)
class DayRecord:
    """What Dagster records of one partition: its verdict, whether accepted, and by which run."""

    verdict: str
    accepted: bool
    reason: str
    run_id: str
    accepted_rows: int | None = None
    # The lake file of the day's accepted version; None for a tombstone, and for a record made
    # before versions had their own files (`LakeIOManager.recorded_key` then names the old one).
    lake_key: str | None = None
    # The data version Dagster recorded for this materialization (None if it recorded none).
    data_version: str | None = None
    # Every metadata entry of the record, by name, as plain values.
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, record: Any) -> "DayRecord":
        """The day record of an `EventLogRecord` of a materialisation."""
        materialization = record.asset_materialization
        metadata = materialization.metadata if materialization else {}
        tags = (materialization.tags if materialization else None) or {}

        def value(name: str, default: Any) -> Any:
            entry = metadata.get(name)
            return entry.value if entry is not None else default

        rows = value("accepted_rows", None)
        lake_key = value(LAKE_KEY, None)
        return cls(
            # Records made before verdicts were recorded are accepted days.
            verdict=str(value("verdict", ACCEPTED)),
            accepted=bool(value("accepted", True)),
            reason=str(value("reason", "")),
            run_id=record.run_id,
            accepted_rows=int(rows) if rows is not None else None,
            lake_key=str(lake_key) if lake_key is not None else None,
            data_version=tags.get(DATA_VERSION_TAG),
            metadata={name: entry.value for name, entry in metadata.items()},
        )


def day_records(
    instance: dg.DagsterInstance,
    key: dg.AssetKey,
    days: Sequence[str],
    before: float | None = None,
) -> dict[str, DayRecord]:
    """The latest record of each of `days` of asset `key` that Dagster holds (before a time)."""
    found: dict[str, DayRecord] = {}
    wanted = set(days)
    cursor = None
    while wanted - set(found):
        result = instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=key,
                asset_partitions=sorted(wanted - set(found)),
                before_timestamp=before,
            ),
            limit=max(len(wanted), 100),
            cursor=cursor,
        )
        for record in result.records:
            day = record.partition_key
            if day is not None and day not in found:
                found[day] = DayRecord.of(record)
        if not result.has_more:
            break
        cursor = result.cursor
    return found


def done_days(instance: dg.DagsterInstance, key: dg.AssetKey, days: Sequence[str]) -> set[str]:
    """Those of `days` whose latest record of asset `key` accepted the day's delivery.

    A rejected day is not done, a tombstone or a day that kept an earlier accepted version
    alike: a corrected file reruns it without `--force`.
    """
    records = day_records(instance, key, days)
    return {day for day, record in records.items() if record.verdict in (ACCEPTED, UNCHANGED)}


def recorded_lake_keys(
    instance: dg.DagsterInstance, key: dg.AssetKey, days: Sequence[str]
) -> set[str]:
    """Every lake file that a materialisation of `days` of asset `key` names, any version."""
    keys: set[str] = set()
    cursor = None
    while days:
        result = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=list(days)),
            limit=1000,
            cursor=cursor,
        )
        for record in result.records:
            lake_key = DayRecord.of(record).lake_key
            if lake_key is not None:
                keys.add(lake_key)
        if not result.has_more:
            break
        cursor = result.cursor
    return keys


def version_metadata(
    prefix: str, records: Mapping[str, DayRecord], this_run: Sequence[str] = (), run_id: str = ""
) -> dict[str, dict[str, str]]:
    """The metadata naming the version of each day a verdict read, from Dagster's records.

    `<prefix>data_versions` and `<prefix>runs`, each by day, from the day's latest record.

    A verdict that reads days outside its inputs (a drift reference, a history window) names
    them so that the UI shows what a day was compared with. Days of `this_run` were computed by
    the running step (`run_id`), which Dagster records only when the step ends: their data
    version is not known yet.
    """
    versions = {
        day: record.data_version or "none recorded" for day, record in sorted(records.items())
    }
    runs = {day: record.run_id for day, record in sorted(records.items())}
    for day in this_run:
        versions[day] = "recorded by this run"
        runs[day] = run_id
    return {
        f"{prefix}data_versions": dict(sorted(versions.items())),
        f"{prefix}runs": dict(sorted(runs.items())),
    }
