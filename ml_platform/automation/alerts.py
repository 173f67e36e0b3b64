"""Alerts a person acts on: the rules, deduplication, and the notifier that delivers them.

Rules (see docs/runbook.md for what to do about each):

- A job, or an asset's step, failing in 3 runs in a row -> one CRITICAL alert, reset by a
  success. Retries of a run (same root run) count once. The success that ends such a streak
  is announced (RESOLVED, sent where the CRITICAL alert went). Streaks are counted from the
  instance's runs, not remembered by a sensor.
- A rejected day (its `delivery_accepted` check failed: a data verdict, the run succeeded) ->
  one WARNING naming the dataset, the day, the check and the reason; the day's other failed
  gate checks are its reasons, not alerts of their own. N rejected days in a row of one dataset
  (by day, not by run; N = `failure_streak`) -> CRITICAL, once: when the day that makes them N
  is judged, whether it is the last or a late one among them. Days rejected by a backfill's runs
  are told once, in the backfill's summary (`backfill_summary_sensor`), not a day at a time.
  A green run never announces RESOLVED for rejected days: a data streak ends with an accepted
  day, which the rejected-days listing shows.
- A failed check of WARN severity (loss plateau, low utilisation, schema change...) ->
  WARNING. A day's drift (`features_drift`) and an open drift episode (`drift_episode`) are
  logged, not paged, every day: a drift episode is told once when it opens (WARNING) and once
  when it closes (RESOLVED), and pages only when the serving champion leans on the feature
  (docs/checks.md#drift-episodes-drift_episode). A backfill's runs replay the past: their
  episodes are in the checks, not told; a rerun of a day tells only what its earlier version
  did not (`registry.monitoring.episode_check`). A failed ERROR check in a run that still
  succeeded -> ERROR.
- A rejected candidate (`promotion_verdict`) is logged but pages nobody: one rejection is an
  outcome of the day. `rejection_streak` (N rejected candidates in a row) pages.
- A landed file that fits no partition -> WARNING.
- Every failed run is logged as a JSON line (level ERROR) but pages nobody on its own: alert
  fatigue makes people ignore the alerts that matter.

Every alert carries the run id, partition, failure class, the one-line cause, a link to the run
in the UI, the runbook section and the owners of the dataset it is about (the contract's
`owners:`), so whoever receives it knows whose it is. Alerts that say the same thing (same rule,
subject, partition and cause) within the dedup window are sent once. Delivery state (what was
sent, what still has to be sent after a sink failed) lives in the delivering sensor's cursor, so
it survives restarts and moves with the instance.
"""

import collections
import dataclasses
import hashlib
import http.client
import json
import logging
import re
import smtplib
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from email.message import EmailMessage
from typing import Any

import dagster as dg
from pydantic import Field

from ml_platform.automation.jobs import DATASET_JOBS
from ml_platform.drift.episodes import NOT_MONITORED, REDEFINED, Episode
from ml_platform.platform.datasets import REPLAY_MARK, dataset_name
from ml_platform.platform.logs import redact
from ml_platform.platform.run_events import EpisodeNews, RunOutcome, classify_outcome
from ml_platform.platform.runbook import check_anchor
from ml_platform.platform.settings import Settings
from ml_platform.validation.assets import DELIVERY_CHECK

CRITICAL = "CRITICAL"
ERROR = "ERROR"
WARNING = "WARNING"
RESOLVED = "RESOLVED"
INFO = "INFO"
LEVELS = {
    CRITICAL: logging.CRITICAL,
    ERROR: logging.ERROR,
    WARNING: logging.WARNING,
    RESOLVED: logging.INFO,
    INFO: logging.INFO,
}
REJECTED_DAY_SECTION = "rejected-day"
# After this many failed attempts (one per sensor tick) a sink gives up on an alert.
MAX_DELIVERY_ATTEMPTS = 5
# The fields an alert copies from what a run, a check or a file said: an error's message may
# quote a database URI with its password, or a token a step read from the environment.
SAID_FIELDS = ("title", "cause", "subject")


class MisconfiguredSink(ValueError):
    """A sink's setting cannot work (a webhook URL without http(s) or a host): no retry fixes it.

    Also a receiver's answer that no retry changes: a webhook's client error (HTTP 4xx but a
    timeout or a rate limit: revoked, deleted, its channel archived), an SMTP login refused, an
    SMTP server that offers no STARTTLS when asked for it.
    """


# Client errors a later attempt can get past: a request timeout, a rate limit.
RETRIED_CLIENT_ERRORS = frozenset({408, 429})
# What a webhook that is gone answers: revoked, deleted, or its channel archived.
GONE = frozenset({401, 403, 404, 410})
# Slack answers a refused post with one word saying why (`no_service`, `invalid_token`,
# `channel_is_archived`): worth repeating, unlike a longer body, which may quote the request.
ANSWER_WORD = re.compile(r"[a-z_]{1,40}")


class NotRedirected(urllib.request.HTTPRedirectHandler):
    """Follows no redirect, which is then raised as an HTTPError.

    urllib resends a redirected POST (301, 302, 303) as a GET without its body, which a receiver
    may answer 200: an alert taken for delivered that no one got.
    """

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        """No request to the place a redirect points to."""
        return None


# What posts to the webhook: a redirect is its answer, not a move to follow.
WEBHOOK_OPENER = urllib.request.build_opener(NotRedirected)


def refused_webhook(error: urllib.error.HTTPError, url: str) -> MisconfiguredSink | None:
    """What a webhook's HTTP error says when no retry can succeed (4xx, 3xx); None if one can.

    Names the status and Slack's one-word reason, never the URL (a secret) nor the receiver's
    free text, nor where a redirect points (the URL's secret path, moved).
    """
    status = error.code
    if 300 <= status < 400:
        phrase = http.client.responses.get(status, "Redirect")
        return MisconfiguredSink(
            f"the webhook answered HTTP {status} {phrase}, a redirect, which is not followed (a "
            "POST redirected may arrive as a GET without the alert): set "
            "ML_PLATFORM_ALERT_WEBHOOK_URL to the address it redirects to, e.g. https:// for "
            "http:// (the URL is a secret and is not shown)"
        )
    if not 400 <= status < 500 or status in RETRIED_CLIENT_ERRORS:
        return None
    phrase = http.client.responses.get(status, "Client Error")
    try:
        # As far as one word can go: a receiver's page is not repeated.
        answer = error.read(64).decode("ascii", errors="replace").strip()
    except (OSError, http.client.HTTPException) as exc:
        # The status decides; the answer would only have said more.
        why = f" (its answer could not be read: {type(exc).__name__})"
    else:
        why = f" ({answer})" if ANSWER_WORD.fullmatch(answer) and answer not in url else ""
    meaning = (
        "ML_PLATFORM_ALERT_WEBHOOK_URL was revoked or deleted, or its channel archived"
        if status in GONE
        else "the receiver refuses the alert and would refuse it again"
    )
    return MisconfiguredSink(
        f"the webhook answered HTTP {status} {phrase}{why}: {meaning} (the URL is a secret and "
        "is not shown)"
    )


def refused_login(error: smtplib.SMTPAuthenticationError) -> MisconfiguredSink:
    """What an SMTP server's refusal of the login says: its code and answer, never the password.

    A server's answer does not repeat the password; smtplib's text of SMTP errors is logged
    already for the same reason.
    """
    said = error.smtp_error
    answer = one_line(said.decode(errors="replace") if isinstance(said, bytes) else said)
    return MisconfiguredSink(
        f"the SMTP server refused the login ({error.smtp_code} {answer}): check "
        "ML_PLATFORM_SMTP_USER and ML_PLATFORM_SMTP_PASSWORD (the password is a secret and is "
        "not shown)"
    )


def webhook_url_problem(url: str) -> str | None:
    """Why `url` cannot be posted to, in words that never repeat it (a secret); None if it can."""
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises ValueError on a port that is not a number
    except ValueError:
        return "its port is not a number"
    if parts.scheme not in ("http", "https"):
        return "it does not start with http:// or https://"
    if not parts.hostname:
        return "it names no host"
    if any(c.isspace() or ord(c) < 32 for c in url):
        return "it holds spaces or control characters"
    if not (parts.path + parts.query).isascii():
        # urllib sends the request line as ASCII (a host goes as IDNA): it would raise a
        # UnicodeEncodeError, no OSError, on each tick, failing the delivering sensor's tick:
        # its cursor lost, every alert logged and emailed again on the next.
        return (
            "it holds a character that is not ASCII (one pasted with it, e.g. a zero-width "
            "space, or a letter to percent-encode)"
        )
    return None


python_logger = logging.getLogger("ml_platform.alerts")
# Failed checks that are logged as alerts but page nobody: a single rejected candidate is an
# outcome the registry records; the rejection_streak check pages when they pile up.
# A day's drift and an open episode are the weather of the day: the episode's opening and
# closing are what is told.
LOGGED_ONLY_CHECKS = frozenset({"promotion_verdict", "features_drift", "drift_episode"})
# Every alert's rule. A contract's `alerts.page` key that is a rule routes that rule's alerts
# only, even where a check has the same name: `drift_episode` is the episode's opening, told
# once, and the check of that name fails every day the episode stays open.
RULES = frozenset(
    {
        "failure_streak",
        "recovered",
        "run_failed",
        "check_failed",
        "day_rejected",
        "rejected_streak",
        "drift_episode",
        "drift_episode_closed",
        "backfill_summary",
        "landing_misfit",
        "data_late",
        "data_arrived",
    }
)


@dataclasses.dataclass(frozen=True)
class Alert:
    """One alert: what happened, why, where to look and what to do."""

    severity: str  # CRITICAL | ERROR | WARNING | RESOLVED | INFO
    rule: str  # one of RULES
    title: str  # what happened, one line
    cause: str  # why, one line
    subject: str  # what failed: a job, an asset, a check or a file
    failure_class: str | None  # a key of failures.RUNBOOK_ANCHORS; None: no failure
    run_id: str | None
    partition: str | None
    run_url: str | None
    runbook: str  # link to the runbook section
    page: bool  # sent to the webhook and email sinks, not only logged
    occurred_at: float
    # The owners of the dataset(s) the alert is about (`team:<name>` or e-mail), from contracts.
    owners: tuple[str, ...] = ()
    # The one dataset the alert is about, whose contract may route it (`alerts.page`).
    dataset: str | None = None

    def __post_init__(self) -> None:
        # Redacted as the JSON log lines are: an alert leaves the process in a run tag, a
        # webhook post and an email, none of which goes through the log's redaction.
        secrets = Settings().secret_values
        for name in SAID_FIELDS:
            object.__setattr__(self, name, redact(getattr(self, name), secrets))

    @property
    def fingerprint(self) -> str:
        """Equal for alerts that say the same thing (run id and time left out)."""
        same = [self.rule, self.severity, self.subject, self.partition or "", self.cause]
        return hashlib.sha256("\x1f".join(same).encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        """The alert as a JSON object (the log line, and the webhook's structured part)."""
        return {**dataclasses.asdict(self), "fingerprint": self.fingerprint}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Alert":
        """An alert read back from `to_json` (e.g. from a cursor's outbox)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        # JSON has no tuples: owners come back as a list.
        values["owners"] = tuple(values.get("owners", ()))
        return cls(**values)

    def text(self) -> str:
        """A message for people: Slack text or an email body."""
        lines = [
            f"[{self.severity}] {self.title}",
            f"Cause: {self.cause}",
            f"Partition: {self.partition or '-'}   Failure class: {self.failure_class or '-'}",
            f"Run: {self.run_id or '-'}" + (f" {self.run_url}" if self.run_url else ""),
            f"Owners: {', '.join(self.owners) or '- (the contract names none)'}",
            f"Runbook: {self.runbook}",
        ]
        return "\n".join(lines)


@dataclasses.dataclass
class DeliveryState:
    """What was sent recently (for dedup) and what a sink still has to send (outbox)."""

    sent: dict[str, float] = dataclasses.field(default_factory=dict)  # fingerprint -> time
    outbox: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """For a sensor cursor."""
        return {"sent": self.sent, "outbox": self.outbox}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> "DeliveryState":
        """From a sensor cursor (None: nothing sent yet)."""
        data = data or {}
        return cls(sent=dict(data.get("sent", {})), outbox=list(data.get("outbox", [])))


class Notifier(dg.ConfigurableResource):
    """Sends alerts to a JSON log line (always), a Slack-compatible webhook and SMTP email.

    The webhook URL and the SMTP password are secrets: set them through environment variables
    (`Settings.notifier_config`), never in code; they are never logged.
    """

    ui_url: str = Field(default="http://127.0.0.1:3000", description="Dagster UI base URL")
    runbook_url: str = Field(default="docs/runbook.md", description="runbook the alerts link")
    webhook_url: str | None = Field(default=None, description="Slack-compatible incoming webhook")
    smtp_host: str | None = Field(default=None, description="SMTP server; unset: no email")
    smtp_port: int = 587
    smtp_user: str | None = None
    smtp_password: str | None = None
    smtp_starttls: bool = True
    email_from: str = "ml-platform@localhost"
    email_to: str = Field(default="", description="comma-separated recipients")
    dedup_seconds: int = Field(default=3600, ge=0, description="identical alerts are sent once per")
    failure_streak: int = Field(default=3, description="failed runs in a row that page")
    timeout_seconds: float = 10.0
    delivery_seconds: float = Field(
        default=20.0,
        gt=0,
        description=(
            "sending time a sensor tick may spend on the sinks; what is left waits for the next "
            "tick (Dagster ends a sensor tick after 60 s)"
        ),
    )
    owners: dict[str, list[str]] = Field(
        default_factory=dict, description="dataset -> its contract's owners, named by its alerts"
    )
    paging: dict[str, dict[str, bool]] = Field(
        default_factory=dict,
        description="dataset -> alert kind -> whether it pages (its contract's `alerts.page`)",
    )
    silent: list[str] = Field(
        default_factory=list, description="datasets whose alerts page no one (replays)"
    )

    def routed(self, alert: Alert) -> Alert:
        """The alert as its dataset's contract routes it: paged or only logged, by kind.

        A failed check's own name wins over its rule (`check_failed`), unless the name is also
        a rule's (RULES), which routes that rule only. A replay's alerts are only logged: it
        runs the past, nobody has to act now: a replay no longer served too (removed, or its
        folder no longer readable), whose runs the sensors may come to after it went.
        """
        if alert.dataset in self.silent or REPLAY_MARK in (alert.dataset or ""):
            return dataclasses.replace(alert, page=False)
        routes = self.paging.get(alert.dataset or "", {})
        check = alert.subject.rsplit(":", 1)[-1] if alert.rule == "check_failed" else None
        if check in RULES:
            check = None
        for kind in (check, alert.rule):
            if kind in routes:
                return dataclasses.replace(alert, page=routes[kind])
        return alert

    def owners_of(self, *datasets: str) -> tuple[str, ...]:
        """The owners of the datasets, each once, in the order the datasets are given."""
        return tuple(dict.fromkeys(o for d in datasets for o in self.owners.get(d, ())))

    def run_url(self, run_id: str | None) -> str | None:
        """Link to a run in the Dagster UI."""
        return f"{self.ui_url.rstrip('/')}/runs/{run_id}" if run_id else None

    def runbook(self, anchor: str) -> str:
        """Link to a runbook section."""
        return f"{self.runbook_url}#{anchor}"

    def paging_sinks(self) -> list[str]:
        """The configured sinks beyond the log line."""
        sinks = []
        if self.webhook_url:
            sinks.append("webhook")
        if self.smtp_host and self.email_to.strip():
            sinks.append("email")
        return sinks

    def deliver(
        self, alerts: list[Alert], state: DeliveryState, log: Any, now: float | None = None
    ) -> DeliveryState:
        """Log every new alert, queue paging ones for the sinks, and work the outbox.

        An alert whose fingerprint was sent within the dedup window is dropped. A sink that
        fails keeps the alert in the outbox and is tried again on the next call (the next
        sensor tick), up to MAX_DELIVERY_ATTEMPTS; other sinks are not held up by it.

        A call sends for at most `delivery_seconds` (plus one send's timeout), and tries a sink
        that failed no more in that call: a webhook that hangs costs one timeout a tick, not
        one per alert. Alerts not tried wait in the outbox without using an attempt. Otherwise
        a tick with several alerts for a hanging sink outlasts Dagster's limit on a sensor
        tick, which then fails without its cursor: every alert logged and sent again, each tick.
        """
        now = time.time() if now is None else now
        sent = {f: t for f, t in state.sent.items() if now - t < self.dedup_seconds}
        outbox = list(state.outbox)
        for alert in map(self.routed, alerts):
            if alert.fingerprint in sent:
                log.info(f"duplicate within {self.dedup_seconds} s, not sent: {alert.title}")
                continue
            sent[alert.fingerprint] = now
            line = json.dumps({"alert": alert.to_json()}, sort_keys=True)
            log.log(LEVELS[alert.severity], line)
            python_logger.log(LEVELS[alert.severity], line)
            sinks = self.paging_sinks() if alert.page else []
            if sinks:
                outbox.append({"alert": alert.to_json(), "sinks": sinks, "attempts": 0})
        return DeliveryState(sent=sent, outbox=self._work_outbox(outbox, log))

    def _work_outbox(self, outbox: list[dict[str, Any]], log: Any) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.delivery_seconds
        failing: set[str] = set()  # sinks that failed in this call: tried again next call
        waiting: collections.Counter[str] = collections.Counter()
        remaining = []
        for entry in outbox:
            alert = Alert.from_json(entry["alert"])
            pending = []
            failed = False  # a sink tried in this call failed: one attempt used
            for sink in entry["sinks"]:
                if sink in failing or time.monotonic() >= deadline:
                    pending.append(sink)
                    waiting[sink] += 1
                    continue
                try:
                    self._send(sink, alert)
                except MisconfiguredSink as exc:
                    # Waiting does not mend a setting: said once, not retried.
                    log.error(
                        f"alert '{alert.title}': {sink} not sent: {exc}; fix the setting, see "
                        "docs/runbook.md#alert-delivery-failed"
                    )
                except (OSError, smtplib.SMTPException) as exc:
                    # URLError and socket errors are OSErrors. Their text never holds the
                    # webhook URL or the password, so it is safe to log.
                    log.error(
                        f"alert '{alert.title}': {sink} delivery failed "
                        f"(attempt {entry['attempts'] + 1} of {MAX_DELIVERY_ATTEMPTS}): "
                        f"{type(exc).__name__}: {exc}"
                    )
                    pending.append(sink)
                    failing.add(sink)
                    failed = True
                except http.client.HTTPException as exc:
                    # A receiver that answered something other than HTTP. The text of http.client's
                    # errors can quote the request line, which holds the URL's secret path.
                    log.error(
                        f"alert '{alert.title}': {sink} delivery failed "
                        f"(attempt {entry['attempts'] + 1} of {MAX_DELIVERY_ATTEMPTS}): "
                        f"{type(exc).__name__} (the receiver's answer was not HTTP)"
                    )
                    pending.append(sink)
                    failing.add(sink)
                    failed = True
            attempts = entry["attempts"] + failed
            if pending and attempts < MAX_DELIVERY_ATTEMPTS:
                remaining.append({**entry, "sinks": pending, "attempts": attempts})
            elif pending:
                log.error(
                    f"alert '{alert.title}' given up on {', '.join(pending)} after "
                    f"{attempts} attempts; see docs/runbook.md#alert-delivery-failed"
                )
        for sink, count in sorted(waiting.items()):
            why = (
                f"{sink} failed on this tick"
                if sink in failing
                else f"this tick's {self.delivery_seconds:g} s of sending are spent"
            )
            log.warning(f"{count} alert(s) wait for the next tick on {sink}: {why}")
        return remaining

    def _send(self, sink: str, alert: Alert) -> None:
        if sink == "webhook":
            self._post_webhook(alert)
        elif sink == "email":
            self._send_email(alert)
        else:
            raise ValueError(f"unknown alert sink {sink!r}")

    def _post_webhook(self, alert: Alert) -> None:
        assert self.webhook_url is not None
        problem = webhook_url_problem(self.webhook_url)
        if problem is not None:
            raise MisconfiguredSink(
                f"ML_PLATFORM_ALERT_WEBHOOK_URL is not a webhook URL: {problem} (its value is a "
                "secret and is not shown)"
            )
        # Slack reads `text`; other receivers get the structured alert beside it.
        body = json.dumps({"text": alert.text(), "ml_platform_alert": alert.to_json()}).encode()
        request = urllib.request.Request(
            self.webhook_url,
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with WEBHOOK_OPENER.open(request, timeout=self.timeout_seconds) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            refused = refused_webhook(exc, self.webhook_url)
            if refused is not None:
                raise refused from exc
            raise  # a 5xx, a timeout or a rate limit: the outbox tries again

    def _send_email(self, alert: Alert) -> None:
        assert self.smtp_host is not None
        message = EmailMessage()
        message["Subject"] = f"[{alert.severity}] {alert.title}"
        message["From"] = self.email_from
        message["To"] = ", ".join(a.strip() for a in self.email_to.split(",") if a.strip())
        message.set_content(alert.text() + "\n\n" + json.dumps(alert.to_json(), indent=2))
        with smtplib.SMTP(self.smtp_host, self.smtp_port, timeout=self.timeout_seconds) as smtp:
            if self.smtp_starttls:
                try:
                    smtp.starttls()
                except smtplib.SMTPNotSupportedError as exc:
                    # The server's offer does not change between attempts: a setting to fix.
                    raise MisconfiguredSink(
                        f"the SMTP server offers no STARTTLS ({self.smtp_host}:{self.smtp_port}): "
                        "point ML_PLATFORM_SMTP_HOST and ML_PLATFORM_SMTP_PORT at a server that "
                        "offers it (submission, port 587), or set ML_PLATFORM_SMTP_STARTTLS=false "
                        "for a relay on a trusted network only (mail and password go in clear)"
                    ) from exc
            if self.smtp_user and self.smtp_password:
                try:
                    smtp.login(self.smtp_user, self.smtp_password)
                except smtplib.SMTPAuthenticationError as exc:
                    # A wrong user or password stays wrong: retrying may only lock the account.
                    raise refused_login(exc) from exc
            smtp.send_message(message)


def streak_keys(outcome: RunOutcome) -> list[str]:
    """What a failure counts against: the job (unless an ad-hoc asset job) and failed assets."""
    keys = [] if outcome.job_name.startswith("__") else [f"job {outcome.job_name}"]
    return keys + [f"asset {f.step}" for f in outcome.step_failures]


def one_line(text: str, limit: int = 300) -> str:
    """The first line of a message, shortened for an alert."""
    line = next((s.strip() for s in text.strip().splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def failure_cause(outcome: RunOutcome) -> str:
    """Why a failed run failed, in one line: the failed blocking check and its reason first.

    A blocking check that fails at ERROR severity fails its step with Dagster's own message,
    whose first line ("1 blocking asset check failed with ERROR severity:") names no check; the
    check's evaluation carries its name and the reason a person acts on.
    """
    blocking = [c for c in outcome.failed_checks if c.severity == "ERROR"]
    if blocking:
        check = blocking[0]
        reason = one_line(check.description) or "no reason recorded"
        more = f" (and {len(blocking) - 1} more failed check(s))" if len(blocking) > 1 else ""
        return one_line(f"check {check.asset}:{check.check} failed: {reason}{more}")
    first = outcome.step_failures[0] if outcome.step_failures else None
    if first is None and outcome.unfinished_steps:
        # An engine's report of a worker that died starts with its own preamble: the reason
        # names the steps and the engine's line that says how the worker ended.
        return one_line(classify_outcome(outcome).reason)
    return one_line(first.message if first else outcome.run_message) or "unknown cause"


def recovery_keys(outcome: RunOutcome) -> list[str]:
    """What a run's successes end a streak of: the job if the run succeeded, and its steps."""
    job = outcome.succeeded and not outcome.job_name.startswith("__")
    return ([f"job {outcome.job_name}"] if job else []) + [
        f"asset {step}" for step in outcome.succeeded_steps
    ]


def dataset_of_asset(asset: str) -> str:
    """The dataset of an asset key as the UI writes it (`flights/validated_data`)."""
    return asset.split("/", 1)[0]


def longest_dataset(name: str, datasets: Iterable[str], separator: str) -> str | None:
    """The longest of `datasets` that `name` starts with, then `separator`; None if none.

    A replay's name extends its live dataset's (`flights__replay_hgb`, its steps
    `flights__replay_hgb__model`, its jobs `flights__replay_hgb_daily_pipeline_job`): the
    longest match is the replay's, never the live dataset's; nor is a replay that is no longer
    served (removed after its runs) the live dataset's.
    """
    matches = [
        d
        for d in datasets
        if name.startswith(f"{d}{separator}") and not name.startswith(f"{d}{REPLAY_MARK}")
    ]
    return max(matches, key=len) if matches else None


def dataset_of_job(job_name: str, datasets: Iterable[str]) -> str | None:
    """Which of `datasets` a job is of (`flights_daily_pipeline_job`: flights); None if none.

    Every job of the code location is one dataset's, named `<dataset>_<job>`
    (`platform.datasets.dataset_name`). A dataset's own job names decide first: of `taxi` and
    `taxi_daily`, `taxi_daily_pipeline_job` is taxi's daily job, though taxi_daily is longer.
    """
    datasets = list(datasets)
    for dataset in datasets:
        if any(job_name == dataset_name(dataset, job) for job in DATASET_JOBS):
            return dataset
    return longest_dataset(job_name, datasets, "_") or unserved_replay(job_name, "_")


def unserved_replay(name: str, separator: str) -> str | None:
    """The replay dataset a step (`__`) or job (`_`) name is of; None if it is no replay's.

    For a name no served dataset claims: a replay removed, or no longer served, after its runs
    ended. Its runs are still its own, whose alerts page no one (`Notifier.routed`), not the
    live dataset's. A step's asset name holds no `__`, a job's is one of DATASET_JOBS.
    """
    if REPLAY_MARK not in name:
        return None
    if separator == "__":
        return name.rsplit(separator, 1)[0]
    suffixes = [f"_{job}" for job in DATASET_JOBS if name.endswith(f"_{job}")]
    return name.removesuffix(suffixes[0]) if suffixes else None


def run_datasets(outcome: RunOutcome, datasets: Iterable[str]) -> list[str]:
    """Those of `datasets` a run worked on: by its steps (`flights__raw_data`) and checks.

    Each name is matched to the longest dataset it starts with (`longest_dataset`), so a
    replay's failure is the replay's, never the live dataset's; a replay no longer served is
    named all the same (`unserved_replay`). A run that failed before any step names its dataset
    in its job only (`flights_daily_pipeline_job`).
    """
    known = set(datasets)
    steps = [*outcome.succeeded_steps, *(failure.step for failure in outcome.step_failures)]
    named = [longest_dataset(step, known, "__") or unserved_replay(step, "__") for step in steps]
    named += [dataset_of_asset(check.asset) for check in outcome.failed_checks]
    found = {d for d in named if d is not None and (d in known or REPLAY_MARK in d)}
    by_job = dataset_of_job(outcome.job_name, known)
    return sorted(found or ({by_job} if by_job else set()))


def episode_alerts(news: EpisodeNews, notifier: Notifier, alert: Any) -> list[Alert]:
    """One alert for the drift episodes that opened on a day (WARNING), one for those closed.

    A weather front moves several features at once: the features of a day are told together,
    each with since when and how far. The alert pages only when the serving champion leans on
    one of them (`leaned_on`, measured when its episode opened); otherwise it is logged for the
    UI's check and the alert log.
    """
    dataset = dataset_of_asset(news.asset)
    told = []
    for severity, rule, entries in [
        (WARNING, "drift_episode", news.opened),
        (RESOLVED, "drift_episode_closed", news.closed),
    ]:
        episodes = [Episode.from_json(e) for e in entries]
        if not episodes:
            continue
        features = ", ".join(e.feature for e in episodes)
        since = min(e.since for e in episodes)
        if rule == "drift_episode":
            title = f"{dataset}: {features} drifting since {since}"
        elif all(e.stopped == NOT_MONITORED for e in episodes):
            title = f"{dataset}: {features} no longer tested for drift (drifting since {since})"
        elif all(e.stopped == REDEFINED for e in episodes):
            title = (
                f"{dataset}: {features} computed otherwise since {news.partition}, its drift "
                f"judged afresh (drifting since {since})"
            )
        elif all(e.stopped for e in episodes):
            title = f"{dataset}: {features} no longer judged as before (drifting since {since})"
        else:
            title = f"{dataset}: {features} back since {news.partition} (drifting since {since})"
        told.append(
            alert(
                severity=severity,
                rule=rule,
                title=title,
                cause="; ".join(f"{e.describe()}; {e.leaning()}" for e in episodes),
                subject=f"{news.asset}:{news.check}",
                partition=news.partition,
                failure_class=None,
                runbook=notifier.runbook(check_anchor(news.check)),
                page=any(e.leaned_on for e in episodes),
                owners=notifier.owners_of(dataset),
                dataset=dataset,
            )
        )
    return told


def evaluate_run(
    outcome: RunOutcome,
    streaks: Mapping[str, int],
    notifier: Notifier,
    now: float,
    rejected_streaks: Mapping[tuple[str, str], int] | None = None,
    in_backfill: bool = False,
) -> list[Alert]:
    """The alerts a finished run raises.

    `streaks` counts failed runs in a row per key ("job daily_pipeline_job", "asset raw_data"),
    a retried run once, as the instance's runs tell: for a key this run fails (`streak_keys`),
    the count this run brings it to, absent when the run retries one already counted; for a key
    this run succeeds (`recovery_keys`), the count of the streak it ends. `rejected_streaks`
    counts, for each (dataset, day) this run rejected, the rejected days in a row through that
    day, `failure_streak` when the day completes the streak (`alert_sensors.rejected_in_a_row`).
    A run of a backfill (`in_backfill`) leaves its rejected days to the backfill's summary.
    """
    alerts: list[Alert] = []
    run_url = notifier.run_url(outcome.run_id)
    threshold = notifier.failure_streak
    rejected_streaks = rejected_streaks or {}
    datasets = run_datasets(outcome, notifier.owners)
    run_owners = notifier.owners_of(*datasets)

    def alert(**fields: Any) -> Alert:
        fields.setdefault("partition", outcome.partition)
        fields.setdefault("owners", run_owners)
        fields.setdefault("dataset", datasets[0] if len(datasets) == 1 else None)
        return Alert(run_id=outcome.run_id, run_url=run_url, occurred_at=now, **fields)

    rejected = [c for c in outcome.failed_checks if c.check == DELIVERY_CHECK]
    # A rejected day's failed ERROR checks (the gates, the schema) are the reasons its one
    # alert gives; they raise none of their own.
    reasons = {(dataset_of_asset(c.asset), c.partition) for c in rejected}
    for check in rejected:
        dataset, day = dataset_of_asset(check.asset), check.partition or "?"
        if in_backfill:
            continue
        in_a_row = rejected_streaks.get((dataset, day), 1)
        told = [(WARNING, "day_rejected", f"{dataset}: the delivery of {day} was rejected")]
        if in_a_row == threshold:
            # The day completes the streak, though it may have landed late, amid its days.
            title = f"{dataset}: {in_a_row} days in a row rejected, completed by {day}"
            told.append((CRITICAL, "rejected_streak", title))
        for severity, rule, title in told:
            alerts.append(
                alert(
                    severity=severity,
                    rule=rule,
                    title=title,
                    cause=one_line(check.description) or "no reason recorded",
                    subject=f"{check.asset}:{check.check}",
                    partition=day,
                    failure_class=None,
                    runbook=notifier.runbook(REJECTED_DAY_SECTION),
                    page=True,
                    owners=notifier.owners_of(dataset),
                    dataset=dataset,
                )
            )
    for check in outcome.failed_checks:
        if check.check == DELIVERY_CHECK:
            continue
        if check.severity == "ERROR" and not outcome.succeeded:
            continue  # reported as the cause of the run failure below
        if check.severity == "ERROR" and (dataset_of_asset(check.asset), check.partition) in (
            reasons
        ):
            continue
        alerts.append(
            alert(
                severity=WARNING if check.severity == "WARN" else ERROR,
                rule="check_failed",
                title=f"check {check.check} on {check.asset} failed",
                cause=one_line(check.description) or f"{check.check} did not pass",
                subject=f"{check.asset}:{check.check}",
                partition=check.partition or outcome.partition,
                failure_class=None,
                runbook=notifier.runbook(check_anchor(check.check)),
                page=check.check not in LOGGED_ONLY_CHECKS,
                owners=notifier.owners_of(dataset_of_asset(check.asset)),
                dataset=dataset_of_asset(check.asset),
            )
        )

    if not in_backfill:
        for news in outcome.episodes:
            alerts += episode_alerts(news, notifier, alert)

    # Only a streak that paged is news when it ends.
    recovered = [k for k in recovery_keys(outcome) if streaks.get(k, 0) >= threshold]
    if recovered:
        steps = [k.removeprefix("asset ") for k in recovered if k.startswith("asset ")]
        alerts.append(
            alert(
                severity=RESOLVED,
                rule="recovered",
                title=f"{' and '.join(recovered)} recovered after failing {threshold} or more "
                "times in a row",
                cause="the run succeeded"
                if outcome.succeeded
                else f"step(s) {', '.join(steps)} succeeded",
                subject=", ".join(recovered),
                failure_class=None,
                runbook=notifier.runbook("failed-3-times-in-a-row"),
                page=True,
            )
        )
    if outcome.succeeded:
        return alerts

    classification = classify_outcome(outcome)
    first = outcome.step_failures[0] if outcome.step_failures else None
    cause = failure_cause(outcome)
    anchor = classification.runbook_anchor
    if first is not None:
        where = f" at step {first.step}"
    elif outcome.unfinished_steps:
        where = f" at step {', '.join(outcome.unfinished_steps)}, which did not finish"
    else:
        where = ""
    alerts.append(
        alert(
            severity=ERROR,
            rule="run_failed",
            title=f"run of {outcome.job_name} failed{where}",
            cause=cause,
            subject=outcome.job_name,
            failure_class=classification.failure_class,
            runbook=notifier.runbook(anchor),
            page=False,
        )
    )
    crossed = [k for k in streak_keys(outcome) if streaks.get(k) == threshold]
    if crossed:
        alerts.append(
            alert(
                severity=CRITICAL,
                rule="failure_streak",
                title=f"{' and '.join(crossed)} failed {threshold} times in a row",
                cause=cause,
                subject=", ".join(crossed),
                failure_class=classification.failure_class,
                runbook=notifier.runbook("failed-3-times-in-a-row"),
                page=True,
            )
        )
    return alerts
