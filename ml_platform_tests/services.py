"""Servers the integration tests start on 127.0.0.1: an S3 API (moto), PostgreSQL, Dagster, and
a log sink that pauses a run at a chosen event.

Each is a real server that other processes (webserver, daemon, run workers) reach over the
network, as in production; nothing is mocked in-process.
"""

import contextlib
import dataclasses
import glob
import http.server
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import dagster as dg
import yaml
from moto.server import ThreadedMotoServer

from ml_platform_tests.conftest import REPO, free_port

# moto accepts any credentials; these only make the SDK's default chain find some.
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class WebhookReceiver(http.server.BaseHTTPRequestHandler):
    """A Slack-compatible webhook: records POSTed JSON bodies; answers 500 while `fail_next`."""

    server: "WebhookServer"

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.server.fail_next > 0:
            self.server.fail_next -= 1
            self.server.refused += 1
            self.send_response(500)
            self.end_headers()
            return
        self.server.received.append(json.loads(body))
        if self.server.on_post is not None:
            self.server.on_post()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


class WebhookServer(http.server.ThreadingHTTPServer):
    """The receiver's server: what it received, and how many posts it should still refuse."""

    received: list[dict]
    fail_next: int
    refused: int
    # Called on each post the receiver accepts, before it answers: what happens meanwhile.
    on_post: Callable[[], None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


@contextlib.contextmanager
def webhook_server() -> Iterator[WebhookServer]:
    """A webhook receiver on 127.0.0.1, served from a thread while the block runs."""
    server = WebhookServer(("127.0.0.1", 0), WebhookReceiver)
    server.received, server.fail_next, server.refused = [], 0, 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


class HeldLogReceiver(http.server.BaseHTTPRequestHandler):
    """Log records from `logging.handlers.HTTPHandler`; holds the first that `hold` matches."""

    server: "HeldLog"

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        message = urllib.parse.parse_qs(body.decode()).get("msg", [""])[0]
        server = self.server
        with server.lock:
            hold = server.hold in message and not server.held.is_set()
            if hold:
                server.held.set()
        # The emitting process waits for this answer: it stays inside the logged event, until
        # the test releases it or, a test having forgotten to, HOLD_LIMIT_SECONDS later.
        if hold and not server.released.wait(HOLD_LIMIT_SECONDS):
            server.expired = True
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


# Longer than any test waits with a run held; a hold that lasts it fails the test (held_log).
HOLD_LIMIT_SECONDS = 900


class HeldLog(http.server.ThreadingHTTPServer):
    """A log sink that stops the process emitting a chosen record until the test releases it.

    Named in an instance's `python_logs` (see `handler`), it receives every record of every
    run; the first whose message contains `hold` gets no answer until `released` is set, so
    its run is paused at that event (a step's start, say) for as long as the test needs.
    """

    hold: str
    held: threading.Event
    released: threading.Event
    expired: bool
    lock: threading.Lock

    def handler(self) -> dict:
        """The `dagster_handler_config` handler that sends every record of a run here."""
        return {
            "class": "logging.handlers.HTTPHandler",
            "level": "DEBUG",
            "host": f"127.0.0.1:{self.server_address[1]}",
            "url": "/log",
            "method": "POST",
        }

    def wait_held(
        self, process: subprocess.Popen, timeout: float, output: Callable[[], str] | None = None
    ) -> None:
        """Until a record is held; fails at once if `process` ends first.

        The failure shows `output()`, else the process's own output (killing it if it runs).
        """
        deadline = time.monotonic() + timeout
        while not self.held.wait(0.2):
            if process.poll() is None and time.monotonic() < deadline:
                continue
            if output is not None:
                said = output()
            else:
                if process.poll() is None:
                    process.kill()  # timed out: its output says where it was
                out, err = process.communicate(timeout=30)
                said = f"{out}\n{err[-3000:]}"
            raise AssertionError(f"no record matched {self.hold!r}:\n{said}")

    def arm(self, hold: str) -> None:
        """Hold the next record containing `hold` (the one held before, if any, is released)."""
        with self.lock:
            self.released.set()
            self.hold = hold
            self.held, self.released = threading.Event(), threading.Event()


@contextlib.contextmanager
def held_log(hold: str) -> Iterator[HeldLog]:
    """A HeldLog on 127.0.0.1 holding the first record containing `hold`; released at the end."""
    server = HeldLog(("127.0.0.1", 0), HeldLogReceiver)
    server.hold, server.lock = hold, threading.Lock()
    server.held, server.released = threading.Event(), threading.Event()
    server.expired = False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.released.set()
        server.shutdown()
        server.server_close()
    assert not server.expired, (
        f"a run held at {server.hold!r} was never released: it went on after {HOLD_LIMIT_SECONDS}s"
    )


@contextlib.contextmanager
def moto_s3() -> Iterator[str]:
    """An S3 API server on 127.0.0.1 for the duration; yields its endpoint URL."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        # moto keeps its buckets in process-wide state: start every test from an empty store.
        reset = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(reset, timeout=10).close()
        yield endpoint
    finally:
        server.stop()


def s3_test_client(endpoint: str):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=FAKE_AWS["AWS_DEFAULT_REGION"],
        aws_access_key_id=FAKE_AWS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_AWS["AWS_SECRET_ACCESS_KEY"],
    )


def postgres_bin() -> Path:
    """The newest installed PostgreSQL's bin directory; a clear failure when there is none."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if not found:
        raise RuntimeError(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin): run "
            "`make system-packages` (Debian package `postgresql`)"
        )
    return Path(found[-1])


@dataclasses.dataclass
class Postgres:
    """A throwaway PostgreSQL cluster in a temporary directory, owned by the `postgres` user.

    initdb and postgres refuse to run as root (the tests do), so the server runs as `postgres`
    through runuser. It listens on 127.0.0.1 with password authentication for TCP clients.
    """

    root: Path
    port: int
    user: str = "ml_platform"
    password: str = ""
    db_name: str = "dagster"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def _as_postgres(self, *command: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *command], check=True, timeout=120)

    def init(self) -> None:
        bin_dir = postgres_bin()
        shutil.chown(self.root, user="postgres", group="postgres")
        self._as_postgres(
            str(bin_dir / "initdb"),
            *("-D", str(self.data), "-U", "postgres", "--auth-local=trust"),
            *("--auth-host=scram-sha-256", "--no-sync", "-E", "UTF8"),
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres(
            str(postgres_bin() / "pg_ctl"),
            *("-D", str(self.data), "-l", str(self.root / "server.log"), "-w"),
            *("-o", options, "start"),
        )

    def stop(self, mode: str = "fast") -> None:
        self._as_postgres(
            str(postgres_bin() / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"
        )

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def admin(self, sql: str) -> None:
        """Run SQL as the superuser over the Unix socket (trusted local connections)."""
        import psycopg2

        connection = psycopg2.connect(
            host=str(self.root), port=self.port, user="postgres", dbname="postgres"
        )
        connection.autocommit = True
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
        finally:
            connection.close()

    def database(self, name: str) -> "Postgres":
        """A new empty database owned by the platform's user: one per test, nothing shared."""
        self.admin(f"CREATE DATABASE {name} OWNER {self.user}")
        return dataclasses.replace(self, db_name=name)

    def connect(self):
        """A TCP connection as the platform's user, as Dagster makes it."""
        import psycopg2

        return psycopg2.connect(
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=self.db_name,
        )

    def query(self, sql: str) -> list[tuple]:
        connection = self.connect()
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
                return cursor.fetchall()
        finally:
            connection.close()

    def url(self) -> str:
        """The database's SQLAlchemy URL, password included (MLflow's MLFLOW_TRACKING_URI)."""
        return f"postgresql+psycopg2://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.db_name}"

    def env(self) -> dict[str, str]:
        """The variables deploy/dagster.yaml reads the connection from."""
        return {
            "DAGSTER_PG_USERNAME": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_DB": self.db_name,
        }


@contextlib.contextmanager
def postgres_server() -> Iterator[Postgres]:
    """A running PostgreSQL with an empty database and a password user; removed afterwards."""
    # Not under pytest's tmp_path: its parents are private to root, and the server runs as
    # the `postgres` user.
    root = Path(tempfile.mkdtemp(prefix="ml-platform-pg-"))
    server = Postgres(root=root, port=free_port(), password=secrets.token_hex(16))
    try:
        server.init()
        server.start()
        server.admin(f"CREATE ROLE {server.user} LOGIN PASSWORD '{server.password}'")
        server.admin(f"CREATE DATABASE {server.db_name} OWNER {server.user}")
        yield server
    finally:
        if server.running():
            server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


# The backfill's state (launched with `ml_platform.automation.launch.LAUNCH_BACKFILL`).
BACKFILL_QUERY = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    ... on PartitionBackfill { status partitionNames }
  }
}
"""


class DagsterProcesses:
    """dagster-webserver and dagster-daemon (in `procs`) with their logs, seen over GraphQL.

    Subclasses set the environment (`env`, with DAGSTER_HOME), the directory the processes run
    in (`cwd`, holding workspace.yaml), the webserver's `port` and the `logs` directory.
    """

    env: dict[str, str]
    cwd: Path
    logs: Path
    port: int
    procs: list[subprocess.Popen]
    daemon: subprocess.Popen

    def start(self, webserver: bool = True, daemon: bool = True) -> None:
        """The instance's storage, the code server, then the webserver and the daemon.

        The webserver and the daemon (each unless not wanted) load the code location from one
        code server over gRPC, as `make serve` (`dg dev`) and the production recipe run them:
        given workspace.yaml's module itself, each would start a code server of its own, and
        the daemon a new one every minute (it reloads its workspace), each importing the code
        location again. Each process runs in its own group.
        """
        bin_dir = Path(sys.executable).parent
        # Create the SQLite storage first: the processes creating it at once can race (alembic
        # then finds two heads).
        # Then every pool's limit, before the daemon meets a run of it (`make serve` does too).
        for command in (["dagster", "instance", "migrate"], ["ml-platform", "pools"]):
            subprocess.run(
                [str(bin_dir / command[0]), *command[1:]],
                cwd=self.cwd,
                env=self.env,
                check=True,
                capture_output=True,
                timeout=180,
            )
        code_port = free_port()
        self.spawn(
            "code-server",
            [
                str(bin_dir / "dagster"),
                *("code-server", "start", "-h", "127.0.0.1", "-p", str(code_port)),
                *("-m", "ml_platform.definitions", "--location-name", "ml_platform"),
            ],
        )
        workspace = self.logs / "workspace.yaml"
        workspace.write_text(
            yaml.safe_dump(
                {
                    "load_from": [
                        {
                            "grpc_server": {
                                "host": "127.0.0.1",
                                "port": code_port,
                                "location_name": "ml_platform",
                            }
                        }
                    ]
                }
            )
        )
        # The code server listens once it has loaded the code location.
        self.wait_for(lambda: listening(code_port), 180, "the code server")
        if webserver:
            self.spawn(
                "webserver",
                [
                    str(bin_dir / "dagster-webserver"),
                    *("-h", "127.0.0.1", "-p", str(self.port), "-w", str(workspace)),
                ],
            )
        if daemon:
            self.start_daemon()

    def start_daemon(self) -> None:
        """dagster-daemon over the code server's workspace (a new daemon.log)."""
        command = [str(Path(sys.executable).parent / "dagster-daemon"), "run"]
        self.daemon = self.spawn("daemon", [*command, "-w", str(self.logs / "workspace.yaml")])

    def stop_daemon(self) -> None:
        """End the daemon's process group; queued runs stay queued until a daemon starts."""
        os.killpg(self.daemon.pid, signal.SIGTERM)
        self.daemon.wait(timeout=60)
        self.procs.remove(self.daemon)

    def spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        """Start a process in its own group (stop() ends the group), logging to <name>.log."""
        with (self.logs / f"{name}.log").open("w") as log:
            proc = subprocess.Popen(
                command,
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def output(self) -> str:
        """The last lines of each process's log, for a failure message."""
        return "\n".join(
            f"--- {name} (last lines)\n" + (self.logs / f"{name}.log").read_text()[-4000:]
            for name in ("code-server", "webserver", "daemon")
            if (self.logs / f"{name}.log").exists()
        )

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        """The data of a GraphQL request to the webserver; errors fail the test."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = json.loads(response.read())
        assert "errors" not in payload, payload["errors"]
        return payload["data"]

    def stop(self) -> None:
        """SIGTERM to each process group, then SIGKILL to what is left of them after 10 s."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        # Code servers and run workers share each process group: leave none of them behind.
        for proc in self.procs:
            # The group can end between the look and the kill.
            if living_in_group(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

    def wait_for(self, predicate, timeout: float, what: str):
        """The first truthy value of `predicate`, polled each second while the processes live."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                assert proc.poll() is None, f"a Dagster process exited\n{self.output()}"
            try:
                value = predicate()
            # A poll that times out while the machine is busy is "not yet": the deadline decides.
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                value = None
            if value:
                return value
            time.sleep(1)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{self.output()}")


def listening(port: int) -> bool:
    """Whether a server accepts connections on 127.0.0.1:port."""
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def living_in_group(pgid: int) -> list[str]:
    """Processes of a process group that still run (zombies awaiting reaping do not count)."""
    ps = subprocess.run(
        ["ps", "-o", "pid=,stat=,args=", "-g", str(pgid)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    return [line for line in ps.stdout.splitlines() if line.split()[1][0] != "Z"]


class DagsterServices(DagsterProcesses):
    """dagster-webserver and dagster-daemon over a fresh instance, as `make serve` runs them.

    The repository's dagster.yaml (queue, limits, pools, run monitoring) plus, when given, a log
    `handler`; the bundled datasets, served from a landing zone and a lake of their own. `env`
    is the environment of a user whose `ml-platform` reaches them (ML_PLATFORM_DAGSTER_URL).
    """

    def __init__(self, root: Path, handler: dict | None = None):
        home = root / "dagster_home"
        home.mkdir()
        config = yaml.safe_load((REPO / "dagster.yaml").read_text())
        if handler is not None:
            config["python_logs"]["dagster_handler_config"]["handlers"]["sink"] = handler
        (home / "dagster.yaml").write_text(yaml.safe_dump(config))
        self.home = home
        self.landing = root / "landing"
        self.lake = root / "lake"
        self.port = free_port()
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "ML_PLATFORM_LANDING_DIR": str(self.landing),
            "ML_PLATFORM_LAKE_DIR": str(self.lake),
            "ML_PLATFORM_DAGSTER_URL": f"http://127.0.0.1:{self.port}",
        }
        self.env.pop("ML_PLATFORM_DATASET", None)
        self.cwd = REPO
        self.logs = root
        self.procs = []

    def start(self, webserver: bool = True, daemon: bool = True) -> None:
        """Start them, and wait until the webserver answers and the daemon works the queue."""
        super().start(webserver=webserver, daemon=daemon)
        if daemon:
            self.wait_for(self.queue_daemon_healthy, 240, "the webserver and the queue's daemon")
        else:
            self.wait_for(lambda: self.graphql("{ version }"), 240, "the webserver")

    def queue_daemon_healthy(self) -> bool:
        data = self.graphql(
            '{ instance { daemonHealth { daemonStatus(daemonType: "QUEUED_RUN_COORDINATOR") '
            "{ healthy } } } }"
        )
        return data["instance"]["daemonHealth"]["daemonStatus"]["healthy"]

    def instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.from_config(str(self.home))


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A Redis server from Debian's package on a free port, kept in memory; its URL."""
    port = free_port()
    server = subprocess.Popen(
        [
            shutil.which("redis-server") or "/usr/bin/redis-server",
            *("--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not _accepts(port):
            assert server.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "redis-server did not listen within 30 s"
            time.sleep(0.2)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(timeout=30)


def _accepts(port: int) -> bool:
    try:
        return listening(port)
    except OSError:
        return False


@contextlib.contextmanager
def memory_cgroup(name: str, limit_mb: int) -> Iterator[Path]:
    """A memory cgroup holding at most `limit_mb` MiB: what a container's memory limit is.

    The kernel ends (SIGKILL) a process of the group that would go over it, as ECS and
    Kubernetes end a task or pod over its memory. Yields the file a process joins it by (write
    its pid). cgroup v1's memory hierarchy, or v2's where the memory controller is there.
    """
    v1 = Path("/sys/fs/cgroup/memory")
    v2 = Path("/sys/fs/cgroup")
    if v1.is_dir():
        group, limit_file = v1 / name, "memory.limit_in_bytes"
    elif "memory" in (v2 / "cgroup.controllers").read_text():
        group, limit_file = v2 / name, "memory.max"
    else:
        raise AssertionError("this machine has no memory cgroup to limit a worker with")
    group.mkdir()
    try:
        (group / limit_file).write_text(str(limit_mb * 1024 * 1024))
        yield group / "cgroup.procs"
    finally:
        # The group can be removed once its processes have ended.
        deadline = time.monotonic() + 30
        while True:
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


class CeleryWorkers:
    """dagster-celery workers, a pool (queue) each, started as the docs start them."""

    def __init__(self, root: Path, broker: str, env: dict[str, str]):
        self.root = root
        self.env = env
        self.config = root / "celery.yaml"
        self.config.write_text(
            yaml.safe_dump({"execution": {"config": {"broker": broker, "backend": broker}}})
        )
        self.procs: dict[str, subprocess.Popen] = {}

    def log(self, pool: str) -> Path:
        return self.root / f"worker-{pool}.log"

    def start(self, pool: str, cgroup: Path | None = None) -> None:
        """A worker of `pool` running one step at a time; in `cgroup` when given.

        Its environment names its pool (ML_PLATFORM_WORKER_POOL), which each step it runs
        records. Returns once the worker listens to its queue.
        """
        command = [
            str(Path(sys.executable).parent / "dagster-celery"),
            *("worker", "start", "-A", "dagster_celery.app", "-n", pool, "-q", pool),
            *("-y", str(self.config), "--", "--concurrency", "1"),
        ]
        if cgroup is not None:
            # Join the group first, then become the worker: all it forks stays in the group.
            command = ["sh", "-c", f'echo $$ > "{cgroup}" && exec "$@"', "sh", *command]
        env = {
            **self.env,
            "ML_PLATFORM_WORKER_POOL": pool,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}",
        }
        with self.log(pool).open("w") as log:
            self.procs[pool] = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 180
        while " ready." not in self.log(pool).read_text():
            assert self.procs[pool].poll() is None, self.log(pool).read_text()[-4000:]
            assert time.monotonic() < deadline, f"worker {pool} not ready in 180 s"
            time.sleep(0.5)

    def stop(self, *pools: str) -> None:
        """End the process group of each worker of `pools` (default: all), and wait for them."""
        procs = [proc for pool, proc in self.procs.items() if not pools or pool in pools]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
