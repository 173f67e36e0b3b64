"""The lake's writes survive a power loss, a lake file deleted mid-read fails at once, and the
troubleshooting commands count canceled runs and say how many days their advice rests on.

The lake is a real local directory, the runs a real temporary instance and real steps
(`dg.materialize`); the webserver's stand-ins are real HTTP servers on a local port.
"""

import http.server
import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest

from ml_platform import cli
from ml_platform.automation.launch import LaunchError, Webserver
from ml_platform.contracts import load_contract
from ml_platform.contracts.model import BUNDLED_DIR, STAGES
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.io_manager import FORMAT_KEY, LakeIOManager
from ml_platform.platform.steps import each_day
from ml_platform.platform.storage import LocalStorage
from ml_platform.troubleshooting import sizing
from ml_platform.troubleshooting.health import pipeline_health

DAY = "2024-01-01"
DAILY = dg.DailyPartitionsDefinition(start_date=DAY)


def test_a_lake_write_is_durable_once_it_returns_file_and_folders_synced(tmp_path, monkeypatch):
    lake = LocalStorage(base_dir=str(tmp_path / "lake"))
    lake.write_bytes("ds/asset/2024-01-01/run-0.json", b"old")
    target = tmp_path / "lake" / "ds" / "asset" / "2024-01-01" / "run-1.json"
    synced: list[tuple[int, bool, bool]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        # What was synced, and whether the new file had its name in place by then.
        info = os.fstat(fd)
        synced.append((info.st_ino, stat.S_ISDIR(info.st_mode), target.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)

    lake.write_bytes("ds/asset/2024-01-01/run-1.json", b"new")
    lake.write_bytes("ds/other/2024-01-01/run-1.json", b"new")

    folders = {ino for ino, is_dir, _ in synced if is_dir}
    # The file's bytes, then the folder holding its new name, after the rename: without that,
    # a power loss after the run records the day can leave the folder without the file.
    assert target.stat().st_ino in {ino for ino, is_dir, _ in synced if not is_dir}
    assert any(is_dir and placed for _, is_dir, placed in synced), synced
    assert target.parent.stat().st_ino in folders
    # A folder the write created is itself a new name in its parent: that one synced too.
    other = tmp_path / "lake" / "ds" / "other"
    assert {other.stat().st_ino, (other / "2024-01-01").stat().st_ino} <= folders
    assert other.parent.stat().st_ino in folders


class DeletedAfterLookup(LocalStorage):
    """The lake as another process deletes an object right after a reader looked it up."""

    def exists(self, key: str) -> bool:
        found = super().exists(key)
        if found and key.startswith("flights/"):
            self._path(key).unlink()
        return found


@dg.asset(partitions_def=DAILY, metadata={FORMAT_KEY: "parquet"})
def flights(context: dg.AssetExecutionContext) -> Iterator:
    """A day of flights."""
    yield from each_day(context, lambda day: iter([dg.MaterializeResult(value=pd.DataFrame())]))


@dg.asset(
    partitions_def=DAILY,
    metadata={FORMAT_KEY: "json"},
    retry_policy=dg.RetryPolicy(max_retries=2),
)
def delays(context: dg.AssetExecutionContext, flights: Any) -> Iterator:
    """The number of flights of the day."""

    def day_of_delays(day: str, flights: pd.DataFrame) -> Iterator:
        yield dg.MaterializeResult(value={"flights": len(flights)})

    yield from each_day(context, day_of_delays, flights=flights)


def test_a_lake_file_deleted_between_lookup_and_read_fails_at_once_naming_it(tmp_path):
    lake = DeletedAfterLookup(base_dir=str(tmp_path / "lake"))
    resources = {"io_manager": LakeIOManager(storage=lake)}
    with dg.DagsterInstance.ephemeral() as instance:
        assert dg.materialize(
            [flights], partition_key=DAY, resources=resources, instance=instance
        ).success
        [stored] = lake.list_keys("flights")

        result = dg.materialize(
            [flights, delays],
            selection=[delays],
            partition_key=DAY,
            resources=resources,
            instance=instance,
            raise_on_error=False,
        )

    assert not result.success
    # Waiting does not bring a deleted file back: no retry.
    events = result.all_events
    assert not [e for e in events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    [failure] = result.get_step_failure_events()
    message = failure.event_specific_data.error.to_string()
    assert "MissingPartitionError" in message, message
    assert f"flights partition {DAY}" in message and stored in message, message


class Gateway(http.server.BaseHTTPRequestHandler):
    """A server at the webserver's address: `answers` in turn, then a daemon found healthy."""

    answers: list[tuple[int, bytes]] = []
    asked = 0

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        cls = type(self)
        cls.asked += 1
        if cls.answers:
            code, body = cls.answers.pop(0)
        else:
            healthy = {"daemonStatus": {"healthy": True}}
            code, body = 200, json.dumps({"data": {"instance": {"daemonHealth": healthy}}}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/html" if code != 200 else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serving(answers: list[tuple[int, bytes]]) -> tuple[http.server.ThreadingHTTPServer, str]:
    Gateway.answers, Gateway.asked = list(answers), 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize(
    "answer",
    [(200, b"<html><body>Welcome to nginx!</body></html>"), (500, b"Internal Server Error")],
    ids=["html", "server error"],
)
def test_waiting_for_the_webserver_gives_up_at_once_on_an_answer_waiting_cannot_mend(answer):
    server, url = serving([answer] * 10)
    try:
        with pytest.raises(LaunchError) as refused:
            Webserver(url).wait_until_up(5)
    finally:
        server.shutdown()
        server.server_close()
    assert Gateway.asked == 1
    assert f"the server at {url} answered" in str(refused.value)


def test_waiting_for_the_webserver_waits_while_its_proxy_says_it_is_not_up_yet():
    server, url = serving([(502, b"Bad Gateway"), (503, b"Service Unavailable")])
    try:
        Webserver(url).wait_until_up(30)
    finally:
        server.shutdown()
        server.server_close()
    assert Gateway.asked == 3


def test_health_counts_canceled_runs_shown_apart(tmp_path):
    with dg.DagsterInstance.local_temp(str(tmp_path)) as instance:
        statuses = {
            "flights_daily_job": [dg.DagsterRunStatus.CANCELED] * 3,
            "trains_daily_job": [
                dg.DagsterRunStatus.SUCCESS,
                dg.DagsterRunStatus.FAILURE,
                dg.DagsterRunStatus.CANCELED,
                dg.DagsterRunStatus.SUCCESS,
            ],
        }
        for job, runs in statuses.items():
            for status in runs:
                instance.add_run(dg.DagsterRun(job_name=job, status=status))

        report = pipeline_health(instance, 1)

    said = report.render()
    assert "  flights_daily_job: 0% of 3 (3 canceled)" in said, said
    assert "  trains_daily_job: 50% of 4 (1 canceled)" in said, said


def record_days(instance: dg.DagsterInstance, dataset: str, days: int) -> None:
    """Each stage's recorded use on `days` days, as steps.day_metrics records it."""
    for stage in STAGES:
        for i in range(days):
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    asset_key=asset_key(dataset, stage),
                    partition=f"2024-01-{i + 1:02d}",
                    metadata={
                        sizing.PEAK_KEY: 900.0 + i,
                        "step_cpu_seconds": 1.0,
                        "step_wall_seconds": 2.0,
                    },
                )
            )


@pytest.fixture
def instance_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.delenv("ML_PLATFORM_CONTRACTS", raising=False)
    monkeypatch.delenv("ML_PLATFORM_DATASET", raising=False)
    return home


def test_resources_says_how_many_days_and_refuses_to_write_from_too_few(
    instance_home, tmp_path, capsys
):
    contract_path = tmp_path / "synthetic.yaml"
    contract_path.write_text((BUNDLED_DIR / "synthetic.yaml").read_text())
    before = contract_path.read_text()
    with dg.DagsterInstance.get() as instance:
        record_days(instance, "synthetic", 1)
    argv = ["resources", "--dataset", "synthetic", "--write", "--contract", str(contract_path)]

    code = cli.main(argv)

    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert contract_path.read_text() == before
    assert f"1 recorded day(s), fewer than the {sizing.ADVICE_MIN_DAYS}" in out, out
    assert f"at least {sizing.ADVICE_MIN_DAYS} recorded days" in err and "the most: 1" in err, err

    with dg.DagsterInstance.get() as instance:
        # The first day again (a rerun) and the days after it: a day counts once.
        record_days(instance, "synthetic", sizing.ADVICE_MIN_DAYS)
        uses = sizing.stage_uses(instance, load_contract("synthetic"), 30)
    assert {len(use.days) for use in uses} == {sizing.ADVICE_MIN_DAYS}
    assert cli.main(argv) == 0
    assert f"wrote the resources: section of {contract_path}" in capsys.readouterr().out
    assert contract_path.read_text() != before


def test_resources_write_advises_on_the_file_it_writes_keeping_its_bounds(
    instance_home, tmp_path, capsys
):
    # A copy being edited: its bound (4 GiB) is not the served contract's (8 GiB). The section
    # was advised on the served contract and written back with its bound, the user's lost.
    contract_path = tmp_path / "synthetic.yaml"
    text = (BUNDLED_DIR / "synthetic.yaml").read_text()
    contract_path.write_text(text.replace("max_memory_mb: 8192", "max_memory_mb: 4096"))
    with dg.DagsterInstance.get() as instance:
        record_days(instance, "synthetic", sizing.ADVICE_MIN_DAYS)
    argv = ["resources", "--dataset", "synthetic", "--write", "--contract", str(contract_path)]

    assert cli.main(argv) == 0, capsys.readouterr()

    written = load_contract(contract_path)
    assert written.resources.max_memory_mb == 4096
    assert "max_memory_mb: 8192" not in contract_path.read_text()


def test_an_https_url_for_a_plain_http_webserver_is_said_so_at_once_not_waited_for():
    # The webserver serves plain HTTP; ML_PLATFORM_DAGSTER_URL says https: the TLS handshake
    # fails on every try, and starting a UI (what "nothing answers" advises) does not mend it.
    server, url = serving([])
    https = url.replace("http://", "https://")
    try:
        with pytest.raises(LaunchError) as refused:
            Webserver(https).wait_until_up(5)
    finally:
        server.shutdown()
        server.server_close()
    assert Gateway.asked == 0
    message = str(refused.value)
    assert f"the server at {https} did not complete a TLS handshake" in message, message
    assert "no Dagster webserver answers" not in message, message
