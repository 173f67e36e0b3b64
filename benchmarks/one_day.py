"""One day end to end: the platform's run of a day against the plain script's, each a new process.

Run: .venv/bin/python benchmarks/one_day.py [--day 2013-01-01] [--repeat 3]

Platform: a new process that loads the code location and runs the daily job for the day on a
fresh instance (the repository's dagster.yaml: SQLite event log, JSON log file), with the
landed file and an empty lake: what a run worker launched from the UI does. Plain
script: `benchmarks/baseline.py` for the same day. Both are timed from process start to exit,
imports included, because each run of the platform is a new process. The first day of the
data is the default: there, both train on a one-day window, so the computation is the same.
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

REPO = Path(__file__).resolve().parents[1]
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
        if failed not in ([], ["evaluation_report:promotion_verdict"]):
            raise RuntimeError(f"the platform's run of {day} failed checks {failed}")
        return seconds, float(json.loads(out)["run_seconds"])


def run_day(day: str) -> None:
    """The daily job for `day` in this process, on the instance of DAGSTER_HOME.

    What a run worker does once it has started: load the code location, run the job. The
    libraries the steps import lazily are imported first, so `run_seconds` is the run without
    imports, to set against the plain script's computation.
    """
    exec(IMPORTS)
    import dagster as dg

    from ml_platform.definitions import DAILY_JOB, defs

    started = time.perf_counter()
    with dg.DagsterInstance.get() as instance:
        result = (
            defs()
            .resolve_job_def(DAILY_JOB)
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
    args = parser.parse_args()
    if args.run_day:
        run_day(args.run_day)
        return
    runs: dict[str, list[float]] = {
        "platform_process": [],
        "baseline_process": [],
        "platform_run": [],
        "baseline_computation": [],
        "imports": [],
    }
    for _ in range(args.repeat):
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
                # A new process each, imports included: what a launched run costs.
                "process_overhead_seconds": round(
                    median["platform_process"] - median["baseline_process"], 2
                ),
                # Imports done: what orchestration, the GE gate, storage and reports add.
                "run_overhead_seconds": round(
                    median["platform_run"] - median["baseline_computation"], 2
                ),
                "all_seconds": {name: [round(v, 2) for v in vs] for name, vs in runs.items()},
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, python "
                f"{platform.python_version()}",
                "load_average": os.getloadavg(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
