"""Shapes a review found in the shared step machinery and the ingestion of landed files: a
range with a day that fails for good, a day trained in a worker process, nullable ids above
2**53, and header names in decomposed Unicode."""

import os
import socket
import unicodedata

import dagster as dg
import pandas as pd
import yaml

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.platform.records import day_records
from ml_platform.training import processes
from ml_platform_tests.conftest import Platform, contract_with, days_from
from ml_platform_tests.test_backfill_range import evaluations, materialize_range

DAY = "2024-01-01"


def synthetic_with(tmp_path, change) -> Platform:
    """The synthetic dataset's graph, its contract changed by `change(document, columns)`."""
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    change(document, {c["name"]: c for c in document["columns"]})
    path = tmp_path / "synthetic.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    return Platform(load_contract(path), tmp_path / "p")


def reland(platform: Platform, day: str, change) -> pd.DataFrame:
    """Rewrite the landed file of `day` as `change(frame)` gives it; the frame written."""
    path = platform.landing_dir / platform.contract.landing.file_name(day)
    frame = change(pd.read_csv(path, dtype={"transaction_id": "Int64"}))
    frame.to_csv(path, index=False)
    return frame


def test_nullable_ids_above_2_to_the_53_reach_the_validated_rows_exact(tmp_path):
    # A nullable int column with a blank was read as float64: 9007199254740993 was stored as
    # 9007199254740992, and two ids that differ by one became one id, without a word.
    platform = synthetic_with(tmp_path, lambda _, c: c["transaction_id"].update(nullable=True))
    platform.land(DAY, 1)

    def big_ids(frame: pd.DataFrame) -> pd.DataFrame:
        ids = frame["transaction_id"] + 2**53
        return frame.assign(transaction_id=ids.mask(ids.index == 5))

    landed = reland(platform, DAY, big_ids)
    result = platform.materialize(DAY, selection=["raw_data", "validated_data"])
    assert result.success
    validated = pd.read_parquet(platform.stored("validated_data", DAY, "parquet"))
    expected = landed["transaction_id"].dropna().astype("int64").tolist()
    assert validated["transaction_id"].dropna().astype("int64").tolist() == expected


def test_a_header_in_decomposed_unicode_is_read_as_the_contracts_column_and_said(tmp_path):
    # "température" written by a macOS tool (NFD) did not match the contract's (NFC): the day
    # was rejected for a missing column that the file visibly has.
    composed = "température"
    decomposed = unicodedata.normalize("NFD", composed)

    def rename(document: dict, columns: dict) -> None:
        columns["temperature"]["name"] = composed
        for feature in document["features"]:
            if feature["source"] == "temperature":
                feature["source"] = composed

    platform = synthetic_with(tmp_path, rename)
    platform.land(DAY, 1)
    reland(platform, DAY, lambda frame: frame.rename(columns={"temperature": decomposed}))
    result = platform.materialize(DAY, selection=["raw_data", "validated_data"])
    assert result.success
    (materialization,) = result.asset_materializations_for_node(platform.node("raw_data"))
    assert materialization.metadata["verdict"].value == "accepted"
    assert materialization.metadata["renamed_columns"].value == {decomposed: composed}
    logs = [r.user_message for r in platform.instance.all_logs(result.run_id)]
    assert any("\\u0301" in m and "read as" in m for m in logs)
    validated = pd.read_parquet(platform.stored("validated_data", DAY, "parquet"))
    assert composed in validated.columns


def test_a_failed_range_reports_no_check_of_a_day_it_did_not_record(tmp_path):
    # A range whose first day fails for good (its raw_data was never materialised) computes its
    # other days but records none of them. Every day's check evaluations were still reported:
    # a day rejected before and accepted in this run showed a passing `delivery_accepted`,
    # while its latest record, and everything after it, was still the rejection.
    first, second = "2024-01-01", "2024-01-02"
    platform = Platform(contract_with(tmp_path, "synthetic"), tmp_path / "p")
    platform.land(second, 1, fault="null_burst")
    assert platform.materialize(second, selection=["raw_data", "validated_data"]).success
    assert evaluations(platform, "validated_data", "delivery_accepted") == {second: False}
    platform.land(second, 1)
    assert platform.materialize(second, selection=["raw_data"]).success

    result = materialize_range(platform, first, second, ["validated_data"])

    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    description = failure.step_failure_data.user_failure_data.description
    assert "1 of 2 days failed" in description and f"{first}: " in description
    records = day_records(platform.instance, platform.key("validated_data"), [second])
    assert records[second].verdict == "failed quality gate"
    # The check says what the record says: the day is still rejected.
    assert evaluations(platform, "validated_data", "delivery_accepted") == {second: False}


def test_a_day_trained_in_a_worker_names_the_worker_its_step_figures_are_of(tmp_path, monkeypatch):
    # A worker's peak memory and CPU seconds are the day's `step_*` figures, but `step_worker`
    # named the step's own process: the figures read as the step process's, which it never used.
    days = days_from(DAY, 4)
    platform = Platform(contract_with(tmp_path, "synthetic"), tmp_path / "p")
    platform.land(DAY, len(days))
    upstream = ["raw_data", "validated_data", "features"]
    assert materialize_range(platform, days[0], days[-1], upstream).success
    # Whatever this machine: its cores and a training's seconds would decide otherwise.
    monkeypatch.setattr(processes, "MIN_PARALLEL_SECONDS", 0.0)
    monkeypatch.setattr(processes, "usable_cores", lambda: 2)

    result = materialize_range(platform, days[0], days[-1], ["model"])

    assert result.success
    here = f"{socket.gethostname()}:{os.getpid()}"
    recorded = {
        m.partition: m.metadata
        for m in result.asset_materializations_for_node(platform.node("model"))
    }
    trained_in = {day: meta["trained_in"].text for day, meta in recorded.items()}
    assert trained_in == {
        day: "the step's process" if day == days[0] else "a worker process" for day in days
    }
    workers = {day: metadata["step_worker"].text for day, metadata in recorded.items()}
    assert {day: worker == here for day, worker in workers.items()} == {
        day: day == days[0] for day in days
    }, workers
    # The training's own figures (`wall_seconds`, `peak_rss_mb`...) say whose they are too.
    assert {day: metadata["worker"].text for day, metadata in recorded.items()} == workers
