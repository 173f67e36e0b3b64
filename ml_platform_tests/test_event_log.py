"""The embedded instance's event log: batches stored at once read back as one by one."""

import os
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import (
    DagsterEvent,
    DagsterEventBatchMetadata,
    DagsterEventType,
    StepMaterializationData,
    generate_event_batch_id,
)
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

from ml_platform.event_log import BATCH_SIZE_ENV, BatchingSqliteEventLogStorage

REPO = Path(__file__).resolve().parents[1]
ASSET = dg.AssetKey("features")
DAYS = [f"2013-01-{d:02d}" for d in range(1, 31)]


def materialisations(run_id: str) -> list[EventLogEntry]:
    """A range step's end: a materialisation of each day, with a data version tag."""
    events = []
    for i, day in enumerate(DAYS):
        materialization = dg.AssetMaterialization(
            asset_key=ASSET,
            partition=day,
            metadata={"rows": i},
            tags={"dagster/data_version": f"v{i}"},
        )
        event = DagsterEvent(
            event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value,
            job_name="daily_pipeline_job",
            event_specific_data=StepMaterializationData(materialization),
        )
        events.append(
            EventLogEntry(
                error_info=None,
                level=20,
                user_message="",
                run_id=run_id,
                timestamp=time.time() + i,
                dagster_event=event,
            )
        )
    return events


def read_back(storage: SqliteEventLogStorage) -> list[tuple]:
    records = storage.fetch_materializations(ASSET, limit=100, ascending=True).records
    return [
        (
            r.partition_key,
            r.asset_materialization.metadata["rows"].value,
            r.asset_materialization.tags["dagster/data_version"],
        )
        for r in records
        if r.asset_materialization is not None
    ]


def test_a_batch_reads_back_as_the_same_events_stored_one_by_one(tmp_path):
    run_id = str(uuid.uuid4())
    one_by_one = SqliteEventLogStorage(str(tmp_path / "one_by_one"))
    batched = BatchingSqliteEventLogStorage(str(tmp_path / "batched"))
    for event in materialisations(run_id):
        one_by_one.store_event(event)
    batched.store_event_batch(materialisations(run_id))

    assert read_back(batched) == read_back(one_by_one)
    assert [p for p, *_ in read_back(batched)] == DAYS
    assert batched.get_materialized_partitions(ASSET) == set(DAYS)
    assert len(batched.get_logs_for_run(run_id)) == len(DAYS)
    latest = batched.get_latest_materialization_events([ASSET])[ASSET]
    assert latest is not None and latest.asset_materialization.partition == DAYS[-1]


def test_the_repository_instance_batches_a_steps_days_where_dagster_keeps_them(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.delenv(BATCH_SIZE_ENV, raising=False)
    (tmp_path / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())

    with dg.DagsterInstance.get() as instance:
        assert isinstance(instance.event_log_storage, BatchingSqliteEventLogStorage)
        assert int(os.environ[BATCH_SIZE_ENV]) > len(DAYS)
        run_id = str(uuid.uuid4())
        events = materialisations(run_id)
        batch = generate_event_batch_id()
        # As a range step hands them over: nothing is stored until the batch's last event.
        for i, event in enumerate(events):
            instance.handle_new_event(
                event, batch_metadata=DagsterEventBatchMetadata(batch, i == len(events) - 1)
            )
            stored = instance.get_materialized_partitions(ASSET)
            assert stored == (set(DAYS) if i == len(events) - 1 else set())
    assert (tmp_path / "history" / "runs" / f"{run_id}.db").is_file()


def test_without_dagster_home_or_base_dir_it_says_what_it_needs(monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    with pytest.raises(dg.DagsterInvariantViolationError, match="DAGSTER_HOME"):
        BatchingSqliteEventLogStorage()
