"""CPU cost of one day's evaluation report on real flights: scoring, plots, report, loss curve.

Run: .venv/bin/python benchmarks/evaluation_report.py [--end 2013-01-28] [--repeat 10]
     .venv/bin/python benchmarks/evaluation_report.py --range

Trains the model of the window ending `--end` (the contract's W days) and a champion on the
window ending the day before, then times, in CPU seconds of this process (other jobs on the
machine move wall time, much less CPU time), each piece of the evaluation asset in the order a
day runs them: scoring the candidate (reading the held-out rows and drawing the bootstrap
samples, as the day's first model does), the trivial baseline and the champion (on the rows and
samples the candidate left), the report's images, the report's markdown, the whole day
(`evaluation_day`: the split, the three scorings, the verdict, images and markdown), and the
model asset's loss curve. Charts are timed as a backfill draws them, into the figure the
previous day of the same layout left. Prints the best of `--repeat` runs after a warm-up.

`--range` measures the steps as a backfill runs them instead: flights days from 2013-03-01 are
landed and taken to features, the model of March is trained (its first days, with too short a
window, fail), then April's 28 days of `model` and of `evaluation_report` each run as one range
(`dg.materialize` in this process, the in-process executor). It prints each range's CPU seconds
per day, all of Dagster's work for the day included (input loading, events, output storage),
and the CPU of each loss chart the model range drew (the median; the first includes importing
matplotlib). The evaluation range runs after the model range, as in a backfill's process.
"""

import argparse
import dataclasses
import datetime as dt
import json
import time
from collections.abc import Callable

import idle

from ml_platform.contracts import load_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.evaluation import metrics
from ml_platform.evaluation.metrics import (
    judge,
    plots,
    render_report,
    score_baseline,
    score_model,
    split_of,
)
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.landing import source_day
from ml_platform.ingestion.synthetic import file_bytes
from ml_platform.training.assets import loss_curve
from ml_platform.training.model import TrainedModel, train_model


def cpu_ms(work: Callable[[], object], repeat: int) -> float:
    work()
    best = []
    for _ in range(repeat):
        started = time.process_time()
        work()
        best.append(time.process_time() - started)
    return round(min(best) * 1000, 1)


def range_run() -> dict[str, object]:
    """CPU per day of April's model and evaluation_report ranges, and of each loss chart."""
    import statistics
    import tempfile
    from pathlib import Path

    import dagster as dg

    from ml_platform.definitions import build_definitions
    from ml_platform.ingestion.landing import LandingZone, land_days
    from ml_platform.platform.datasets import asset_key
    from ml_platform.training import assets as training_assets

    contract = load_contract("flights")
    root = Path(tempfile.mkdtemp(prefix="evaluation-range-"))
    defs = build_definitions(
        contract, landing_dir=str(root / "landing"), lake_dir=str(root / "lake")
    )
    instance = dg.DagsterInstance.ephemeral()
    first, april, last = dt.date(2013, 3, 1), dt.date(2013, 4, 1), dt.date(2013, 4, 28)
    days = [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]
    list(land_days(contract, LandingZone(base_dir=str(root / "landing")), days))
    charts: list[float] = []
    drawn = training_assets.loss_curve

    def timed_loss_curve(model: TrainedModel) -> str:
        # The model asset looks the function up when it runs: each chart it draws is timed.
        started = time.process_time()
        try:
            return drawn(model)
        finally:
            charts.append(time.process_time() - started)

    training_assets.loss_curve = timed_loss_curve

    def cpu_per_day(asset: str, start: dt.date, end: dt.date, may_fail: bool = False) -> float:
        started = time.process_time()
        result = dg.materialize(
            [*(defs.assets or []), *(defs.asset_checks or [])],  # type: ignore[list-item]
            resources=defs.resources,
            instance=instance,
            selection=[asset_key(contract.name, asset)],
            tags={
                "dagster/asset_partition_range_start": start.isoformat(),
                "dagster/asset_partition_range_end": end.isoformat(),
            },
            raise_on_error=False,
        )
        if not (result.success or may_fail):
            raise RuntimeError(f"{asset} {start}..{end} failed: its time would not be the step's")
        return round((time.process_time() - started) / ((end - start).days + 1), 3)

    for asset in ("raw_data", "validated_data", "features"):
        cpu_per_day(asset, first, last)
    # March's first models' windows reach before the landed days: some of them fail.
    cpu_per_day("model", first, april - dt.timedelta(days=1), may_fail=True)
    march_charts = len(charts)
    model = cpu_per_day("model", april, last)
    evaluation = cpu_per_day("evaluation_report", april, last)
    april_charts = charts[march_charts:]
    return {
        "days": (last - april).days + 1,
        "cpu_s_per_day": {"model": model, "evaluation_report": evaluation},
        "loss_chart_cpu_ms": {
            "first_of_the_process": round(charts[0] * 1000, 1),
            "median_in_the_range": round(statistics.median(april_charts) * 1000, 1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--end", type=dt.date.fromisoformat, default=dt.date(2013, 1, 28))
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--range", action="store_true", help="time April's ranges instead")
    idle.add_argument(parser)
    args = parser.parse_args()
    load = idle.before(args.loaded)
    if args.range:
        print(json.dumps({**range_run(), **idle.after(load)}, indent=2))
        return
    contract = load_contract("flights")
    text_columns = [c.name for c in contract.columns if c.dtype == "str"]
    features = {}
    for back in range(contract.training.window_days + 1):
        day = args.end - dt.timedelta(days=back)
        key = day.isoformat()
        data = file_bytes(source_day(contract, day))
        raw = read_landed_file(data, "bench.csv", key, text_columns)
        features[key] = build_features(type_rows(raw, contract, key), contract)
    keys = sorted(features)
    window = {k: features[k] for k in keys[1:]}
    model = train_model(window, contract)
    champion = train_model({k: features[k] for k in keys[:-1]}, contract)
    train, holdout = split_of(model, window, contract)
    samples, seed = contract.evaluation.bootstrap_samples, contract.training.random_seed
    candidate = score_model(model, holdout, samples, seed)
    incumbent = score_model(champion, holdout, samples, seed)
    baseline = score_baseline(model, train, candidate.labels, samples, seed)
    verdict = judge(contract, candidate, incumbent, baseline)
    images = plots(model, candidate)

    def first_scoring() -> object:
        # A new day: its held-out rows not read yet, its bootstrap samples not drawn.
        metrics._one_block.cache_clear()
        return score_model(model, dataclasses.replace(holdout), samples, seed)

    def whole_day() -> object:
        metrics._one_block.cache_clear()
        day_train, day_holdout = split_of(model, window, contract)
        scores = score_model(model, day_holdout, samples, seed)
        trivial = score_baseline(model, day_train, scores.labels, samples, seed)
        other = score_model(champion, day_holdout, samples, seed)
        decided = judge(contract, scores, other, trivial)
        return render_report(
            args.end.isoformat(),
            model,
            scores,
            other,
            "champion",
            decided,
            plots(model, scores),
            trivial,
        )

    pieces = {
        "score_candidate": first_scoring,
        "score_baseline": lambda: score_baseline(model, train, candidate.labels, samples, seed),
        "score_champion": lambda: score_model(champion, holdout, samples, seed),
        "plots": lambda: plots(model, candidate),
        "render_report": lambda: render_report(
            args.end.isoformat(), model, candidate, incumbent, "champion", verdict, images, baseline
        ),
        "evaluation_day": whole_day,
        "loss_curve": lambda: loss_curve(model),
    }
    cpu = {name: cpu_ms(work, args.repeat) for name, work in pieces.items()}
    report = render_report(
        args.end.isoformat(), model, candidate, incumbent, "champion", verdict, images, baseline
    )
    print(
        json.dumps(
            {
                "day": args.end.isoformat(),
                "holdout_rows": len(holdout),
                "bootstrap_samples": samples,
                "cpu_ms": cpu,
                "report_images_cpu_ms": round(cpu["plots"] + cpu["loss_curve"], 1),
                "report_kb": round((len(report) + len(loss_curve(model))) / 1024, 1),
                **idle.after(load),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
