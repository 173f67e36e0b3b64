"""Alerts: streaks of failures, recoveries, resets, dedup, retries, warning checks, delivery.

Webhook alerts are received by a real HTTP server on 127.0.0.1 and email by a real SMTP
server on 127.0.0.1, both in threads; runs are real runs in an ephemeral instance, and the
alert sensors (Dagster's run-status sensors and the delivery sensor) tick over them through
`SensorDefinition.evaluate_tick`, with their cursors carried as the daemon carries them.
"""

import dataclasses
import email
import http.server
import json
import logging
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pydantic
import pytest
import yaml

from ml_platform.automation.alert_sensors import (
    ALERT_DELIVERY_SENSOR,
    ALERT_DELIVERY_TAG,
    ALERTS_TAG,
    BACKFILL_TAG,
    DELIVERED,
    RUN_FAILURE_ALERTS_SENSOR,
    RUN_SUCCESS_ALERTS_SENSOR,
    backfill_summaries,
    build_alert_sensors,
    pending_alerts,
)
from ml_platform.automation.alerts import (
    Alert,
    DeliveryState,
    Notifier,
    dataset_of_job,
    evaluate_run,
)
from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.definitions import build_definitions
from ml_platform.platform.failures import (
    CODE_BUG,
    CONFIGURATION,
    DATA,
    DEPENDENCY_MISMATCH,
    FAILURE_CLASS_TAG,
    RESOURCE_EXHAUSTION,
    TRANSIENT_INFRASTRUCTURE,
    FailedCheck,
    StepFailure,
    classify_failure,
)
from ml_platform.platform.run_events import RunOutcome, run_outcome
from ml_platform.platform.settings import Settings
from ml_platform_tests.conftest import REPO
from ml_platform_tests.services import WebhookReceiver, WebhookServer, webhook_server

DAILY = dg.DailyPartitionsDefinition(start_date="2024-01-01")
BEHAVIOUR: dict[str, object] = {"fail": None, "drift": False}


@dg.asset(
    partitions_def=DAILY,
    check_specs=[
        dg.AssetCheckSpec("drift_ks", asset="scored"),
        dg.AssetCheckSpec("null_share", asset="scored", blocking=True),
    ],
)
def scored(context: dg.AssetExecutionContext):
    """A day's scores; fails, drifts or fails its blocking gate as the test says."""
    drift = bool(BEHAVIOUR["drift"])
    gate_fails = BEHAVIOUR["fail"] == "gate"
    yield dg.AssetCheckResult(
        check_name="null_share",
        passed=not gate_fails,
        severity=dg.AssetCheckSeverity.ERROR,
        description=(
            f"scored (partition {context.partition_key}): 12% of x1 is null, above 5%\n"
            "fix the upstream export, then rerun the day"
            if gate_fails
            else "no nulls"
        ),
    )
    yield dg.AssetCheckResult(
        check_name="drift_ks",
        passed=not drift,
        severity=dg.AssetCheckSeverity.WARN,
        description="x1 drifted from the reference: KS D=0.31 > 0.10" if drift else "no drift",
    )
    if BEHAVIOUR["fail"] == "data":
        raise dg.Failure(
            description=f"scored (partition {context.partition_key}) failed the gate: 12% nulls",
            allow_retries=False,
        )
    if BEHAVIOUR["fail"] == "software":
        raise RuntimeError("division by zero while scoring")
    yield dg.MaterializeResult()


@pytest.fixture
def webhook() -> Iterator[WebhookServer]:
    with webhook_server() as server:
        yield server


class SMTPHandler(socketserver.StreamRequestHandler):
    """The part of SMTP that smtplib's send_message speaks, without TLS or auth."""

    def handle(self):
        self.wfile.write(b"220 127.0.0.1 test SMTP\r\n")
        lines: list[bytes] = []
        in_data = False
        while line := self.rfile.readline():
            if in_data:
                if line.rstrip(b"\r\n") == b".":
                    self.server.messages.append(b"".join(lines))
                    lines, in_data = [], False
                    self.wfile.write(b"250 queued\r\n")
                else:
                    lines.append(line)
                continue
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                self.wfile.write(b"250 127.0.0.1\r\n")
            elif verb == b"DATA":
                in_data = True
                self.wfile.write(b"354 go ahead\r\n")
            elif verb == b"QUIT":
                self.wfile.write(b"221 bye\r\n")
                return
            else:
                self.wfile.write(b"250 ok\r\n")


@pytest.fixture
def smtp_server() -> Iterator[socketserver.ThreadingTCPServer]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), SMTPHandler)
    server.messages = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


class AlertSensors:
    """The alert sensors over an instance, each ticked in turn as the daemon ticks them."""

    def __init__(self, instance: dg.DagsterInstance, notifier: Notifier):
        self.instance = instance
        self.notifier = notifier
        self.sensors = build_alert_sensors(minimum_interval_seconds=0)
        self.cursors: dict[str, str | None] = {s.name: None for s in self.sensors}
        self.tick()  # the first tick only marks where alerting starts

    def tick(self) -> dict[str, Any]:
        """One tick of each sensor; fails on an error the sensor reported for a run."""
        results = {}
        for sensor in self.sensors:
            context = dg.build_sensor_context(
                instance=self.instance,
                cursor=self.cursors[sensor.name],
                resources={"notifier": self.notifier},
            )
            data = sensor.evaluate_tick(context)
            errors = [r.error for r in data.dagster_run_reactions or [] if r.error]
            assert not errors, errors
            self.cursors[sensor.name] = data.cursor
            results[sensor.name] = data
        return results


class Scene:
    """Runs of a named job in one instance, and the alert sensors ticking after them."""

    def __init__(self, tmp_path, notifier: Notifier):
        self.defs = dg.Definitions(
            assets=[scored],
            jobs=[dg.define_asset_job("scoring_job", selection=[scored])],
            resources={"io_manager": dg.FilesystemIOManager(base_dir=str(tmp_path / "io"))},
        )
        self.job = self.defs.resolve_job_def("scoring_job")
        self.instance = dg.DagsterInstance.ephemeral()
        self.notifier = notifier
        self.alerts = AlertSensors(self.instance, notifier)

    def run(self, day="2024-01-05", fail=None, drift=False, tags=None) -> str:
        BEHAVIOUR.update(fail=fail, drift=drift)
        result = self.job.execute_in_process(
            partition_key=day, instance=self.instance, raise_on_error=False, tags=tags
        )
        assert result.success == (fail is None)
        return result.run_id

    def tick(self) -> dict[str, Any]:
        return self.alerts.tick()


@pytest.fixture
def scene(tmp_path, webhook):
    notifier = Notifier(webhook_url=f"http://127.0.0.1:{webhook.server_port}/hooks/alerts")
    yield Scene(tmp_path, notifier)
    BEHAVIOUR.update(fail=None, drift=False)


def alerts_of(webhook) -> list[dict]:
    return [body["ml_platform_alert"] for body in webhook.received]


def test_three_consecutive_failures_send_exactly_one_critical_alert(scene, webhook, caplog):
    runs = []
    with caplog.at_level(logging.ERROR, logger="ml_platform.alerts"):
        for _ in range(3):
            runs.append(scene.run(fail="data"))
            scene.tick()

    [alert] = alerts_of(webhook)
    assert alert["severity"] == "CRITICAL"
    assert alert["rule"] == "failure_streak"
    assert alert["title"] == "job scoring_job and asset scored failed 3 times in a row"
    assert alert["run_id"] == runs[2]
    assert alert["partition"] == "2024-01-05"
    assert alert["failure_class"] == DATA
    assert alert["cause"] == "scored (partition 2024-01-05) failed the gate: 12% nulls"
    assert alert["run_url"] == f"http://127.0.0.1:3000/runs/{runs[2]}"
    assert alert["runbook"] == "docs/runbook.md#failed-3-times-in-a-row"
    assert webhook.received[0]["text"].startswith("[CRITICAL] job scoring_job and asset scored")
    # Each failed run is still a JSON log line (level ERROR), though none paged anyone.
    logged = [json.loads(r.getMessage())["alert"] for r in caplog.records]
    assert [a["rule"] for a in logged].count("run_failed") == 1  # the same failure, deduplicated
    assert any(a["rule"] == "failure_streak" for a in logged)

    scene.run(fail="data", day="2024-01-06")
    scene.tick()
    assert len(webhook.received) == 1  # a fourth failure does not page again


def test_a_success_resets_the_streak(scene, webhook):
    for fail in ["software", "software", None, "software", "software"]:
        scene.run(fail=fail)
        scene.tick()
    assert webhook.received == []

    scene.run(fail="software")
    scene.tick()
    [alert] = alerts_of(webhook)
    assert alert["severity"] == "CRITICAL"
    assert alert["failure_class"] == CODE_BUG
    assert alert["cause"] == "division by zero while scoring"
    assert alert["runbook"].endswith("#failed-3-times-in-a-row")


def test_a_failed_blocking_check_alert_names_the_check_and_its_reason(scene, webhook):
    for _ in range(3):
        scene.run(fail="gate")
        scene.tick()

    [alert] = alerts_of(webhook)
    assert alert["rule"] == "failure_streak" and alert["failure_class"] == DATA
    # Not Dagster's "1 blocking asset check failed with ERROR severity:", which names no check.
    assert alert["cause"] == (
        "check scored:null_share failed: scored (partition 2024-01-05): 12% of x1 is null, above 5%"
    )
    assert "Cause: check scored:null_share failed: scored (partition" in webhook.received[0]["text"]


def test_a_retried_run_counts_once_and_evaluating_in_one_tick_changes_nothing(scene, webhook):
    first = scene.run(fail="data")
    # A run retry (what the run-retry daemon or "Re-execute" creates) shares the root run.
    scene.run(fail="data", tags={"dagster/root_run_id": first, "dagster/parent_run_id": first})
    scene.run(fail="data", day="2024-01-06")
    scene.tick()  # all three at once
    assert webhook.received == []

    scene.run(fail="data", day="2024-01-07")
    scene.tick()
    assert [a["severity"] for a in alerts_of(webhook)] == ["CRITICAL"]


def test_identical_warnings_are_sent_once_within_the_window(scene, webhook):
    scene.run(drift=True)
    scene.tick()
    scene.run(drift=True)  # the same day again: the same warning
    scene.tick()
    scene.run(drift=True, day="2024-01-06")  # another day: news
    scene.tick()

    alerts = alerts_of(webhook)
    assert [(a["severity"], a["partition"]) for a in alerts] == [
        ("WARNING", "2024-01-05"),
        ("WARNING", "2024-01-06"),
    ]
    assert alerts[0]["rule"] == "check_failed"
    assert alerts[0]["subject"] == "scored:drift_ks"
    assert alerts[0]["cause"] == "x1 drifted from the reference: KS D=0.31 > 0.10"
    assert alerts[0]["runbook"] == "docs/runbook.md#warning-check"
    assert alerts[0]["failure_class"] is None


def test_a_failing_webhook_is_retried_on_the_next_tick_without_duplicates(scene, webhook):
    webhook.fail_next = 1
    for _ in range(3):
        scene.run(fail="data")
    first = scene.tick()[ALERT_DELIVERY_SENSOR]
    assert webhook.received == [] and webhook.refused == 1
    assert "1 awaiting delivery" in str(first.skip_message)

    # No run finishes in between: the delivery sensor retries by itself.
    scene.tick()
    last = scene.tick()[ALERT_DELIVERY_SENSOR]
    assert [a["severity"] for a in alerts_of(webhook)] == ["CRITICAL"]
    assert "0 awaiting delivery" in str(last.skip_message)


def test_a_run_deleted_while_its_alerts_go_out_is_delivered_once(scene, webhook):
    # Someone deletes the failed run in the UI as its page goes out: marking it delivered
    # failed the tick, which then kept no cursor, and the next tick paged again.
    for _ in range(3):
        run_id = scene.run(fail="data")
    webhook.on_post = lambda: scene.instance.delete_run(run_id)

    for _ in range(3):
        scene.tick()

    assert [a["severity"] for a in alerts_of(webhook)] == ["CRITICAL"]
    assert scene.instance.get_run_by_id(run_id) is None


def test_the_failure_sensor_handles_a_failed_run_once(tmp_path, webhook):
    # A streak of one: every failed run pages, so a run handled twice would page twice.
    url = f"http://127.0.0.1:{webhook.server_port}/hooks/alerts"
    scene = Scene(tmp_path, Notifier(webhook_url=url, failure_streak=1))
    try:
        run_id = scene.run(fail="data")
        ticks = [scene.tick() for _ in range(3)]
    finally:
        BEHAVIOUR.update(fail=None)

    [alert] = alerts_of(webhook)
    assert (alert["severity"], alert["run_id"]) == ("CRITICAL", run_id)
    assert alert["title"] == "job scoring_job and asset scored failed 1 times in a row"
    assert [len(t[RUN_FAILURE_ALERTS_SENSOR].dagster_run_reactions) for t in ticks] == [1, 0, 0]
    tags = scene.instance.get_run_by_id(run_id).tags
    assert tags[FAILURE_CLASS_TAG] == DATA
    assert tags[ALERT_DELIVERY_TAG] == DELIVERED
    raised = json.loads(tags[ALERTS_TAG])
    assert [(a["rule"], a["page"]) for a in raised] == [
        ("run_failed", False),
        ("failure_streak", True),
    ]


def test_a_recovery_is_announced_once(scene, webhook):
    for _ in range(3):
        scene.run(fail="software")
    scene.tick()
    recovery = scene.run(day="2024-01-06")
    scene.tick()
    scene.run(day="2024-01-07")
    scene.tick()

    critical, resolved = alerts_of(webhook)
    assert critical["severity"] == "CRITICAL"
    assert resolved["severity"] == "RESOLVED" and resolved["rule"] == "recovered"
    assert resolved["title"] == (
        "job scoring_job and asset scored recovered after failing 3 or more times in a row"
    )
    assert (resolved["run_id"], resolved["partition"]) == (recovery, "2024-01-06")
    assert resolved["cause"] == "the run succeeded"
    assert resolved["runbook"] == "docs/runbook.md#failed-3-times-in-a-row"
    assert webhook.received[1]["text"].startswith("[RESOLVED] job scoring_job and asset scored")


def test_a_short_streak_ends_without_an_announcement(scene, webhook):
    for fail in ["software", "software", None]:
        scene.run(fail=fail)
    scene.tick()
    assert webhook.received == []


def test_a_failed_warning_check_on_a_successful_run_pages(scene, webhook):
    run_id = scene.run(drift=True)
    ticks = scene.tick()

    [alert] = alerts_of(webhook)
    assert (alert["severity"], alert["rule"], alert["run_id"]) == (
        "WARNING",
        "check_failed",
        run_id,
    )
    assert alert["title"] == "check drift_ks on scored failed"
    # The success sensor raised it; the failure sensor saw no failed run.
    assert len(ticks[RUN_SUCCESS_ALERTS_SENSOR].dagster_run_reactions) == 1
    assert ticks[RUN_FAILURE_ALERTS_SENSOR].dagster_run_reactions == []
    assert FAILURE_CLASS_TAG not in scene.instance.get_run_by_id(run_id).tags


def test_an_asset_streak_counts_its_failures_in_any_job(scene, webhook):
    scene.run(fail="data")
    scene.run(fail="data", day="2024-01-06")
    BEHAVIOUR.update(fail="data")
    # The third failure is an ad-hoc materialisation: the job's streak stays at 2.
    adhoc = dg.materialize(
        [scored],
        partition_key="2024-01-07",
        instance=scene.instance,
        resources=scene.defs.resources,
        raise_on_error=False,
    )
    assert not adhoc.success
    scene.tick()

    [alert] = alerts_of(webhook)
    assert alert["title"] == "asset scored failed 3 times in a row"
    assert alert["run_id"] == adhoc.run_id


def test_streaks_are_counted_from_the_runs_whatever_the_sensors_remember(scene, webhook):
    scene.run(fail="data")
    scene.run(fail="data")
    scene.tick()
    # Sensors turned off and on again (their cursors reset): the instance's runs still count.
    scene.alerts = AlertSensors(scene.instance, scene.notifier)
    scene.run(fail="data")
    scene.tick()

    [alert] = alerts_of(webhook)
    assert alert["title"] == "job scoring_job and asset scored failed 3 times in a row"


def test_critical_alert_by_email(tmp_path, smtp_server):
    notifier = Notifier(
        smtp_host="127.0.0.1",
        smtp_port=smtp_server.server_address[1],
        smtp_starttls=False,
        email_to="oncall@example.org, ml@example.org",
    )
    scene = Scene(tmp_path, notifier)
    try:
        for _ in range(3):
            scene.run(fail="data")
        scene.tick()
    finally:
        BEHAVIOUR.update(fail=None)

    [raw] = smtp_server.messages
    message = email.message_from_bytes(raw)
    assert (
        message["Subject"] == "[CRITICAL] job scoring_job and asset scored failed 3 times in a row"
    )
    assert message["To"] == "oncall@example.org, ml@example.org"
    body = message.get_payload(decode=True).decode()
    assert "Runbook: docs/runbook.md#failed-3-times-in-a-row" in body
    assert "Partition: 2024-01-05" in body


def paging_alert() -> Alert:
    """A CRITICAL alert that goes to every sink configured."""
    return Alert(
        severity="CRITICAL",
        rule="failure_streak",
        title="scoring_job failed 3 times in a row",
        cause="ValueError",
        subject="scoring_job",
        failure_class=CODE_BUG,
        run_id="r1",
        partition=None,
        run_url=None,
        runbook="docs/runbook.md#failed-3-times-in-a-row",
        page=True,
        occurred_at=0.0,
    )


@pytest.mark.parametrize(
    "url",
    [
        "hooks.example.org/services/T0/B0/SECRET",
        "https://hooks.example.org:https/services/SECRET",
        "https:///services/SECRET",
        "https://hooks.example.org/services/SECRET\n",
    ],
    ids=["no scheme", "port not a number", "no host", "a newline pasted with it"],
)
def test_a_webhook_url_that_cannot_work_is_said_once_and_email_still_goes(smtp_server, caplog, url):
    notifier = Notifier(
        webhook_url=url,
        smtp_host="127.0.0.1",
        smtp_port=smtp_server.server_address[1],
        smtp_starttls=False,
        email_to="oncall@example.org",
    )
    alert = paging_alert()
    with caplog.at_level(logging.INFO):
        state = notifier.deliver([alert], DeliveryState(), logging.getLogger("test"), now=0.0)

    # The email went; the webhook is not queued for a retry no wait can make succeed.
    assert len(smtp_server.messages) == 1
    assert state.outbox == []
    [said] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "webhook not sent: ML_PLATFORM_ALERT_WEBHOOK_URL is not a webhook URL" in said
    assert "docs/runbook.md#alert-delivery-failed" in said
    # The URL is a secret: no record repeats any of it.
    assert "SECRET" not in caplog.text and "hooks.example.org" not in caplog.text


class NotHTTP(socketserver.StreamRequestHandler):
    """A receiver that reads the request and answers something that is not HTTP."""

    def handle(self):
        self.rfile.readline()
        self.wfile.write(b"220 not a web server\r\n\r\n")


def test_a_webhook_that_answers_something_else_than_http_is_retried_without_its_url(caplog):
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), NotHTTP)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/services/SECRET"
    alert = paging_alert()
    try:
        with caplog.at_level(logging.INFO):
            state = Notifier(webhook_url=url).deliver(
                [alert], DeliveryState(), logging.getLogger("test"), now=0.0
            )
    finally:
        server.shutdown()
        server.server_close()

    # A receiver can answer properly on a later tick: the alert waits in the outbox.
    assert [entry["sinks"] for entry in state.outbox] == [["webhook"]]
    [said] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "webhook delivery failed (attempt 1 of 5): BadStatusLine" in said
    assert "SECRET" not in caplog.text


class Answering(http.server.BaseHTTPRequestHandler):
    """A webhook receiver that answers every post with the server's `status` and `body`."""

    server: "AnsweringServer"

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts += 1
        self.send_response(self.server.status)
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, *args):
        pass


class AnsweringServer(http.server.ThreadingHTTPServer):
    status: int
    body: bytes
    posts: int


def delivered_over_five_ticks(
    notifier: Notifier, caplog: pytest.LogCaptureFixture
) -> DeliveryState:
    """One paging alert delivered, then the delivery sensor's next four ticks, logs captured.

    What a sink that refuses for good must meet: nothing left to try again on those ticks.
    """
    with caplog.at_level(logging.INFO):
        state = notifier.deliver(
            [paging_alert()], DeliveryState(), logging.getLogger("test"), now=0.0
        )
        for tick in range(1, 5):
            state = notifier.deliver([], state, logging.getLogger("test"), now=float(tick))
    return state


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (404, b"no_service", "HTTP 404 Not Found (no_service): ML_PLATFORM_ALERT_WEBHOOK_URL was"),
        (
            403,
            b"invalid_token",
            "HTTP 403 Forbidden (invalid_token): ML_PLATFORM_ALERT_WEBHOOK_URL",
        ),
        (410, b"channel_is_archived", "HTTP 410 Gone (channel_is_archived): ML_PLATFORM_ALERT"),
        # A receiver's page may quote the request, whose path is the secret: not repeated.
        (404, b"Cannot POST /services/T000/B000/SECRET", "HTTP 404 Not Found: ML_PLATFORM_ALERT"),
        (400, b"invalid_payload", "HTTP 400 Bad Request (invalid_payload): the receiver refuses"),
    ],
    ids=["revoked", "bad token", "archived channel", "a page quoting the path", "bad payload"],
)
def test_a_webhook_that_refuses_for_good_is_said_once_and_not_retried(caplog, status, body, said):
    server = AnsweringServer(("127.0.0.1", 0), Answering)
    server.status, server.body, server.posts = status, body, 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    notifier = Notifier(webhook_url=f"http://127.0.0.1:{server.server_port}/services/B000/SECRET")
    try:
        state = delivered_over_five_ticks(notifier, caplog)
    finally:
        server.shutdown()
        server.server_close()

    assert server.posts == 1
    assert state.outbox == []
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert f"webhook not sent: the webhook answered {said}" in error
    assert error.endswith("fix the setting, see docs/runbook.md#alert-delivery-failed")
    assert "SECRET" not in caplog.text and "B000" not in caplog.text


@pytest.mark.parametrize("status", [408, 429, 500, 503])
def test_a_webhook_that_may_answer_later_is_retried(caplog, status):
    server = AnsweringServer(("127.0.0.1", 0), Answering)
    server.status, server.body, server.posts = status, b"later", 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    notifier = Notifier(webhook_url=f"http://127.0.0.1:{server.server_port}/services/SECRET")
    state = DeliveryState()
    try:
        with caplog.at_level(logging.INFO):
            for tick, alerts in enumerate([[paging_alert()], [], [], [], [], []]):
                state = notifier.deliver(alerts, state, logging.getLogger("test"), now=float(tick))
    finally:
        server.shutdown()
        server.server_close()

    assert server.posts == 5  # MAX_DELIVERY_ATTEMPTS, then given up
    assert state.outbox == []
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert f"webhook delivery failed (attempt 1 of 5): HTTPError: HTTP Error {status}" in errors[0]
    assert "given up on webhook after 5 attempts" in errors[-1]
    assert "SECRET" not in caplog.text


class Hanging(socketserver.StreamRequestHandler):
    """A receiver that takes a request and never answers it (until the test ends)."""

    server: "HangingServer"

    def handle(self):
        self.server.requests += 1
        self.rfile.readline()
        self.server.released.wait(30)


class HangingServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    requests: int
    released: threading.Event


def paging_alerts(count: int) -> list[Alert]:
    """`count` paging alerts about different jobs: none is a duplicate of another."""
    return [
        dataclasses.replace(paging_alert(), title=f"job_{n} failed 3 times", subject=f"job_{n}")
        for n in range(count)
    ]


def test_a_hanging_webhook_costs_one_timeout_a_tick_and_keeps_every_alert(caplog, webhook):
    hanging = HangingServer(("127.0.0.1", 0), Hanging)
    hanging.requests, hanging.released = 0, threading.Event()
    threading.Thread(target=hanging.serve_forever, daemon=True).start()
    notifier = Notifier(
        webhook_url=f"http://127.0.0.1:{hanging.server_address[1]}/hook", timeout_seconds=0.5
    )
    try:
        with caplog.at_level(logging.INFO):
            state = notifier.deliver(
                paging_alerts(6), DeliveryState(), logging.getLogger("test"), now=0.0
            )
    finally:
        hanging.released.set()
        hanging.shutdown()
        hanging.server_close()

    # One post waited out its timeout; the five after it were not tried on this tick, so a
    # tick stays far within Dagster's limit however many alerts a hanging sink has.
    assert hanging.requests == 1
    assert [entry["attempts"] for entry in state.outbox] == [1, 0, 0, 0, 0, 0]
    assert "5 alert(s) wait for the next tick on webhook: webhook failed on this tick" in (
        caplog.text
    )

    # The receiver answers again (here: another one, as after a fix of its URL): the next
    # tick sends all six, each once, and logs none of them again.
    caplog.clear()
    answering = notifier.model_copy(update={"webhook_url": webhook.url})
    with caplog.at_level(logging.INFO):
        state = answering.deliver([], state, logging.getLogger("test"), now=1.0)
    assert state.outbox == []
    assert sorted(a["ml_platform_alert"]["subject"] for a in webhook.received) == [
        f"job_{n}" for n in range(6)
    ]
    assert "failed 3 times" not in caplog.text


class SlowReceiver(WebhookReceiver):
    """The webhook receiver, answering each post after 0.3 s."""

    def do_POST(self):
        time.sleep(0.3)
        super().do_POST()


def test_a_tick_sends_for_its_budget_and_leaves_the_rest_for_the_next_ticks(caplog):
    server = WebhookServer(("127.0.0.1", 0), SlowReceiver)
    server.received, server.fail_next, server.refused = [], 0, 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    notifier = Notifier(webhook_url=server.url, delivery_seconds=0.5)
    try:
        with caplog.at_level(logging.INFO):
            state = notifier.deliver(
                paging_alerts(5), DeliveryState(), logging.getLogger("test"), now=0.0
            )
            first_tick = len(server.received)
            for tick in range(1, 6):
                state = notifier.deliver([], state, logging.getLogger("test"), now=float(tick))
    finally:
        server.shutdown()
        server.server_close()

    assert 1 <= first_tick < 5
    assert "alert(s) wait for the next tick on webhook: this tick's 0.5 s of sending" in (
        caplog.text
    )
    # Waiting used none of an alert's attempts: every one arrives, once.
    assert state.outbox == []
    assert sorted(a["ml_platform_alert"]["subject"] for a in server.received) == [
        f"job_{n}" for n in range(5)
    ]


class RefusingLogin(socketserver.StreamRequestHandler):
    """An SMTP server that offers AUTH PLAIN and refuses every login, as to a wrong password."""

    def handle(self):
        self.wfile.write(b"220 127.0.0.1 test SMTP\r\n")
        while line := self.rfile.readline():
            verb = line[:4].upper()
            if verb == b"EHLO":
                self.wfile.write(b"250-127.0.0.1\r\n250 AUTH PLAIN\r\n")
            elif verb == b"AUTH":
                self.server.logins += 1
                self.wfile.write(b"535 5.7.8 Authentication credentials invalid\r\n")
            elif verb == b"QUIT":
                self.wfile.write(b"221 bye\r\n")
                return
            else:
                self.wfile.write(b"250 ok\r\n")


def test_a_refused_smtp_login_is_said_once_and_not_retried(caplog, webhook):
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), RefusingLogin)
    server.logins = 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    notifier = Notifier(
        webhook_url=webhook.url,
        smtp_host="127.0.0.1",
        smtp_port=server.server_address[1],
        smtp_starttls=False,
        smtp_user="alerts",
        smtp_password="wrong-Pa55word",
        email_to="oncall@example.org",
    )
    try:
        state = delivered_over_five_ticks(notifier, caplog)
    finally:
        server.shutdown()
        server.server_close()

    # Retrying a wrong password cannot help, and may lock the account: one login, said once.
    assert server.logins == 1
    assert state.outbox == []
    assert len(webhook.received) == 1  # the webhook is not held up by it
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "email not sent: the SMTP server refused the login (535 5.7.8 Authentication " in error
    assert "check ML_PLATFORM_SMTP_USER and ML_PLATFORM_SMTP_PASSWORD" in error
    assert "wrong-Pa55word" not in caplog.text


def test_an_smtp_server_without_starttls_is_said_once_and_not_retried(caplog, webhook, smtp_server):
    # A server on the port of plain SMTP that offers no STARTTLS, as the platform's default
    # asks: the password would go in clear, and no later attempt changes the server's offer.
    notifier = Notifier(
        webhook_url=webhook.url,
        smtp_host="127.0.0.1",
        smtp_port=smtp_server.server_address[1],
        email_to="oncall@example.org",
    )

    state = delivered_over_five_ticks(notifier, caplog)

    assert state.outbox == []
    assert smtp_server.messages == []
    assert len(webhook.received) == 1  # the webhook is not held up by it
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "email not sent: the SMTP server offers no STARTTLS" in error
    assert "ML_PLATFORM_SMTP_STARTTLS" in error


def test_a_missing_landed_file_is_a_recorded_verdict_alerted_as_its_failed_check(platform_for):
    platform = platform_for("synthetic")
    # The landing zone is there; the day's file never landed (a zone that is not there at all
    # is a configuration failure, not a verdict of the day).
    platform.landing_dir.mkdir(parents=True)
    result = platform.materialize("2024-01-05")
    # A data verdict is an outcome of the day, not a failure of the run.
    assert result.success
    types = {e.event_type_value for e in result.all_events}
    assert "STEP_UP_FOR_RETRY" not in types  # not retried: waiting will not land the file
    assert "STEP_FAILURE" not in types

    [record] = result.asset_materializations_for_node(platform.node("raw_data"))
    metadata = {name: entry.value for name, entry in record.metadata.items()}
    assert metadata["verdict"] == "missing file"
    assert metadata["accepted"] is False and metadata["accepted_rows"] == 0
    assert metadata["reason"].startswith("No landed file for partition 2024-01-05: expected ")
    assert not platform.stored("raw_data", "2024-01-05", "parquet").exists()
    [validated] = result.asset_materializations_for_node(platform.node("validated_data"))
    assert validated.metadata["verdict"].value == "no accepted input"
    assert "synthetic/raw_data 2024-01-05 was rejected (missing file)" in (
        validated.metadata["reason"].value
    )

    outcome = run_outcome(platform.instance, result.run_id, succeeded=True)
    assert outcome is not None and outcome.step_failures == []
    schema = next(c for c in outcome.failed_checks if c.check == "raw_schema")
    assert (schema.asset, schema.severity) == ("synthetic/raw_data", "ERROR")
    assert schema.description.startswith("No landed file for partition 2024-01-05: expected ")
    assert schema.partition == "2024-01-05" and "synthetic_2024-01-05.csv" in schema.description
    # The rejected day is one alert, its delivery check's, which names the file, the day and
    # why; the failed raw_schema check is its reason, not an alert of its own. No run failed.
    [alert] = evaluate_run(outcome, {}, Notifier(), now=0.0)
    assert (alert.rule, alert.severity, alert.page) == ("day_rejected", "WARNING", True)
    assert alert.subject == "synthetic/validated_data:delivery_accepted"
    assert (alert.partition, alert.failure_class) == ("2024-01-05", None)
    assert alert.title == "synthetic: the delivery of 2024-01-05 was rejected"
    assert "(missing file): No landed file for partition 2024-01-05: expected " in alert.cause
    assert "synthetic_2024-01-05.csv" in alert.cause
    assert alert.runbook == "docs/runbook.md#rejected-day"


def test_classifier_tells_the_six_classes_apart():
    gate = FailedCheck("validated_data", "gx_validity", "ERROR", "3 rows out of range")
    warn = FailedCheck("features", "drift_ks", "WARN", "drift")
    crash = StepFailure("model", "ValueError", "bad shape", user_failure=False)
    stop = StepFailure("raw_data", "Failure", "schema mismatch", user_failure=True)
    missing = StepFailure("raw_data", "MissingLandingFileError", "no file", user_failure=False)
    disk = StepFailure(
        "features", "OSError", "[Errno 28] No space left on device", user_failure=False
    )
    wrapped = StepFailure(
        "raw_data",
        "StorageError",
        "could not read",
        user_failure=False,
        chain=("StorageError: could not read", "ConnectionRefusedError: [Errno 111] refused"),
        attempts=4,
    )
    conflict = StepFailure(
        "model", "RuntimeError", "version conflict: numpy 1.26 installed", user_failure=False
    )
    read_only = StepFailure(
        "validated_data", "OSError", "[Errno 30] Read-only file system", user_failure=False
    )

    assert classify_failure([crash], [gate]).failure_class == DATA
    assert classify_failure([stop], []).failure_class == DATA
    assert classify_failure([missing], []).failure_class == DATA
    assert classify_failure([disk], []).failure_class == RESOURCE_EXHAUSTION
    verdict = classify_failure([wrapped], [])
    assert verdict.failure_class == TRANSIENT_INFRASTRUCTURE
    assert "after 4 attempts" in verdict.reason
    assert classify_failure([conflict], []).failure_class == DEPENDENCY_MISMATCH
    assert classify_failure([read_only], []).failure_class == CONFIGURATION
    killed = classify_failure([], [], "run worker exited with code 137")
    assert killed.failure_class == RESOURCE_EXHAUSTION
    assert killed.reason.startswith("the run process died") and killed.steps == ()
    # A distributed engine's worker killed mid-step: no step failure, the step never ended.
    engine = (
        "During celery execution errors occurred in workers:\n[flights__model]: "
        "billiard.exceptions.WorkerLostError: Worker exited prematurely: signal 9 (SIGKILL)"
    )
    worker = classify_failure([], [], engine, ["flights__model"])
    assert worker.failure_class == RESOURCE_EXHAUSTION
    assert worker.steps == ("flights__model",)
    assert worker.reason.startswith("flights__model did not finish: the process running it")
    assert worker.reason.endswith(
        "[flights__model]: billiard.exceptions.WorkerLostError: "
        "Worker exited prematurely: signal 9 (SIGKILL)"
    )
    ecs = StepFailure(
        "flights__model",
        "Failure",
        "Task stopped: OutOfMemoryError: Container killed due to memory usage",
        user_failure=False,
    )
    assert classify_failure([ecs], []).failure_class == RESOURCE_EXHAUSTION
    lost = classify_failure([], [], "Worker exited prematurely: exitcode 1", ["flights__model"])
    assert lost.failure_class == CODE_BUG  # not memory unless something says so
    assert classify_failure([crash], [warn]).failure_class == CODE_BUG
    assert classify_failure([], []).failure_class == CODE_BUG


def test_notifier_takes_secrets_from_the_environment_as_env_vars(monkeypatch):
    monkeypatch.setenv("ML_PLATFORM_ALERT_WEBHOOK_URL", "https://hooks.example/T000/secret")
    monkeypatch.setenv("ML_PLATFORM_SMTP_PORT", "2525")
    monkeypatch.setenv("ML_PLATFORM_UI_URL", "http://dagster.internal:3000")
    monkeypatch.delenv("ML_PLATFORM_SMTP_HOST", raising=False)

    notifier = Notifier(**Settings().notifier_config)

    assert notifier.webhook_url == dg.EnvVar("ML_PLATFORM_ALERT_WEBHOOK_URL")
    assert notifier.smtp_port == dg.EnvVar.int("ML_PLATFORM_SMTP_PORT")
    assert notifier.smtp_host is None
    resolved = notifier.process_config_and_initialize()
    assert resolved.webhook_url == "https://hooks.example/T000/secret"
    assert resolved.smtp_port == 2525
    assert resolved.run_url("abc") == "http://dagster.internal:3000/runs/abc"
    assert resolved.paging_sinks() == ["webhook"]


def test_every_check_and_failure_class_links_an_existing_runbook_section(tmp_path):
    from ml_platform.contracts import load_contract
    from ml_platform.definitions import build_definitions
    from ml_platform.platform.failures import RUNBOOK_ANCHORS
    from ml_platform.platform.runbook import RUNBOOK_PATH, check_anchor

    runbook = (REPO / "docs" / "runbook.md").read_text()
    headings = {
        line[3:].strip().lower().replace(" ", "-")
        for line in runbook.splitlines()
        if line.startswith("## ")
    }
    defs = build_definitions(
        load_contract("flights"), landing_dir=str(tmp_path), lake_dir=str(tmp_path)
    )
    graph = defs.resolve_asset_graph()
    specs = [graph.get_check_spec(key) for key in graph.asset_check_keys]
    from ml_platform.platform.runbook import CHECK_SECTIONS

    assert {spec.name for spec in specs} == CHECK_SECTIONS
    for spec in specs:
        anchor = check_anchor(spec.name)
        assert anchor in headings, spec.name
        assert f"{RUNBOOK_PATH}#{anchor}" in (spec.description or ""), spec.name
    for anchor in [
        *RUNBOOK_ANCHORS.values(),
        "warning-check",
        "failed-3-times-in-a-row",
        "landing-file-fits-no-partition",
        "alert-delivery-failed",
        "rerun-failed-days",
        "data-did-not-arrive",
    ]:
        assert anchor in headings, anchor


def test_only_the_rejection_streak_pages_a_rejected_candidate_is_logged():
    outcome = RunOutcome(
        run_id="run-3",
        root_run_id="run-3",
        job_name="daily_pipeline_job",
        partition="2024-01-03",
        succeeded=True,
        step_failures=[],
        succeeded_steps=["evaluation_report", "registered_model"],
        failed_checks=[
            FailedCheck("evaluation_report", "promotion_verdict", "WARN", "reject: r2 0.9 misses"),
            FailedCheck(
                "registered_model",
                "rejection_streak",
                "WARN",
                "3 candidates in a row were rejected (2024-01-01 to 2024-01-03)",
            ),
        ],
        run_message="",
    )

    alerts = evaluate_run(outcome, {}, Notifier(), now=0.0)

    by_check = {a.subject: a for a in alerts}
    assert set(by_check) == {
        "evaluation_report:promotion_verdict",
        "registered_model:rejection_streak",
    }
    streak = by_check["registered_model:rejection_streak"]
    assert (streak.rule, streak.severity, streak.page) == ("check_failed", "WARNING", True)
    assert streak.runbook == "docs/runbook.md#check-rejection_streak"
    assert streak.cause.startswith("3 candidates in a row were rejected")
    assert by_check["evaluation_report:promotion_verdict"].page is False


def test_a_failed_run_announces_the_recovery_of_a_step_that_now_succeeds():
    outcome = RunOutcome(
        run_id="run-9",
        root_run_id="run-9",
        job_name="daily_pipeline_job",
        partition="2024-01-09",
        succeeded=False,
        step_failures=[StepFailure("model", "ValueError", "bad shape", user_failure=False)],
        succeeded_steps=["raw_data"],
        failed_checks=[],
        run_message="",
    )
    streaks = {"job daily_pipeline_job": 1, "asset model": 1, "asset raw_data": 3}

    alerts = evaluate_run(outcome, streaks, Notifier(), now=0.0)

    assert [(a.severity, a.rule) for a in alerts] == [
        ("RESOLVED", "recovered"),
        ("ERROR", "run_failed"),
    ]
    resolved = alerts[0]
    assert resolved.subject == "asset raw_data" and resolved.page
    assert resolved.cause == "step(s) raw_data succeeded"
    # A streak that never reached the threshold ends silently.
    assert evaluate_run(outcome, {**streaks, "asset raw_data": 2}, Notifier(), 0.0)[0].rule == (
        "run_failed"
    )


def test_a_rejected_day_warns_once_pages_at_the_streak_and_a_backfill_leaves_it_to_its_summary():
    from ml_platform.platform.failures import FailedCheck

    day = "2024-01-03"
    reason = f"{day} was rejected (failed quality gate): x2 has 31% missing values"
    outcome = RunOutcome(
        run_id="r1",
        root_run_id="r1",
        job_name="synthetic_daily_pipeline_job",
        partition=day,
        succeeded=True,
        step_failures=[],
        succeeded_steps=["synthetic__validated_data"],
        failed_checks=[
            FailedCheck("synthetic/validated_data", "gx_completeness", "ERROR", "x2: 31%", day),
            FailedCheck("synthetic/validated_data", "delivery_accepted", "ERROR", reason, day),
        ],
        run_message="",
    )
    notifier = Notifier()

    def told(in_a_row: int, in_backfill: bool = False) -> list[tuple[str, str]]:
        alerts = evaluate_run(
            outcome, {}, notifier, 0.0, {("synthetic", day): in_a_row}, in_backfill
        )
        assert all(a.partition == day and a.cause == reason for a in alerts)
        assert all(a.runbook.endswith("#rejected-day") for a in alerts)
        return [(a.severity, a.rule) for a in alerts]

    # One warning for the day; its failed gate is the reason, not an alert of its own.
    assert told(1) == [("WARNING", "day_rejected")]
    # Counted by day: the third rejected day in a row pages, once.
    assert told(3) == [("WARNING", "day_rejected"), ("CRITICAL", "rejected_streak")]
    assert told(4) == [("WARNING", "day_rejected")]
    # A backfill's runs leave their rejected days to the backfill's one summary.
    assert told(3, in_backfill=True) == []


def test_a_job_backfills_rejected_day_is_told_in_its_summary(platform_for):
    platform = platform_for("synthetic")
    platform.land("2024-01-01", 1)  # 2024-01-02 never lands: the day is rejected
    # The code location's notifier, which knows every dataset (the contracts' owners).
    notifier = platform.defs.resources["notifier"]
    sensors = AlertSensors(platform.instance, notifier)
    # What `dagster job backfill -j synthetic_ingestion_job` launches: the whole job, a run a
    # day, tagged with the backfill and selecting no asset.
    job = platform.defs.resolve_job_def("synthetic_ingestion_job")
    runs = [
        job.execute_in_process(
            instance=platform.instance,
            partition_key=day,
            tags={BACKFILL_TAG: "jobbackfill"},
            raise_on_error=False,
        ).dagster_run
        for day in ["2024-01-01", "2024-01-02"]
    ]
    assert [run.asset_selection or None for run in runs] == [None, None]
    sensors.tick()

    # Each run leaves its rejected day to the backfill's summary...
    raised = [
        a for run in runs for a in pending_alerts(platform.instance.get_run_by_id(run.run_id))
    ]
    assert [a["rule"] for a in raised if a["rule"] == "day_rejected"] == []
    # ...which tells it, with where it was rejected and the command that reruns it.
    [summary] = backfill_summaries(platform.instance, "jobbackfill", notifier, now=0.0)
    assert summary.title == (
        "backfill jobbackfill of synthetic ended: 2 day(s), 1 rejected, 0 failed run(s)"
    )
    assert summary.cause == (
        "rejected: 2024-01-02 (raw_data: missing file); once their files are corrected: "
        "ml-platform materialize --dataset synthetic --start 2024-01-02 --days 1"
    )
    assert (summary.severity, summary.page, summary.dataset) == ("WARNING", True, "synthetic")
    assert summary.owners == ("team:ml-platform",)


def test_every_alert_names_the_owners_of_the_dataset_it_is_about(tmp_path):
    owners = {"flights": ["team:flight-analytics"], "sales": ["ana@example.com", "team:sales"]}
    notifier = Notifier(owners=owners, failure_streak=1)
    outcome = RunOutcome(
        run_id="run-1",
        root_run_id="run-1",
        job_name="sales_daily_pipeline_job",
        partition="2024-01-02",
        succeeded=False,
        step_failures=[StepFailure("sales__model", "ValueError", "bad shape", user_failure=False)],
        succeeded_steps=["sales__raw_data"],
        failed_checks=[FailedCheck("flights/features", "features_drift", "WARN", "drift")],
        run_message="",
    )
    alerts = {
        a.rule: a for a in evaluate_run(outcome, {"job sales_daily_pipeline_job": 1}, notifier, 0.0)
    }
    assert set(alerts) == {"check_failed", "run_failed", "failure_streak"}
    # A check is its asset's dataset's; the run's own alerts are for every dataset it ran.
    assert alerts["check_failed"].owners == ("team:flight-analytics",)
    assert alerts["failure_streak"].owners == (
        "team:flight-analytics",
        "ana@example.com",
        "team:sales",
    )
    assert "Owners: team:flight-analytics, ana@example.com, team:sales" in (
        alerts["failure_streak"].text()
    )
    # A run that failed before any step is its job's dataset's.
    no_step = dataclasses.replace(outcome, step_failures=[], succeeded_steps=[], failed_checks=[])
    [failed] = evaluate_run(no_step, {}, notifier, 0.0)
    assert failed.owners == ("ana@example.com", "team:sales")
    # Owners survive the run tag and the cursor the alerts travel in.
    assert Alert.from_json(json.loads(json.dumps(failed.to_json()))) == failed
    assert (
        "Owners: - (the contract names none)"
        in evaluate_run(no_step, {}, Notifier(), 0.0)[0].text()
    )


def test_a_replays_failed_runs_are_the_replays_and_page_no_one():
    # A replay's dataset name extends its live dataset's, and so do its step keys.
    replay = "flights__replay_hgb"
    notifier = Notifier(
        owners={"flights": ["team:flight-analytics"], replay: ["team:flight-analytics"]},
        silent=[replay],
        failure_streak=1,
    )
    outcome = RunOutcome(
        run_id="run-2",
        root_run_id="run-2",
        job_name=f"{replay}_daily_pipeline_job",
        partition="2013-02-01",
        succeeded=False,
        step_failures=[StepFailure(f"{replay}__model", "ValueError", "bad", user_failure=False)],
        succeeded_steps=[f"{replay}__raw_data"],
        failed_checks=[],
        run_message="",
    )

    alerts = evaluate_run(outcome, {f"job {replay}_daily_pipeline_job": 1}, notifier, 0.0)

    assert {a.rule for a in alerts} == {"run_failed", "failure_streak"}
    assert {a.dataset for a in alerts} == {replay}
    # Delivery routes them by their dataset: a replay's are logged, never paged.
    assert [a.rule for a in map(notifier.routed, alerts) if a.page] == []


def test_a_worker_killed_mid_step_is_alerted_with_the_step_and_how_it_ended():
    outcome = RunOutcome(
        run_id="run-oom",
        root_run_id="run-oom",
        job_name="flights_daily_pipeline_job",
        partition="2013-01-04",
        succeeded=False,
        step_failures=[],
        succeeded_steps=["flights__raw_data"],
        failed_checks=[],
        run_message=(
            "During celery execution errors occurred in workers:\n[flights__model]: "
            "billiard.exceptions.WorkerLostError: Worker exited prematurely: signal 9 (SIGKILL)"
        ),
        unfinished_steps=["flights__model"],
    )

    [failed] = evaluate_run(outcome, {}, Notifier(), now=0.0)

    assert failed.title == (
        "run of flights_daily_pipeline_job failed at step flights__model, which did not finish"
    )
    assert failed.failure_class == RESOURCE_EXHAUSTION
    assert failed.cause.startswith("flights__model did not finish: the process running it")
    assert "signal 9 (SIGKILL)" in failed.cause
    assert failed.runbook == "docs/runbook.md#resource-exhaustion"


def test_a_contract_routes_its_alerts_by_kind_over_the_defaults(tmp_path, webhook):
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    # This team wants every drift day paged, and champion decay only logged.
    document["alerts"] = {"page": {"features_drift": True, "champion_decay": False}}
    path = tmp_path / "synthetic.yaml"
    path.write_text(yaml.safe_dump(document))
    defs = build_definitions(
        load_contract(path), landing_dir=str(tmp_path / "in"), lake_dir=str(tmp_path / "lake")
    )
    notifier = defs.resources["notifier"]
    assert notifier.paging == {"synthetic": {"features_drift": True, "champion_decay": False}}
    notifier = notifier.model_copy(update={"webhook_url": webhook.url})

    def failed(check: str) -> FailedCheck:
        return FailedCheck(
            f"synthetic/{check}_asset", check, "WARN", f"{check} failed", "2024-01-05"
        )

    outcome = RunOutcome(
        run_id="r1",
        root_run_id="r1",
        job_name="synthetic_daily_pipeline_job",
        partition="2024-01-05",
        succeeded=True,
        step_failures=[],
        succeeded_steps=["synthetic__champion_performance"],
        failed_checks=[failed("features_drift"), failed("champion_decay"), failed("loss_plateau")],
        run_message="",
    )
    alerts = evaluate_run(outcome, {}, notifier, now=0.0)
    # By default a day's drift is logged and decay pages; the contract turns both round, and
    # leaves the kinds it does not name (loss_plateau) as they were.
    assert {a.subject: a.page for a in alerts} == {
        "synthetic/features_drift_asset:features_drift": False,
        "synthetic/champion_decay_asset:champion_decay": True,
        "synthetic/loss_plateau_asset:loss_plateau": True,
    }
    notifier.deliver(alerts, DeliveryState(), logging.getLogger("test"), now=0.0)
    assert sorted(a["subject"] for a in alerts_of(webhook)) == [
        "synthetic/features_drift_asset:features_drift",
        "synthetic/loss_plateau_asset:loss_plateau",
    ]


def test_a_job_is_its_own_datasets_though_another_dataset_name_is_longer():
    # taxi's daily job is taxi_daily_pipeline_job, which also starts with the dataset
    # taxi_daily: a job's own name decides, the longest prefix only for names of no known job.
    datasets = ["taxi", "taxi_daily", "flights", "flights__replay_hgb"]
    assert dataset_of_job("taxi_daily_pipeline_job", datasets) == "taxi"
    assert dataset_of_job("taxi_daily_daily_pipeline_job", datasets) == "taxi_daily"
    assert dataset_of_job("flights__replay_hgb_weekly_retrain_job", datasets) == (
        "flights__replay_hgb"
    )
    assert dataset_of_job("flights__replay_hgb_replay_comparison_job", datasets) == (
        "flights__replay_hgb"
    )
    assert dataset_of_job("__ephemeral_asset_job__", datasets) is None


def test_a_location_url_botocore_refuses_to_send_is_a_configuration_failure():
    refused = StepFailure(
        "flights__raw_data",
        "ParamValidationError",
        'Parameter validation failed: Invalid bucket name "minio.internal:9000"',
        user_failure=False,
    )
    assert classify_failure([refused], []).failure_class == CONFIGURATION


def test_a_negative_dedup_window_is_refused_not_read_as_no_dedup():
    with pytest.raises(pydantic.ValidationError, match="dedup_seconds"):
        Notifier(dedup_seconds=-1)
