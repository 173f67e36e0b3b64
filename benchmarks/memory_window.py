"""Peak memory of the model and evaluation steps on a long window, and the streamed SGD fit.

Run: .venv/bin/python benchmarks/memory_window.py [--rows 20000] [--window-days 28]
     [--estimator sgd [linear]] [--max-epochs N] [--equivalence]

The synthetic contract is copied with `rows_per_day` (and the row-count bounds) set to `--rows`,
its window set to `--window-days` and its estimator to each `--estimator` in turn (`linear`,
the contract's own, learns from at most `training.max_training_rows` rows). The window's
feature partitions are generated (ingestion/synthetic.py, typed and built as the features asset
builds them) and written to the lake directly: how they got there does not change what the
model reads. Then
the last day's `model` and `evaluation_report` run alone in a fresh process with
`dg.materialize`, each step measured as benchmarks/memory_day.py measures it: the peak resident
memory (VmHWM) from Dagster's own events, reset at STEP_START, with freed memory handed back to
the OS first, so input loading and output storage count.

`--equivalence` (sgd) also trains the streamed model in a fresh process and compares it with a
non-streaming fit in the same row order: every training row encoded in one matrix by the same
fitted preprocessing, each epoch's rows in the order the streamed run draws (days in a seeded
order, rows within each day in the order drawn next), cut into `batch_size` calls as the
platform cut the whole window's rows before it streamed. The streamed run gathers its batches
across days at the same boundaries, so the weights agree to rounding in the losses' sums.

`--max-epochs` caps SGD's epochs (memory does not depend on it; a 1M-row window's epochs
take a minute each). The script runs against any checkout whose contracts know the settings it
writes: the before figure comes from main's environment running this file.
"""

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from memory_day import StepMemory, import_libraries, platform_for, run_child, write_contract

MB = 1024 * 1024
MEASURED = ["model", "evaluation_report"]


def contract_file(root: Path, rows: int, window_days: int, estimator: str, epochs: int | None):
    path = root / "synthetic.yaml"
    if not path.exists():
        write_contract(root, rows, window_days)
    document = yaml.safe_load(path.read_text())
    document["model"] = {"estimator": estimator}
    if estimator == "sgd" and epochs is not None:
        document["model"]["max_epochs"] = epochs
    path.write_text(yaml.safe_dump(document))
    return path


def stored_key(day: str) -> str:
    """Lake key of the window's day as `write_window` stores it."""
    return f"synthetic/features/{day}/prepared-0.parquet"


def write_window(root: Path, days: list[str]) -> float:
    """Generate, store and record the window's feature partitions; the last day's size in MB.

    Each day is stored as a version of its own and recorded in the benchmark's instance, as a
    features run would: the model reads the days Dagster records.
    """
    import dagster as dg

    from ml_platform.contracts import load_contract
    from ml_platform.contracts.schema import type_rows
    from ml_platform.features.transforms import build_features
    from ml_platform.ingestion.synthetic import generate_day

    contract = load_contract(root / "synthetic.yaml")
    defs, instance, _ = platform_for(root)
    io_manager = defs.resources["io_manager"]
    key = dg.AssetKey(["synthetic", "features"])
    size = 0.0
    for day in days:
        raw = generate_day(
            dt.date.fromisoformat(day),
            seed=contract.source.seed,
            rows=contract.source.rows_per_day,
        )
        features = build_features(type_rows(raw, contract, f"synthetic_{day}.csv"), contract)
        metadata = io_manager.store_at(stored_key(day), "parquet", features)
        event = dg.AssetMaterialization(key, partition=day, metadata=metadata)
        instance.report_runless_asset_event(event)
        size = float(features.memory_usage(deep=True).sum()) / MB
    instance.dispose()
    return size


def child_platform(root: Path, day: str) -> dict[str, Any]:
    import dagster as dg

    import_libraries()
    memory = StepMemory()
    defs, instance, assets = platform_for(root)
    started = time.perf_counter()
    with instance:
        memory.watch(instance)
        result = dg.materialize(
            assets,
            partition_key=day,
            resources=defs.resources,
            instance=instance,
            selection=[f"synthetic/{name}" for name in MEASURED],
            raise_on_error=False,
        )
    steps = {}
    for key, figures in memory.steps.items():
        name = key.removeprefix("synthetic__")
        if name in MEASURED:
            steps[name] = figures
    model = result.asset_materializations_for_node("synthetic__model")
    metadata = model[0].metadata if model else {}
    return {
        "success": result.success,
        "seconds": time.perf_counter() - started,
        "steps": steps,
        "model": {
            name: metadata[name].value
            for name in ("train_rows", "rows_learnt_from", "epochs", "trained_for")
            if name in metadata
        },
    }


def child_equivalence(root: Path, days: list[str]) -> dict[str, Any]:
    """The streamed model against `same_order_fit`, on the same stored window."""
    import numpy as np
    import pandas as pd

    from ml_platform.contracts import load_contract
    from ml_platform.training.equivalence import same_order_fit
    from ml_platform.training.model import train_model

    contract = load_contract(root / "synthetic.yaml")
    lake = root / "lake"
    partitions = {day: pd.read_parquet(lake / stored_key(day)) for day in days}
    started = time.perf_counter()
    streamed = train_model(partitions, contract)
    streamed_seconds = time.perf_counter() - started
    started = time.perf_counter()
    preprocess = streamed.pipeline.named_steps["preprocess"]
    reference, history = same_order_fit(partitions, contract, preprocess)
    batch_seconds = time.perf_counter() - started
    ours = streamed.pipeline.named_steps["estimator"]
    weights = np.concatenate([np.ravel(ours.coef_), np.ravel(ours.intercept_)])
    theirs = np.concatenate([np.ravel(reference.coef_), np.ravel(reference.intercept_)])
    losses = [h["train_loss"] for h in streamed.history]
    reference_losses = [h["train_loss"] for h in history]
    return {
        "epochs": len(streamed.history),
        "reference_epochs": len(history),
        "best_epoch": streamed.best_epoch,
        "max_abs_weight_difference": float(np.max(np.abs(weights - theirs))),
        "max_relative_weight_difference": float(
            np.max(np.abs(weights - theirs) / np.maximum(np.abs(theirs), 1e-12))
        ),
        "max_relative_loss_difference": float(
            np.max(np.abs(np.subtract(losses, reference_losses)) / np.abs(reference_losses))
        )
        if len(losses) == len(reference_losses)
        else None,
        "streamed_seconds": streamed_seconds,
        "same_order_seconds": batch_seconds,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="memory_window_") as tmp:
        root = Path(tmp)
        contract_file(root, args.rows, args.window_days, args.estimator[0], args.max_epochs)
        days = [(args.start + dt.timedelta(days=i)).isoformat() for i in range(args.window_days)]
        started = time.perf_counter()
        frame_mb = write_window(root, days)
        result: dict[str, Any] = {
            "rows": args.rows,
            "window_days": args.window_days,
            "day_frame_mb": frame_mb,
            "generate_seconds": time.perf_counter() - started,
            "platform": {},
        }
        # Each estimator on the same stored window, in a fresh process with a fresh instance.
        for estimator in args.estimator:
            contract_file(root, args.rows, args.window_days, estimator, args.max_epochs)
            for folder in ("dagster_home", "lake/synthetic/model", "lake/synthetic/checkpoints"):
                shutil.rmtree(root / folder, ignore_errors=True)
            result["platform"][estimator] = run_child(
                "--child", "platform", "--root", tmp, "--days", days[-1], script=__file__
            )
            if args.equivalence and estimator == "sgd":
                result["equivalence"] = run_child(
                    "--child", "equivalence", "--root", tmp, "--days", *days, script=__file__
                )
        result["machine"] = (
            f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}"
        )
        result["load_average"] = os.getloadavg()
        return result


def table(result: dict[str, Any]) -> str:
    lines = [
        "| estimator | step | wall (s) | peak RSS (MB) | RSS before (MB) | increment (MB) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for estimator, measured in result["platform"].items():
        for name in MEASURED:
            f = measured["steps"].get(name)
            if f is None:
                continue
            lines.append(
                f"| {estimator} | {name} | {f['wall_seconds']:.2f} | {f['peak_rss_mb']:.0f} | "
                f"{f['rss_before_mb']:.0f} | {f['increment_mb']:.0f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--window-days", type=int, default=28)
    parser.add_argument("--estimator", nargs="+", default=["sgd"], choices=["sgd", "linear"])
    parser.add_argument("--max-epochs", type=int)
    parser.add_argument("--equivalence", action="store_true")
    parser.add_argument("--start", type=dt.date.fromisoformat, default=dt.date(2024, 1, 1))
    parser.add_argument("--child", choices=["platform", "equivalence"])
    parser.add_argument("--root", type=Path)
    parser.add_argument("--days", nargs="*")
    args = parser.parse_args()
    if args.child == "platform":
        print(json.dumps(child_platform(args.root, args.days[0])))
    elif args.child == "equivalence":
        print(json.dumps(child_equivalence(args.root, args.days)))
    else:
        result = run(args)
        print(table(result))
        print(json.dumps(result))


if __name__ == "__main__":
    main()
