"""How a daily asset's step computes its days: one day, or a range of days in one run.

Sensors and schedules run one day per run. A backfill (the UI's "Materialize" of a partition range,
or GraphQL) is split by the backfill daemon into runs of at most N days (`daily_backfill_policy`:
`BackfillPolicy.multi_run(N)`, N from `ML_PLATFORM_BACKFILL_DAYS_PER_RUN`), the registry and the
champion's monitoring into a run per daemon loop that finds days ready for them
(`chained_backfill_policy`), which the instance's run launcher places: processes beside the daemon
on the embedded instance (as many at once as the queue allows), ECS tasks or Kubernetes pods in
production (deploy/dagster.yaml). A run of N days pays one process start and one import of pandas,
scikit-learn and Great Expectations for its N days. Each asset stores its days as it computes them,
in order, each day's version in a file of its own that the day's record names
(`LakeIOManager`): a step holds one day's data (or one window) at a time, and a step that fails
deletes what it stored, since none of it is recorded. Every partitioned input arrives
as a `DailyInput` (the IO manager's), read a day at a time.

Which assets share a run is the choice of Dagster's asset backfill daemon. On each loop (every 30 s)
the daemon requests the target's partitions whose targeted parents are materialised, or are
requested in the same loop with the same partitions through an identity mapping and the same
backfill policy; it then cuts each requested set of partitions into runs of at most N days. The
model's window (`TimeWindowPartitionMapping(start_offset=-(W-1))`) is not an identity mapping, so
the model waits for every targeted day of its window. Three assets depend on their own day
before (`previous_day_input`), which orders their days, whatever the split into runs:

- validated_data: its history gate judges a day against the accepted days before it, so a chunk
  waits for the chunk before it (the daemon requests at most N waiting days of a self-dependent
  asset a loop, the first ones). A day's verdict is then the same in a one-day run, in any split
  of a range, and through the CLI.
- registered_model, the one writer of the registry's aliases: it walks its days in date order in
  one step, comparing each eligible candidate (daily, and the weekly one of the day before) with
  the serving champion. `chained_backfill_policy` (`single_run()`) makes it take every day whose
  evaluation is recorded in one run; its dependency on the day before orders the runs when a
  range is registered in two parts. champion_performance follows it (it reads the serving
  champion from the registry's record) and also keeps its day before, which its decay streak
  reads.

evaluation_report judges each candidate alone and depends on nothing but the day's model and
its window, so its chunks run side by side, in the model's run when the daemon requests both.
A range of C chunks therefore runs raw_data of every chunk in the first wave, validated_data chunk
after chunk (features and drift_report with it or after it), the model and the evaluation of
each chunk once the features of its window are recorded (and the chunk's drift reports, which
the model reads when the contract marks a feature blocking), then the registry and the
monitoring (`benchmarks/backfill_year.py` prints a range's timeline;
`ml_platform_tests/test_backfill_daemon.py` runs one). Days of independent chunks run side by side
as far as the run queue's `max_concurrent_runs` and the launcher allow.

An asset describes one day as a generator (`compute(day, **inputs)`) that yields its check
results and ends with a `dg.MaterializeResult`. `each_day` runs it for the step's days, one day
or a range alike (one code path), and reports each day as its own partition: its metadata (with
the step metrics of that day), its check evaluations, its stored value.

How a day ends (docs/verdicts.md has the table):

- **accepted**: the day's value is stored; its record says `verdict: accepted`, `accepted: true`
  and `accepted_rows`.
- **a data verdict** (`DataVerdict`: a rejected delivery, a window below coverage, no accepted
  input...): an outcome of the day, never a failure of the step. The day is recorded as a
  *tombstone*: `verdict`, `reason`, `accepted: false`, `accepted_rows: 0` and no data file. Its
  checks say why. A day whose earlier version was accepted keeps that version (nothing good is
  overwritten): the record says `kept_previous_version`, and the assets after it record the day
  `unchanged` without recomputing it. A day whose input is a tombstone is a tombstone too
  ("no accepted input"), so a rejected delivery flows down as a recorded verdict, not as a
  failure Dagster would spread to every later day and window.
- **a software or infrastructure failure** (any other exception: a bug, storage, memory): the
  day fails. The other days of a range are still computed; the step then fails naming each
  failed day, and the retry policy retries it when waiting can help. The step reports the
  failed days' checks alone: it records none of its days, so the others keep their earlier
  record and the checks that went with it. A storage error names the object, the asset and
  the day (`storage_errors.partition_errors`); one that waiting cannot fix (a full disk, a
  read-only lake, a permission refused) fails the day at once, never retried.
"""

import dataclasses
import enum
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import dagster as dg

from ml_platform.platform.failures import transient
from ml_platform.platform.formats import FORMAT_KEY
from ml_platform.platform.inputs import DailyInput
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.observability import (
    STEP_PREFIX,
    StepTelemetry,
    readable_metadata,
    row_count,
    take_bytes_read,
)
from ml_platform.platform.records import ACCEPTED, LAKE_KEY, UNCHANGED, DayRecord, day_records
from ml_platform.platform.settings import Settings
from ml_platform.platform.storage_errors import (
    LakeStorageError,
    MissingPartitionError,
    PermanentStorageError,
    partition_errors,
)

# Dagster 1.13 marks `backfill_policy` as beta; runs of N days are what a year of days needs,
# so the warning every daily asset would print at each code load is muted.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)
# A job over assets of both policies (the daily and weekly jobs) warns that it takes the smaller
# one at each code load; a job runs one day a run, and a job backfill one run a day, whatever
# the policy.
warnings.filterwarnings(
    "ignore", message=r"Asset job .* materializes assets with varying BackfillPolicies"
)


def daily_backfill_policy() -> dg.BackfillPolicy:
    """A daily asset's policy: at most `ML_PLATFORM_BACKFILL_DAYS_PER_RUN` days a run.

    Every asset up to evaluation_report has the same one, so that the assets of a chunk of days
    can share its run (see the module's docstring). For validated_data, which depends on its day
    before, the cap orders the chunks: the daemon requests at most N waiting days of a
    self-dependent asset a loop, its first ones.
    """
    return dg.BackfillPolicy.multi_run(Settings().backfill_days_per_run)


def chained_backfill_policy() -> dg.BackfillPolicy:
    """The registry's and champion_performance's policy: the days a loop can take, in one run.

    Their days follow one another, so chunks of them would buy no parallelism, only a daemon loop
    each: a range's days whose evaluations are recorded are registered (then monitored) in one
    run, in day order (see the module's docstring).
    """
    return dg.BackfillPolicy.single_run()


def previous_day_input(key: dg.AssetKey, days_before: int = 1) -> dg.AssetIn:
    """A dependency of a daily asset on its own day `days_before` days earlier, loading nothing.

    It makes Dagster's backfill daemon request a day only once the day before is materialised
    or requested with it in the same run, so the asset's days run in order: with
    `daily_backfill_policy` at most N days a loop, chunk after chunk; with
    `chained_backfill_policy` every day whose inputs are recorded, in one run. A self-dependent
    asset never shares a run with another asset requested in the same loop. The first day of
    the partitions, which has no day before, runs at once.
    """
    # The flag is marked beta; dropping the day before the first partition is what it does.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        mapping = dg.TimeWindowPartitionMapping(
            start_offset=-days_before,
            end_offset=-days_before,
            allow_nonexistent_upstream_partitions=True,
        )
    return dg.AssetIn(key, partition_mapping=mapping, dagster_type=dg.Nothing)


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
    plots across partitions and `ml-platform health` sizes containers from; and `step_worker`,
    the process those `step_*` figures are of.
    """
    return {
        **telemetry.metadata(prefix=STEP_PREFIX),
        "rows_in": sum(row_count(v) for v in inputs.values()),
        "rows_out": row_count(value),
        "bytes_read": take_bytes_read(op_name),
    }


class Verdict(enum.StrEnum):
    """How a day of a daily asset can end other than accepted: each a data verdict.

    docs/verdicts.md lists them beside the software failures, and a test holds the two together.
    """

    MISSING_FILE = "missing file"
    UNREADABLE_FILE = "unreadable file"
    SCHEMA_MISMATCH = "schema mismatch"
    QUALITY_GATE = "failed quality gate"
    NO_ACCEPTED_INPUT = "no accepted input"
    WINDOW_BELOW_COVERAGE = "window below coverage"
    TRAINING_DATA = "training data error"
    NON_FINITE_WEIGHTS = "non-finite weights"
    BLOCKING_DRIFT = "blocking drift"
    # A model whose contract marks a feature blocking, on a day with features but no accepted
    # drift report: whether it drifted is unknown, which is not "no drift".
    NO_DRIFT_REPORT = "no drift report"


class DataVerdict(Exception):
    """The day's data cannot go on: an outcome of the day, recorded as a tombstone.

    Raised by a day's computation (`each_day`); never a step failure, never retried.
    """

    def __init__(self, verdict: Verdict, reason: str, metadata: dict[str, Any] | None = None):
        super().__init__(reason)
        self.verdict = verdict
        self.reason = reason
        self.metadata = metadata or {}


@dataclasses.dataclass
class DayOutcome:
    """What one day of a step produced: its checks' fields and its metadata, or its failure."""

    day: str
    checks: list[dict[str, Any]]
    metadata: dict[str, Any] | None = None
    failure: str | None = None
    # The failure's exception, chained to the step's, so that the run is classed by it.
    error: Exception | None = None


def check_fields(result: dg.AssetCheckResult) -> dict[str, Any]:
    """The fields of a check result, from which `partition_evaluation` makes a day's evaluation."""
    return {
        "check_name": str(result.check_name),
        "passed": result.passed,
        "severity": result.severity,
        "description": result.description,
        "metadata": result.metadata,
    }


def verdict_fields(check_name: str, day: str, record: DayRecord) -> dict[str, Any]:
    """An ERROR check that says whether the day's delivery was accepted, and why not.

    It passes only for an accepted day: a day that kept its earlier accepted version (its own
    verdict, or `unchanged` after a rejection before it) fails it with the reason.
    """
    if record.verdict == ACCEPTED:
        description = f"{day} was accepted ({record.accepted_rows} rows)."
    elif record.accepted:
        description = (
            f"{day}: this delivery was rejected ({record.verdict}): {record.reason} The day keeps "
            "its earlier accepted version, and everything after it is unchanged."
        )
    else:
        description = f"{day} was rejected ({record.verdict}): {record.reason}"
    return {
        "check_name": check_name,
        "passed": record.verdict == ACCEPTED,
        "severity": dg.AssetCheckSeverity.ERROR,
        "description": description,
        "metadata": {"verdict": record.verdict, "accepted": record.accepted},
    }


def each_day(
    context: dg.AssetExecutionContext,
    compute: Callable[..., Iterator],
    verdict_check: str | None = None,
    before_recording: Callable[[], None] | None = None,
    carried: Sequence[str] = (),
    on_unchanged: Callable[[str, DayRecord], None] | None = None,
    **inputs: Any,
) -> Iterator:
    """Run `compute(day, **inputs)` for each day of the step and report each day's results.

    One day or a range, one path (see the module's docstring). `verdict_check`, when given, is
    the name of an ERROR check of the asset that each day passes when accepted and fails with
    the verdict's reason otherwise. `before_recording`, when given, runs once every day of the
    step succeeded, before any is recorded: what the step commits outside the lake (the
    registry's aliases) once, and never for an attempt that fails.

    A day recorded unchanged keeps its earlier outcome: its record repeats the earlier record's
    `carried` metadata (what readers of the latest record rely on, such as the aliases a
    registry day left), and `on_unchanged(day, earlier_record)`, when given, tells `compute`'s
    later days of the step that it was not computed again.
    """
    op_name = context.op_def.name
    asset_key = context.asset_key
    assets_def = context.assets_def
    fmt = assets_def.metadata_by_key[asset_key][FORMAT_KEY]
    store: LakeIOManager = context.resources.io_manager
    instance = context.instance
    run_id = context.run.run_id
    days = list(context.partition_keys)
    # What runs that failed or were killed before recording these days left (`LakeIOManager`).
    span = f"{days[0]}...{days[-1]}" if len(days) > 1 else days[0]
    with partition_errors(asset_key, span):
        swept = store.sweep(instance, asset_key, days)
    for key in swept:
        context.log.info(f"{op_name}: deleted {store.storage.uri(key)}, which no run recorded")
    version = f"{run_id}-{context.retry_number}"
    written: list[str] = []
    daily_inputs = {name: v for name, v in inputs.items() if isinstance(v, DailyInput)}
    previous = day_records(instance, asset_key, days)
    # The upstream days this run recorded: a day whose every input is `unchanged` (or kept its
    # accepted version) in this run is recorded unchanged without recomputing it.
    upstream = {
        name: {
            day: record
            for day, record in day_records(instance, value.asset_key, days).items()
            if record.run_id == run_id
        }
        for name, value in daily_inputs.items()
        if value.asset_key is not None
    }

    def kept_key(day: str) -> str | None:
        """The stored file of the day's accepted version, if it has one."""
        before = previous.get(day)
        if before is None or not before.accepted:
            return None
        key = store.recorded_key(before, asset_key, day, fmt)
        return key if store.storage.exists(key) else None

    def tombstone(day: str, verdict: str, reason: str, extra: dict[str, Any]) -> dict[str, Any]:
        key = kept_key(day)
        if key is not None:
            return {
                **extra,
                "verdict": verdict,
                "reason": reason,
                "accepted": True,
                "accepted_rows": previous[day].accepted_rows or 0,
                "kept_previous_version": dg.MetadataValue.path(store.storage.uri(key)),
                LAKE_KEY: key,
            }
        rejected = {"verdict": verdict, "reason": reason, "accepted": False, "accepted_rows": 0}
        return {**extra, **rejected}

    def unchanged_because(day: str) -> str | None:
        """Why the day is recorded unchanged, or None when it must be computed.

        Unchanged when the day keeps an accepted version and every input's day kept its own in
        this run (a rejected re-delivery upstream): the reason names that rejection.
        """
        if not upstream or kept_key(day) is None:
            return None
        records = {name: by_day.get(day) for name, by_day in upstream.items()}
        if len(records) != len(daily_inputs) or not all(
            r is not None and r.accepted and r.verdict != ACCEPTED for r in records.values()
        ):
            return None
        for name, record in records.items():
            assert record is not None
            if record.verdict != UNCHANGED:
                key = daily_inputs[name].asset_key
                where = key.to_user_string() if key is not None else name
                return f"{where} {day} rejected a re-delivery ({record.verdict}): {record.reason}"
        return next(r.reason for r in records.values() if r is not None)

    def no_accepted_input(name: str, day: str, exc: MissingPartitionError) -> DataVerdict:
        key = daily_inputs[name].asset_key
        record = day_records(instance, key, [day]).get(day) if key is not None else None
        if record is None or record.accepted:
            # Never recorded (or recorded with its file gone): not a verdict about the data.
            raise exc
        if record.verdict == Verdict.NO_ACCEPTED_INPUT:
            # Its reason already names the day's first rejected asset and why.
            return DataVerdict(Verdict.NO_ACCEPTED_INPUT, record.reason)
        where = key.to_user_string() if key is not None else name
        return DataVerdict(
            Verdict.NO_ACCEPTED_INPUT,
            f"{where} {day} was rejected ({record.verdict}): {record.reason}",
        )

    def compute_day(day: str) -> DayOutcome:
        because = unchanged_because(day)
        if because is not None:
            earlier = previous[day]
            if on_unchanged is not None:
                on_unchanged(day, earlier)
            return DayOutcome(
                day,
                [],
                metadata={
                    **{k: earlier.metadata[k] for k in carried if k in earlier.metadata},
                    "verdict": UNCHANGED,
                    "reason": because,
                    "accepted": True,
                    "accepted_rows": earlier.accepted_rows or 0,
                    LAKE_KEY: kept_key(day),
                },
            )
        # A day's bytes are what its own computation reads: not a range's look-ahead over all
        # its days (validated_data's screen), nor what an earlier day left uncounted.
        take_bytes_read(op_name)
        telemetry = StepTelemetry(reset_peak=True).start()
        checks: list[dict[str, Any]] = []
        day_inputs: dict[str, Any] = {}
        try:
            for name, value in inputs.items():
                try:
                    day_inputs[name] = value.for_day(day) if name in daily_inputs else value
                except MissingPartitionError as exc:
                    raise no_accepted_input(name, day, exc) from exc
            for item in compute(day, **day_inputs):
                if isinstance(item, dg.AssetCheckResult):
                    checks.append(check_fields(item))
                    continue
                telemetry.stop()
                metadata = day_metrics(op_name, telemetry, day_inputs, item.value)
                metadata.update(item.metadata or {})
                if item.value is not None:
                    key = store.version_key(asset_key, day, fmt, version)
                    written.append(key)
                    metadata.update(store.store_at(key, fmt, item.value))
                rows = row_count(item.value)
                metadata.update(verdict=ACCEPTED, accepted=True, accepted_rows=rows)
                return DayOutcome(day, checks, metadata=metadata)
        except DataVerdict as verdict:
            telemetry.stop()
            context.log.warning(f"{op_name} {day}: {verdict.verdict}: {verdict.reason}")
            extra = {
                **telemetry.metadata(prefix=STEP_PREFIX),
                "bytes_read": take_bytes_read(op_name),
                **verdict.metadata,
            }
            return DayOutcome(
                day, checks, metadata=tombstone(day, verdict.verdict.value, verdict.reason, extra)
            )
        except dg.Failure as exc:
            return DayOutcome(day, checks, failure=exc.description or str(exc), error=exc)
        raise dg.DagsterInvariantViolationError(f"{op_name} {day}: no MaterializeResult")

    def computed(day: str) -> DayOutcome:
        """The day's outcome, which the step's later days then read as recorded."""
        try:
            with partition_errors(asset_key, day):
                outcome = compute_day(day)
        except PermanentStorageError as exc:
            outcome = DayOutcome(day, [], failure=exc.description, error=exc)
        except Exception as exc:
            # A bug, memory, a storage hiccup: the day fails, the range's other days go on,
            # and the step says which days failed and why (below), retried only if waiting
            # can help. Interrupts (a KeyboardInterrupt, the run terminated) stop the step.
            outcome = DayOutcome(day, [], failure=f"{type(exc).__name__}: {exc}", error=exc)
        meta = outcome.metadata
        if meta is not None and (LAKE_KEY in meta or not meta["accepted"]):
            store.step_computed(asset_key, day, meta.get(LAKE_KEY) if meta["accepted"] else None)
        return outcome

    def forget_written() -> None:
        # Nothing this attempt stored is recorded: its files go, and a retry stores them again.
        store.step_ended(asset_key, days)
        for key in written:
            try:
                store.storage.delete(key)
            except LakeStorageError as exc:
                # The step's own error is the one to report; this file is unrecorded, so no
                # reader sees it, and the lake sweep deletes it once the run is recorded failed.
                context.log.warning(f"{op_name}: {exc}; the lake sweep deletes it later")

    failed: dict[str, str] = {}
    fields_by_day: dict[str, list[dict[str, Any]]] = {}
    try:
        outcomes = [computed(day) for day in days]
    except BaseException:
        forget_written()
        raise
    finally:
        take_bytes_read(op_name)  # nothing this step read is counted for a later step
    for outcome in outcomes:
        day = outcome.day
        # No check blocks: a day's failed check is its verdict, which must not stop the other
        # days or the assets after them (each of which records the day's verdict in turn).
        fields = list(outcome.checks)
        if outcome.metadata is not None and verdict_check is not None:
            meta = outcome.metadata
            record = DayRecord(
                verdict=meta["verdict"],
                accepted=meta["accepted"],
                reason=meta.get("reason", ""),
                run_id=run_id,
                accepted_rows=meta["accepted_rows"],
            )
            fields.append(verdict_fields(verdict_check, day, record))
        fields_by_day[day] = fields
        if outcome.metadata is None:
            failed[day] = outcome.failure or "no result"
            context.log.error(f"{op_name} {day} failed: {failed[day]}")
        else:
            context.add_asset_metadata(readable_metadata(outcome.metadata), partition_key=day)
    if failed:
        forget_written()
        # The failed days' checks alone, which say why they failed. The other days are not
        # recorded: their latest record stays the earlier one, which a check of this run must
        # not contradict (a day rejected before and accepted here would pass delivery_accepted
        # while its record, and every day after it, still says rejected).
        yield from evaluations(context, {day: fields_by_day[day] for day in failed})
        reasons = " ".join(f"{day}: {reason}" for day, reason in failed.items())
        errors = [o.error for o in outcomes if o.error is not None]
        raise dg.Failure(
            description=(
                f"{op_name}: {len(failed)} of {len(days)} days failed; no day of this run was "
                f"stored or recorded (a rerun computes them all again). {reasons}"
            ),
            metadata={"failed_partitions": list(failed)},
            # A retry computes every day again: it can only succeed when waiting can fix each
            # failed day, not when one of them fails the same way whatever the wait.
            allow_retries=bool(errors) and all(retryable(error) for error in errors),
        ) from next(iter(errors), None)
    if before_recording is not None:
        try:
            before_recording()
        except BaseException:
            forget_written()
            raise
    # The days' materialisations first, so that each day's check evaluations target them.
    yield dg.MaterializeResult()
    store.step_ended(asset_key, days)
    reported = set()
    for item in evaluations(context, fields_by_day):
        reported.add(item.check_name)
        yield item
    # Every check of the asset has an output; a day that reported none of a check (a rejected
    # day's model has no loss to judge) gives it an empty one.
    for check_key in context.selected_asset_check_keys:
        if not context.has_partition_key or check_key.name not in reported:
            output = assets_def.get_output_name_for_asset_check_key(check_key)
            yield dg.Output(None, output_name=output)


def retryable(error: Exception) -> bool:
    """Whether a day's error is one waiting can fix, for which the step's retry policy retries.

    A storage or I/O error that `partition_errors` did not find permanent (an OSError: the lake,
    the registry's files, a file mid-replace), and a timeout or a refused or dropped connection
    (`failures.transient`). Not a `dg.Failure` that forbids retries (a permanent storage error,
    a missing upstream day), nor a bug or an exhausted memory, which the same input meets again.
    """
    if isinstance(error, dg.Failure) and not error.allow_retries:
        return False
    return isinstance(error, OSError) or transient(error)


def evaluations(
    context: dg.AssetExecutionContext, fields_by_day: dict[str, list[dict[str, Any]]]
) -> Iterator[dg.AssetCheckResult | dg.AssetCheckEvaluation]:
    """The check results of the step's days, each reported as its day's.

    A one-day step reports `AssetCheckResult`s, which Dagster links to the day's
    materialisation (the UI then counts the day's check as passed or failed, not "Missing");
    a range reports each day's as that partition's `AssetCheckEvaluation`, since an
    `AssetCheckResult` takes its partition from the step.
    """
    for day, fields in fields_by_day.items():
        for field in fields:
            if field.get("metadata"):
                field = {**field, "metadata": readable_metadata(field["metadata"])}
            if context.has_partition_key:
                yield dg.AssetCheckResult(asset_key=context.asset_key, **field)
            else:
                yield partition_evaluation(field, context.asset_key, day, blocking=False)


def partition_evaluation(
    fields: dict[str, Any], asset_key: dg.AssetKey, day: str, *, blocking: bool
) -> dg.AssetCheckEvaluation:
    """A check result of one day of a range (its `check_fields`) as that partition's evaluation.

    `AssetCheckResult` takes its partition from the step, which a range step does not have.
    """
    return dg.AssetCheckEvaluation(asset_key=asset_key, partition=day, blocking=blocking, **fields)
