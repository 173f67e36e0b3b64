"""Where a range's step seconds go: each day asset's range with no daemon, and Dagster's share.

Run: .venv/bin/python benchmarks/step_costs.py [--days 90] [--start 2013-01-01]
     [--instance-dir DIR]

Lands real flights days and runs each day asset of the daily job over the whole range, one
range at a time in day-asset order, in this process with the in-process executor (the
embedded default's, as a backfill's run executes its steps) on a fresh SQLite instance (the
embedded default's storage; `--instance-dir` names a folder whose dagster.yaml names
another, such as PostgreSQL). No daemon, no queue, no run start: what is left is the steps.
For each asset it reports the range's wall seconds, its CPU seconds (this process and the
training workers it started), and how many events Dagster stored for it and in how many
seconds (every materialisation, check evaluation and planned event goes through
`DagsterInstance.handle_new_event`, timed here; a run through the queue stores its planned
events when it is created, before its steps, here inside the range's seconds) and how often it
read Dagster's records of days (`fetch_materializations`) in how many seconds, then the
seconds of importing the libraries the steps import when they first need them (Great
Expectations, MLflow, matplotlib, in that order, in a new process that has loaded the code
location already), and the plain script (`baseline.py`) over the same days in one process.
The ratio of the steps' seconds to the script's is the floor that a backfill through the
daemon adds its waves and run starts to.
"""

import argparse
import collections
import datetime as dt
import functools
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import baseline
import dagster as dg
import idle

from ml_platform.contracts import load_contract
from ml_platform.definitions import build_definitions
from ml_platform.ingestion.landing import LandingZone, land_days
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.rejected import DAY_ASSETS

# In the order a day's steps first need them (validated_data, then model), so that what one
# imports for the next is counted where a run pays it.
LIBRARIES = ("great_expectations", "mlflow", "matplotlib.pyplot")
IMPORT_TIMES = """
import importlib, json, sys, time
import ml_platform.definitions
seconds = {}
for name in sys.argv[1:]:
    started = time.perf_counter()
    importlib.import_module(name)
    seconds[name] = round(time.perf_counter() - started, 2)
print(json.dumps(seconds))
"""


def cpu_seconds() -> float:
    """CPU of this process and of its reaped children (a model step's training workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class EventTimer:
    """Counts and times every event the instance stores, by event type."""

    def __init__(self, instance: dg.DagsterInstance):
        self.count: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        store: Callable[..., None] = instance.handle_new_event

        @functools.wraps(store)
        def timed(event: Any, *args: Any, **kwargs: Any) -> None:
            started = time.perf_counter()
            try:
                store(event, *args, **kwargs)
            finally:
                kind = event.dagster_event.event_type_value if event.dagster_event else "LOG"
                self.seconds[kind] += time.perf_counter() - started
                self.count[kind] += 1

        instance.handle_new_event = timed  # type: ignore[method-assign]

    def totals(self) -> tuple[int, float]:
        return sum(self.count.values()), sum(self.seconds.values())


class QueryCounter:
    """Counts the steps' reads of Dagster's records (`fetch_materializations`) and their time."""

    def __init__(self, instance: dg.DagsterInstance):
        self.count = 0
        self.seconds = 0.0
        fetch: Callable[..., Any] = instance.fetch_materializations

        @functools.wraps(fetch)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fetch(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.count += 1

        instance.fetch_materializations = timed  # type: ignore[method-assign]


def import_seconds() -> dict[str, float]:
    """Seconds to import each of LIBRARIES in turn, in a new process with the code location."""
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_TIMES, *LIBRARIES],
        capture_output=True,
        text=True,
        check=True,
    )
    seconds: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return seconds


def steps(root: Path, start: dt.date, days: int, instance_dir: Path | None) -> dict[str, Any]:
    contract = load_contract("flights")
    defs = build_definitions(
        contract, landing_dir=str(root / "landing"), lake_dir=str(root / "lake")
    )
    if instance_dir is None:
        (root / "home").mkdir()
        instance = dg.DagsterInstance.local_temp(str(root / "home"))
    else:
        instance = dg.DagsterInstance.from_config(str(instance_dir))
    dates = [start + dt.timedelta(days=i) for i in range(days)]
    list(land_days(contract, LandingZone(base_dir=str(root / "landing")), dates))
    timer = EventTimer(instance)
    queries = QueryCounter(instance)
    per_asset: dict[str, dict[str, Any]] = {}
    # The day assets in the order a day flows through them, as a backfill's waves run them.
    for name in DAY_ASSETS:
        # A day's champion is scored on the next day's rows: the last day has none yet.
        last = dates[-2] if name == "champion_performance" else dates[-1]
        events_before, event_seconds_before = timer.totals()
        kinds_before = timer.count.copy()
        queries_before, query_seconds_before = queries.count, queries.seconds
        wall, cpu = time.perf_counter(), cpu_seconds()
        result = dg.materialize(
            [*(defs.assets or []), *(defs.asset_checks or [])],  # type: ignore[list-item]
            resources=defs.resources,
            instance=instance,
            selection=[asset_key(contract.name, name)],
            tags={
                "dagster/asset_partition_range_start": dates[0].isoformat(),
                "dagster/asset_partition_range_end": last.isoformat(),
            },
            raise_on_error=False,
        )
        if not result.success:
            raise RuntimeError(f"{name} over {dates[0]}..{last} failed: no figure to report")
        events, event_seconds = timer.totals()
        kinds = timer.count - kinds_before
        per_asset[name] = {
            "wall_s": round(time.perf_counter() - wall, 2),
            "cpu_s": round(cpu_seconds() - cpu, 2),
            "events": events - events_before,
            "event_s": round(event_seconds - event_seconds_before, 2),
            "events_by_kind": dict(kinds.most_common()),
            "record_queries": queries.count - queries_before,
            "record_query_s": round(queries.seconds - query_seconds_before, 2),
        }
    wall_total = sum(a["wall_s"] for a in per_asset.values())
    event_total = sum(a["event_s"] for a in per_asset.values())
    return {
        "steps": per_asset,
        "steps_wall_s": round(wall_total, 1),
        "events_s": round(event_total, 1),
        "events_share": round(event_total / wall_total, 3),
        "ms_per_event": {
            kind: round(1000 * timer.seconds[kind] / timer.count[kind], 1)
            for kind, _ in timer.count.most_common(4)
        },
        "events_per_day": round(sum(timer.count.values()) / days, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=dt.date.fromisoformat, default=dt.date(2013, 1, 1))
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument(
        "--instance-dir",
        type=Path,
        help="a folder whose dagster.yaml names the instance's storage (e.g. `storage: postgres`, "
        "as deploy/dagster.yaml); by default a fresh SQLite instance",
    )
    idle.add_argument(parser)
    args = parser.parse_args()
    if args.days < 2:
        parser.error("--days must be at least 2: a day's champion is scored on the next day's rows")
    load = idle.before(args.loaded)
    with tempfile.TemporaryDirectory(prefix="step-costs-") as root:
        figures = steps(Path(root), args.start, args.days, args.instance_dir)
    figures["imports_s"] = import_seconds()
    script = baseline.run(load_contract("flights"), args.start, args.days)
    figures["script_s"] = script["seconds"]
    figures["steps_over_script"] = round(figures["steps_wall_s"] / script["seconds"], 2)
    print(json.dumps({"days": args.days, **figures, **idle.after(load)}, indent=2))


if __name__ == "__main__":
    main()
