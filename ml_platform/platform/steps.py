"""How a daily asset's step computes its days: one day, or a range of days in one run.

Sensors and schedules run one day per run. A backfill (the UI's "Materialize" of a partition
range, `dagster job backfill`, or GraphQL) runs a whole range of days in a single run: every
daily asset has `BackfillPolicy.single_run()`, so a year costs one process, one import of
pandas, scikit-learn and Great Expectations and one run's bookkeeping, instead of 365 of each.
Each asset writes its days as it computes them: a step holds one day's data (or one window) at
a time, whatever the range. The assets annotate their inputs `Any`: a one-day step gets the
day's value, a range step a `DailyInput`. Steps whose days are independent compute them in
forked worker processes (`map_days`), so a range uses every core.

An asset describes one day as a generator (`compute(day, **inputs)`) that yields its check
results and ends with a `dg.MaterializeResult`, or raises `dg.Failure` when the day must not be
stored. `each_day` runs it for the step's days and reports each day as its own partition: its
metadata (with the step metrics of that day), its check evaluations, its stored value.

In a range, a failed day does not stop the others: every day is computed, the good ones are
stored, and the step then fails naming each failed day and its reason. Dagster records a
single-run step's partitions all together, so none of the range is recorded as materialised
until every day of it passes: rerun the range (or the failed days) once they are fixed.
"""

import ctypes
import dataclasses
import math
import multiprocessing
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import dagster as dg

from ml_platform.platform.observability import (
    STEP_PREFIX,
    StepTelemetry,
    row_count,
    take_bytes_read,
)
from ml_platform.platform.settings import Settings
from ml_platform.platform.storage import (
    FORMAT_KEY,
    DailyInput,
    LakeIOManager,
    MissingPartitionError,
)

T = TypeVar("T")
SINGLE_RUN = dg.BackfillPolicy.single_run()
# Dagster 1.13 marks `backfill_policy` as beta; a single run per range is what a year of days
# needs, so the warning every daily asset would print at each code load is muted.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)


def daily_check_spec(
    name: str, asset: dg.AssetKey | str, partitions: dg.PartitionsDefinition, **kwargs: Any
) -> dg.AssetCheckSpec:
    """A check of a daily asset, evaluated per partition, so the UI shows its result per day.

    Without `partitions_def` a check of a partitioned asset has one result for the whole asset
    (the UI's "Partition —"). Dagster 1.13 marks it as preview; it is what a daily check needs,
    so the warning is muted here.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return dg.AssetCheckSpec(name, asset=asset, partitions_def=partitions, **kwargs)


def day_metrics(op_name: str, telemetry: StepTelemetry, inputs: dict[str, Any], value: Any):
    """Resource use and data volume of one day's computation, as numeric metadata.

    `step_wall_seconds`, `step_cpu_seconds`, `step_cpu_utilisation`, `step_peak_rss_mb`,
    `rows_in`, `rows_out` and `bytes_read` (the IO manager adds `stored_bytes`), which the UI
    plots across partitions and `ml-platform health` sizes containers from.
    """
    return {
        **telemetry.metadata(prefix=STEP_PREFIX),
        "rows_in": sum(row_count(v) for v in inputs.values()),
        "rows_out": row_count(value),
        "bytes_read": take_bytes_read(op_name),
    }


def each_day(
    context: dg.AssetExecutionContext,
    compute: Callable[..., Iterator],
    *,
    independent_days: bool = False,
    **inputs: Any,
) -> Iterator:
    """Run `compute(day, **inputs)` for each day of the step and report each day's results.

    One day: its results pass through unchanged (the IO manager stores the value). A range:
    see the module's docstring. `independent_days` says a day's computation reads nothing the
    step wrote for the days before it (nor the instance), so a range may compute its days in
    worker processes (`map_days`).
    """
    op_name = context.op_def.name
    if context.has_partition_key:
        yield from _one_day(op_name, context.partition_key, compute, inputs)
        return
    yield from _range(context, op_name, compute, inputs, independent_days)


def _one_day(op_name: str, day: str, compute: Callable[..., Iterator], inputs: dict[str, Any]):
    telemetry = StepTelemetry(reset_peak=True).start()
    # A check evaluated before its asset's materialisation targets no materialisation, and the
    # UI counts its day as "Missing" rather than "Passed": the day's check results travel with
    # its MaterializeResult, and are reported on their own only when the day fails.
    checks: list[dg.AssetCheckResult] = []
    try:
        for item in compute(day, **inputs):
            if isinstance(item, dg.AssetCheckResult):
                checks.append(item)
                continue
            if isinstance(item, dg.MaterializeResult):
                # The result is the day's last item: measure up to it.
                telemetry.stop()
                metrics = day_metrics(op_name, telemetry, inputs, item.value)
                item = dg.MaterializeResult(
                    asset_key=item.asset_key,
                    metadata={**metrics, **(item.metadata or {})},
                    check_results=[*checks, *(item.check_results or [])],
                    data_version=item.data_version,
                    tags=item.tags,
                    value=item.value,
                )
                checks = []
            yield item
    except Exception:
        yield from checks
        raise
    yield from checks


@dataclasses.dataclass
class DayOutcome:
    """What one day of a range step produced, in a form a worker process can send back."""

    day: str
    checks: list[dict[str, Any]]
    metadata: dict[str, Any] | None = None
    failure: str | None = None


def check_fields(result: dg.AssetCheckResult) -> dict[str, Any]:
    """The fields of a check result: Dagster's check results do not pickle, their fields do."""
    return {
        "check_name": str(result.check_name),
        "passed": result.passed,
        "severity": result.severity,
        "description": result.description,
        "metadata": result.metadata,
    }


def _range(
    context: dg.AssetExecutionContext,
    op_name: str,
    compute: Callable[..., Iterator],
    inputs: dict[str, Any],
    independent_days: bool,
) -> Iterator:
    asset_key = context.asset_key
    assets_def = context.assets_def
    fmt = assets_def.metadata_by_key[asset_key][FORMAT_KEY]
    store: LakeIOManager = context.resources.io_manager
    blocking = {spec.key.name: spec.blocking for spec in assets_def.check_specs}
    days = context.partition_keys

    def compute_day(day: str) -> DayOutcome:
        try:
            day_inputs = {
                name: value.for_day(day) if isinstance(value, DailyInput) else value
                for name, value in inputs.items()
            }
        except MissingPartitionError as exc:
            # A backfill of a range also targets the later days whose window reaches into it;
            # a day whose own input was never materialised fails alone, named.
            return DayOutcome(day, [], failure=str(exc))
        telemetry = StepTelemetry(reset_peak=True).start()
        checks: list[dict[str, Any]] = []
        try:
            for item in compute(day, **day_inputs):
                if isinstance(item, dg.AssetCheckResult):
                    checks.append(check_fields(item))
                    continue
                telemetry.stop()
                metadata = day_metrics(op_name, telemetry, day_inputs, item.value)
                metadata.update(item.metadata or {})
                if item.value is not None:
                    metadata.update(store.store_partition(asset_key, day, fmt, item.value))
                return DayOutcome(day, checks, metadata=metadata)
        except dg.Failure as exc:
            return DayOutcome(day, checks, failure=exc.description or str(exc))
        raise dg.DagsterInvariantViolationError(f"{op_name} {day}: no MaterializeResult")

    failed: dict[str, str] = {}
    evaluations: list[dg.AssetCheckEvaluation] = []
    if independent_days:
        workers = min(step_workers(), len(days))
        context.log.info(f"{op_name}: {len(days)} days in {workers} worker process(es)")
        outcomes: Iterator[DayOutcome] = map_days(compute_day, days)
    else:
        outcomes = map(compute_day, days)
    for outcome in outcomes:
        day = outcome.day
        for check in outcome.checks:
            # A failed check of one day (a rejected model, say) must not make Dagster stop
            # the other days: a day a blocking check stops fails through dg.Failure instead.
            check_blocks = check["passed"] and blocking.get(check["check_name"], False)
            evaluations.append(partition_evaluation(check, asset_key, day, blocking=check_blocks))
        if outcome.metadata is None:
            failed[day] = outcome.failure or "no result"
            context.log.error(f"{op_name} {day} failed: {failed[day]}")
        else:
            context.add_asset_metadata(outcome.metadata, partition_key=day)
    if failed:
        yield from evaluations
        reasons = " ".join(f"{day}: {reason}" for day, reason in failed.items())
        raise dg.Failure(
            description=(
                f"{op_name}: {len(failed)} of {len(days)} days failed and were not stored; the "
                f"other days were stored and will be recorded once the range passes. {reasons}"
            ),
            metadata={"failed_partitions": list(failed)},
            allow_retries=False,
        )
    # The days' materialisations first, so that each day's check evaluations target them.
    yield dg.MaterializeResult()
    yield from evaluations
    # Every check of the asset has an output; its per-day evaluations were reported above.
    for check_key in context.selected_asset_check_keys:
        yield dg.Output(None, output_name=assets_def.get_output_name_for_asset_check_key(check_key))


def step_workers() -> int:
    """Worker processes a range step may use: `ML_PLATFORM_STEP_WORKERS`, else the usable CPUs."""
    configured = Settings().step_workers
    if configured is not None:
        return configured
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# The function the forked workers of `map_days` call: set before the pool forks, so the
# function (a closure over the step's resources and inputs) is inherited, never pickled.
_DAY_FUNCTION: Callable[[str], Any] | None = None


def _map_chunk(days: list[str]) -> list[Any]:
    assert _DAY_FUNCTION is not None, "map_days sets the function before forking"
    return [_DAY_FUNCTION(day) for day in days]


def map_days(function: Callable[[str], T], days: Sequence[str]) -> Iterator[T]:
    """`function(day)` for each day, in order, computed by forked worker processes.

    For the days of a range that do not depend on each other: a year's backfill then uses
    every core instead of one. Workers get contiguous chunks of days, so a window input read
    by one day is mostly still cached for the next. The function must not use the step's
    context or the instance (the workers share the parent's connections); it may read and
    write the lake. Its results come back pickled. With one worker, or one day, it runs here.
    """
    workers = min(step_workers(), len(days))
    if workers < 2 or multiprocessing.current_process().daemon:
        yield from map(function, days)
        return
    # About 12 chunks per worker: small enough that no worker idles long at the end, large
    # enough that a 28-day window is re-read only once per chunk.
    size = max(1, math.ceil(len(days) / (workers * 12)))
    chunks = [list(days[i : i + size]) for i in range(0, len(days), size)]
    global _DAY_FUNCTION
    _DAY_FUNCTION = function
    try:
        # fork: the workers inherit the imports, resources and inputs already in memory.
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=_start_worker)
        try:
            for results in pool.imap(_map_chunk, chunks):
                yield from results
            pool.close()
        except BaseException:
            # A day's error, or the step stopped: the other workers' days are not needed.
            pool.terminate()
            raise
        finally:
            pool.join()
    finally:
        _DAY_FUNCTION = None


def _start_worker() -> None:
    # The run's process defers SIGTERM and SIGINT to Dagster's handlers, which a worker
    # inherits: restore the defaults, so that stopping the pool (or the run) stops the worker.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # And die with the run's process, were it killed outright, instead of waiting for days
    # that will never come (Linux: prctl PR_SET_PDEATHSIG).
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def partition_evaluation(
    fields: dict[str, Any], asset_key: dg.AssetKey, day: str, *, blocking: bool
) -> dg.AssetCheckEvaluation:
    """A check result of one day of a range (its `check_fields`) as that partition's evaluation.

    `AssetCheckResult` takes its partition from the step, which a range step does not have.
    """
    return dg.AssetCheckEvaluation(asset_key=asset_key, partition=day, blocking=blocking, **fields)
