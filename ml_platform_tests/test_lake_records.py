"""Dagster is the record: the lake holds no data file that Dagster does not record.

A run worker is killed (`kill -9`) at each point between storing a day's file and recording it:
after the first day's file of a three-day range, before the first materialisation is recorded
(every file stored), and between the first and the second record. Whatever the point, a reader
reads only the versions Dagster records (never the killed run's other files); while the run is
still recorded as running its files are left alone (it might yet record them); once Dagster
records it failed (what run monitoring does with a dead worker), the next run of the days
deletes them and stores its own, so every data file is one Dagster records. The worker is a
real process running the real raw_data step on a real on-disk instance; the kill is a real
SIGKILL at the exact point, placed by wrapping the storage write or the instance's event store
in that process.
"""

import os
import subprocess
import sys
import textwrap

import dagster as dg
import pytest

from ml_platform.automation.lake_sweep import build_lake_sweep_sensors
from ml_platform.platform.records import recorded_lake_keys
from ml_platform_tests.conftest import Platform, contract_with, days_from
from ml_platform_tests.test_backfill_range import materialize_range

pytestmark = pytest.mark.slow

DAYS = days_from("2024-01-01", 3)
ASSET = "raw_data"

WORKER = textwrap.dedent(
    """
    import os, signal, sys
    import dagster as dg
    from ml_platform.contracts import load_contract
    from ml_platform.platform.storage import LocalStorage
    from ml_platform_tests.conftest import Platform
    from ml_platform_tests.test_backfill_range import materialize_range

    point, nth, contract_path, root, first, last = sys.argv[1:]
    nth = int(nth)
    seen = []

    def kill_at(count):
        seen.append(1)
        if len(seen) == count:
            os.kill(os.getpid(), signal.SIGKILL)

    if point == "after_write":
        write_with = LocalStorage.write_with

        def killing_write(self, key, write):
            size = write_with(self, key, write)
            if "/raw_data/" in key:
                kill_at(nth)
            return size

        LocalStorage.write_with = killing_write
    else:  # before the nth materialisation is stored
        handle_new_event = dg.DagsterInstance.handle_new_event

        def killing_store(self, event, *args, **kwargs):
            if event.dagster_event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
                kill_at(nth)
            return handle_new_event(self, event, *args, **kwargs)

        dg.DagsterInstance.handle_new_event = killing_store

    platform = Platform(load_contract(contract_path), __import__("pathlib").Path(root))
    platform.instance = dg.DagsterInstance.get()
    materialize_range(platform, first, last, ["raw_data"])
    """
)


def data_files(platform: Platform) -> set[str]:
    folder = platform.lake_dir / platform.contract.name / ASSET
    return {str(p.relative_to(platform.lake_dir)) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("point", "nth"),
    [
        ("after_write", 1),  # the first day's file stored, the other days not computed yet
        ("before_record", 1),  # every day's file stored, none recorded
        ("before_record", 2),  # the first day recorded, the second and third not
    ],
)
def test_a_run_worker_killed_between_storing_and_recording_leaves_no_file_once_rerun(
    tmp_path, monkeypatch, point, nth
):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("")
    contract = contract_with(tmp_path, "synthetic")
    platform = Platform(contract, tmp_path / "platform")
    platform.land(DAYS[0], len(DAYS))
    worker = subprocess.run(
        [sys.executable, "-c", WORKER, point, str(nth), str(tmp_path / "synthetic.yaml")]
        + [str(tmp_path / "platform"), DAYS[0], DAYS[-1]],
        env={**os.environ, "DAGSTER_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert worker.returncode == -9, worker.stderr[-3000:]

    monkeypatch.setenv("DAGSTER_HOME", str(home))
    platform.instance = dg.DagsterInstance.get()
    io_manager = platform.defs.resources["io_manager"]
    key = platform.key(ASSET)
    [run] = platform.instance.get_runs()
    assert run.status == dg.DagsterRunStatus.STARTED  # nobody told Dagster the worker died
    recorded = recorded_lake_keys(platform.instance, key, DAYS)
    left = data_files(platform)
    assert left - recorded, "the worker was killed after storing a file it had not recorded"
    # A reader sees exactly the versions Dagster records.
    visible = io_manager.stored_versions(platform.instance, key, DAYS, "parquet")
    assert set(visible.values()) == recorded
    assert len(recorded) == (1 if (point, nth) == ("before_record", 2) else 0)
    # The run may still be going as far as Dagster knows: its files may yet be recorded.
    assert io_manager.sweep(platform.instance, key, DAYS) == []

    # Run monitoring records a run whose worker died as failed; the sweep sensor is handed it.
    platform.instance.report_run_failed(run)
    failure = platform.instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE
    ).records[0]
    sweep = build_lake_sweep_sensors()[0]
    with dg.build_run_status_sensor_context(
        sensor_name=sweep.name,
        dagster_instance=platform.instance,
        dagster_run=platform.instance.get_run_by_id(run.run_id),
        dagster_event=failure.event_log_entry.dagster_event,
        resources={"io_manager": io_manager},
    ) as context:
        sweep(context.for_run_failure())
    assert data_files(platform) == recorded_lake_keys(platform.instance, key, DAYS)

    # The days are run again, and the rerun's versions are the ones recorded.
    result = materialize_range(platform, DAYS[0], DAYS[-1], [ASSET])

    assert result.success
    recorded = recorded_lake_keys(platform.instance, key, DAYS)
    assert data_files(platform) == recorded
    latest = io_manager.stored_versions(platform.instance, key, DAYS, "parquet")
    assert sorted(latest) == DAYS
    assert all(
        path.startswith(f"synthetic/raw_data/{day}/{result.run_id}-")
        for day, path in latest.items()
    )


def test_a_failed_step_deletes_what_it_stored(tmp_path):
    contract = contract_with(tmp_path, "synthetic")
    platform = Platform(contract, tmp_path / "platform")
    platform.land(DAYS[0], len(DAYS))
    for day in (DAYS[0], DAYS[2]):
        assert platform.materialize(day, selection=[ASSET]).success
    # The middle day's delivery was never recorded: validated_data computes the range's other
    # days, then fails naming it (a software failure: nothing says the data is bad).
    result = materialize_range(platform, DAYS[0], DAYS[-1], ["validated_data"])

    assert not result.success
    [failure] = result.get_step_failure_events()
    assert "1 of 3 days failed" in failure.event_specific_data.error.to_string()
    validated = platform.lake_dir / contract.name / "validated_data"
    assert not validated.exists() or not any(p.is_file() for p in validated.rglob("*"))
    assert recorded_lake_keys(platform.instance, platform.key("validated_data"), DAYS) == set()
