"""One day end to end: the platform's run of a day, as a user launches it, against the plain script.

Run: .venv/bin/python benchmarks/one_day.py [--day 2013-01-01] [--repeat 3]

Platform, launched: `dagster-webserver` and `dagster-daemon` on a fresh instance (the
repository's dagster.yaml: SQLite, the run queue, Dagster's DefaultRunLauncher), the day's file
landed and a lake whose MLflow store exists (created once a deployment, by its first day). One
run of another day (`ingestion_job`, which touches nothing the measured day reads) is launched
and waited for first, as a daemon that has been running has launched runs before; then the
daily job for the day is launched through the webserver's GraphQL API (what the UI's
"Materialize" of a partition sends, and what a sensor's run request becomes), timed from the
launch request to the run's end as the API reports it.

Platform, new process (the previous measurement, kept as the second row): a new process that
loads the code location and runs the daily job for the day on a fresh instance: what a run
worker started by the DefaultRunLauncher does, imports included. Plain script:
`benchmarks/baseline.py` for the same day, timed from process start to exit, imports included.
The first day of the data is the default: there, both train on a one-day window, so the
computation is the same.
"""

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import idle
from backfill_year import Stack, fresh_instance, land

REPO = Path(__file__).resolve().parents[1]
# A day far from the measured one: the warm-up run writes nothing the measured run reads.
WARM_UP_DAY = dt.timedelta(days=31)
LAUNCH_RUN = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
  }
}
"""
RUN = """
query Run($runId: ID!) {
  runOrError(runId: $runId) {
    ... on Run {
      status creationTime startTime endTime
      stepStats { stepKey status startTime endTime }
    }
  }
}
"""
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}
IMPORTS = (
    "import dagster, pandas, sklearn.linear_model, scipy.stats, great_expectations; "
    "import ml_platform.definitions"
)


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall seconds of a command from start to exit, and its stdout."""
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def platform_day(day: dt.date) -> tuple[float, float]:
    """Seconds of the platform's process from start to exit, and of its run once imports ended."""
    from ml_platform.contracts import load_contract
    from ml_platform.ingestion.landing import LandingZone, land_days

    with tempfile.TemporaryDirectory(prefix="one-day-") as root:
        home, landing, lake = (Path(root) / name for name in ("home", "landing", "lake"))
        for directory in (home, landing, lake):
            directory.mkdir()
        (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
        zone = LandingZone(base_dir=str(landing))
        list(land_days(load_contract("flights"), zone, [day]))
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "ML_PLATFORM_DATASET": "flights",
            "ML_PLATFORM_LANDING_DIR": str(landing),
            "ML_PLATFORM_LAKE_DIR": str(lake),
        }
        seconds, out = timed([sys.executable, __file__, "--run-day", day.isoformat()], env)
        # A rejected model is a verdict, not an error: the day's work was all done.
        failed = json.loads(out)["failed_checks"]
        if failed not in ([], ["flights/evaluation_report:promotion_verdict"]):
            raise RuntimeError(f"the platform's run of {day} failed checks {failed}")
        return seconds, float(json.loads(out)["run_seconds"])


def launch(stack: Stack, job: str, day: dt.date) -> str:
    params = {
        "selector": {
            "repositoryLocationName": "ml_platform",
            "repositoryName": "__repository__",
            "jobName": job,
        },
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": day.isoformat()}]},
    }
    launched = stack.graphql(LAUNCH_RUN, {"params": params})["launchRun"]
    if launched["__typename"] != "LaunchRunSuccess":
        raise RuntimeError(f"the run was not launched: {launched}")
    return str(launched["run"]["runId"])


def finished(stack: Stack, run_id: str) -> dict:
    def done() -> dict | None:
        run = stack.graphql(RUN, {"runId": run_id})["runOrError"]
        return dict(run) if run["status"] in FINISHED else None

    # Polled 4 times a second: finer polling would take CPU from the run on a small machine.
    return dict(stack.wait(done, 1800, f"run {run_id}", interval=0.25))


def verdict(lake: Path, day: dt.date) -> str | None:
    """The decision of the day's evaluation report, if one was stored."""
    report = lake / "flights" / "evaluation_report" / f"{day.isoformat()}.json"
    return str(json.loads(report.read_text())["decision"]) if report.is_file() else None


def create_mlflow_store(lake: Path) -> None:
    """The lake's embedded MLflow store, created as the platform's first model step does."""
    from ml_platform.platform.storage import LocalStorage
    from ml_platform.platform.tracking import MlflowStores

    MlflowStores(lake=LocalStorage(base_dir=str(lake))).client().search_experiments()


def launched_day(day: dt.date) -> dict:
    """Seconds from launching the daily job for `day` to its end, on a running daemon."""
    with tempfile.TemporaryDirectory(prefix="one-day-launched-") as directory:
        root = Path(directory)
        env = fresh_instance(root)
        land(root / "landing", day, 1)
        land(root / "landing", day + WARM_UP_DAY, 1)
        # A running deployment's MLflow store exists: its first day created it (the migrations
        # of a new database, about 2 s, once a deployment), not each day after.
        create_mlflow_store(root / "lake")
        stack = Stack(root, env)
        stack.start()
        try:
            stack.wait(lambda: stack.graphql("{ version }", {}), 180, "the webserver")
            warm_up = finished(stack, launch(stack, "flights_ingestion_job", day + WARM_UP_DAY))
            if warm_up["status"] != "SUCCESS":
                raise RuntimeError(f"the warm-up run failed; see {root}/daemon.log")
            launched_at = time.time()
            run_id = launch(stack, "flights_daily_pipeline_job", day)
            run = finished(stack, run_id)
            seconds = time.time() - launched_at
            decision = verdict(root / "lake", day)
        finally:
            stack.stop()
    failed_steps = [s["stepKey"] for s in run["stepStats"] if s["status"] == "FAILURE"]
    # A rejected model stops the run at its blocking verdict, after the whole day was computed
    # and judged (the first day's one-day window may well be rejected): a complete day.
    rejected = failed_steps == ["evaluation_report"] and decision == "reject"
    if run["status"] != "SUCCESS" and not rejected:
        raise RuntimeError(f"the launched run of {day} failed in steps {failed_steps}")
    return {
        "seconds": seconds,
        "status": run["status"],
        "decision": decision,
        # Dagster's own account: waiting in the queue and for the worker, then the run.
        "queued_to_started": run["startTime"] - run["creationTime"],
        "run": run["endTime"] - run["startTime"],
        # The steps' own seconds, summed: the computation, without the run worker's start.
        "steps": sum(
            s["endTime"] - s["startTime"] for s in run["stepStats"] if s["endTime"] is not None
        ),
    }


def run_day(day: str) -> None:
    """The daily job for `day` in this process, on the instance of DAGSTER_HOME.

    What a run worker does once it has started: load the code location, run the job. The
    libraries the steps import lazily are imported first, so `run_seconds` is the run without
    imports, to set against the plain script's computation.
    """
    exec(IMPORTS)
    import dagster as dg

    from ml_platform.definitions import DAILY_JOB, defs
    from ml_platform.platform.datasets import dataset_name

    started = time.perf_counter()
    with dg.DagsterInstance.get() as instance:
        result = (
            defs()
            .resolve_job_def(dataset_name("flights", DAILY_JOB))
            .execute_in_process(partition_key=day, instance=instance, raise_on_error=False)
        )
    failed = [
        f"{e.asset_key.to_user_string()}:{e.check_name}"
        for e in result.get_asset_check_evaluations()
        if not e.passed and e.severity == dg.AssetCheckSeverity.ERROR
    ]
    seconds = time.perf_counter() - started
    print(json.dumps({"success": result.success, "failed_checks": failed, "run_seconds": seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--day", type=dt.date.fromisoformat, default=dt.date(2013, 1, 1))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--run-day", help=argparse.SUPPRESS)
    idle.add_argument(parser)
    args = parser.parse_args()
    if args.run_day:
        run_day(args.run_day)
        return
    load = idle.before(args.loaded)
    runs: dict[str, list[float]] = {
        "platform_launched": [],
        "platform_launched_queue": [],
        "platform_launched_run": [],
        "platform_launched_steps": [],
        "platform_process": [],
        "baseline_process": [],
        "platform_run": [],
        "baseline_computation": [],
        "imports": [],
    }
    for _ in range(args.repeat):
        launched = launched_day(args.day)
        runs["platform_launched"].append(launched["seconds"])
        runs["platform_launched_queue"].append(launched["queued_to_started"])
        runs["platform_launched_run"].append(launched["run"])
        runs["platform_launched_steps"].append(launched["steps"])
        process, run = platform_day(args.day)
        runs["platform_process"].append(process)
        runs["platform_run"].append(run)
        seconds, out = timed(
            [
                sys.executable,
                str(REPO / "benchmarks" / "baseline.py"),
                *("--start", args.day.isoformat(), "--days", "1"),
            ]
        )
        runs["baseline_process"].append(seconds)
        runs["baseline_computation"].append(float(json.loads(out)["seconds"]))
        runs["imports"].append(timed([sys.executable, "-c", IMPORTS])[0])
    median = {name: round(statistics.median(values), 2) for name, values in runs.items()}
    print(
        json.dumps(
            {
                "day": args.day.isoformat(),
                "repeat": args.repeat,
                "median_seconds": median,
                # What a user waits for: a running daemon launches the day (queue included).
                "launched_overhead_seconds": round(
                    median["platform_launched"] - median["baseline_process"], 2
                ),
                # A new process each, imports included: what a run worker of the
                # DefaultRunLauncher costs.
                "process_overhead_seconds": round(
                    median["platform_process"] - median["baseline_process"], 2
                ),
                # Imports done: what orchestration, the GE gate, storage and reports add.
                "run_overhead_seconds": round(
                    median["platform_run"] - median["baseline_computation"], 2
                ),
                # The launched run's steps against the script's computation of the same day.
                "steps_over_script": round(
                    median["platform_launched_steps"] / median["baseline_computation"], 2
                ),
                "all_seconds": {name: [round(v, 2) for v in vs] for name, vs in runs.items()},
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, python "
                f"{platform.python_version()}",
                **idle.after(load),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
