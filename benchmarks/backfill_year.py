"""A backfill of real flights days through dagster-daemon, as a user launches it from the UI.

Run: .venv/bin/python benchmarks/backfill_year.py [--days 365] [--start 2013-01-01]
     [--days-per-run 30] [--baseline-processes 2]

Lands the days' files, starts `dagster-webserver` and `dagster-daemon` on a fresh instance (the
repository's dagster.yaml: SQLite, the queued run coordinator and its limits, two runs at once)
with `ML_PLATFORM_BACKFILL_DAYS_PER_RUN` set to `--days-per-run`, and launches a backfill of the
daily job's assets (champion_performance included) over the days through the webserver's GraphQL
API, which is what the UI's "Materialize" of a partition range sends. The daemon splits it into
runs of at most that many days. It waits for the backfill to finish and reports the time from
the request to the last run's end and to the backfill's completion, the runs (how many, the most
days one held), each step's time, each run's timeline and the seconds during which no run was
running (the daemon's loops and run starts that no computation overlapped) and the CPU seconds
the stack used from the request on (runs, daemon, webserver), then runs the plain script
(`benchmarks/baseline.py`) over the same days with the same cores (`--baseline-processes`
processes over contiguous parts, its CPU seconds too) and divides. `cpu_floor_over_baseline` is
the platform's CPU seconds spread over every core with no wait, against the script's seconds:
no arrangement of the same runs on this machine can give a ratio below it.
"""

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import idle

from ml_platform.automation.launch import LAUNCH_BACKFILL as LAUNCH
from ml_platform.platform.rejected import DAY_ASSETS
from ml_platform.platform.settings import BACKFILL_DAYS_PER_RUN_ENV, DEFAULT_BACKFILL_DAYS_PER_RUN

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DAILY_ASSETS = list(DAY_ASSETS)
BACKFILL = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    ... on PartitionBackfill { status timestamp endTimestamp }
  }
}
"""
RUNS = """
query Runs($filter: RunsFilter) {
  runsOrError(filter: $filter) {
    ... on Runs {
      results {
        runId status creationTime startTime endTime
        tags { key value }
        stepStats { stepKey status startTime endTime }
      }
    }
  }
}
"""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
DONE = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    """Whether a server accepts connections on 127.0.0.1:port (ConnectionError if not)."""
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


class Stack:
    """dagster-webserver and dagster-daemon on a fresh instance, each in its process group."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root = root
        self.env = env
        self.port = free_port()
        self.procs: list[subprocess.Popen] = []
        self.names: list[str] = []

    def start(self, code_server: bool = False) -> None:
        """The webserver and the daemon; with `code_server`, both load the code location from
        one code server (as `dg dev` and the production stack run them), else each from
        workspace.yaml's module in a code server of its own."""
        workspace = "workspace.yaml"
        if code_server:
            port = free_port()
            self.spawn(
                "code-server",
                ["dagster", "code-server", "start", "-h", "127.0.0.1", "-p", str(port)]
                + ["-m", "ml_platform.definitions", "--location-name", "ml_platform"],
            )
            workspace = str(self.root / "workspace.yaml")
            Path(workspace).write_text(
                json.dumps(
                    {
                        "load_from": [
                            {
                                "grpc_server": {
                                    "host": "127.0.0.1",
                                    "port": port,
                                    "location_name": "ml_platform",
                                }
                            }
                        ]
                    }
                )
            )
            self.wait(lambda: listening(port), 180, "the code server")
        host = ["-h", "127.0.0.1", "-p", str(self.port)]
        self.spawn("webserver", ["dagster-webserver", *host, "-w", workspace])
        self.spawn("daemon", ["dagster-daemon", "run", "-w", workspace])

    def spawn(self, name: str, command: list[str]) -> None:
        self.names.append(name)
        with (self.root / f"{name}.log").open("w") as log:
            self.procs.append(
                subprocess.Popen(
                    [str(BIN / command[0]), *command[1:]],
                    cwd=REPO,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds the stack's processes have used so far, by role (Linux's /proc).

        A process's own time, and the time of the children it has reaped, which the kernel adds
        to it when they end. The servers (`webserver`, `daemon`, `code-server`) count their own
        time; everything below them is `runs`: the code servers they start (which the daemon
        restarts as it reloads the workspace), the run workers those start, and the runs'
        training workers. A code server's own time is small beside its runs' (a few seconds a
        backfill), and one that has ended can no longer be told apart from them.
        """
        parents: dict[int, int] = {}
        own: dict[int, float] = {}
        reaped: dict[int, float] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                pid = int(entry.name)
                parents[pid] = int(fields[1])
                # utime, stime, cutime, cstime (fields 14 to 17 of proc(5)), in clock ticks.
                own[pid] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
                reaped[pid] = (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
        seconds = {"runs": 0.0, **dict.fromkeys(self.names, 0.0)}

        def below(pid: int) -> float:
            return sum(own[c] + reaped[c] + below(c) for c, p in parents.items() if p == pid)

        for name, proc in zip(self.names, self.procs, strict=True):
            seconds[name] += own.get(proc.pid, 0.0)
            seconds["runs"] += reaped.get(proc.pid, 0.0) + below(proc.pid)
        return seconds

    def graphql(self, query: str, variables: dict) -> dict:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/graphql",
            data=json.dumps({"query": query, "variables": variables}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            payload = json.loads(response.read())
        if "errors" in payload:
            raise RuntimeError(f"GraphQL errors: {payload['errors']}")
        return dict(payload["data"])

    def wait(self, predicate, timeout: float, what: str, interval: float = 1.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Dagster process exited; see {self.root}/*.log")
            with contextlib.suppress(urllib.error.URLError, ConnectionError):
                value = predicate()
                if value:
                    return value
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def land(landing: Path, start: dt.date, days: int) -> None:
    from ml_platform.contracts import load_contract
    from ml_platform.ingestion.landing import LandingZone, land_days

    dates = [start + dt.timedelta(days=i) for i in range(days)]
    list(land_days(load_contract("flights"), LandingZone(base_dir=str(landing)), dates))


def step_seconds(runs: list[dict]) -> dict[str, float]:
    """Seconds per step over the runs, by asset name (step keys are `flights__<asset>`)."""
    seconds: dict[str, float] = {}
    for run in runs:
        for step in run["stepStats"]:
            if step["startTime"] and step["endTime"]:
                took = step["endTime"] - step["startTime"]
                name = step["stepKey"].removeprefix("flights__")
                seconds[name] = seconds.get(name, 0.0) + took
    return {key: round(value, 1) for key, value in seconds.items()}


def widened_contracts(root: Path, spread: float) -> Path:
    """A contracts directory holding the flights contract with its history gate's `spread` set.

    The gate computes the same statistics and bounds, only wider: three real 2013 days fail it
    at the default, and a failed day ends a backfill's chains of days (docs/running.md), so a
    year of every stage needs wider bounds. The work done is the same.
    """
    contracts = root / "contracts"
    contracts.mkdir()
    text = (REPO / "ml_platform" / "contracts" / "flights.yaml").read_text()
    anchor = "  bad_rows: {policy: fail}\n"
    if anchor not in text:
        raise RuntimeError("the flights contract's quality section changed: update this benchmark")
    (contracts / "flights.yaml").write_text(
        text.replace(anchor, f"{anchor}  history: {{spread: {spread}}}\n")
    )
    return contracts


def fresh_instance(
    root: Path,
    days_per_run: int = DEFAULT_BACKFILL_DAYS_PER_RUN,
    history_spread: float | None = None,
) -> dict[str, str]:
    """A new instance (the repository's dagster.yaml) and an empty landing zone and lake for
    flights under `root` (dagster_home, landing, lake): the environment that serves them."""
    home, landing, lake = root / "dagster_home", root / "landing", root / "lake"
    for directory in (home, landing, lake):
        directory.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "ML_PLATFORM_DATASET": "flights",
        "ML_PLATFORM_LANDING_DIR": str(landing),
        "ML_PLATFORM_LAKE_DIR": str(lake),
        BACKFILL_DAYS_PER_RUN_ENV: str(days_per_run),
    }
    if history_spread is not None:
        env["ML_PLATFORM_CONTRACTS"] = str(widened_contracts(root, history_spread))
    # Create the SQLite storage first: the webserver, the daemon and the code server each
    # creating it at once can race (alembic then finds two heads). Then every pool's limit,
    # before the daemon starts, as `make serve` stores them.
    for command in (["dagster", "instance", "migrate"], ["ml-platform", "pools"]):
        subprocess.run(
            [str(BIN / command[0]), *command[1:]], env=env, check=True, capture_output=True
        )
    return env


def run_days(run: dict) -> int:
    """How many days a run of the backfill held, from its partition tags."""
    tags = {tag["key"]: tag["value"] for tag in run["tags"]}
    if "dagster/partition" in tags:
        return 1
    first = dt.date.fromisoformat(tags["dagster/asset_partition_range_start"])
    last = dt.date.fromisoformat(tags["dagster/asset_partition_range_end"])
    return (last - first).days + 1


def timeline(runs: list[dict], launched_at: float) -> list[dict]:
    """Each run of the backfill in start order: its assets, days, and when it was created,
    started (its process up and the code loaded) and ended, in seconds after the request."""
    rows = []
    for run in sorted(runs, key=lambda r: r["startTime"] or float("inf")):
        tags = {tag["key"]: tag["value"] for tag in run["tags"]}
        steps = sorted(
            {
                step["stepKey"].removeprefix("flights__")
                for step in run["stepStats"]
                if step["stepKey"].removeprefix("flights__") in DAILY_ASSETS
            },
            key=DAILY_ASSETS.index,
        )
        first = tags.get("dagster/asset_partition_range_start", tags.get("dagster/partition"))
        rows.append(
            {
                "assets": steps,
                "first_day": first,
                "days": run_days(run),
                **{
                    name: round(run[field] - launched_at, 1) if run[field] else None
                    for name, field in (
                        ("created", "creationTime"),
                        ("started", "startTime"),
                        ("ended", "endTime"),
                    )
                },
            }
        )
    return rows


def idle_seconds(rows: list[dict]) -> float:
    """Seconds between the request and the last run's end during which no run was running:
    the daemon's loops and the runs' process starts that no computation overlapped."""
    busy, reached = 0.0, 0.0
    for row in sorted((r for r in rows if r["started"] and r["ended"]), key=lambda r: r["started"]):
        start, end = max(row["started"], reached), row["ended"]
        if end > start:
            busy += end - start
            reached = end
    return round(max(row["ended"] or 0.0 for row in rows) - busy, 1)


def backfill(
    start: dt.date, days: int, root: Path, days_per_run: int, history_spread: float | None = None
) -> dict:
    env = fresh_instance(root, days_per_run, history_spread)
    land(root / "landing", start, days)
    stack = Stack(root, env)
    stack.start()
    try:
        stack.wait(lambda: stack.graphql("{ version }", {}), 180, "the webserver")
        partitions = [(start + dt.timedelta(days=i)).isoformat() for i in range(days)]
        # From the request on: the servers' start and code loads are a deployment's, not the
        # backfill's.
        cpu_before = stack.cpu_seconds()
        launched_at = time.time()
        launched = stack.graphql(
            LAUNCH,
            {
                # The days of every asset, as the UI's "Materialize" of a range sends them.
                # (With `partitionNames` instead, Dagster also targets the days after the
                # range whose training window reaches into it.)
                "params": {
                    "partitionsByAssets": [
                        {
                            "assetKey": {"path": ["flights", name]},
                            "partitions": {
                                "range": {"start": partitions[0], "end": partitions[-1]}
                            },
                        }
                        for name in DAILY_ASSETS
                    ]
                }
            },
        )["launchPartitionBackfill"]
        if launched["__typename"] != "LaunchBackfillSuccess":
            raise RuntimeError(f"the backfill was not launched: {launched}")
        backfill_id = launched["backfillId"]

        def finished() -> dict | None:
            backfill = stack.graphql(BACKFILL, {"id": backfill_id})["partitionBackfillOrError"]
            return backfill if backfill["status"] in DONE else None

        status = stack.wait(finished, 4 * 3600, "the backfill")
        finished_at = time.time()
        cpu_after = stack.cpu_seconds()
        runs = stack.graphql(
            RUNS, {"filter": {"tags": [{"key": "dagster/backfill", "value": backfill_id}]}}
        )["runsOrError"]["results"]
    finally:
        stack.stop()
    rows = timeline(runs, launched_at)
    days_of = [(start + dt.timedelta(days=i)).isoformat() for i in range(days)]
    rejected, registered = recorded_verdicts(env["DAGSTER_HOME"], days_of)
    started = min(run["startTime"] for run in runs if run["startTime"])
    ended = max(run["endTime"] for run in runs if run["endTime"])
    return {
        "status": status["status"],
        "days_per_run": days_per_run,
        "runs": len(runs),
        "most_days_in_a_run": max(run_days(run) for run in runs),
        "run_statuses": sorted({run["status"] for run in runs}),
        # The backfill is marked complete on the daemon's next loop after its last run.
        "seconds": round(ended - launched_at, 1),
        "seconds_to_completed": round(finished_at - launched_at, 1),
        "seconds_to_first_run_start": round(started - launched_at, 1),
        "seconds_in_runs": round(ended - started, 1),
        "step_seconds": step_seconds(runs),
        "seconds_without_a_run": idle_seconds(rows),
        # What the machine's cores did for the backfill: divided by the cores, the fewest
        # seconds any arrangement of these runs could take.
        "cpu_seconds": cpu_used(cpu_before, cpu_after),
        "timeline": rows,
        "evaluation_reports": len(
            list((root / "lake" / "flights" / "evaluation_report").glob("*/*.json"))
        ),
        # Days whose registered_model Dagster records as accepted (registered or a rejected
        # candidate), and the days rejected on the way, with where and why.
        "days_through_the_registry": registered,
        "rejected_days": rejected,
    }


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds by role between two readings of `Stack.cpu_seconds`, and their total."""
    used = {role: round(after[role] - before.get(role, 0.0), 1) for role in after}
    return {**used, "total": round(sum(used.values()), 1)}


def recorded_verdicts(home: str, days: list[str]) -> tuple[list[dict], int]:
    """The rejected days Dagster records (day, asset, verdict), and the days the registry took."""
    import dagster as dg

    from ml_platform.platform.datasets import asset_key
    from ml_platform.platform.records import done_days
    from ml_platform.platform.rejected import rejected_days

    os.environ["DAGSTER_HOME"] = home  # the benchmark's instance, read after its processes ended
    with dg.DagsterInstance.get() as instance:
        rejected = [
            {"day": r.day, "asset": r.asset, "verdict": r.verdict}
            for r in rejected_days(instance, "flights", days)
        ]
        registered = len(done_days(instance, asset_key("flights", "registered_model"), days))
    return rejected, registered


def baseline(start: dt.date, days: int, processes: int) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "baseline.py"),
            *("--start", start.isoformat(), "--days", str(days)),
            *("--processes", str(processes)),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    # The script and its worker processes, reaped: its CPU seconds, as the platform's above.
    return {**json.loads(done.stdout), "cpu_seconds": round(cpu, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=dt.date.fromisoformat, default=dt.date(2013, 1, 1))
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument(
        "--days-per-run",
        type=int,
        default=DEFAULT_BACKFILL_DAYS_PER_RUN,
        help="days one run of the backfill holds at most",
    )
    parser.add_argument(
        "--baseline-processes",
        type=int,
        default=2,
        help="processes of the plain script: the runs the queue starts at once (dagster.yaml)",
    )
    parser.add_argument(
        "--history-spread",
        type=float,
        help="widen the history gate (contract quality.history.spread); default: the contract's, "
        "as users run it (three real 2013 days are rejected, and recorded as such)",
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain script")
    parser.add_argument("--keep", action="store_true", help="keep the instance, lake and logs")
    idle.add_argument(parser)
    args = parser.parse_args()
    load = idle.before(args.loaded)
    root = tempfile.mkdtemp(prefix="backfill-")
    try:
        platform_figures = backfill(
            args.start, args.days, Path(root), args.days_per_run, args.history_spread
        )
    finally:
        if args.keep:
            print(f"instance, lake and logs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root)
    result: dict = {
        "days": args.days,
        "history_spread": args.history_spread,
        "platform": platform_figures,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, python "
        f"{platform.python_version()}",
    }
    if not args.no_baseline:
        plain = baseline(args.start, args.days, args.baseline_processes)
        result["baseline"] = plain
        result["platform_over_baseline"] = round(
            platform_figures["seconds"] / float(plain["seconds"]), 2
        )
        # Until the UI shows the backfill complete: the daemon's last loop included.
        result["completed_over_baseline"] = round(
            platform_figures["seconds_to_completed"] / float(plain["seconds"]), 2
        )
        # The floor under the first ratio: the platform's CPU seconds spread over every core
        # with no wait, against the script's seconds.
        result["cpu_floor_over_baseline"] = round(
            platform_figures["cpu_seconds"]["total"]
            / (os.cpu_count() or 1)
            / float(plain["seconds"]),
            2,
        )
    result.update(idle.after(load))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
