"""Peak memory of each step of one synthetic day, against the in-memory size of the day's frame.

Run: .venv/bin/python benchmarks/memory_day.py [--rows 1000000] [--window-days 1]

The synthetic contract is copied with `rows_per_day` (and the row-count bounds) set to `--rows`,
`--window-days` days are landed, the days before the last are materialised (raw_data to
features, so the model's window is full), and then the measured day runs alone in a fresh
process: the daily graph (raw_data, validated_data, features, drift_report (with its check), model,
evaluation_report, registered_model) with `dg.materialize` over temporary storage, as the
tests do, and, in another fresh process, the plain script's `run_day` (benchmarks/baseline.py).

Per step it reports wall seconds, the peak resident memory of the process (VmHWM), and the
peak above the resident memory when the step started. The figures are taken from Dagster's
own events, read synchronously in the run's process: the peak is reset at STEP_START and read
at every event of the step, so input loading and output storage count (the platform's own
`step_peak_rss_mb` starts after the inputs load and stops before the output is stored). Freed
memory is handed back to the OS before each step starts, so the starting figure is what is
alive, not what the allocator kept from the step before.
"""

import argparse
import contextlib
import ctypes
import datetime as dt
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from ml_platform.contracts.model import bundled_contracts

MB = 1024 * 1024
STEP_ORDER = [
    "raw_data",
    "validated_data",
    "features",
    "drift_report",
    "model",
    "evaluation_report",
    "registered_model",
]


def status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def release_free_memory() -> None:
    """Give memory freed by earlier work back to the OS, so RSS counts only live objects."""
    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def write_contract(root: Path, rows: int, window_days: int) -> Path:
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["source"]["rows_per_day"] = rows
    document["quality"]["row_count"] = {"min": int(rows * 0.9), "max": int(rows * 1.1) + 1}
    document["training"]["window_days"] = window_days
    path = root / "synthetic.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def day_frame_mb(root: Path, day: str) -> float:
    """In-memory size of the typed day (as validated_data stores it)."""
    import pandas as pd

    [stored] = (root / "lake" / "synthetic" / "validated_data" / day).glob("*.parquet")
    frame = pd.read_parquet(stored)
    return float(frame.memory_usage(deep=True).sum()) / MB


def platform_for(root: Path) -> tuple[Any, Any, list[Any]]:
    import dagster as dg

    from ml_platform.contracts import load_contract
    from ml_platform.definitions import build_definitions

    contract = load_contract(root / "synthetic.yaml")
    defs = build_definitions(
        contract, landing_dir=str(root / "landing"), lake_dir=str(root / "lake")
    )
    home = root / "dagster_home"
    home.mkdir(exist_ok=True)
    instance = dg.DagsterInstance.local_temp(str(home))
    return defs, instance, [*(defs.assets or []), *(defs.asset_checks or [])]


def materialise(
    root: Path, day: str, selection: list[str], memory: "StepMemory | None" = None
) -> Any:
    import dagster as dg

    defs, instance, assets = platform_for(root)
    with instance:
        if memory is not None:
            memory.watch(instance)
        return dg.materialize(
            assets,
            partition_key=day,
            resources=defs.resources,
            instance=instance,
            selection=[f"synthetic/{name}" for name in selection],
            raise_on_error=memory is None,
        )


class StepMemory:
    """Per-step wall time, peak RSS and RSS at the start, from a run's events as they happen."""

    def __init__(self) -> None:
        self.steps: dict[str, dict[str, float]] = {}

    def watch(self, instance: Any) -> None:
        handle = instance.handle_new_event

        def handle_new_event(event: Any, **kwargs: Any) -> Any:
            self.on_event(event)
            return handle(event, **kwargs)

        instance.handle_new_event = handle_new_event

    def on_event(self, event: Any) -> None:
        dagster_event = event.dagster_event
        if dagster_event is None or not dagster_event.step_key:
            return
        kind = dagster_event.event_type_value
        step = self.steps.setdefault(dagster_event.step_key, {})
        if kind == "STEP_START":
            release_free_memory()
            step.update(
                rss_before_mb=status_mb("VmRSS"), peak_rss_mb=0.0, start=time.perf_counter()
            )
            reset_peak()
            return
        step["peak_rss_mb"] = max(step.get("peak_rss_mb", 0.0), status_mb("VmHWM"))
        if kind in ("STEP_SUCCESS", "STEP_FAILURE"):
            step["wall_seconds"] = time.perf_counter() - step.pop("start")
            step["increment_mb"] = step["peak_rss_mb"] - step["rss_before_mb"]
            step["failed"] = kind == "STEP_FAILURE"


def import_libraries() -> None:
    """Import what the steps import lazily, so a step's increment is its data, not its imports."""
    import great_expectations  # noqa: F401
    import matplotlib.backends.backend_svg  # noqa: F401
    import matplotlib.figure  # noqa: F401
    import scipy.stats  # noqa: F401
    import sklearn.linear_model  # noqa: F401


def child_platform(root: Path, day: str) -> dict[str, Any]:
    import_libraries()
    memory = StepMemory()
    started = time.perf_counter()
    result = materialise(root, day, STEP_ORDER, memory)
    total = time.perf_counter() - started
    own = {
        event.asset_key.path[-1]: event.materialization.metadata.get("step_peak_rss_mb")
        for event in result.get_asset_materialization_events()
    }
    steps = {}
    for key, figures in memory.steps.items():
        # A check's step key is derived from its asset's and its own name.
        # Asset steps are named by the key's path: `synthetic__raw_data`.
        key = key.removeprefix("synthetic__")
        name = key if key in STEP_ORDER else next((s for s in STEP_ORDER if s in key), key)
        reported = own.get(name)
        figures["platform_step_peak_rss_mb"] = reported.value if reported is not None else None
        steps[name] = figures
    return {"success": result.success, "seconds": total, "steps": steps}


def child_plain(root: Path, days: list[str]) -> dict[str, Any]:
    from baseline import Baseline

    from ml_platform.contracts import load_contract

    import_libraries()
    contract = load_contract(root / "synthetic.yaml")
    baseline = Baseline(contract)
    landing = root / "landing"
    for day in days[:-1]:
        baseline.run_day(
            dt.date.fromisoformat(day), (landing / f"synthetic_{day}.csv").read_bytes()
        )
    data = (landing / f"synthetic_{days[-1]}.csv").read_bytes()
    release_free_memory()
    before = status_mb("VmRSS")
    reset_peak()
    started = time.perf_counter()
    baseline.run_day(dt.date.fromisoformat(days[-1]), data)
    wall = time.perf_counter() - started
    peak = status_mb("VmHWM")
    return {
        "wall_seconds": wall,
        "rss_before_mb": before,
        "peak_rss_mb": peak,
        "increment_mb": peak - before,
        "stage_seconds": baseline.seconds,
    }


def run_child(*args: str, script: str = __file__) -> dict[str, Any]:
    """Run `script` (this one by default) with `args` in a fresh process; its last line as JSON."""
    done = subprocess.run(
        [sys.executable, str(Path(script).resolve()), *args], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-5000:])
    return json.loads(done.stdout.splitlines()[-1])


def table(result: dict[str, Any]) -> str:
    frame_mb = result["day_frame_mb"]
    lines = [
        "| step | wall (s) | peak RSS (MB) | RSS before (MB) | increment (MB) | day frame (MB) "
        "| peak / frame | increment / frame |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [
        (s, result["platform"]["steps"][s]) for s in STEP_ORDER if s in result["platform"]["steps"]
    ]
    rows.append(("plain script (run_day)", result["plain"]))
    for name, f in rows:
        lines.append(
            f"| {name} | {f['wall_seconds']:.2f} | {f['peak_rss_mb']:.0f} | "
            f"{f['rss_before_mb']:.0f} | {f['increment_mb']:.0f} | {frame_mb:.0f} | "
            f"{f['peak_rss_mb'] / frame_mb:.1f} | {f['increment_mb'] / frame_mb:.1f} |"
        )
    return "\n".join(lines)


def run(rows: int, window_days: int, start: dt.date) -> dict[str, Any]:
    from ml_platform.contracts import load_contract
    from ml_platform.ingestion.landing import LandingZone, land_days

    with tempfile.TemporaryDirectory(prefix="memory_day_") as tmp:
        root = Path(tmp)
        contract = load_contract(write_contract(root, rows, window_days))
        days = [start + dt.timedelta(days=i) for i in range(window_days)]
        started = time.perf_counter()
        list(land_days(contract, LandingZone(base_dir=str(root / "landing")), days))
        land_seconds = time.perf_counter() - started
        keys = [d.isoformat() for d in days]
        if len(keys) > 1:
            run_child("--child", "prepare", "--root", tmp, "--days", *keys[:-1])
        measured = run_child("--child", "platform", "--root", tmp, "--days", keys[-1])
        plain = run_child("--child", "plain", "--root", tmp, "--days", *keys)
        return {
            "rows": rows,
            "window_days": window_days,
            "day": keys[-1],
            "csv_mb": (root / "landing" / f"synthetic_{keys[-1]}.csv").stat().st_size / MB,
            "day_frame_mb": day_frame_mb(root, keys[-1]),
            "land_seconds": land_seconds,
            "platform": measured,
            "plain": plain,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
            f"python {platform.python_version()}",
            "load_average": os.getloadavg(),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--window-days", type=int, default=1)
    parser.add_argument("--start", type=dt.date.fromisoformat, default=dt.date(2024, 1, 1))
    parser.add_argument("--child", choices=["prepare", "platform", "plain"])
    parser.add_argument("--root", type=Path)
    parser.add_argument("--days", nargs="*")
    args = parser.parse_args()
    if args.child == "prepare":
        for day in args.days:
            materialise(args.root, day, ["raw_data", "validated_data", "features"])
        print(json.dumps({}))
    elif args.child == "platform":
        print(json.dumps(child_platform(args.root, args.days[0])))
    elif args.child == "plain":
        print(json.dumps(child_plain(args.root, args.days)))
    else:
        result = run(args.rows, args.window_days, args.start)
        print(table(result))
        print(json.dumps(result))


if __name__ == "__main__":
    main()
