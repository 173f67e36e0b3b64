"""Runs submitted to the instance as the UI submits them: through the Dagster webserver's API.

`ml-platform materialize` launches each day as a run of the dataset's daily job through the
webserver's GraphQL API (`ML_PLATFORM_DAGSTER_URL`), the way the UI's Materialize does. The run
goes into the instance's queue; dagster-daemon starts it when the instance's limits allow
(dagster.yaml: the assets' pools, one run of a day at a time), the run launcher starts its run
worker, and run monitoring watches that worker. So a run of the command is like any other: the
queue keeps it apart from other runs writing its assets, and a command killed mid-day leaves a
run that goes on (or that run monitoring records failed), never one STARTED forever.
"""

import dataclasses
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

# The daemon that takes queued runs from the queue and launches them.
QUEUE_DAEMON = "QUEUED_RUN_COORDINATOR"
# dagster-daemon stores a heartbeat of each of its daemons every 30 s (Dagster's default, which
# `dagster-daemon run` does not change). Dagster still calls a daemon healthy 30 minutes after
# its last one, long enough for runs to wait unseen behind a daemon that died: one silent for
# four intervals has stopped or hangs.
HEARTBEAT_INTERVAL_SECONDS = 30
QUEUE_SILENCE_SECONDS = 4 * HEARTBEAT_INTERVAL_SECONDS
DAEMON_HEALTH = """
query QueueDaemon($daemonType: String!) {
  instance {
    daemonHealth {
      daemonStatus(daemonType: $daemonType) { required healthy lastHeartbeatTime }
    }
  }
}
"""
RELOAD_WORKSPACE = """
mutation {
  reloadWorkspace {
    __typename
    ... on Workspace {
      locationEntries {
        name
        locationOrLoadError { __typename ... on PythonError { message } }
      }
    }
    ... on PythonError { message }
  }
}
"""
LAUNCH_BACKFILL = """
mutation Backfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
  }
}
"""
BACKFILL_STATUS = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { status }
    ... on Error { message }
  }
}
"""
# A backfill's status once the daemon has nothing left to launch or wait for.
BACKFILL_DONE = frozenset(
    {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
)
# A run's status once it no longer executes or waits.
FINISHED = frozenset(
    {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
)
# What a proxy in front of the webserver answers while the webserver is not up (yet): a bad
# gateway, unavailable, a gateway timeout. Any other error status is an answer of a server
# that is up: the webserver's own 500 (its instance's storage refusing, a bug) or another
# service's, which waiting does not mend.
NOT_UP_STATUSES = frozenset({502, 503, 504})
# Seconds between two looks at a webserver that is not up yet.
UP_POLL_SECONDS = 1.0


class LaunchError(Exception):
    """The webserver cannot take the run: not reachable, no daemon, or it refused the run.

    Nothing was launched; the message says what to start or fix. Waiting does not help.
    """


class NotUpYetError(LaunchError):
    """A `LaunchError` that waiting can mend: the webserver or its daemon is not up yet.

    Nothing answers at the webserver's address, a proxy says it is not up (`NOT_UP_STATUSES`),
    or no daemon works its queue yet.
    """


def client_failure(exc: Exception) -> str:
    """What the GraphQL client's error was caused by, without the query it puts in its text."""
    cause = exc.__cause__
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    # The client's own refusals carry (kind, message): `JobNotFoundError: No jobs with ...`.
    return ": ".join(str(arg) for arg in exc.args) or type(exc).__name__


def _start_of(body: bytes, limit: int = 200) -> str:
    """The first characters of an answer's body, on one line, for a message."""
    text = " ".join(body.decode("utf-8", errors="replace").split())
    return repr(text[:limit] + ("..." if len(text) > limit else "")) if text else "an empty body"


def _errors_in(body: bytes) -> str:
    """The GraphQL errors an error answer carries (`, errors: [...]`), else its first characters."""
    try:
        errors = json.loads(body).get("errors")
    except (ValueError, AttributeError):
        errors = None
    return f", errors: {errors}" if errors else f" ({_start_of(body)})"


@dataclasses.dataclass(frozen=True)
class Webserver:
    """The Dagster webserver at `url`, through which runs are launched and terminated."""

    url: str

    def _client(self):
        from dagster_graphql import DagsterGraphQLClient

        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LaunchError(f"ML_PLATFORM_DAGSTER_URL={self.url!r} is not an http(s) URL")
        # A webserver served under a path (`--path-prefix`) answers there, as `_query` asks.
        return DagsterGraphQLClient(
            parts.hostname,
            port_number=parts.port,
            use_https=parts.scheme == "https",
            path_prefix=parts.path.rstrip("/"),
        )

    def _query(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url.rstrip('/')}/graphql",
            data=json.dumps({"query": query, "variables": variables}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            # Something answers, but with an error status (a 500, a redirect urllib does not
            # follow for a POST): saying nothing answers would send the user to start a UI.
            body = exc.read()
            kind = NotUpYetError if exc.code in NOT_UP_STATUSES else LaunchError
            raise kind(
                f"the server at {self.url} answered HTTP {exc.code} {exc.reason}"
                f"{_errors_in(body)}: is ML_PLATFORM_DAGSTER_URL the Dagster webserver itself?"
            ) from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLError):
                # A server answers, but not in the TLS the URL asks for (an https URL for a
                # plain-HTTP webserver, a certificate not trusted): every try fails the same.
                raise LaunchError(
                    f"the server at {self.url} did not complete a TLS handshake "
                    f"({exc.reason}): is ML_PLATFORM_DAGSTER_URL's scheme (http or https) the "
                    "webserver's, and is its certificate trusted here (SSL_CERT_FILE)?"
                ) from exc
            raise self._not_up(exc) from exc
        except (ConnectionError, TimeoutError) as exc:
            raise self._not_up(exc) from exc
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        if not isinstance(payload, dict) or not ({"data", "errors"} & payload.keys()):
            # A login page a redirect led to, or another service on the port.
            raise LaunchError(
                f"the server at {self.url} answered no GraphQL result ({_start_of(body)}): is "
                "ML_PLATFORM_DAGSTER_URL the Dagster webserver itself?"
            )
        if payload.get("errors") or not isinstance(payload.get("data"), dict):
            raise LaunchError(
                f"the webserver at {self.url} answered {payload.get('errors') or payload}"
            )
        return payload["data"]

    def _not_up(self, exc: Exception) -> NotUpYetError:
        return NotUpYetError(
            f"no Dagster webserver answers at {self.url} ({exc}): start the UI and daemon "
            "(`make serve`, or `dg dev`), or set ML_PLATFORM_DAGSTER_URL to the webserver of "
            "this instance"
        )

    def check_queue(self) -> None:
        """Raise `LaunchError` unless the webserver answers and a daemon works the run queue.

        A run queued with no daemon would wait in the queue until one starts. A daemon works it
        while its heartbeats come (`QUEUE_SILENCE_SECONDS`), read against this machine's clock.
        """
        data = self._query(DAEMON_HEALTH, {"daemonType": QUEUE_DAEMON})
        status = data["instance"]["daemonHealth"]["daemonStatus"]
        start = (
            "Start it (`make serve` starts one; alone: `ml-platform pools && dagster-daemon run "
            "-w workspace.yaml`, the pools' limits first) and run this again"
        )
        if status.get("required") is False:
            # No run queue: each run starts as it is launched, so the pools' limits, which only
            # the queue applies, would let two writers of a day run at once. No daemon mends that.
            raise LaunchError(
                f"the instance served at {self.url} has no run queue (its dagster.yaml's "
                "run_coordinator is not the QueuedRunCoordinator), so the limits only the queue "
                "applies (the pools, one run of a day at a time) would not hold: configure the "
                "QueuedRunCoordinator (Dagster's default, which the repository's dagster.yaml "
                "keeps), restart the webserver and daemon, then run this again"
            )
        if not status["healthy"]:
            raise NotUpYetError(
                f"no dagster-daemon works the run queue of the instance served at {self.url}: "
                f"a run launched now would wait in the queue. {start}"
            )
        # Dagster's healthy daemon has a heartbeat; a server that says no time is taken at its word.
        last = status.get("lastHeartbeatTime")
        silent = 0.0 if last is None else time.time() - float(last)
        if silent > QUEUE_SILENCE_SECONDS:
            raise NotUpYetError(
                f"the dagster-daemon that works the run queue of the instance served at "
                f"{self.url} last reported {silent:.0f} s ago (one at work reports every "
                f"{HEARTBEAT_INTERVAL_SECONDS} s): it stopped or hangs, and a run launched now "
                f"would wait in the queue. {start}"
            )

    def wait_until_up(self, wait: float) -> None:
        """Return once the webserver answers and a daemon works its queue, waiting up to `wait` s.

        `make run` starts a command beside the UI it launches through, which needs a few
        seconds to answer: only that is waited for (`NotUpYetError`). An answer waiting cannot
        mend (a page that is not the webserver's, its own server error, a GraphQL error) is
        raised at once, not after the whole wait; past `wait`, the last `NotUpYetError` says
        what to start.
        """
        deadline = time.monotonic() + wait
        while True:
            try:
                self.check_queue()
                return
            except NotUpYetError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(UP_POLL_SECONDS)

    def launch(self, job: str, tags: dict[str, str]) -> str:
        """Submit a run of `job` with `tags` to the instance's queue; its run id."""
        from dagster_graphql import DagsterGraphQLClientError

        try:
            return self._client().submit_job_execution(job, tags=tags)
        except DagsterGraphQLClientError as exc:
            raise LaunchError(
                f"the webserver at {self.url} did not launch {job}: {client_failure(exc)}; is it "
                "serving this code location (workspace.yaml) with the same contracts?"
            ) from exc

    def terminate(self, run_id: str) -> None:
        """Ask the instance to terminate a run (a queued one is canceled before it starts)."""
        from dagster_graphql import DagsterGraphQLClientError

        try:
            self._client().terminate_run(run_id)
        except DagsterGraphQLClientError as exc:
            raise LaunchError(
                f"the webserver at {self.url} did not terminate run {run_id}: "
                f"{client_failure(exc)}; terminate it in the UI (Runs) or leave it to end"
            ) from exc

    def reload_workspace(self) -> None:
        """Have the webserver load its code locations again (a replay added or removed)."""
        data = self._query(RELOAD_WORKSPACE, {})["reloadWorkspace"]
        if data["__typename"] != "Workspace":
            raise LaunchError(f"the webserver at {self.url} did not reload: {data}")
        failed = [
            f"{entry['name']}: {entry['locationOrLoadError'].get('message', '')}"
            for entry in data["locationEntries"]
            if (entry["locationOrLoadError"] or {}).get("__typename") == "PythonError"
        ]
        if failed:
            raise LaunchError(f"the webserver at {self.url} could not load {'; '.join(failed)}")

    def backfill(self, ranges: Mapping[dg.AssetKey, Sequence[tuple[str, str]]]) -> str:
        """Launch a backfill of each asset over its ranges of days (first, last); its id.

        Sent as the UI's Materialize of partition ranges; the daemon splits it into runs.
        """
        params = {
            "partitionsByAssets": [
                {
                    "assetKey": {"path": key.path},
                    "partitions": {
                        "ranges": [{"start": first, "end": last} for first, last in runs]
                    },
                }
                for key, runs in ranges.items()
            ]
        }
        data = self._query(LAUNCH_BACKFILL, {"params": params})["launchPartitionBackfill"]
        if data["__typename"] != "LaunchBackfillSuccess":
            raise LaunchError(
                f"the webserver at {self.url} did not launch the backfill: {data}; is it "
                "serving this code location (workspace.yaml) with the same contracts?"
            )
        return str(data["backfillId"])

    def backfill_status(self, backfill_id: str) -> str:
        """The backfill's status as the instance records it (`BACKFILL_DONE` once ended)."""
        data = self._query(BACKFILL_STATUS, {"id": backfill_id})["partitionBackfillOrError"]
        if "status" not in data:
            # Not found (another instance, or deleted) or an error: waiting would never end.
            raise LaunchError(
                f"the webserver at {self.url} has no backfill {backfill_id} "
                f"({data['__typename']}: {data.get('message', 'no message')}): is it serving "
                "the instance of DAGSTER_HOME?"
            )
        return str(data["status"])
