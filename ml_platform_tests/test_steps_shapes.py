"""Shapes the shared step machinery meets on failure paths: JSON log lines that cannot be
written, names that are not UTF-8, secrets percent-encoded or of several lines, a range whose
failed days cannot all be fixed by waiting, and an experiment deleted in MLflow mid-range."""

import json
import logging
import urllib.parse

import dagster as dg
import pytest

from ml_platform.platform.logs import LOG_FILE_NAME, JsonFileHandler, JsonFormatter
from ml_platform.platform.storage import LocalStorage
from ml_platform.platform.tracking import DeletedInMlflowError, MlflowStores
from ml_platform_tests.conftest import Platform, contract_with, tmpfs

# The handlers of dagster.yaml's `python_logs`, as every run process of the instance builds them.
PYTHON_LOGS = {
    "python_log_level": "INFO",
    "managed_python_loggers": ["ml_platform"],
    "dagster_handler_config": {
        "handlers": {
            "json_file": {"class": "ml_platform.platform.logs.JsonFileHandler", "level": "DEBUG"}
        }
    },
}


def record(message: str) -> logging.LogRecord:
    return logging.makeLogRecord(
        {"name": "ml_platform.test", "levelno": 20, "levelname": "INFO", "msg": message}
    )


def test_a_read_only_log_directory_never_fails_a_run(tmp_path, monkeypatch, capfd):
    # DAGSTER_HOME on a volume mounted read-only (or one whose logs/ cannot be made): the JSON
    # handler raised from its first line, out of the run's `context.log` call, and the day
    # failed for a log line; its construction alone failed every run of the instance.
    contract = contract_with(tmp_path, "synthetic")
    platform = Platform(contract, tmp_path / "p")
    platform.land("2024-01-01", 1)
    with tmpfs(tmp_path / "home", "1m", "ro") as home:
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        platform.instance = dg.DagsterInstance.ephemeral(settings={"python_logs": PYTHON_LOGS})
        result = platform.materialize("2024-01-01", selection=["raw_data"])
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        assert platform.materialized("raw_data") == {"2024-01-01"}
        assert not (home / "logs").exists()
    # The lines that could not be written are said on stderr, as `logging` says a failed write.
    assert "Logging error" in capfd.readouterr().err


def test_a_lock_file_that_cannot_be_opened_drops_the_line_without_raising(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "logs" / f"{LOG_FILE_NAME}.lock").mkdir(parents=True)
    handler = JsonFileHandler()
    try:
        handler.handle(record("a line"))
    finally:
        handler.close()
    assert not (tmp_path / "logs" / LOG_FILE_NAME).exists()


def test_a_name_that_is_not_utf8_is_written_escaped_not_lost(tmp_path, monkeypatch):
    # A landing file named in Latin-1 reaches Python as a lone surrogate (surrogateescape): the
    # UTF-8 log file refused the whole line, and the run's line about the refused file was lost.
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    name = b"vols-\xe9t\xe9.csv".decode("utf-8", "surrogateescape")
    handler = JsonFileHandler()
    try:
        handler.handle(record(f"refused {name}"))
        handler.handle(record("the next line"))
    finally:
        handler.close()
    lines = (tmp_path / "logs" / LOG_FILE_NAME).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["message"] for line in lines] == [f"refused {name}", "the next line"]


def test_a_secret_percent_encoded_in_a_url_is_redacted(monkeypatch):
    # A base64 token holds '/', '+' and '=': in a webhook's query or a URI it reads %2F, %2B,
    # %3D (or '+' for a space), and the line carried it whole.
    token = "k9/Qx+T3zW=wq8 Lp"
    monkeypatch.setenv("ML_PLATFORM_ALERT_WEBHOOK_TOKEN", token)
    formatter = JsonFormatter()
    for encoded in (urllib.parse.quote(token, safe=""), urllib.parse.quote_plus(token)):
        line = formatter.format(record(f"posting to https://hooks.example.org/a?token={encoded}"))
        message = json.loads(line)["message"]
        assert message == "posting to https://hooks.example.org/a?token=***", encoded


def test_a_range_with_a_day_waiting_cannot_fix_is_not_retried_for_another_days_hiccup(tmp_path):
    # A range's first day has no validated day (never materialised: waiting cannot store it)
    # and its last day's version cannot be written for now (a storage error, retried alone).
    # The step was retried for the last day, recomputing every day each attempt (about 22 s of
    # backoff and three times the work), to fail on the first day again: no attempt could pass.
    contract = contract_with(tmp_path, "synthetic")
    platform = Platform(contract, tmp_path / "p")
    first, last = "2024-01-01", "2024-01-02"
    platform.land(first, 2)
    assert platform.materialize(last, selection=["raw_data", "validated_data"]).success
    # A file where the day's folder goes: storing the day fails with an OSError (ENOTDIR) that
    # the storage retry policy retries, as it does any storage error of no permanent kind.
    folder = platform.lake_dir / contract.name / "features"
    folder.mkdir(parents=True)
    (folder / last).write_text("")
    result = dg.materialize(
        list(platform.defs.assets or []),
        resources=platform.defs.resources,
        instance=platform.instance,
        selection=[platform.key("features")],
        tags={
            "dagster/asset_partition_range_start": first,
            "dagster/asset_partition_range_end": last,
        },
        raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    message = failure.step_failure_data.user_failure_data.description
    assert "2 of 2 days failed" in message
    assert f"{first}: " in message and f"{last}: " in message
    retries = [
        e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY
    ]
    assert retries == []


def test_an_experiment_deleted_after_an_earlier_day_used_it_is_named_not_written_to(tmp_path):
    # A range's run trains day after day in one process: the experiment's id, kept from the
    # first day, was handed out after a person deleted the experiment in MLflow's UI, and the
    # next day failed on MLflow's "must be in the 'active' state" (a code bug, by its class)
    # instead of the deleted experiment named with how to restore it (a configuration failure).
    stores = MlflowStores(lake=LocalStorage(base_dir=str(tmp_path / "lake")))
    experiment = stores.experiment_id("synthetic")
    assert stores.experiment_id("synthetic") == experiment
    stores.client().delete_experiment(experiment)
    with pytest.raises(DeletedInMlflowError) as raised:
        stores.experiment_id("synthetic")
    assert f"(id {experiment}) was deleted" in raised.value.description
    # Restored, it is the dataset's experiment again.
    stores.client().restore_experiment(experiment)
    assert stores.experiment_id("synthetic") == experiment


def test_each_line_of_a_secret_of_several_lines_is_redacted(monkeypatch):
    # A credential file mounted into a variable has line breaks: logged with CRLF, or a line at
    # a time, the whole value never matched and every one of its lines was written out.
    lines = ["first-part-of-it-93kd", "second-part-of-it-x7q"]
    monkeypatch.setenv("ML_PLATFORM_SIGNING_KEY", "\n".join(lines) + "\n")
    formatter = JsonFormatter()
    for message in ("\r\n".join(lines), f"read line: {lines[1]}"):
        logged = json.loads(formatter.format(record(message)))["message"]
        assert not any(line in logged for line in lines), logged
