"""Known failures of the code that describes failures: alerts, diagnose and reproduce.

Each test makes a real failure of the real graph (`dg.materialize` over temporary storage) and
reads what the platform says about it.
"""

import json
from typing import Any

import dagster as dg
import pandas as pd
import pytest

from ml_platform import cli
from ml_platform.automation.alert_sensors import ALERTS_TAG, BACKFILL_TAG, backfill_summaries
from ml_platform.automation.alerts import Notifier
from ml_platform.troubleshooting.reproduce import InputsChangedError, reproduce
from ml_platform_tests.services import webhook_server
from ml_platform_tests.test_alerts import AlertSensors

pytestmark = pytest.mark.slow

DAY = "2024-01-03"
PASSWORD = "Sup3r-s3cret-pw"
TOKEN = "tok-4b1d9e7a2c5f"


def features_raising(error: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    """Have the features step raise `error` while it builds a day's features."""
    import ml_platform.features.assets as feature_assets

    def build_features(frame: pd.DataFrame, contract: Any) -> Any:
        raise error

    monkeypatch.setattr(feature_assets, "build_features", build_features)


def test_a_failure_alert_never_repeats_a_url_password_or_a_secret(platform_for, monkeypatch):
    # A step's error quoting a database URI with its password, and a token of the environment:
    # what a driver or an HTTP client may put in its message.
    monkeypatch.setenv("ML_PLATFORM_TEST_API_TOKEN", TOKEN)
    features_raising(
        RuntimeError(
            f"cannot reach postgresql://mlflow:{PASSWORD}@db:5432/mlflow with token {TOKEN}"
        ),
        monkeypatch,
    )
    platform = platform_for("synthetic")
    platform.land(DAY, 1)
    with webhook_server() as webhook:
        notifier = Notifier(
            webhook_url=f"http://127.0.0.1:{webhook.server_port}/hooks/alerts", failure_streak=1
        )
        sensors = AlertSensors(platform.instance, notifier)
        result = platform.materialize(DAY, selection=["raw_data", "validated_data", "features"])
        assert not result.success
        sensors.tick()
        sensors.tick()
        received = list(webhook.received)

    # The failure pages (one failed run is a streak of 1 here), and is stored on the run.
    assert [body["ml_platform_alert"]["rule"] for body in received] == ["failure_streak"]
    stored = platform.instance.get_run_by_id(result.run_id).tags[ALERTS_TAG]
    for said in [*(json.dumps(body) for body in received), stored]:
        assert PASSWORD not in said
        assert TOKEN not in said
    # The cause still says what went wrong, and where.
    cause = received[0]["ml_platform_alert"]["cause"]
    assert "postgresql://mlflow:***@db:5432/mlflow with token ***" in cause
    assert DAY in cause
    assert "postgresql://mlflow:***@db" in received[0]["text"]


def test_reproduce_refuses_once_the_file_of_an_input_the_run_read_is_gone(
    platform_for, monkeypatch, tmp_path
):
    platform = platform_for("synthetic")
    platform.land(DAY, 1)
    assert platform.materialize(DAY, selection=["raw_data", "validated_data"]).success
    with monkeypatch.context() as patched:
        features_raising(RuntimeError("a bug in the features"), patched)
        failed = platform.materialize(DAY, selection=["features"])
    assert not failed.success
    # The lake loses the day's validated_data file the run read (a clean-up, a lifecycle
    # rule): Dagster still records the version.
    stored = platform.stored("validated_data", DAY, "parquet")
    stored.unlink()

    # A rerun would fail on the missing file, not on the run's bug: refused, saying so.
    with pytest.raises(InputsChangedError) as refused:
        reproduce(
            platform.instance,
            failed.run_id,
            platform.defs,
            tmp_path / "scratch",
            contract=platform.contract,
        )
    message = str(refused.value)
    assert f"synthetic/validated_data partition {DAY}" in message
    assert "is gone from the lake" in message
    assert stored.name in message


@dg.asset
def never_run() -> None:
    """An asset whose run is created and never launched."""


def test_diagnose_of_a_run_never_launched_says_it_has_not_started(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    defs = dg.Definitions(
        assets=[never_run], jobs=[dg.define_asset_job("never_run_job", selection=[never_run])]
    )
    with dg.DagsterInstance.get() as instance:
        # What a launch that stopped before it submitted the run leaves: a run, no events.
        run = instance.create_run_for_job(defs.resolve_job_def("never_run_job"))
    assert run.status == dg.DagsterRunStatus.NOT_STARTED

    assert cli.main(["diagnose", run.run_id]) == 0

    out = capsys.readouterr().out
    assert f"run {run.run_id}: NOT_STARTED" in out
    assert "the run has not started (NOT_STARTED): it was created but never launched" in out
    assert "still running" not in out


def test_a_backfill_that_failed_or_was_canceled_is_not_summarised_as_a_success(platform_for):
    platform = platform_for("synthetic")
    platform.land("2024-01-01", 2)
    notifier = platform.defs.resources["notifier"]
    # The runs a backfill launched before it stopped: two days of 2024-01-01..2024-01-10.
    job = platform.defs.resolve_job_def("synthetic_ingestion_job")
    for day in ["2024-01-01", "2024-01-02"]:
        run = job.execute_in_process(
            instance=platform.instance, partition_key=day, tags={BACKFILL_TAG: "stopped"}
        )
        assert run.success

    [ended] = backfill_summaries(platform.instance, "stopped", notifier, now=0.0)
    assert (ended.severity, ended.page, ended.cause) == ("INFO", False, "every day accepted")

    # Dagster's statuses of a backfill the daemon gave up on, and of one a person canceled.
    error = "DagsterInvariantViolationError: partition 2024-01-03 of the selection is gone\n..."
    [failed] = backfill_summaries(
        platform.instance, "stopped", notifier, now=0.0, status="FAILED", error=error
    )
    assert failed.title == (
        "backfill stopped of synthetic failed: 2 day(s), 0 rejected, 0 failed run(s)"
    )
    assert failed.cause == (
        "the backfill failed before it ran all its days: DagsterInvariantViolationError: "
        "partition 2024-01-03 of the selection is gone; every day it ran accepted"
    )
    assert (failed.severity, failed.page) == ("WARNING", True)
    assert failed.runbook == "docs/runbook.md#rerun-failed-days"
    [canceled] = backfill_summaries(
        platform.instance, "stopped", notifier, now=0.0, status="CANCELED"
    )
    assert canceled.title.startswith("backfill stopped of synthetic canceled: 2 day(s)")
    assert canceled.cause.startswith("the backfill was canceled before it ran all its days; ")
    assert (canceled.severity, canceled.page) == ("WARNING", False)

    # A backfill that failed before it launched a run is told all the same.
    [silent] = backfill_summaries(
        platform.instance, "norun", notifier, now=0.0, status="FAILED", error=error
    )
    assert silent.title == "backfill norun failed: 0 day(s), 0 rejected, 0 failed run(s)"
    assert (silent.severity, silent.page, silent.partition) == ("WARNING", True, None)


def test_a_backfill_of_another_locations_hourly_assets_does_not_stop_the_summaries(
    tmp_path, monkeypatch
):
    # The instance is shared with a code location whose assets are hourly: its backfill's runs
    # carry ranges that are no days, which failed every tick of the summary sensor.
    @dg.asset(
        key_prefix="weather",
        partitions_def=dg.HourlyPartitionsDefinition(start_date="2024-01-01-00:00"),
    )
    def readings() -> None: ...

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    defs = dg.Definitions(
        assets=[readings], jobs=[dg.define_asset_job("readings_job", selection=[readings])]
    )
    with dg.DagsterInstance.get() as instance:
        instance.create_run_for_job(
            defs.resolve_job_def("readings_job"),
            asset_selection=frozenset({readings.key}),
            tags={
                BACKFILL_TAG: "hourly",
                "dagster/asset_partition_range_start": "2024-01-01-00:00",
                "dagster/asset_partition_range_end": "2024-01-01-05:00",
            },
        )
        summaries = backfill_summaries(instance, "hourly", Notifier(), now=0.0)

    # Nothing of this platform's: no dataset summarised, and no error.
    assert summaries == []
