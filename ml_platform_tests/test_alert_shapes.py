"""Alerts and drift episodes on shapes nobody designed for: days out of order, long streaks."""

import dataclasses
import http.server
import json
import logging
import socketserver
import threading
from collections.abc import Iterator

import dagster as dg
import pytest
import yaml

from ml_platform.automation.alert_sensors import pending_alerts
from ml_platform.automation.alerts import DeliveryState, Notifier, evaluate_run
from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.drift import detect
from ml_platform.drift.episodes import REDEFINED, FeatureDay, advance, states_from_json
from ml_platform.platform.failures import FailedCheck, StepFailure
from ml_platform.platform.run_events import EpisodeNews, RunOutcome, run_outcome
from ml_platform_tests.conftest import Platform, contract_with
from ml_platform_tests.test_alerts import AlertSensors, SMTPHandler, paging_alert
from ml_platform_tests.test_backfill_range import materialize_range
from ml_platform_tests.test_monitoring_known import DAYS, WARM, land, record


def rejected_days_told(platform, days: list[str], tick_each: bool = True) -> list[tuple[str, str]]:
    """Run the ingestion job for each of `days` in turn, ticking the alert sensors after each as
    the daemon would (or once after all: a daemon behind); the (day, title) of each
    rejected_streak alert."""
    notifier = platform.defs.resources["notifier"]
    sensors = AlertSensors(platform.instance, notifier)
    job = platform.defs.resolve_job_def("synthetic_ingestion_job")
    runs = []
    for day in days:
        result = job.execute_in_process(
            instance=platform.instance, partition_key=day, raise_on_error=False
        )
        runs.append(result.run_id)
        if tick_each:
            sensors.tick()
    sensors.tick()
    raised = [a for run in runs for a in pending_alerts(platform.instance.get_run_by_id(run))]
    return [(a["partition"], a["title"]) for a in raised if a["rule"] == "rejected_streak"]


@pytest.mark.parametrize("tick_each", [True, False])
def test_a_rejected_streak_pages_once_however_long_it_lasts(platform_for, tick_each):
    platform = platform_for("synthetic")
    platform.land("2024-01-01", 1)  # the days after it never land: each is rejected
    days = ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05", "2024-01-06"]
    # The third rejected day in a row pages; the fourth and fifth are the same streak, also when
    # the sensors come to the runs after they all ended.
    assert rejected_days_told(platform, days, tick_each) == [
        ("2024-01-04", "synthetic: 3 days in a row rejected, completed by 2024-01-04")
    ]


def test_a_rejected_day_that_lands_late_and_completes_a_streak_pages(platform_for):
    platform = platform_for("synthetic")
    platform.land("2024-01-01", 1)
    platform.land("2024-01-05", 1)
    # 2024-01-03 and 2024-01-04 are judged first; 2024-01-02 comes late, rejected too: three
    # days in a row rejected, told when the late day makes them three.
    days = ["2024-01-01", "2024-01-05", "2024-01-03", "2024-01-04", "2024-01-02"]
    assert rejected_days_told(platform, days) == [
        ("2024-01-02", "synthetic: 3 days in a row rejected, completed by 2024-01-02")
    ]


@pytest.mark.parametrize(
    "steps",
    [
        # A run that failed at a step, and one that failed before any step (its job names it).
        (
            ["flights__replay_hgb__raw_data"],
            [StepFailure("flights__replay_hgb__model", "ValueError", "bad", user_failure=False)],
        ),
        ([], []),
    ],
)
def test_a_replay_no_longer_served_is_not_the_live_datasets_and_pages_no_one(steps):
    # The replay was removed (or its folder can no longer be served) after its run ended and
    # before the sensors came to it: the code location's notifier knows the live dataset only.
    replay = "flights__replay_hgb"
    notifier = Notifier(owners={"flights": ["team:flight-analytics"]}, failure_streak=1)
    succeeded_steps, step_failures = steps
    outcome = RunOutcome(
        run_id="run-2",
        root_run_id="run-2",
        job_name=f"{replay}_daily_pipeline_job",
        partition="2013-02-01",
        succeeded=False,
        step_failures=step_failures,
        succeeded_steps=succeeded_steps,
        failed_checks=[
            FailedCheck(f"{replay}/raw_data", "schema_change", "WARN", "a column moved", None)
        ],
        run_message="the run worker could not start",
    )
    streaks = {f"job {replay}_daily_pipeline_job": 1}
    streaks.update({f"asset {f.step}": 1 for f in step_failures})

    alerts = evaluate_run(outcome, streaks, notifier, 0.0)

    assert {"run_failed", "failure_streak", "check_failed"} <= {a.rule for a in alerts}
    # Neither the live dataset's owners nor its routes: the replay is not flights.
    assert all(a.dataset in (replay, None) and a.owners == () for a in alerts)
    # A replay runs the past: nobody is paged, served or not.
    assert [a.rule for a in map(notifier.routed, alerts) if a.page] == []


class Redirecting(http.server.BaseHTTPRequestHandler):
    """A webhook's host that moved (e.g. http:// to https://): every request is redirected."""

    server: "RedirectingServer"

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append("POST")
        self.send_response(self.server.status)
        self.send_header("Location", "/moved/services/B000/SECRET")
        self.end_headers()

    def do_GET(self):
        # What a redirected POST becomes in urllib: a GET without the alert, answered 200.
        self.server.requests.append("GET")
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


class RedirectingServer(http.server.ThreadingHTTPServer):
    status: int
    requests: list[str]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_webhook_url_that_redirects_is_not_taken_for_delivered(caplog, status):
    server = RedirectingServer(("127.0.0.1", 0), Redirecting)
    server.status, server.requests = status, []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    notifier = Notifier(webhook_url=f"http://127.0.0.1:{server.server_port}/services/B000/SECRET")
    try:
        with caplog.at_level(logging.INFO):
            state = notifier.deliver(
                [paging_alert()], DeliveryState(), logging.getLogger("test"), now=0.0
            )
            for tick in range(1, 5):
                state = notifier.deliver([], state, logging.getLogger("test"), now=float(tick))
    finally:
        server.shutdown()
        server.server_close()

    # The alert never reached a receiver: said, as a setting to fix, and not retried.
    assert server.requests == ["POST"]
    assert state.outbox == []
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert f"webhook not sent: the webhook answered HTTP {status}" in error
    assert "redirect" in error and error.endswith("docs/runbook.md#alert-delivery-failed")
    assert "SECRET" not in caplog.text and "B000" not in caplog.text and "moved" not in error


@pytest.fixture
def smtp_server() -> Iterator[socketserver.ThreadingTCPServer]:
    """An SMTP server that keeps the messages it is sent (test_alerts' receiver)."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), SMTPHandler)
    server.messages = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.org/services/T0/B0/SEC\u200bRET",
        "https://hooks.example.org/services/T0/B0/SECRÉT",
    ],
    ids=["a zero-width space pasted with it", "a letter beyond ASCII"],
)
def test_a_webhook_url_urllib_cannot_send_is_said_once_and_email_still_goes(
    smtp_server, caplog, url
):
    notifier = Notifier(
        webhook_url=url,
        smtp_host="127.0.0.1",
        smtp_port=smtp_server.server_address[1],
        smtp_starttls=False,
        email_to="oncall@example.org",
    )
    with caplog.at_level(logging.INFO):
        # The delivery sensor's ticks: one raising would keep no cursor, and every tick would
        # log and email every alert again.
        state = notifier.deliver(
            [paging_alert()], DeliveryState(), logging.getLogger("test"), now=0.0
        )
        for tick in range(1, 3):
            state = notifier.deliver([], state, logging.getLogger("test"), now=float(tick))

    assert len(smtp_server.messages) == 1
    assert state.outbox == []
    [said] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "webhook not sent: ML_PLATFORM_ALERT_WEBHOOK_URL is not a webhook URL" in said
    assert "not ASCII" in said
    assert "SEC" not in caplog.text and "hooks.example.org" not in caplog.text


def test_an_episode_of_a_feature_the_contract_computes_otherwise_ends_saying_so(tmp_path):
    # log_amount drifts for three days under the bundled contract (log1p of the amount)...
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    before = load_contract(bundled_contracts()["synthetic"])
    spec = before.drift.episodes
    drifted = {"log_amount": FeatureDay(drifted=True, effect=0.4)}
    states: dict = {}
    for day in ["2024-02-01", "2024-02-02", "2024-02-03"]:
        # Each day starts from what the day before stored, read back as the step reads it.
        result = advance(day, drifted, states, spec, None, before.feature_definitions)
        states = states_from_json(json.loads(json.dumps(result.states_json())))
    assert [e.feature for e in result.opened] == ["log_amount"]
    # ...then the team makes it the amount itself. Its reference holds logarithms: it has no
    # verdict until the reference holds amounts; its old episode is no longer about it.
    for feature in document["features"]:
        if feature["name"] == "log_amount":
            feature.pop("transform")
    (tmp_path / "synthetic.yaml").write_text(yaml.safe_dump(document))
    after = load_contract(tmp_path / "synthetic.yaml")
    monitored = {f.name for f in detect.tested_features(after)}

    changed = advance("2024-02-04", {}, states, spec, monitored, after.feature_definitions)

    assert changed.open == [] and "log_amount" not in changed.states
    [ended] = changed.closed
    assert ended.describe().endswith(f"ended 2024-02-04: {REDEFINED}")
    news = EpisodeNews(
        "synthetic/champion_performance", "drift_episode", "2024-02-04", [], [ended.to_json()]
    )
    outcome = RunOutcome(
        "r", "r", "synthetic_daily_pipeline_job", "2024-02-04", True, [], [], [], ""
    )
    outcome.episodes.append(news)
    [alert] = evaluate_run(outcome, {}, Notifier(), now=0.0)
    assert alert.title == (
        "synthetic: log_amount computed otherwise since 2024-02-04, its drift judged afresh "
        "(drifting since 2024-02-01)"
    )
    # Its new values open an episode of their own only when they drift as long.
    fresh = advance(
        "2024-02-05", drifted, changed.states, spec, monitored, after.feature_definitions
    )
    assert fresh.opened == [] and fresh.states["log_amount"].recent == (("2024-02-05", True, 0.4),)
    # The same definition, or a state stored before definitions were, keeps its episode.
    kept = advance("2024-02-04", {}, states, spec, monitored, before.feature_definitions)
    assert [e.feature for e in kept.open] == ["log_amount"] and kept.closed == []
    unrecorded = {f: dataclasses.replace(s, definition=None) for f, s in states.items()}
    kept = advance("2024-02-04", {}, unrecorded, spec, monitored, after.feature_definitions)
    assert [e.feature for e in kept.open] == ["log_amount"] and kept.closed == []


def test_the_monitoring_step_ends_the_episode_of_a_feature_made_categorical(tmp_path):
    # temperature drifts in an episode; the team then makes it categorical (which still feeds
    # the champion). Its reference holds numbers: no verdict until it holds categories.
    old = contract_with(tmp_path, "synthetic", window_days=7)
    platform = Platform(old, tmp_path / "p")
    land(platform, DAYS[:2], warm=False)
    land(platform, WARM, warm=True)
    assert materialize_range(platform, DAYS[0], DAYS[-2]).success
    assert record(platform, DAYS[-2])["drift_episodes"]["temperature"]["episode"] is not None

    document = yaml.safe_load((tmp_path / "synthetic.yaml").read_text())
    for feature in document["features"]:
        if feature["name"] == "temperature":
            feature["kind"] = "categorical"
    (tmp_path / "synthetic.yaml").write_text(yaml.safe_dump(document))
    changed = Platform(load_contract(tmp_path / "synthetic.yaml"), tmp_path / "p")
    changed.instance = platform.instance
    result = changed.materialize(DAYS[-1], checks=True)

    assert result.success
    [check] = [
        e.asset_check_evaluation_data
        for e in result.all_events
        if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
        and e.asset_check_evaluation_data.check_name == "drift_episode"
    ]
    [ended] = check.metadata["closed"].value
    assert (ended["feature"], ended["closed"], ended["stopped"]) == (
        "temperature",
        DAYS[-1],
        REDEFINED,
    )
    assert check.passed
    assert "temperature" not in record(changed, DAYS[-1])["drift_episodes"]


def test_a_past_day_rerun_alone_does_not_tell_its_episode_again(tmp_path):
    platform = Platform(contract_with(tmp_path, "synthetic", window_days=7), tmp_path / "p")
    land(platform, DAYS[:2], warm=False)
    land(platform, WARM, warm=True)
    first = materialize_range(platform, DAYS[0], DAYS[-1])
    assert first.success

    def episodes_told(run_id: str) -> list[tuple[str, str | None]]:
        outcome = run_outcome(platform.instance, run_id, True)
        assert outcome is not None
        alerts = evaluate_run(outcome, {}, Notifier(), now=0.0)
        return [(a.rule, a.partition) for a in alerts if a.rule.startswith("drift_episode")]

    # The episode opened on the first warm day, told when that day was first judged...
    assert ("drift_episode", WARM[0]) in episodes_told(first.run_id)
    # ...and not again when the day is rerun alone weeks after (its file re-landed as it was,
    # or a step fixed): the episode is the one told.
    rerun = platform.materialize(WARM[0], checks=True)
    assert rerun.success
    assert episodes_told(rerun.run_id) == []
    [check] = [
        e.asset_check_evaluation_data
        for e in rerun.all_events
        if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
        and e.asset_check_evaluation_data.check_name == "drift_episode"
    ]
    # The check still says what the day opened, and that it was told.
    assert check.description.startswith("Drift episode opened: temperature since")
    assert "Told before, when the day first ran: not told again." in check.description

    # A corrected file that changes what the day opens is news: it is told.
    land(platform, WARM[:1], warm=False)
    corrected = platform.materialize(WARM[0], checks=True)
    assert corrected.success
    land(platform, WARM[:1], warm=True)
    again = platform.materialize(WARM[0], checks=True)
    assert again.success
    assert episodes_told(again.run_id) == [("drift_episode", WARM[0])]
