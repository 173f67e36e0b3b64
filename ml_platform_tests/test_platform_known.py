"""Lake files, health and pools: strict JSON for undefined metrics; a queue daemon gone silent,
or an instance without a queue, told before runs wait; every queued run listed by health; the
pools of a dataset added while the daemon runs limited, and a limit of 0 refused.
"""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from ml_platform.automation.launch import QUEUE_DAEMON, LaunchError, NotUpYetError, Webserver
from ml_platform.contracts import load_contract
from ml_platform.definitions import build_definitions
from ml_platform.platform.formats import NON_FINITE_KEY, deserialise, serialise
from ml_platform.platform.pools import (
    POOL_LIMITS_SENSOR,
    PoolLimitError,
    pools_of,
    store_pool_limits,
)
from ml_platform.troubleshooting.health import pipeline_health
from ml_platform_tests.conftest import Platform, free_port


def strict_json(text: str):
    """`text` read as jq or a browser reads it: NaN and Infinity are no JSON."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_report_whose_metric_the_day_cannot_define_is_strict_json_and_reads_back(tmp_path):
    platform = Platform(load_contract("flights"), tmp_path / "flights")
    platform.land("2013-01-01", 2)
    # The second day's flights all arrived on time: its held-out rows are of one class, whose
    # ROC AUC is undefined.
    landed = platform.landing_dir / "flights_2013-01-02.csv"
    frame = pd.read_csv(landed)
    frame["arr_delay"] = frame["arr_delay"].where(frame["arr_delay"].isna(), 0.0)
    frame.to_csv(landed, index=False)
    assert platform.materialize("2013-01-01").success

    # registered_model reads the day's evaluation back from the lake.
    result = platform.materialize("2013-01-02")

    assert result.success
    stored = platform.stored("evaluation_report", "2013-01-02", "json").read_text()
    report = strict_json(stored)
    assert report["metrics"]["roc_auc"] is None
    assert report[NON_FINITE_KEY]["/metrics/roc_auc"] == "NaN"
    lift = report["baseline"]["lifts"]["roc_auc"]
    assert lift["lift"] is None and report[NON_FINITE_KEY]["/baseline/lifts/roc_auc/lift"] == "NaN"
    # Read back by the platform, each null it lists is the number it stood for again.
    read = deserialise(stored.encode(), "json")
    assert NON_FINITE_KEY not in read and math.isnan(read["metrics"]["roc_auc"])
    assert read["metrics"]["accuracy"] == report["metrics"]["accuracy"]
    [registered] = result.asset_materializations_for_node(platform.node("registered_model"))
    assert registered.metadata["decision"].value == "reject"


def test_lake_json_round_trips_every_non_finite_number_and_reads_files_written_before():
    value = {
        "metrics": {"roc_auc": float("nan"), "f1": 0.5},
        "draws": [1.0, float("inf"), -math.inf],
        "odd/key~": {"x": float("nan")},
        "absent": None,
    }

    text = serialise(value, "json").decode()

    document = strict_json(text)
    assert document[NON_FINITE_KEY] == {
        "/metrics/roc_auc": "NaN",
        "/draws/1": "Infinity",
        "/draws/2": "-Infinity",
        "/odd~1key~0/x": "NaN",
    }
    read = deserialise(text.encode(), "json")
    assert math.isnan(read["metrics"]["roc_auc"]) and read["metrics"]["f1"] == 0.5
    assert read["draws"] == [1.0, math.inf, -math.inf] and read["absent"] is None
    assert math.isnan(read["odd/key~"]["x"]) and NON_FINITE_KEY not in read
    # A report stored before, with bare NaN, reads as it did.
    assert math.isnan(deserialise(b'{"metrics": {"roc_auc": NaN}}', "json")["metrics"]["roc_auc"])


def test_a_lake_json_listing_a_null_it_does_not_hold_is_refused_naming_it():
    damaged = json.dumps({"metrics": {"roc_auc": 0.7}, NON_FINITE_KEY: {"/metrics/roc_auc": "NaN"}})

    with pytest.raises(ValueError, match="lists '/metrics/roc_auc' as 'NaN', which is no null"):
        deserialise(damaged.encode(), "json")


def test_a_registered_version_whose_metric_is_undefined_has_strict_json_files(tmp_path):
    platform = Platform(load_contract("synthetic"), tmp_path / "synthetic")
    platform.land("2024-01-01", 1)
    assert platform.materialize("2024-01-01").success
    registry = platform.registry()
    champion = str(registry.alias("champion"))
    model = dataclasses.replace(registry.load(champion), initial_loss=math.nan)
    manifest = {**registry.manifest(champion), "metrics": {"r2": math.nan, "rmse": 0.5}}
    example = pd.read_parquet(platform.stored("features", "2024-01-01", "parquet"))
    before = set(platform.lake_dir.rglob("ml_platform_*.json"))

    registry.upsert("daily-2024-01-02", model, manifest, example)

    written = set(platform.lake_dir.rglob("ml_platform_*.json")) - before
    assert {path.name for path in written} == {
        "ml_platform_manifest.json",
        "ml_platform_model.json",
    }
    for path in written:
        strict_json(Path(path).read_text())
    assert math.isnan(registry.manifest("daily-2024-01-02")["metrics"]["r2"])
    assert math.isnan(registry.load("daily-2024-01-02").initial_loss)


def store_heartbeat(instance: dg.DagsterInstance, seconds_ago: float) -> None:
    """A heartbeat of the queue's daemon `seconds_ago`, stored as dagster-daemon stores one."""
    # Reading the heartbeats makes Dagster register their class, which deserialising needs.
    instance.get_daemon_heartbeats()
    heartbeat = dg.deserialize_value(
        json.dumps(
            {
                "__class__": "DaemonHeartbeat",
                "timestamp": time.time() - seconds_ago,
                "daemon_type": QUEUE_DAEMON,
                "daemon_id": "a daemon that stopped",
                "errors": [],
            }
        )
    )
    instance.add_daemon_heartbeat(heartbeat)


def test_health_says_the_queue_daemon_stopped_once_its_heartbeats_stop(tmp_path):
    with dg.DagsterInstance.local_temp(str(tmp_path)) as instance:
        # Dagster calls it healthy for 30 minutes more; it has been silent for ten intervals.
        store_heartbeat(instance, 300)
        stopped = pipeline_health(instance, 1)
        store_heartbeat(instance, 10)
        working = pipeline_health(instance, 1)

    said = "no dagster-daemon has worked the queue of this instance for 5.0min"
    # Nothing queued yet: told all the same, as whatever is launched next will wait.
    assert f"queue: {said}" in stopped.render(), stopped.render()
    assert said not in working.render(), working.render()
    # With runs waiting (a run queued by the UI or a sensor, waited for a minute so far).
    waiting = dataclasses.replace(stopped, queued_seconds=[60.0]).render()
    assert f"queued now: 1 run(s), the oldest for 1.0min; {said}" in waiting, waiting
    assert "nothing starts queued runs; start one (`ml-platform pools" in waiting, waiting
    waiting = dataclasses.replace(working, queued_seconds=[60.0]).render()
    assert "a dagster-daemon last worked the queue 10s ago: if none runs now" in waiting, waiting


@pytest.fixture
def webserver_of(tmp_path):
    """Factory: the Dagster webserver of a new instance, and that instance.

    It serves the code location of the Python `code` given, else none; `config` is added to
    the instance's dagster.yaml. Unless not to `wait`, it returns once the webserver answers
    and finds a daemon (a heartbeat stored now) working the queue.
    """
    started: list[subprocess.Popen] = []

    def start(
        code: str | None = None, config: str = "", wait: bool = True
    ) -> tuple[Webserver, dg.DagsterInstance]:
        home = tmp_path / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n" + config)
        # The storage is created here, before the webserver would race to create it too.
        instance = dg.DagsterInstance.from_config(str(home))
        store_heartbeat(instance, 0)
        location = ["--empty-workspace"]
        if code is not None:
            (tmp_path / "location.py").write_text(code)
            location = ["-f", str(tmp_path / "location.py")]
        port = free_port()
        with (tmp_path / "webserver.log").open("w") as log:
            started.append(
                subprocess.Popen(
                    [
                        str(Path(sys.executable).parent / "dagster-webserver"),
                        *location,
                        *("-h", "127.0.0.1", "-p", str(port)),
                    ],
                    cwd=tmp_path,
                    env={**os.environ, "DAGSTER_HOME": str(home)},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        webserver = Webserver(f"http://127.0.0.1:{port}")
        if wait:
            webserver.wait_until_up(120)
        return webserver, instance

    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def test_a_launch_is_refused_while_the_queue_daemon_is_silent_though_dagster_calls_it_healthy(
    webserver_of,
):
    webserver, instance = webserver_of()
    with instance:
        store_heartbeat(instance, 300)
        with pytest.raises(NotUpYetError) as refused:
            webserver.check_queue()
        # Its heartbeats come again (a daemon restarted): launches go ahead.
        store_heartbeat(instance, 5)
        webserver.check_queue()

    message = str(refused.value)
    assert f"the run queue of the instance served at {webserver.url} last reported 30" in message
    assert "it stopped or hangs" in message and "dagster-daemon run" in message, message


def tick(sensor: dg.SensorDefinition, instance: dg.DagsterInstance, defs: dg.Definitions):
    """One tick of `sensor` in the code location of `defs`, as the daemon ticks it."""
    with dg.build_sensor_context(
        instance=instance, repository_def=defs.get_repository_def()
    ) as context:
        return sensor.evaluate_tick(context)


def test_the_pools_of_a_dataset_added_while_the_daemon_runs_are_limited_by_the_next_tick(
    tmp_path,
):
    limited = {"concurrency": {"pools": {"granularity": "run", "default_limit": 1}}}
    with dg.DagsterInstance.local_temp(str(tmp_path), overrides=limited) as instance:
        # `ml-platform pools` ran for the datasets served then: synthetic's pools have limits,
        # one of them set to 2 by an operator.
        served = build_definitions(load_contract("synthetic"), lake_dir=str(tmp_path / "lake"))
        store_pool_limits(instance, pools_of(served))
        operated = sorted(pools_of(served))[0]
        instance.event_log_storage.set_concurrency_slots(operated, 2)
        # A contract added, the code location reloaded: its sensor is the one it serves now.
        added = load_contract("flights")
        reloaded = build_definitions(
            [load_contract("synthetic"), added], lake_dir=str(tmp_path / "lake")
        )
        new = pools_of(reloaded) - pools_of(served)
        assert new and all(pool.startswith("flights.") for pool in new)
        sensor = reloaded.resolve_sensor_def(POOL_LIMITS_SENSOR)
        assert sensor.default_status == dg.DefaultSensorStatus.RUNNING

        first = tick(sensor, instance, reloaded)
        second = tick(sensor, instance, reloaded)

        storage = instance.event_log_storage
        assert storage.get_concurrency_keys() == pools_of(reloaded)
        assert {storage.get_concurrency_info(pool).slot_count for pool in new} == {1}
        assert storage.get_concurrency_info(operated).slot_count == 2
    assert f"limits stored for {len(new)} (" in str(first.skip_message), first.skip_message
    assert "limits stored for 0," in str(second.skip_message), second.skip_message


def test_the_pools_sensor_fails_its_tick_on_an_instance_that_would_limit_nothing(tmp_path):
    defs = build_definitions(load_contract("synthetic"), lake_dir=str(tmp_path / "lake"))
    # No `concurrency: pools: default_limit`: Dagster would store no limit for a pool.
    with dg.DagsterInstance.local_temp(str(tmp_path)) as instance:
        with pytest.raises(PoolLimitError, match="sets no `concurrency: pools: default_limit`"):
            tick(defs.resolve_sensor_def(POOL_LIMITS_SENSOR), instance, defs)
        assert instance.event_log_storage.get_concurrency_keys() == set()


def test_health_lists_every_run_still_queued_however_long_ago_it_was_created(webserver_of):
    code = (
        "import dagster as dg\n\n\n@dg.op\ndef step():\n    pass\n\n\n"
        "@dg.job\ndef waiting_job():\n    step()\n"
    )
    webserver, instance = webserver_of(code)
    with instance:
        # Launched as the UI launches it; no daemon takes it from the queue.
        run_id = webserver.launch("waiting_job", {})
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.QUEUED
        # Asked two days later about the last day: the run was created before that day.
        two_days = time.time() + 2 * 86400
        report = pipeline_health(instance, 1, now=two_days)

    assert report.runs == 0
    said = report.render()
    assert "queued now: 1 run(s), the oldest for 48.0h" in said, said


def test_a_default_pool_limit_of_zero_is_refused_as_it_would_start_no_run(tmp_path):
    defs = build_definitions(load_contract("synthetic"), lake_dir=str(tmp_path / "lake"))
    # Read as "no limit" by whoever wrote it; Dagster reads it as no slot for any run.
    zero = {"concurrency": {"pools": {"granularity": "run", "default_limit": 0}}}
    with dg.DagsterInstance.local_temp(str(tmp_path), overrides=zero) as instance:
        with pytest.raises(PoolLimitError) as refused:
            store_pool_limits(instance, pools_of(defs))
        assert instance.event_log_storage.get_concurrency_keys() == set()

    message = str(refused.value)
    assert "`concurrency: pools: default_limit: 0`" in message, message
    assert "in the queue forever" in message and "set it to 1" in message, message


def test_a_webserver_whose_instance_has_no_run_queue_is_refused_at_once_not_waited_for(
    webserver_of,
):
    # Runs would start as launched: the pools' limits, applied by the queue only, would not.
    default = (
        "run_coordinator:\n  module: dagster.core.run_coordinator\n  class: DefaultRunCoordinator\n"
    )
    webserver, instance = webserver_of(config=default, wait=False)
    with instance:
        assert QUEUE_DAEMON not in instance.get_required_daemon_types()
    up = time.monotonic() + 120
    while True:
        try:
            webserver.check_queue()
        except NotUpYetError as exc:
            # Not answering yet, as the webserver starts; nothing else may be waited for.
            if "no Dagster webserver answers" not in str(exc) or time.monotonic() > up:
                raise
            time.sleep(1)
            continue
        except LaunchError as exc:
            refused = exc
            break
        pytest.fail("check_queue passed an instance without a run queue")

    message = str(refused)
    assert f"the instance served at {webserver.url} has no run queue" in message, message
    assert "configure the QueuedRunCoordinator" in message, message
