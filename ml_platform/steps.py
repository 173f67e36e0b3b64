"""How a daily asset's step computes its days: one day, or a range of days in one run.

Sensors and schedules run one day per run. A backfill (the UI's "Materialize" of a partition
range, `dagster job backfill`, or GraphQL) runs a whole range of days in a single run: every
daily asset has
`BackfillPolicy.single_run()`, so a year costs one process, one import of pandas, scikit-learn
and Great Expectations and one run's bookkeeping, instead of 365 of each. Each asset writes its
days as it computes them: a step holds one day's data (or one window) at a time, whatever the
range. The assets annotate their inputs `Any`: a one-day step gets the day's value, a range step
a `DailyInput`.

An asset describes one day as a generator (`compute(day, **inputs)`) that yields its check
results and ends with a `dg.MaterializeResult`, or raises `dg.Failure` when the day must not be
stored. `each_day` runs it for the step's days and reports each day as its own partition: its
metadata (with the step metrics of that day), its check evaluations, its stored value.

In a range, a failed day does not stop the others: every day is computed, the good ones are
stored, and the step then fails naming each failed day and its reason. Dagster records a
single-run step's partitions all together, so none of the range is recorded as materialised
until every day of it passes: rerun the range (or the failed days) once they are fixed.
"""

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import dagster as dg

from ml_platform.observability import STEP_PREFIX, StepTelemetry, row_count, take_bytes_read
from ml_platform.storage import FORMAT_KEY, DailyInput, LakeIOManager, MissingPartitionError

SINGLE_RUN = dg.BackfillPolicy.single_run()
# Dagster 1.13 marks `backfill_policy` as beta; a single run per range is what a year of days
# needs, so the warning every daily asset would print at each code load is muted.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)


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
    context: dg.AssetExecutionContext, compute: Callable[..., Iterator], **inputs: Any
) -> Iterator:
    """Run `compute(day, **inputs)` for each day of the step and report each day's results.

    One day: its results pass through unchanged (the IO manager stores the value). A range:
    see the module's docstring.
    """
    op_name = context.op_def.name
    if context.has_partition_key:
        yield from _one_day(op_name, context.partition_key, compute, inputs)
        return
    yield from _range(context, op_name, compute, inputs)


def _one_day(op_name: str, day: str, compute: Callable[..., Iterator], inputs: dict[str, Any]):
    telemetry = StepTelemetry(reset_peak=True).start()
    for item in compute(day, **inputs):
        if isinstance(item, dg.MaterializeResult):
            # The result is the day's last item: measure up to it.
            telemetry.stop()
            metrics = day_metrics(op_name, telemetry, inputs, item.value)
            item = dg.MaterializeResult(
                asset_key=item.asset_key,
                metadata={**metrics, **(item.metadata or {})},
                check_results=item.check_results,
                data_version=item.data_version,
                tags=item.tags,
                value=item.value,
            )
        yield item


def _range(
    context: dg.AssetExecutionContext,
    op_name: str,
    compute: Callable[..., Iterator],
    inputs: dict[str, Any],
) -> Iterator:
    asset_key = context.asset_key
    assets_def = context.assets_def
    fmt = assets_def.metadata_by_key[asset_key][FORMAT_KEY]
    store: LakeIOManager = context.resources.io_manager
    blocking = {spec.key.name: spec.blocking for spec in assets_def.check_specs}
    days = context.partition_keys
    failed: dict[str, str] = {}
    for day in days:
        try:
            day_inputs = {
                name: value.for_day(day) if isinstance(value, DailyInput) else value
                for name, value in inputs.items()
            }
        except MissingPartitionError as exc:
            # A backfill of a range also targets the later days whose window reaches into it;
            # a day whose own input was never materialised fails alone, named.
            failed[day] = str(exc)
            context.log.error(f"{op_name} {day} failed: {failed[day]}")
            continue
        telemetry = StepTelemetry(reset_peak=True).start()
        try:
            for item in compute(day, **day_inputs):
                if isinstance(item, dg.AssetCheckResult):
                    # A failed check of one day (a rejected model, say) must not make Dagster
                    # stop the other days: a day a blocking check stops raises dg.Failure.
                    check_blocks = item.passed and blocking.get(str(item.check_name), False)
                    yield partition_evaluation(item, asset_key, day, blocking=check_blocks)
                    continue
                telemetry.stop()
                metadata = day_metrics(op_name, telemetry, day_inputs, item.value)
                metadata.update(item.metadata or {})
                if item.value is not None:
                    metadata.update(store.store_partition(asset_key, day, fmt, item.value))
                context.add_asset_metadata(metadata, partition_key=day)
        except dg.Failure as exc:
            failed[day] = exc.description or str(exc)
            context.log.error(f"{op_name} {day} failed: {failed[day]}")
    if failed:
        reasons = " ".join(f"{day}: {reason}" for day, reason in failed.items())
        raise dg.Failure(
            description=(
                f"{op_name}: {len(failed)} of {len(days)} days failed and were not stored; the "
                f"other days were stored and will be recorded once the range passes. {reasons}"
            ),
            metadata={"failed_partitions": list(failed)},
            allow_retries=False,
        )
    # Every check of the asset has an output; its per-day evaluations were reported above.
    for check_key in context.selected_asset_check_keys:
        yield dg.Output(None, output_name=assets_def.get_output_name_for_asset_check_key(check_key))
    yield dg.MaterializeResult()


def partition_evaluation(
    result: dg.AssetCheckResult, asset_key: dg.AssetKey, day: str, *, blocking: bool
) -> dg.AssetCheckEvaluation:
    """A check result of one day of a range, as the evaluation of that day's partition.

    `AssetCheckResult` takes its partition from the step, which a range step does not have.
    """
    return dg.AssetCheckEvaluation(
        asset_key=asset_key,
        check_name=str(result.check_name),
        passed=result.passed,
        metadata=result.metadata,
        severity=result.severity,
        description=result.description,
        blocking=blocking,
        partition=day,
    )
