"""The embedded instance's event log: Dagster's SQLite storage, writing batches in one go.

A single-run backfill of a year records each asset's 365 days together when its step ends,
and the run's creation records each day as planned: about 4,400 asset events for the six
daily assets. Dagster's SQLite storage writes every event in its own transactions (the run's
database, then the index), opening and closing both databases each time: 20 ms or more an
event, several minutes a year. Dagster hands such events over in batches to storages that
take them (`DAGSTER_EVENT_BATCH_SIZE`, as its PostgreSQL storage does); this one writes a
batch's asset events in one transaction per database. Every other event, and every read, is
Dagster's own code. The files are where Dagster's default puts them ($DAGSTER_HOME/history/
runs), so an instance keeps its history when it switches to this storage or back.

Configured in dagster.yaml:

    event_log_storage:
      module: ml_platform.event_log
      class: BatchingSqliteEventLogStorage
"""

import os
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

# Dagster 1.13 has no public API for event log storages: the SQLite storage, its events and
# its SQL helpers live in dagster._core, as for every storage Dagster ships.
from dagster._core.events import ASSET_EVENTS
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.sqlalchemy_compat import db_result
from dagster._serdes import ConfigurableClassData

BATCH_SIZE_ENV = "DAGSTER_EVENT_BATCH_SIZE"
# Events per batch: a year's step ends with 365 materialisations of its asset.
BATCH_SIZE = 500


class BatchingSqliteEventLogStorage(SqliteEventLogStorage):
    """SQLite event log storage (per-run databases and an index) that writes batches at once."""

    def __init__(self, base_dir: str | None = None, inst_data: ConfigurableClassData | None = None):
        home = os.environ.get("DAGSTER_HOME")
        if base_dir is None and not home:
            raise dg.DagsterInvariantViolationError(
                "BatchingSqliteEventLogStorage needs DAGSTER_HOME (or a base_dir in its config)"
            )
        super().__init__(base_dir or os.path.join(str(home), "history", "runs"), inst_data)
        # Dagster batches events only where this is set; it reads it at every event, so setting
        # it in each process that loads this storage (daemon, webserver, runs) is enough.
        os.environ.setdefault(BATCH_SIZE_ENV, str(BATCH_SIZE))

    @classmethod
    def config_type(cls) -> Any:
        """`base_dir` is optional: by default, where Dagster's default storage keeps it."""
        return {"base_dir": dg.Field(dg.StringSource, is_required=False)}

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> "BatchingSqliteEventLogStorage":
        """This class, not the parent's (whose method names the parent class)."""
        return cls(inst_data=inst_data, **config_value)

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        """Store the batch's asset events of one run in one transaction per database.

        What `store_event` does per event, batched: the rows in the run's database, then in
        the index with each asset's tags and latest event. Other events (the planned checks
        that come with planned materialisations) go through `store_event`, after them.
        """
        assets = [e for e in events if e.is_dagster_event and e.dagster_event_type in ASSET_EVENTS]
        if not assets or len({e.run_id for e in assets}) != 1:
            super().store_event_batch(events)
            return
        statements = [self.prepare_insert_event(event) for event in assets]
        # The asset's row keeps its latest event: only each asset's last one of a kind updates
        # it, as Dagster's PostgreSQL storage does with its batches.
        last = {(e.dagster_event_type, e.get_dagster_event().asset_key): e for e in assets}
        with self.run_connection(assets[0].run_id) as conn:
            for statement in statements:
                conn.execute(statement)
        with self.index_transaction() as conn:
            for event, statement in zip(assets, statements, strict=True):
                with db_result(conn, statement) as result:
                    event_id = result.inserted_primary_key[0]
                if event_id is None:
                    raise dg.DagsterInvariantViolationError(
                        "Cannot store asset event tags for null event id."
                    )
                self._store_asset_event_tags(conn, [event], [event_id])
                if last[(event.dagster_event_type, event.get_dagster_event().asset_key)] is event:
                    self._store_asset_event(conn, event, event_id)
        for event in events:
            if not (event.is_dagster_event and event.dagster_event_type in ASSET_EVENTS):
                self.store_event(event)
