"""The command's own run when the webserver it launched through stops answering, or a signal
comes before the command has anything to stop.

A real instance with Dagster's queued run coordinator holds the run; the webserver's address is
one nothing listens on, as after the UI was stopped or crashed. (A queued run needs the code
location's origin: its case runs against the daemon's queue in test_automation_integration.)
A server at the webserver's address that is not it (a login page, another web app, a failing
server) is a clear error, not a traceback.
"""

import http.server
import os
import signal
import socket
import threading

import dagster as dg
import pytest

from ml_platform.automation.launch import LaunchError, Webserver
from ml_platform.cli import main, terminated


@pytest.fixture
def instance(tmp_path):
    with dg.DagsterInstance.local_temp(
        str(tmp_path),
        overrides={
            "run_coordinator": {
                "module": "dagster.core.run_coordinator",
                "class": "QueuedRunCoordinator",
            }
        },
    ) as instance:
        yield instance


@pytest.fixture
def gone() -> Webserver:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return Webserver(url=f"http://127.0.0.1:{port}")


def run_in(instance: dg.DagsterInstance, status: dg.DagsterRunStatus) -> dg.DagsterRun:
    return instance.add_run(dg.DagsterRun(job_name="daily_pipeline_job", status=status))


def test_a_started_run_the_webserver_cannot_terminate_is_said_so_without_the_query(instance, gone):
    run = run_in(instance, dg.DagsterRunStatus.STARTED)

    status = terminated(instance, gone, run.run_id)

    assert status.startswith(f"not terminated: the webserver at {gone.url} did not terminate"), (
        status
    )
    assert "Connection refused" in status and "mutation" not in status, status
    recorded = instance.get_run_by_id(run.run_id)
    assert recorded is not None and recorded.status == dg.DagsterRunStatus.STARTED


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_instance_opens_stops_the_command_as_shells_expect(
    signum, gone, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setenv("ML_PLATFORM_DAGSTER_URL", gone.url)
    opens = dg.DagsterInstance.get

    def interrupted_while_opening() -> dg.DagsterInstance:
        # Ctrl-C (or a SIGTERM) as `make run` starts: the instance is still opening.
        os.kill(os.getpid(), signum)
        return opens()

    monkeypatch.setattr(dg.DagsterInstance, "get", staticmethod(interrupted_while_opening))

    code = main(["materialize", "--dataset", "synthetic", "--start", "2024-01-01"])

    assert code == 128 + signum
    err = capsys.readouterr().err
    assert f"stopped by {signal.Signals(signum).name}" in err and "Traceback" not in err


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every request 404, keeping the paths asked for (a proxy with no Dagster)."""

    paths: list[str] = []

    def do_POST(self):
        type(self).paths.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_webserver_served_under_a_path_is_asked_there_for_every_request():
    Recorder.paths = []
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            webserver = Webserver(url=f"http://127.0.0.1:{server.server_address[1]}/dagster/")
            for ask in (webserver.check_queue, lambda: webserver.launch("job", {})):
                with pytest.raises(LaunchError):
                    ask()
        finally:
            server.shutdown()

    assert Recorder.paths and set(Recorder.paths) == {"/dagster/graphql"}, Recorder.paths


class Impostor(http.server.BaseHTTPRequestHandler):
    """Answers as a server that is not the Dagster webserver at its address: a proxy's login
    page behind a redirect, another web app on the port, or a failing server.
    """

    answer = "login redirect"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.answer == "login redirect":
            self.reply(302, b"", Location="/login")
        elif self.answer == "html":
            self.reply(200, b"<html><body>Welcome to nginx!</body></html>")
        else:
            self.reply(500, b"Internal Server Error")

    def do_GET(self):
        # urllib follows a POST's 302 with a GET: the login page.
        self.reply(200, b"<html><body>Sign in</body></html>")

    def reply(self, code: int, body: bytes, **headers: str) -> None:
        self.send_response(code)
        for name, value in {"Content-Type": "text/html", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("answer", ["login redirect", "html", "server error"])
def test_a_server_answering_no_graphql_is_a_clear_error_of_the_command(
    answer, tmp_path, monkeypatch, capsys
):
    Impostor.answer = answer
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Impostor) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
        monkeypatch.setenv("ML_PLATFORM_DAGSTER_URL", url)
        try:
            code = main(["materialize", "--dataset", "synthetic", "--start", "2024-01-01"])
            with pytest.raises(LaunchError) as backfill:
                Webserver(url).backfill({dg.AssetKey(["synthetic", "raw_data"]): [("a", "b")]})
        finally:
            server.shutdown()

    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    # Something answers there: not "start the UI", but what answered and what to check.
    expected = {"login redirect": "Sign in", "html": "nginx", "server error": "HTTP 500"}[answer]
    for message in (err, str(backfill.value)):
        assert f"the server at {url} answered" in message and expected in message, message
        assert "no Dagster webserver answers" not in message, message
