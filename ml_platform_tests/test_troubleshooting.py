"""Troubleshooting: a real failure of each class; diagnose, tags, JSON logs, health, reproduce.

All runs are real runs on a real instance in a temporary DAGSTER_HOME configured by the
repository's dagster.yaml (so the JSON log handler is the one users get). The data failure is
the platform's validated_data run for a synthetic day whose raw_data was never materialised
(a day the quality gate rejects is no failure: its run succeeds, and is recorded beside them);
the software failures come from small assets defined here over the real lake IO manager; the memory
exhaustion runs `dagster asset materialize` in a subprocess whose step caps its address space
with `resource.setrlimit`.
"""

import datetime as dt
import json
import math
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest

from ml_platform import cli
from ml_platform.automation.alerts import Notifier
from ml_platform.contracts import load_contract
from ml_platform.definitions import build_definitions
from ml_platform.ingestion.landing import LandingZone, land_days
from ml_platform.platform.failures import (
    CODE_BUG,
    CONFIGURATION,
    DATA,
    DEPENDENCY_MISMATCH,
    FAILURE_CLASS_TAG,
    RESOURCE_EXHAUSTION,
    RUNBOOK_ANCHORS,
    TRANSIENT_INFRASTRUCTURE,
    Classification,
    StepFailure,
    classify_failure,
)
from ml_platform.platform.formats import FORMAT_KEY
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.logs import LOG_FILE_NAME
from ml_platform.platform.run_events import classify_outcome, run_outcome
from ml_platform.platform.steps import each_day
from ml_platform.platform.storage import LocalStorage
from ml_platform.registry.monitoring import CHAMPION_PERFORMANCE, EPISODES_KEY, OPEN_EPISODES_KEY
from ml_platform.troubleshooting.reproduce import (
    InputsChangedError,
    NothingToReproduceError,
    not_reproduced_advice,
    reproduce,
    scaled_contract,
)
from ml_platform_tests.conftest import REPO, free_port
from ml_platform_tests.test_alerts import AlertSensors

pytestmark = pytest.mark.slow

DAY = "2024-01-03"
# The day the incidents' faulty delivery is landed for, which the quality gate rejects.
REJECTED_DAY = "2024-01-02"
DAILY = dg.DailyPartitionsDefinition(start_date="2024-01-01")
SECRET_VAR = "ML_PLATFORM_TEST_API_TOKEN"
SECRET = "tok-7f3a9c1e5b2d"
BIN = Path(sys.executable).parent


# Flights cancelled per day: none, unless a test has the upstream deliver a corrected day.
CANCELLED = {"rows": 0}


@dg.asset(partitions_def=DAILY, metadata={FORMAT_KEY: "parquet"})
def flights(context: dg.AssetExecutionContext) -> Iterator:
    """1000 flights of the day, none cancelled (unless CANCELLED says otherwise)."""

    def day_of_flights(day: str) -> Iterator:
        context.log.info("generated the day's flights", extra={"rows": 1000})
        cancelled = CANCELLED["rows"]
        frame = pd.DataFrame(
            {
                "delay": [float(i % 60) for i in range(1000)],
                "status": ["cancelled"] * cancelled + ["landed"] * (1000 - cancelled),
            }
        )
        yield dg.MaterializeResult(value=frame)

    yield from each_day(context, day_of_flights)


@dg.asset(partitions_def=DAILY, metadata={FORMAT_KEY: "json"})
def cancellation_delay(context: dg.AssetExecutionContext, flights: Any) -> dict:
    """Mean delay of the cancelled flights: divides by zero on a day without cancellations."""
    # A partitioned input is the lake's lazy DailyInput: the step reads its own day.
    day: pd.DataFrame = flights.for_day(context.partition_key)
    cancelled = day[day["status"] == "cancelled"]
    return {"mean_delay": sum(cancelled["delay"].tolist()) / len(cancelled)}


def delays_of_each_day(context: dg.AssetExecutionContext, flights: Any) -> Iterator:
    """cancellation_delay a day at a time, for each day of its step (of a range: several)."""

    def day_of_delays(day: str, flights: pd.DataFrame) -> Iterator:
        cancelled = flights[flights["status"] == "cancelled"]
        yield dg.MaterializeResult(
            value={"mean_delay": sum(cancelled["delay"].tolist()) / len(cancelled)}
        )

    yield from each_day(context, day_of_delays, flights=flights)


cancellation_delays = dg.asset(
    name="cancellation_delays", partitions_def=DAILY, metadata={FORMAT_KEY: "json"}
)(delays_of_each_day)


def delays_of_the_range(context: dg.AssetExecutionContext, flights: Any) -> Iterator:
    """Fails before it computes any day of its step (a range's error names no day)."""
    cancelled = sum(0 for _ in context.partition_keys)  # a look-ahead over the range's days
    share = 1 / cancelled
    yield from each_day(context, lambda day, flights: iter([share]), flights=flights)


@dg.asset(partitions_def=DAILY, metadata={FORMAT_KEY: "json"})
def plugin_scores(flights: Any) -> dict:
    """Scores from a plugin that is not installed in this environment."""
    import ml_platform_scoring_plugin  # type: ignore[import-not-found]  # noqa: F401

    return {}


@dg.asset(
    partitions_def=DAILY,
    metadata={FORMAT_KEY: "json"},
    retry_policy=dg.RetryPolicy(max_retries=2, delay=0.1),
)
def weather(context: dg.AssetExecutionContext, flights: Any) -> dict:
    """Weather from a service that refuses connections (nothing listens on its port)."""
    port = int(os.environ["TEST_WEATHER_PORT"])
    context.log.info(f"calling the weather service with token {os.environ[SECRET_VAR]}")
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        return {}


OOM_SCRIPT = '''
import resource
from pathlib import Path
from typing import Any

import dagster as dg


@dg.asset
def big_join() -> None:
    """Caps its own address space 256 MiB above what it uses, then allocates 1 GiB."""
    status = Path("/proc/self/status").read_text()
    used = int(next(l for l in status.splitlines() if l.startswith("VmSize:")).split()[1]) * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 1024**2, hard))
    bytearray(1024**3)


defs = dg.Definitions(assets=[big_join])
'''


def run_id_of(result: dg.ExecuteInProcessResult) -> str:
    assert not result.success
    return result.run_id


@pytest.fixture(scope="module")
def incidents(tmp_path_factory):
    """One failed run per class on one instance; the alert sensors tick over them."""
    root = tmp_path_factory.mktemp("incidents")
    home = root / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {
        "DAGSTER_HOME": str(home),
        "ML_PLATFORM_DATASET": "synthetic",
        "ML_PLATFORM_LANDING_DIR": str(root / "landing"),
        "ML_PLATFORM_LAKE_DIR": str(root / "lake"),
        "TEST_WEATHER_PORT": str(free_port()),
        SECRET_VAR: SECRET,
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        instance = dg.DagsterInstance.get()
        alerts = AlertSensors(instance, Notifier())  # alerting starts from now
        runs: dict[str, str] = {}

        contract = load_contract("synthetic")
        defs = build_definitions(contract)

        def platform_run(day: str, selection: list[str]) -> dg.ExecuteInProcessResult:
            return dg.materialize(
                list(defs.assets or []),
                partition_key=day,
                resources=defs.resources,
                instance=instance,
                selection=selection,
                raise_on_error=False,
            )

        # A data failure: validated_data of a day whose raw_data was never materialised.
        runs[DATA] = run_id_of(platform_run(DAY, ["synthetic/validated_data"]))
        # A delivery the quality gate rejects is a verdict of its day, not a failed run.
        zone = LandingZone(base_dir=env["ML_PLATFORM_LANDING_DIR"])
        list(land_days(contract, zone, [pd.Timestamp(REJECTED_DAY).date()], fault="out_of_range"))
        rejected = platform_run(REJECTED_DAY, ["synthetic/raw_data", "synthetic/validated_data"])
        assert rejected.success

        lake = LocalStorage(base_dir=env["ML_PLATFORM_LAKE_DIR"])
        resources = {"io_manager": LakeIOManager(storage=lake)}
        assets = [flights, cancellation_delay, plugin_scores, weather]
        upstream = dg.materialize(
            assets, selection=[flights], partition_key=DAY, resources=resources, instance=instance
        )
        assert upstream.success
        for failure_class, asset in [
            (CODE_BUG, cancellation_delay),
            (DEPENDENCY_MISMATCH, plugin_scores),
            (TRANSIENT_INFRASTRUCTURE, weather),
        ]:
            result = dg.materialize(
                assets,
                selection=[asset],
                partition_key=DAY,
                resources=resources,
                instance=instance,
                raise_on_error=False,
            )
            runs[failure_class] = run_id_of(result)

        script = root / "oom_definitions.py"
        script.write_text(textwrap.dedent(OOM_SCRIPT))
        before = {r.run_id for r in instance.get_runs()}
        materialized = subprocess.run(
            [str(BIN / "dagster"), "asset", "materialize", "-f", str(script), "--select", "*"],
            env={**os.environ},
            cwd=root,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert materialized.returncode != 0, materialized.stdout[-2000:]
        [oom_run] = [r.run_id for r in instance.get_runs() if r.run_id not in before]
        runs[RESOURCE_EXHAUSTION] = oom_run

        # Dagster hands a run-status sensor at most 5 runs a tick, as the daemon would.
        alerts.tick()
        alerts.tick()
        tags = {
            failure_class: instance.get_run_by_id(run_id).tags.get(FAILURE_CLASS_TAG)
            for failure_class, run_id in runs.items()
        }
        yield {
            "instance": instance,
            "runs": runs,
            "rejected_run": rejected.run_id,
            "tags": tags,
            "home": home,
            "lake": lake,
        }
        instance.dispose()  # close its SQLite connections before the home directory goes


EXPECTED = {
    DATA: (
        "synthetic__validated_data",
        [f"synthetic/raw_data partition {DAY} is not in storage", "materialise it first"],
    ),
    RESOURCE_EXHAUSTION: ("big_join", ["MemoryError"]),
    DEPENDENCY_MISMATCH: (
        "plugin_scores",
        ["ModuleNotFoundError: No module named 'ml_platform_scoring_plugin'"],
    ),
    TRANSIENT_INFRASTRUCTURE: ("weather", ["(after 3 attempts)", "ConnectionRefusedError"]),
    CODE_BUG: ("cancellation_delay", ["ZeroDivisionError"]),
}


@pytest.mark.parametrize("failure_class", sorted(EXPECTED))
def test_diagnose_names_the_failed_step_its_last_lines_and_class(incidents, failure_class, capsys):
    run_id = incidents["runs"][failure_class]
    step, words = EXPECTED[failure_class]

    assert cli.main(["diagnose", run_id]) == 0

    out = capsys.readouterr().out
    assert f"run {run_id}: FAILURE" in out
    assert f"failed step: {step}" in out
    for word in words:
        assert word in out, out
    before_failure = out.split("last log lines before the failure:\n", 1)[1]
    assert f"{step} STEP_FAILURE" in before_failure or "RUN_FAILURE" in before_failure
    assert f"failure class: {failure_class} (" in out
    assert f"runbook: docs/runbook.md#{RUNBOOK_ANCHORS[failure_class]}" in out


def test_the_failure_alerts_sensor_tags_every_failed_run_with_its_class(incidents):
    assert incidents["tags"] == {c: c for c in EXPECTED}
    # A rejected day is no failure: its run has no class.
    rejected = incidents["instance"].get_run_by_id(incidents["rejected_run"])
    assert FAILURE_CLASS_TAG not in rejected.tags


def test_diagnose_names_a_run_that_is_not_in_the_instance(incidents, capsys):
    assert cli.main(["diagnose", "0000-no-such-run"]) == 2
    err = capsys.readouterr().err
    assert "no run 0000-no-such-run in the Dagster instance at" in err


def test_diagnose_takes_the_short_run_id_that_materialize_prints(incidents, capsys):
    run_id = incidents["runs"][DATA]
    short = run_id[:8]  # what `ml-platform materialize` prints
    assert [r for r in incidents["instance"].get_run_ids() if r.startswith(short)] == [run_id]

    assert cli.main(["diagnose", short]) == 0

    out = capsys.readouterr().out
    assert f"run {run_id}: FAILURE" in out and "failed step: synthetic__validated_data" in out


@dg.asset
def probe() -> None:
    """Fails at once: a run to diagnose."""
    raise ValueError("probe failed on purpose")


def test_diagnose_refuses_an_ambiguous_or_unknown_run_id_prefix(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    job = dg.Definitions(assets=[probe], jobs=[dg.define_asset_job("probe_job")]).resolve_job_def(
        "probe_job"
    )
    # Two runs whose ids share their first 8 characters, as ids of a busy instance come to.
    ids = ["0badc0de-1111-4000-8000-000000000001", "0badc0de-2222-4000-8000-000000000002"]
    with dg.DagsterInstance.get() as instance:
        for run_id in ids:
            assert not job.execute_in_process(
                instance=instance, run_id=run_id, raise_on_error=False
            ).success

    assert cli.main(["diagnose", "0badc0de"]) == 2
    err = capsys.readouterr().err
    assert "run id prefix '0badc0de' matches 2 runs" in err
    assert all(run_id in err for run_id in ids) and "give more characters" in err

    assert cli.main(["diagnose", "0badc0de-2"]) == 0
    out = capsys.readouterr().out
    assert f"run {ids[1]}: FAILURE" in out and "ValueError: probe failed on purpose" in out

    assert cli.main(["diagnose", "0badc0de-3"]) == 2
    assert f"no run 0badc0de-3 in the Dagster instance at {tmp_path}" in capsys.readouterr().err


def test_diagnose_of_a_run_whose_event_log_is_gone_says_so_and_classes_nothing(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with dg.DagsterInstance.get() as instance:
        run_id = dg.materialize([probe], instance=instance, raise_on_error=False).run_id
    # Its events, as a clean-up of the instance's disk removes them; the run's record stays.
    (tmp_path / "history" / "runs" / f"{run_id}.db").unlink()

    assert cli.main(["diagnose", run_id]) == 2
    err = capsys.readouterr().err
    assert f"run {run_id} is recorded FAILURE, but the instance holds none of its events" in err
    assert "Rerun it (the UI's Materialize of its assets) and diagnose the new run" in err
    with dg.DagsterInstance.get() as instance:
        assert FAILURE_CLASS_TAG not in instance.get_run_by_id(run_id).tags
    assert cli.main(["reproduce", run_id, "--dataset", "synthetic"]) == 2
    assert "holds none of its events" in capsys.readouterr().err


# Lets the run of the diagnose test end once the test has diagnosed it while it ran.
RELEASE = threading.Event()


# Priority: the in-process executor runs it first, so the run has failed a step while the step
# below still waits.
@dg.asset(op_tags={"dagster/priority": "1"})
def fails_first() -> None:
    """Fails at once, while the run goes on."""
    raise ZeroDivisionError("division by zero")


@dg.asset
def waits_for_the_test() -> None:
    """Keeps its run going until the test releases it."""
    RELEASE.wait(60)


def test_diagnose_a_run_still_going_or_canceled_with_a_failed_step(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    RELEASE.clear()
    with dg.DagsterInstance.get() as instance:
        run = threading.Thread(
            target=dg.materialize,
            args=([fails_first, waits_for_the_test],),
            kwargs={"instance": instance, "raise_on_error": False},
        )
        run.start()
        try:
            deadline = time.monotonic() + 60
            while (
                not instance.get_runs()
                or not instance.get_records_for_run(
                    instance.get_runs()[0].run_id, of_type=dg.DagsterEventType.STEP_FAILURE
                ).records
            ):
                assert time.monotonic() < deadline, "the step never failed"
                time.sleep(0.05)
            [going] = instance.get_runs()

            # What the command prints; its exit code for a run not ended is the CLI's choice.
            cli.main(["diagnose", going.run_id])

            out = capsys.readouterr().out
            assert f"run {going.run_id}: STARTED" in out
            assert "the run is still running (STARTED): 1 step(s) failed so far" in out
            assert "failed step: fails_first" in out and "ZeroDivisionError" in out
            assert f"failure class: {CODE_BUG} (" in out
            assert "did not fail" not in out
            # A run still going is no failed run (yet): the failure alerts sensor tags it once
            # it has ended.
            tags = instance.get_run_by_id(going.run_id).tags
            assert FAILURE_CLASS_TAG not in tags

            # Asked to stop as the UI's Terminate asks (the default run launcher's request).
            instance.report_run_canceling(going)
        finally:
            RELEASE.set()
            run.join()
        assert instance.get_run_by_id(going.run_id).status == dg.DagsterRunStatus.CANCELED

        cli.main(["diagnose", going.run_id[:8]])

    out = capsys.readouterr().out
    assert f"run {going.run_id}: CANCELED" in out
    assert "the run was canceled: 1 step(s) failed before it ended" in out
    assert "  cancel requested: Sending run termination request." in out
    assert "failed step: fails_first" in out and f"failure class: {CODE_BUG} (" in out
    assert "did not fail" not in out


def test_every_line_of_the_json_log_is_json_with_run_step_and_partition(incidents):
    path = Path(incidents["home"]) / "logs" / LOG_FILE_NAME
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # fails on any line that is not JSON
    fields = {"timestamp", "level", "component", "run_id", "partition", "message"}
    for record in records:
        assert fields <= record.keys(), record
    run_id = incidents["runs"][DATA]
    ours = [r for r in records if r["run_id"] == run_id]
    assert {r["partition"] for r in ours} == {DAY}
    assert "synthetic__validated_data" in {r["component"] for r in ours}
    [failure] = [r for r in ours if r["event"] == "STEP_FAILURE"]
    assert failure["level"] == "ERROR" and failure["component"] == "synthetic__validated_data"
    assert failure["error"].startswith("Failure: synthetic__validated_data: 1 of 1 days failed")
    assert f"synthetic/raw_data partition {DAY} is not in storage" in failure["error"]
    # A rejected day is a warning line of its run, with its partition, and no failure.
    rejected = [r for r in records if r["run_id"] == incidents["rejected_run"]]
    assert {r["partition"] for r in rejected} == {REJECTED_DAY}
    components = {r["component"] for r in rejected}
    assert {"synthetic__raw_data", "synthetic__validated_data"} <= components
    assert not [r for r in rejected if r["event"] == "STEP_FAILURE"]
    [verdict] = [r for r in rejected if r["level"] == "WARNING" and "quality gate" in r["message"]]
    assert verdict["component"] == "synthetic__validated_data"
    assert verdict["message"].startswith(
        f"synthetic__validated_data {REJECTED_DAY}: failed quality gate: "
    )
    assert "gx_validity" in verdict["message"]
    [check] = [r for r in rejected if "'delivery_accepted'" in r["message"]]
    assert check["event"] == "ASSET_CHECK_EVALUATION" and "did not pass" in check["message"]
    extra = [r for r in records if r["message"] == "generated the day's flights"]
    assert extra and extra[0]["rows"] == 1000  # extra= fields become JSON fields
    weather_lines = [r for r in records if r["message"].startswith("calling the weather")]
    assert len(weather_lines) == 3  # one per attempt
    assert SECRET not in path.read_text()
    assert weather_lines[0]["message"] == "calling the weather service with token ***"


def test_asset_steps_record_time_cpu_memory_rows_and_bytes(incidents):
    instance = incidents["instance"]
    [raw] = instance.fetch_materializations(dg.AssetKey(["synthetic", "raw_data"]), limit=1).records
    metadata = {k: v.value for k, v in raw.asset_materialization.metadata.items()}
    for key in ["step_wall_seconds", "step_cpu_seconds", "step_cpu_utilisation"]:
        assert isinstance(metadata[key], float) and metadata[key] >= 0, key
    assert 50 < metadata["step_peak_rss_mb"] < 4096
    assert metadata["rows_out"] == metadata["dagster/row_count"] > 0
    assert metadata["bytes_read"] == metadata["source_bytes"]
    [day] = instance.fetch_materializations(dg.AssetKey("flights"), limit=1).records
    metadata = {k: v.value for k, v in day.asset_materialization.metadata.items()}
    assert metadata["rows_out"] == 1000 and metadata["stored_bytes"] > 0


def test_health_summarises_rates_durations_checks_and_memory(incidents, capsys):
    assert cli.main(["health", "--days", "1"]) == 0
    out = capsys.readouterr().out
    assert "last 1 day(s): 7 run(s)" in out
    # dg.materialize runs: flights and the rejected day's run succeeded, four failed; the CLI's
    # run (memory) failed.
    assert "  __ephemeral_asset_job__: 33% of 6" in out
    assert "  __ASSET_JOB: 0% of 1" in out
    assert "  weather: 0% of 1, p50 -, p95 -, 2 retries" in out
    assert "  synthetic__raw_data: 100% of 1, p50 " in out
    # A rejected day is a step that succeeded: its verdict shows in its checks.
    assert "  synthetic__validated_data: 50% of 2, p50 " in out
    assert "  synthetic/validated_data:gx_validity: 0% of 1" in out
    assert "  synthetic/validated_data:delivery_accepted: 0% of 1" in out
    assert "  synthetic/validated_data:gx_volume: 100% of 1" in out
    [flights_line] = [line for line in out.splitlines() if line.startswith("  flights: peak")]
    peak = float(flights_line.split("peak ")[1].split(" MiB")[0])
    request = int(flights_line.split("request ")[1].split(" MiB")[0])
    assert request % 64 == 0 and request >= peak * 1.25


def test_health_lists_the_drift_episodes_of_the_latest_day_that_records_them(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    open_two = {
        "verdict": "accepted",
        "accepted": True,
        OPEN_EPISODES_KEY: 2,
        EPISODES_KEY: "dep_delay since 2024-01-03\narr_delay since 2024-01-04",
    }
    # What each_day records of a day whose features were rejected: no monitoring, no episodes.
    tombstone = {"verdict": "no_accepted_input", "accepted": False, "accepted_rows": 0}
    # A day recorded again as it was (its inputs kept their accepted version).
    unchanged = {"verdict": "unchanged", "accepted": True, "accepted_rows": 10}
    recorded = {
        "flights": [("2024-01-05", open_two), ("2024-01-06", tombstone)],
        "trains": [("2024-01-06", open_two), ("2024-01-06", unchanged)],
        "buses": [("2024-01-06", tombstone)],
    }
    with dg.DagsterInstance.get() as instance:
        for dataset, days in recorded.items():
            for day, metadata in days:
                instance.report_runless_asset_event(
                    dg.AssetMaterialization(
                        asset_key=dg.AssetKey([dataset, CHAMPION_PERFORMANCE]),
                        partition=day,
                        metadata=metadata,
                    )
                )

    assert cli.main(["health", "--days", "1"]) == 0

    out = capsys.readouterr().out
    episodes = "    dep_delay since 2024-01-03\n    arr_delay since 2024-01-04"
    assert f"  flights (2024-01-05): 2\n{episodes}" in out
    assert f"  trains (2024-01-06): 2\n{episodes}" in out
    # No record says which episodes are open: that is not "none open".
    assert "  buses (2024-01-06): unknown (" in out
    assert ": none" not in out


def test_reproduce_raises_the_same_exception_on_a_100_row_sample(incidents, tmp_path, caplog):
    instance = incidents["instance"]
    defs = dg.Definitions(
        assets=[flights, cancellation_delay],
        resources={
            "lake": incidents["lake"],
            "io_manager": LakeIOManager(storage=incidents["lake"]),
        },
    )
    caplog.set_level("INFO", logger="ml_platform.troubleshooting.reproduce")
    lake_dir = Path(incidents["lake"].base_dir)
    stored = sorted(lake_dir.rglob("*"))
    with pytest.raises(ZeroDivisionError) as raised:
        reproduce(instance, incidents["runs"][CODE_BUG], defs, tmp_path, sample_rows=100)
    # The traceback ends in the asset's own code: a debugger stops on the failing line.
    assert raised.traceback[-1].name == "cancellation_delay"
    assert "input flights (flights): 100 of 1000 rows" in caplog.text
    assert f"cancellation_delay partition {DAY} on 100 rows" in caplog.text
    assert sorted(lake_dir.rglob("*")) == stored  # the rerun wrote nothing to the real lake


def test_reproduce_command_reruns_a_failed_data_step_without_touching_the_lake(incidents, capsys):
    lake_dir = Path(incidents["lake"].base_dir)
    stored = sorted(lake_dir.rglob("*"))
    # The same environment as the run: the platform's definitions of the synthetic dataset.
    # raw_data of the day is still not stored, so the rerun fails as the run did.
    with pytest.raises(dg.Failure, match=f"synthetic/raw_data partition {DAY} is not in storage"):
        cli.main(["reproduce", incidents["runs"][DATA][:8], "--sample", "200"])
    err = capsys.readouterr().err
    assert f"reproducing run {incidents['runs'][DATA]}" in err
    assert f"synthetic/validated_data partition {DAY}" in err
    # validated_data writes its GE result and data docs beside the lake; nothing went there.
    assert sorted(lake_dir.rglob("*")) == stored


def test_reproduce_runs_the_step_once_and_raises_its_error_not_the_retries(incidents, tmp_path):
    defs = dg.Definitions(
        assets=[flights, weather],
        resources={
            "lake": incidents["lake"],
            "io_manager": LakeIOManager(storage=incidents["lake"]),
        },
    )
    # The run retried twice; a rerun with its retry policy would end in Dagster's
    # DagsterMaxRetriesExceededError after the backoff, not in the step's own error.
    with pytest.raises(ConnectionRefusedError) as raised:
        reproduce(
            incidents["instance"], incidents["runs"][TRANSIENT_INFRASTRUCTURE], defs, tmp_path
        )
    assert raised.traceback[-1].name in {"weather", "create_connection"}


@pytest.mark.parametrize("debugger", [False, True], ids=["traceback", "pdb"])
def test_reproduce_command_hands_an_assets_own_key_error_to_the_user(
    incidents, monkeypatch, debugger
):
    # A missing column is a KeyError, a LookupError like an unknown run id: the command must
    # not mistake the step's own error for "no such run" and print it as one line.
    def missing_column(*args, **kwargs):
        return pd.DataFrame({"dep_time": [1]})["dep_delay"]

    debugged = []
    monkeypatch.setattr("ml_platform.troubleshooting.reproduce.reproduce", missing_column)
    monkeypatch.setattr("pdb.post_mortem", lambda tb: debugged.append(tb.tb_frame))
    command = ["reproduce", incidents["runs"][CODE_BUG][:8], *(["--pdb"] if debugger else [])]
    if debugger:
        assert cli.main(command) == 1
        assert len(debugged) == 1
    else:
        with pytest.raises(KeyError, match="dep_delay"):
            cli.main(command)
        assert debugged == []


def test_reproduce_of_a_run_that_rejected_a_day_says_it_has_no_failed_step(incidents, capsys):
    # A rejected delivery is an outcome, not a failure: there is nothing to rerun on a sample.
    run_id = incidents["rejected_run"]

    assert cli.main(["reproduce", run_id[:8]]) == 2

    err = capsys.readouterr().err
    assert f"error: run {run_id} is SUCCESS and has no failed step to reproduce" in err


def test_a_sample_is_judged_with_volume_expectations_scaled_to_it():
    contract = load_contract("synthetic")
    bounds = contract.quality.row_count

    scaled, note = scaled_contract(contract, 0.2)

    assert scaled.quality.row_count.min == math.floor(bounds.min * 0.2)
    assert bounds.max is not None and scaled.quality.row_count.max == math.ceil(bounds.max * 0.2)
    assert "volume expectations scaled to the sample (20.0% of the rows)" in note
    # The history gate's whole-day counts are left out; its other statistics stay.
    history = scaled.quality.history.statistics
    assert not {"row_count", "distinct_count"} & set(history)
    assert set(history) == set(contract.quality.history.statistics) - {
        "row_count",
        "distinct_count",
    }


def test_reproduce_after_the_lake_moved_on_uses_what_the_run_read_or_refuses(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    lake = LocalStorage(base_dir=str(tmp_path / "lake"))
    resources = {"lake": lake, "io_manager": LakeIOManager(storage=lake)}
    defs = dg.Definitions(assets=[flights, cancellation_delay], resources=resources)
    later = "2024-01-04"

    def run(asset: dg.AssetsDefinition, day: str) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            [flights, cancellation_delay],
            selection=[asset],
            partition_key=day,
            resources=resources,
            instance=instance,
            raise_on_error=False,
        )

    with dg.DagsterInstance.get() as instance:
        assert run(flights, DAY).success
        failed = run_id_of(run(cancellation_delay, DAY))
        # The lake moves on: more days land and fail, the failed day's input stays as it was.
        assert run(flights, later).success
        assert not run(cancellation_delay, later).success

        with pytest.raises(ZeroDivisionError):
            reproduce(instance, failed, defs, tmp_path / "scratch1")

        # A corrected delivery of the day is rerun and succeeds: the data the run failed on is
        # gone, and a rerun on today's flights would succeed and prove nothing.
        monkeypatch.setitem(CANCELLED, "rows", 10)
        assert run(flights, DAY).success and run(cancellation_delay, DAY).success
        with pytest.raises(InputsChangedError) as refused:
            reproduce(instance, failed, defs, tmp_path / "scratch2")

    message = str(refused.value)
    assert (
        f"cannot reproduce run {failed}: flights partition {DAY} changed since the run read it"
        in message
    )
    assert "materialised by run" in message and "would say nothing about that failure" in message
    assert f"ml-platform materialize --start {DAY} --force" in message


# The tags of a backfill's run of several days (a backfill policy's multi-day run).
RANGE_TAGS = {
    "dagster/asset_partition_range_start": "2024-01-01",
    "dagster/asset_partition_range_end": "2024-01-03",
}


def lake_defs(root: Path, assets: list[dg.AssetsDefinition]) -> dg.Definitions:
    """The assets over a lake under `root`, with the resources reproduce needs."""
    lake = LocalStorage(base_dir=str(root / "lake"))
    return dg.Definitions(
        assets=assets, resources={"lake": lake, "io_manager": LakeIOManager(storage=lake)}
    )


def run_of(
    defs: dg.Definitions, instance: dg.DagsterInstance, asset: dg.AssetsDefinition, **kwargs: Any
) -> dg.ExecuteInProcessResult:
    """A run of `asset` (a day: partition_key=, or a range: tags=RANGE_TAGS)."""
    return dg.materialize(
        list(defs.assets or []),
        selection=[asset],
        resources=defs.resources,
        instance=instance,
        raise_on_error=False,
        **kwargs,
    )


def test_reproduce_of_a_range_run_reruns_its_first_failed_day_on_that_days_inputs(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    caplog.set_level("INFO", logger="ml_platform.troubleshooting.reproduce")
    defs = lake_defs(tmp_path, [flights, cancellation_delays])
    with dg.DagsterInstance.get() as instance:
        monkeypatch.setitem(CANCELLED, "rows", 10)
        assert run_of(defs, instance, flights, partition_key="2024-01-01").success
        # The range's first day computes; its other days' flights were never stored, each a
        # failed day that each_day names in its failure.
        failed = run_id_of(run_of(defs, instance, cancellation_delays, tags=RANGE_TAGS))

        with pytest.raises(dg.Failure, match="flights partition 2024-01-02 is not in storage"):
            reproduce(instance, failed, defs, tmp_path / "scratch1")
        assert "reproducing 2024-01-02, the first (the others that failed: 2024-01-03)" in (
            caplog.text
        )
        assert "cancellation_delays partition 2024-01-02 on 100 rows" in caplog.text

        # The inputs are checked for that day: its flights are stored since.
        assert run_of(defs, instance, flights, partition_key="2024-01-02").success
        with pytest.raises(InputsChangedError) as refused:
            reproduce(instance, failed, defs, tmp_path / "scratch2")
    assert (
        f"cannot reproduce run {failed}: flights partition 2024-01-02 was not stored when the "
        "run read it; it is now" in str(refused.value)
    )
    assert "ml-platform materialize --start 2024-01-02 --force" in str(refused.value)


def test_reproduce_of_a_range_run_raises_its_first_failed_days_own_error(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    caplog.set_level("INFO", logger="ml_platform.troubleshooting.reproduce")
    defs = lake_defs(tmp_path, [flights, cancellation_delays])
    with dg.DagsterInstance.get() as instance:
        assert run_of(defs, instance, flights, tags=RANGE_TAGS).success
        # No day has a cancelled flight: each divides by zero, and the step names every day.
        result = run_of(defs, instance, cancellation_delays, tags=RANGE_TAGS)
        message = result.get_step_failure_events()[0].event_specific_data.error.to_string()
        assert "3 of 3 days failed" in message and "2024-01-03: ZeroDivisionError" in message

        # The day's own error, as the asset raised it: not the step's account of its days.
        with pytest.raises(ZeroDivisionError) as raised:
            reproduce(instance, run_id_of(result), defs, tmp_path / "scratch")
    assert raised.traceback[-1].name == "day_of_delays"
    assert "reproducing 2024-01-01, the first (the others that failed: 2024-01-02, 2024-01-03)" in (
        caplog.text
    )


def test_reproduce_of_a_range_run_whose_failure_names_no_day(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    caplog.set_level("INFO", logger="ml_platform.troubleshooting.reproduce")
    range_delays = dg.asset(
        name="cancellation_delays", partitions_def=DAILY, metadata={FORMAT_KEY: "json"}
    )(delays_of_the_range)
    defs = lake_defs(tmp_path, [flights, range_delays])
    with dg.DagsterInstance.get() as instance:
        assert run_of(defs, instance, flights, tags=RANGE_TAGS).success
        failed = run_id_of(run_of(defs, instance, range_delays, tags=RANGE_TAGS))

        with pytest.raises(ZeroDivisionError):
            reproduce(instance, failed, defs, tmp_path / "scratch1")
        assert "names no day" in caplog.text
        assert "reproducing 2024-01-01, the range's first, where the step began" in caplog.text
        assert "one of 2024-01-02, 2024-01-03 did" in caplog.text

        # The dataset's first day moved since: the range is no days of the asset any more.
        moved = dg.asset(
            name="cancellation_delays",
            partitions_def=dg.DailyPartitionsDefinition(start_date="2024-02-01"),
            metadata={FORMAT_KEY: "json"},
        )(delays_of_the_range)
        with pytest.raises(NothingToReproduceError) as refused:
            reproduce(instance, failed, lake_defs(tmp_path, [flights, moved]), tmp_path / "s2")
    message = str(refused.value)
    assert "for the partition range 2024-01-01...2024-01-03" in message
    assert "ml-platform materialize --start 2024-01-01 --days 3 --force" in message


def test_reproduce_command_on_a_failed_data_step_after_the_lake_moved_on(
    tmp_path, monkeypatch, capsys
):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("")
    env = {
        "DAGSTER_HOME": str(home),
        "ML_PLATFORM_DATASET": "synthetic",
        "ML_PLATFORM_LANDING_DIR": str(tmp_path / "landing"),
        "ML_PLATFORM_LAKE_DIR": str(tmp_path / "lake"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    contract = load_contract("synthetic")
    defs = build_definitions(contract)
    zone = LandingZone(base_dir=env["ML_PLATFORM_LANDING_DIR"])
    day, later = dt.date(2024, 1, 2), dt.date(2024, 1, 3)
    list(land_days(contract, zone, [day, later]))
    with dg.DagsterInstance.get() as instance:

        def run(day: dt.date, selection: list[str]) -> dg.ExecuteInProcessResult:
            return dg.materialize(
                list(defs.assets or []),
                selection=selection,
                partition_key=day.isoformat(),
                resources=defs.resources,
                instance=instance,
                raise_on_error=False,
            )

        # validated_data of a day whose raw_data was never materialised: a data failure.
        failed = run_id_of(run(day, ["synthetic/validated_data"]))
        # The lake moves on.
        assert run(later, ["synthetic/raw_data", "synthetic/validated_data"]).success

    # The day's raw_data is still not stored: the run's own error, and a quiet terminal.
    command = [str(BIN / "ml-platform"), "reproduce", failed[:8]]
    result = subprocess.run(
        command, env={**os.environ}, capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 1, result.stderr[-3000:]
    # The traceback names the day's own exception, as the step met it (not the step's account
    # of its failed days).
    assert re.search(
        r"\bMissingPartitionError: synthetic/raw_data partition 2024-01-02 is not in storage",
        result.stderr,
    ), result.stderr[-3000:]
    reproducing = f"reproducing run {failed}: synthetic/validated_data partition 2024-01-02"
    assert reproducing in result.stderr
    for noise in ("alembic", "SQLiteImpl", " - dagster - ", "INFO"):
        assert noise not in result.stderr, noise

    # The day's raw_data is materialised since: the absence the run failed on is gone.
    with dg.DagsterInstance.get() as instance:
        assert run(day, ["synthetic/raw_data"]).success
    assert cli.main(["reproduce", failed]) == 2
    err = capsys.readouterr().err
    assert f"error: cannot reproduce run {failed}: synthetic/raw_data partition 2024-01-02 " in err
    assert "was not stored when the run read it; it is now (materialised by run " in err


def test_a_resource_failure_not_reproduced_on_a_sample_says_what_to_change():
    memory = Classification(RESOURCE_EXHAUSTION, "big_join raised MemoryError: ")
    disk = Classification(
        RESOURCE_EXHAUSTION, "model raised OSError: [Errno 28] No space left on device"
    )
    bug = Classification(CODE_BUG, "features raised KeyError: 'x1'")

    assert "ran out of memory" in not_reproduced_advice(memory, 100)
    assert "Give the step more memory" in not_reproduced_advice(memory, 100)
    assert "ran out of disk" in not_reproduced_advice(disk, 100)
    assert "Free space" in not_reproduced_advice(disk, 100)
    for advice in (not_reproduced_advice(memory, 100), not_reproduced_advice(disk, 100)):
        assert "--sample" not in advice
    assert not_reproduced_advice(bug, 100).startswith("try a larger --sample")


def test_json_lines_redact_escaped_secrets_and_url_passwords(monkeypatch):
    import logging

    from ml_platform.platform.logs import JsonFormatter

    monkeypatch.setenv("ML_PLATFORM_SMTP_PASSWORD", 'pa"ss\\word99')
    monkeypatch.setenv("ML_PLATFORM_SMTP_PORT", "587")  # not a secret: never redacted
    record = logging.makeLogRecord(
        {
            "name": "ml_platform.test",
            "levelname": "INFO",
            # Assembled here so that the repository's secret scan does not flag this file.
            "msg": 'login pa"ss\\word99 to postgresql://etl:' + "hunter22@db:587/runs",
        }
    )
    line = JsonFormatter().format(record)
    assert json.loads(line)["message"] == "login *** to postgresql://etl:***@db:587/runs"


def test_missing_window_days_and_unstored_partitions_are_data_failures():
    # A window's missing days, as runs recorded before windows below coverage became verdicts
    # failed on them: classed by its type whatever its message says.
    coverage = StepFailure(
        "model",
        "WindowCoverageError",
        "model 2024-01-05 was not trained: only 2 of the 4 days ... Connection refused",
        user_failure=True,
    )
    # An input's partition that was never stored, raised while loading it and retried.
    unstored = StepFailure(
        "evaluation_report",
        "MissingPartitionError",
        "model partition 2024-01-05 is not in storage: materialise it first.",
        user_failure=False,
        chain=("MissingPartitionError: model partition 2024-01-05 is not in storage",),
        attempts=4,
    )

    for failure in (coverage, unstored):
        verdict = classify_failure([failure], [])
        assert verdict.failure_class == DATA, verdict.reason
        assert failure.error_class in verdict.reason


def test_reproduce_of_a_failed_data_step_refuses_once_its_input_was_materialised_again(
    tmp_path, monkeypatch
):
    # reproduce checks that each input partition is the one the run read: here raw_data, whose
    # file the lake lost after it was recorded accepted (validated_data then fails to read it).
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    contract = load_contract("synthetic")
    root = tmp_path / "platform"
    defs = build_definitions(
        contract, landing_dir=str(root / "landing"), lake_dir=str(root / "lake")
    )
    zone = LandingZone(base_dir=str(root / "landing"))

    def run(selection: list[str]) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            list(defs.assets or []),
            selection=selection,
            partition_key=DAY,
            resources=defs.resources,
            instance=instance,
            raise_on_error=False,
        )

    with dg.DagsterInstance.get() as instance:
        list(land_days(contract, zone, [dt.date.fromisoformat(DAY)]))
        assert run(["synthetic/raw_data"]).success
        for stored in (root / "lake" / "synthetic" / "raw_data" / DAY).glob("*.parquet"):
            stored.unlink()
        failed = run_id_of(run(["synthetic/validated_data"]))
        with pytest.raises(dg.Failure, match=f"synthetic/raw_data partition {DAY} is not in"):
            reproduce(instance, failed, defs, tmp_path / "scratch1", contract=contract)

        # raw_data runs again and stores the day: the state the run failed on is gone.
        assert run(["synthetic/raw_data"]).success
        with pytest.raises(InputsChangedError, match=f"raw_data partition {DAY} changed"):
            reproduce(instance, failed, defs, tmp_path / "scratch2", contract=contract)


RANGE = ["2024-01-01", "2024-01-02", "2024-01-03"]


def range_run(platform: Any, assets: list[str]) -> dg.ExecuteInProcessResult:
    """One run of `assets` over the days of RANGE, as a backfill's range runs them."""
    return dg.materialize(
        [*(platform.defs.assets or []), *(platform.defs.asset_checks or [])],
        resources=platform.defs.resources,
        instance=platform.instance,
        selection=[platform.key(asset) for asset in assets],
        tags={
            "dagster/asset_partition_range_start": RANGE[0],
            "dagster/asset_partition_range_end": RANGE[-1],
        },
        raise_on_error=False,
    )


def land_with_a_rejected_second_day(platform: Any) -> None:
    """RANGE's deliveries, the second out of range: its quality gate rejects it."""
    zone = LandingZone(base_dir=str(platform.landing_dir))
    dates = [dt.date.fromisoformat(day) for day in RANGE]
    list(land_days(platform.contract, zone, dates, fault="out_of_range", fault_days={dates[1]}))


def features_failing_on(day: str, fail: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Have the features of `day` call `fail()` before they are built (the other days' are)."""
    import ml_platform.features.assets as feature_assets

    real = feature_assets.build_features

    def build_features(frame: pd.DataFrame, contract: Any) -> Any:
        if str(frame["event_time"].iloc[0])[:10] == day:
            fail()
        return real(frame, contract)

    monkeypatch.setattr(feature_assets, "build_features", build_features)


def test_a_rejected_day_does_not_hide_the_class_of_a_step_that_ran_out_of_memory(
    platform_for, monkeypatch
):
    platform = platform_for("synthetic")
    land_with_a_rejected_second_day(platform)

    def out_of_memory() -> None:
        raise MemoryError()

    features_failing_on(RANGE[2], out_of_memory, monkeypatch)

    result = range_run(platform, ["raw_data", "validated_data", "features"])

    outcome = run_outcome(platform.instance, result.run_id, result.success)
    assert outcome is not None and not outcome.succeeded
    # The rejected day failed its ERROR checks, and the run went on to the third day.
    rejected = {(c.check, c.partition) for c in outcome.failed_checks if c.severity == "ERROR"}
    assert ("delivery_accepted", RANGE[1]) in rejected
    [failure] = outcome.step_failures
    assert failure.step == "synthetic__features"
    verdict = classify_outcome(outcome)
    assert verdict.failure_class == RESOURCE_EXHAUSTION, verdict.reason
    assert "MemoryError" in verdict.reason
    assert verdict.steps == ("synthetic__features",)


def test_pyarrow_out_of_memory_is_resource_exhaustion_not_a_code_bug(platform_for, monkeypatch):
    import pyarrow as pa

    platform = platform_for("synthetic")
    platform.land(RANGE[0], len(RANGE))
    # A real failed allocation: what to_parquet or read_parquet raise on a day too big for the
    # worker (pyarrow's ArrowMemoryError, a MemoryError).
    features_failing_on(RANGE[2], lambda: pa.allocate_buffer(1 << 50), monkeypatch)

    result = range_run(platform, ["raw_data", "validated_data", "features"])

    outcome = run_outcome(platform.instance, result.run_id, result.success)
    assert outcome is not None and not outcome.succeeded
    [failure] = outcome.step_failures
    assert any(link.startswith("ArrowMemoryError: malloc of size") for link in failure.chain)
    verdict = classify_outcome(outcome)
    assert verdict.failure_class == RESOURCE_EXHAUSTION, verdict.reason
    assert "malloc of size" in verdict.reason


@pytest.mark.parametrize(
    ("error_class", "message"),
    [
        # pyarrow's error, a MemoryError subclass, known by its name alone in the event log.
        ("ArrowMemoryError", "out of buffers"),
        # Its messages, wherever a wrapper repeats them.
        ("Failure", "features: 1 of 3 days failed. 2024-01-03: malloc of size 4096 failed"),
        ("RuntimeError", "realloc of size 1125899906842624 failed"),
        # The kernel refusing an allocation (ENOMEM).
        ("OSError", "[Errno 12] Cannot allocate memory"),
    ],
)
def test_a_failed_allocation_is_resource_exhaustion(error_class, message):
    failure = StepFailure("synthetic__features", error_class, message, user_failure=False)

    verdict = classify_failure([failure], [])

    assert verdict.failure_class == RESOURCE_EXHAUSTION, verdict.reason


def test_an_unmaterialised_upstream_day_is_named_in_the_failure_class_reason(platform_for):
    platform = platform_for("synthetic")
    platform.land(DAY, 1)

    # validated_data of the day was never materialised.
    result = platform.materialize(DAY, selection=["features"])

    outcome = run_outcome(platform.instance, result.run_id, result.success)
    assert outcome is not None
    [failure] = outcome.step_failures
    assert failure.user_failure  # the step reports the day's error inside its own dg.Failure
    verdict = classify_outcome(outcome)
    assert verdict.failure_class == DATA
    assert verdict.reason.startswith("synthetic__features raised MissingPartitionError: ")
    assert f"synthetic/validated_data partition {DAY} is not in storage" in verdict.reason
    assert "materialise it first" in verdict.reason


def test_a_deliberate_stop_is_named_with_its_message():
    stop = StepFailure("raw_data", "Failure", "schema mismatch: column x missing", True)

    verdict = classify_failure([stop], [])

    assert verdict.failure_class == DATA
    assert verdict.reason == (
        "raw_data stopped on a failed gate (dg.Failure): schema mismatch: column x missing"
    )


def test_a_step_whose_retries_ran_out_is_classed_and_logged_by_its_own_error(incidents):
    instance = incidents["instance"]
    run_id = incidents["runs"][TRANSIENT_INFRASTRUCTURE]

    outcome = run_outcome(instance, run_id, succeeded=False)

    assert outcome is not None
    [failure] = outcome.step_failures
    assert failure.attempts == 3
    # Not Dagster's "RetryRequestedFromPolicy: Exceeded max_retries of 2" around it.
    assert failure.error_class == "ConnectionRefusedError"
    assert failure.chain[0].startswith("ConnectionRefusedError: ")
    verdict = classify_outcome(outcome)
    assert verdict.reason.startswith("weather raised ConnectionRefusedError: ")
    assert verdict.reason.endswith("after 3 attempts")
    assert "RetryRequestedFromPolicy" not in verdict.reason
    lines = (Path(incidents["home"]) / "logs" / LOG_FILE_NAME).read_text().splitlines()
    [logged] = [
        r for r in map(json.loads, lines) if r["run_id"] == run_id and r["event"] == "STEP_FAILURE"
    ]
    assert logged["error"].startswith("ConnectionRefusedError: ")


def test_json_lines_of_a_range_run_carry_each_days_partition_or_the_range(
    platform_for, tmp_path, monkeypatch
):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    platform = platform_for("synthetic")
    land_with_a_rejected_second_day(platform)
    # The repository's instance, whose JSON log handler is the one users get.
    platform.instance = dg.DagsterInstance.get()
    try:
        result = range_run(platform, ["raw_data", "validated_data"])
    finally:
        platform.instance.dispose()

    lines = (home / "logs" / LOG_FILE_NAME).read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r["run_id"] == result.run_id]
    assert records
    by_event: dict[str, set[str | None]] = {}
    for record in records:
        by_event.setdefault(record["event"], set()).add(record["partition"])
    # Each day's materialisation and check evaluations name the day they are about.
    assert by_event["ASSET_MATERIALIZATION"] == set(RANGE)
    assert by_event["ASSET_CHECK_EVALUATION"] == set(RANGE)
    # The run's other lines name its range: the rejected day's warning too.
    span = f"{RANGE[0]}...{RANGE[-1]}"
    assert by_event["STEP_START"] == {span}
    [warning] = [r for r in records if r["level"] == "WARNING" and "quality gate" in r["message"]]
    assert RANGE[1] in warning["message"] and warning["partition"] == span
    assert None not in {r["partition"] for r in records}


@pytest.mark.parametrize(
    ("scheme_user", "password", "host"),
    [
        # A Redis broker's password with no user (ML_PLATFORM_CELERY_BROKER's form).
        ("redis://", "Sup3rS3cretPass", "redis:6379/0"),
        # A password holding '@': parsers split the user info from the host at the last '@'.
        ("postgresql://dagster", "p@ssw0rd-long", "db:5432/dagster"),
        ("amqp://guest", "a@b@c", "rabbit"),
    ],
)
def test_json_lines_redact_the_whole_url_password(scheme_user, password, host, monkeypatch):
    import logging

    from ml_platform.platform.logs import JsonFormatter

    # Assembled here: no tracked file holds a URL with a password (test_security).
    url = f"{scheme_user}:{password}@{host}"

    # The URL comes from a variable whose name does not look like a secret (the broker's).
    monkeypatch.setenv("ML_PLATFORM_CELERY_BROKER", url)
    record = logging.makeLogRecord(
        {
            "name": "ml_platform.test",
            "levelname": "ERROR",
            "msg": f"cannot reach the broker at {url}: connection refused (user@example.com)",
        }
    )

    line = JsonFormatter().format(record)

    message = json.loads(line)["message"]
    host = url.rsplit("@", 1)[1]
    user = url.split("://", 1)[1].split(":", 1)[0]
    scheme = url.split("://", 1)[0]
    assert message == (
        f"cannot reach the broker at {scheme}://{user}:***@{host}: connection refused "
        "(user@example.com)"
    )
    assert password not in line
    assert not [part for part in password.split("@") if len(part) > 3 and part in line]


# A run process writing the JSON log: it readies its handler, waits for the others, then
# writes its lines as fast as it can.
WRITER = """
import logging, sys, time
from pathlib import Path
from ml_platform.platform.logs import JsonFileHandler

name, home = sys.argv[1], Path(sys.argv[2])
handler = JsonFileHandler(max_bytes=10_000, backup_count=11)
(home / f"ready-{name}").touch()
while not (home / "go").exists():
    time.sleep(0.01)
for i in range(150):
    message = {"name": "ml_platform", "levelno": 20, "levelname": "INFO", "msg": f"{name} {i:04d}"}
    handler.emit(logging.makeLogRecord(message))
handler.close()
"""


def test_json_log_lines_of_runs_rotating_the_file_together_are_all_kept(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    names = [f"run{n}" for n in range(3)]
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, name, str(tmp_path)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{name}").exists() for name in names):
        assert time.monotonic() < deadline, "the writers never started"
        time.sleep(0.05)
    (tmp_path / "go").touch()
    errors = [writer.communicate(timeout=120)[1] for writer in writers]

    assert [writer.returncode for writer in writers] == [0, 0, 0], errors
    assert not [e for e in errors if "Logging error" in e], errors
    # 450 lines of about 200 bytes: well within the file and its eleven backups of 10 kB.
    files = [f for f in (tmp_path / "logs").glob(f"{LOG_FILE_NAME}*") if f.suffix != ".lock"]
    kept = [json.loads(line)["message"] for f in files for line in f.read_text().splitlines()]
    assert sorted(kept) == sorted(f"{name} {i:04d}" for name in names for i in range(150))


@pytest.mark.parametrize(
    ("error_class", "message", "expected"),
    [
        # A landed file still written in place after the retries: waiting is what it needs.
        (
            "LandedFileChangedError",
            "synthetic_2024-01-02.csv (partition 2024-01-02) changed while it was read",
            TRANSIENT_INFRASTRUCTURE,
        ),
        # The landing zone's volume not mounted: no retry mounts it.
        (
            "LandingZoneMissingError",
            "the landing zone /mnt/landing does not exist",
            CONFIGURATION,
        ),
        # S3 refusing a request signed by a clock 15 minutes off.
        (
            "ClientError",
            "An error occurred (RequestTimeTooSkewed) when calling the PutObject operation: "
            "The difference between the request time and the current time is too large.",
            CONFIGURATION,
        ),
    ],
    ids=["file changing", "zone missing", "clock skew"],
)
def test_landing_and_clock_failures_are_classed_by_what_fixes_them(error_class, message, expected):
    failure = StepFailure("synthetic__raw_data", error_class, message, user_failure=False)

    verdict = classify_failure([failure], [])

    assert verdict.failure_class == expected, verdict.reason


def test_a_champion_the_contract_no_longer_feeds_is_a_configuration_failure():
    # A contract change a person resolves: neither the day's data nor a bug of the code.
    message = (
        "2024-01-02: the serving champion daily-2024-01-01 (version 1) needs feature(s) x4, "
        "which the contract no longer provides"
    )
    alone = StepFailure("synthetic__registered_model", "ChampionFeaturesError", message, True)
    assert classify_failure([alone], []).failure_class == CONFIGURATION


def dropped_download() -> Exception:
    """A real S3 body read whose connection drops: botocore's ResponseStreamingError.

    A server on 127.0.0.1 announces 100 bytes of a day file, sends 8 and closes; botocore's own
    StreamingBody reads it through urllib3, as S3LandingZone.open_file hands raw_data the body.
    """
    import urllib3
    from botocore.exceptions import ResponseStreamingError
    from botocore.response import StreamingBody

    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\na,b\n1,2\n")

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    port = listener.getsockname()[1]
    with urllib3.PoolManager() as pool:
        response = pool.request(
            "GET", f"http://127.0.0.1:{port}/synthetic_2024-01-03.csv", preload_content=False
        )
        with pytest.raises(ResponseStreamingError) as dropped:
            StreamingBody(response, 100).read()
    server.join(timeout=10)
    listener.close()
    return dropped.value


def test_a_download_dropped_mid_file_is_retried_and_classed_transient(tmp_path):
    # raw_data streams the landed object's body: S3 closing the connection mid-file is a
    # network hiccup the step's retry policy is for, and the alert's class if it lasts.
    attempts: list[int] = []

    @dg.asset(
        partitions_def=DAILY,
        metadata={FORMAT_KEY: "parquet"},
        retry_policy=dg.RetryPolicy(max_retries=1, delay=0.1),
    )
    def landed(context: dg.AssetExecutionContext) -> Iterator:
        """Reads the day's landed object, whose download drops every time."""

        def day_of_landed(day: str) -> Iterator:
            attempts.append(context.retry_number)
            raise dropped_download()
            yield

        yield from each_day(context, day_of_landed)

    defs = lake_defs(tmp_path, [landed])
    with dg.instance_for_test() as instance:
        result = run_of(defs, instance, landed, partition_key=DAY)
        assert not result.success
        assert attempts == [0, 1]  # retried, not failed at once as a bug
        outcome = run_outcome(instance, result.run_id, succeeded=False)
        assert outcome is not None
        verdict = classify_outcome(outcome)
    assert verdict.failure_class == TRANSIENT_INFRASTRUCTURE, verdict.reason
    assert "ResponseStreamingError" in verdict.reason


def test_reproduce_of_raw_data_judges_the_file_the_run_read_not_the_one_the_sensor_listed(
    platform_for, monkeypatch, tmp_path
):
    import ml_platform.ingestion.assets as ingestion_assets
    from ml_platform.ingestion.landing import LANDED_FILE_TAG, LANDED_VERSION_TAG
    from ml_platform.platform.storage import write_atomically

    def storable(frame: pd.DataFrame, contract: Any) -> pd.DataFrame:
        raise RuntimeError("a bug in raw_data")

    monkeypatch.setattr(ingestion_assets, "storable", storable)
    platform = platform_for("synthetic")
    platform.land(DAY, 1)
    zone = LandingZone(base_dir=str(platform.landing_dir))
    path = zone.path_for(platform.contract.landing.file_name(DAY))
    listed = zone.find(path.name)  # the version the landing sensor's tick listed
    assert listed is not None
    # Delivered again between the tick and the run (the upstream system re-sent it): the run
    # reads this one, which is still there.
    write_atomically(path, path.read_bytes())
    result = dg.materialize(
        list(platform.defs.assets or []),
        selection=[platform.key("raw_data")],
        partition_key=DAY,
        resources=platform.defs.resources,
        instance=platform.instance,
        tags={LANDED_FILE_TAG: str(path), LANDED_VERSION_TAG: listed.version},
        raise_on_error=False,
    )
    failed = run_id_of(result)

    def reproduced(scratch: str) -> None:
        reproduce(
            platform.instance, failed, platform.defs, tmp_path / scratch, contract=platform.contract
        )

    with pytest.raises(RuntimeError, match="a bug in raw_data"):
        reproduced("scratch1")

    # Replaced after the run read it: a rerun would read other data.
    time.sleep(1.1)  # past the local zone's second of slack on modification times
    write_atomically(path, path.read_bytes() + path.read_bytes().splitlines(keepends=True)[-1])
    with pytest.raises(InputsChangedError, match="was replaced at .*, after the run read it"):
        reproduced("scratch2")

    # A link in the file's place is nothing the zone reads: said so, not "gone".
    kept = tmp_path / "kept.csv"
    path.rename(kept)
    path.symlink_to(kept)
    with pytest.raises(InputsChangedError, match="is no readable file now: "):
        reproduced("scratch3")


def test_a_days_deliberate_stop_inside_its_steps_failure_is_a_deliberate_stop():
    # each_day wraps a day's dg.Failure in the step's own: two links, both deliberate stops.
    stop = StepFailure(
        "drift_report",
        "Failure",
        "drift_report: 1 of 1 days failed; no day of this run was stored or recorded",
        True,
        chain=(
            "Failure: drift_report: 1 of 1 days failed; no day of this run was stored",
            "Failure: drift_report 2024-01-02: the features of 2024-01-02 lack x4_value",
        ),
    )

    verdict = classify_failure([stop], [])

    assert verdict.failure_class == DATA
    assert verdict.reason.startswith("drift_report stopped on a failed gate (dg.Failure): ")
