"""How a daily step reports its days: worker processes for a range, checks that target the day."""

import os
import signal
import time

import dagster as dg
import pytest

from ml_platform.platform.settings import WORKERS_ENV
from ml_platform.platform.steps import map_days, step_workers
from ml_platform_tests.conftest import Platform, contract_with

DAYS = [f"2024-01-{d:02d}" for d in range(1, 31)]


def test_days_come_back_in_order_computed_by_worker_processes(monkeypatch, sigterm_deferred):
    monkeypatch.setenv(WORKERS_ENV, "2")
    here = os.getpid()

    def compute(day: str) -> tuple[str, int]:
        time.sleep(0.05)  # a day's work: long enough that both workers get some
        return day, os.getpid()

    results = list(map_days(compute, DAYS))

    assert [day for day, _ in results] == DAYS
    pids = {pid for _, pid in results}
    assert here not in pids
    assert len(pids) == 2


def test_one_worker_computes_here(monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "1")
    assert {pid for pid in map_days(lambda day: os.getpid(), DAYS)} == {os.getpid()}


@pytest.fixture
def sigterm_deferred():
    """SIGTERM handled as a run's process handles it (Dagster defers it), and a deadline."""

    def deadline(*_):
        raise TimeoutError("the worker pool did not stop")

    deferred = signal.signal(signal.SIGTERM, lambda *_: None)
    alarm = signal.signal(signal.SIGALRM, deadline)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, alarm)
    signal.signal(signal.SIGTERM, deferred)


def test_an_exception_of_a_day_reaches_the_step(monkeypatch, sigterm_deferred):
    # The other worker is stopped mid-range: it must not inherit the parent's SIGTERM handler.
    monkeypatch.setenv(WORKERS_ENV, "2")

    def compute(day: str) -> str:
        time.sleep(0.05)
        if day == "2024-01-17":
            raise OSError(f"lake unreachable while writing {day}")
        return day

    with pytest.raises(OSError, match="2024-01-17"):
        list(map_days(compute, DAYS))


def test_the_default_is_the_usable_cpus(monkeypatch):
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert step_workers() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("value", ["two", "0", "-1"])
def test_a_bad_worker_count_is_named(monkeypatch, value):
    monkeypatch.setenv(WORKERS_ENV, value)
    with pytest.raises(ValueError, match=WORKERS_ENV):
        step_workers()


def test_a_passing_days_checks_target_its_materialisation(tmp_path):
    # The UI counts a day's check as passed only when the evaluation targets the day's
    # materialisation; an evaluation reported before it counts the day as "Missing".
    contract = contract_with(tmp_path, "synthetic")
    platform = Platform(contract, tmp_path / "p")
    platform.land("2024-01-01", 1)
    assert platform.materialize("2024-01-01", selection=["raw_data", "validated_data"]).success
    for check in ("raw_schema", "gx_validity"):
        asset = "raw_data" if check == "raw_schema" else "validated_data"
        records = platform.instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(platform.key(asset), check), limit=5
        )
        assert records, check
        evaluation = records[0].event.dagster_event.event_specific_data
        assert evaluation.partition == "2024-01-01" and evaluation.passed
        assert evaluation.target_materialization_data is not None, check
