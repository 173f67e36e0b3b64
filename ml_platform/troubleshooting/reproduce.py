"""Rerun a failed run's asset for its partition, in this process, on a sample of its real inputs.

The inputs are the partitions the failed run read, loaded from the lake by the same IO manager,
cut to a sample so the rerun takes seconds. The IO manager reads the version of each partition
that Dagster records now, so before anything runs, each input's materialisation that the run
read (the last one recorded before the failed step started) is compared with the one recorded
now, and the landed file a raw-data step reads with the file the run read. If any changed since
(a later run recorded other data), or its file is gone from the lake though still recorded (a
rerun would stop on the missing file, not on the run's error), `reproduce` refuses with
InputsChangedError naming what changed instead of rerunning on other data: a rerun on today's
lake says nothing about the run's failure.

A run of a partition range (a backfill's run of several days) is reproduced for one day: the
first of the days its step recorded as failed (`each_day`'s `failed_partitions`), or, when the
failure names none (an error raised out of the step), the range's first day, where the step
began; the log names the range's other days.

The exception the asset raises propagates out of `reproduce` unchanged, with its traceback
ending in the asset's own code, so `pdb.post_mortem` (`ml-platform reproduce --pdb`) stops
where it broke. The step runs once: its retry policy is left out (retries would only repeat
the same error after their backoff). With the contract given, the volume expectations
(`quality.row_count`) are scaled to the sample and the history gate's count statistics left
out, so that a sample is not mistaken for a short delivery; the log says so.

Nothing the rerun writes reaches the real lake (local or S3) or instance: writes go to a
scratch directory layered over the lake (reads see the scratch first, then the lake), and the
run is recorded in an ephemeral instance. So a reproduced training run cannot leave a
checkpoint that a real run would resume from.
"""

import dataclasses
import datetime as dt
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.contracts.reference import reference_days
from ml_platform.ingestion.landing import LandingStore
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.failures import (
    RESOURCE_EXHAUSTION,
    Classification,
    out_of_disk,
)
from ml_platform.platform.inputs import DailyInput
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.observability import row_count
from ml_platform.platform.partitions import run_days
from ml_platform.platform.records import ACCEPTED, DayRecord, day_records
from ml_platform.platform.storage import LakeStorage, LocalStorage
from ml_platform.platform.tracking import MlflowStores
from ml_platform.registry.store import ModelRegistryResource
from ml_platform.troubleshooting.diagnose import Diagnosis, diagnose_run

DEFAULT_SAMPLE_ROWS = 100
# The rerun's events go to its scratch instance; the terminal shows the asset's exception only.
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
# History statistics that count rows or values: a sample's counts are not the day's.
COUNT_STATISTICS = ("row_count", "distinct_count")
# The tags of a run of a partition range, and the metadata in which `each_day`'s dg.Failure
# names the range's days that failed.
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
FAILED_PARTITIONS = "failed_partitions"
python_logger = logging.getLogger("ml_platform.troubleshooting.reproduce")


class NothingToReproduceError(RuntimeError):
    """The run has no failed asset step that the definitions know."""


class InputsChangedError(NothingToReproduceError):
    """An input the run read was replaced since, and the version the run read is gone."""


class OverlayStorage(LakeStorage):
    """The lake read-only, with writes going to `write_dir` (and read back from there first)."""

    lake: LakeStorage
    write_dir: str

    def _scratch(self) -> LocalStorage:
        return LocalStorage(base_dir=self.write_dir)

    def uri(self, key: str) -> str:
        """Where the object is read from: the scratch copy if written, else the lake."""
        scratch = self._scratch()
        return scratch.uri(key) if scratch.exists(key) else self.lake.uri(key)

    def exists(self, key: str) -> bool:
        """Whether the scratch directory or the lake holds `key`."""
        return self._scratch().exists(key) or self.lake.exists(key)

    def write_bytes(self, key: str, data: bytes) -> None:
        """Store in the scratch directory; the lake is never written."""
        self._scratch().write_bytes(key, data)

    def read_bytes(self, key: str) -> bytes:
        """The scratch copy if there is one, else the lake's."""
        scratch = self._scratch()
        return scratch.read_bytes(key) if scratch.exists(key) else self.lake.read_bytes(key)

    def delete(self, key: str) -> None:
        """Remove the scratch copy only."""
        self._scratch().delete(key)

    def list_keys(self, prefix: str) -> list[str]:
        """Keys in the lake and in the scratch directory."""
        return sorted(set(self.lake.list_keys(prefix)) | set(self._scratch().list_keys(prefix)))


def sample(value: Any, rows: int) -> Any:
    """`rows` rows of a frame (a fixed random sample, kept in order); other values as they are."""
    if isinstance(value, pd.DataFrame) and len(value) > rows:
        return value.sample(n=rows, random_state=0).sort_index()
    if isinstance(value, dict):
        return {key: sample(item, rows) for key, item in value.items()}
    return value


class SampleIOManager(LakeIOManager):
    """The lake IO manager, handing each input partition to the asset as a sample of its rows.

    The rerun is recorded in an ephemeral instance, so the days it reads are those of `pinned`
    (asset -> day -> lake key, "" for a day recorded before versions had files): the versions
    the failed run read, as the real instance recorded them when its step started.
    """

    sample_rows: int
    pinned: dict[str, dict[str, str]] = {}

    def records(
        self, instance: dg.DagsterInstance, asset_key: dg.AssetKey, days: Sequence[str]
    ) -> dict[str, DayRecord]:
        """The pinned versions of `days`, recorded as accepted."""
        by_day = self.pinned.get(asset_key.to_user_string(), {})
        return {
            day: DayRecord(ACCEPTED, True, "", "", lake_key=by_day[day] or None)
            for day in days
            if day in by_day
        }

    def load_input(self, context: dg.InputContext) -> Any:
        """The real input, each partition sampled to `sample_rows` rows as the step reads it."""
        value = super().load_input(context)
        if not isinstance(value, DailyInput):
            return self._sampled(context, value)
        # A step reads a DailyInput a partition at a time: sample each one as it is loaded.
        load = value.cache.load
        value.cache.load = lambda key: self._sampled(context, load(key))
        return value

    def _sampled(self, context: dg.InputContext, value: Any) -> Any:
        sampled = sample(value, self.sample_rows)
        python_logger.info(
            f"input {context.name} ({context.asset_key.to_user_string()}): "
            f"{row_count(sampled)} of {row_count(value)} rows"
        )
        return sampled


@dataclasses.dataclass(frozen=True)
class Target:
    """What to rerun: the failed asset and its partition, and what the run knew of it."""

    run_id: str
    asset: dg.AssetsDefinition
    partition: str | None  # one day, also of a run of a partition range
    step_started: float = 0.0  # when the failed step's last attempt started (epoch seconds)
    diagnosis: Diagnosis | None = None
    tags: dict[str, str] = dataclasses.field(default_factory=dict)  # the run's tags


def step_started(instance: dg.DagsterInstance, run_id: str, step: str) -> float:
    """When the last attempt of `step` started in the run: what it read was stored before."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_START).records
    starts = [r.event_log_entry.timestamp for r in records if r.event_log_entry.step_key == step]
    if not starts:
        raise NothingToReproduceError(f"run {run_id} never started step {step}")
    return max(starts)


def failed_partitions(instance: dg.DagsterInstance, run_id: str, step: str) -> list[str]:
    """The days the step's last failure names as failed (`each_day`'s dg.Failure), if any."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    failures = [r for r in records.records if r.event_log_entry.step_key == step]
    if not failures:
        return []
    event = failures[-1].event_log_entry.dagster_event
    data: Any = event.event_specific_data if event is not None else None
    user = getattr(data, "user_failure_data", None)
    entry = (user.metadata or {}).get(FAILED_PARTITIONS) if user is not None else None
    value = entry.value if entry is not None else None
    return [str(day) for day in value] if isinstance(value, list) else []


def range_days(asset: dg.AssetsDefinition, start: str, end: str) -> list[str]:
    """The asset's partitions from `start` to `end`; none if either end is no partition of it."""
    partitions = asset.partitions_def
    if partitions is None or not all(partitions.has_partition_key(k) for k in (start, end)):
        return []
    return list(partitions.get_partition_keys_in_range(dg.PartitionKeyRange(start, end)))


def dataset_option(asset: dg.AssetsDefinition) -> str:
    """` --dataset NAME` for a command that reruns the asset's days, or "" for a bare key.

    The platform's asset keys start with their dataset, which the commands need when several
    are served.
    """
    path = asset.key.path
    return f" --dataset {path[0]}" if len(path) > 1 else ""


def failed_day(
    instance: dg.DagsterInstance, run_id: str, step: str, asset: dg.AssetsDefinition
) -> str | None:
    """The one partition to rerun the failed step for: the run's, or a day of its range.

    A run of a range (a backfill's) failed on some of its days: the first the step's failure
    names, or, when it names none (an error raised out of `each_day` stops the step at the
    first day that raised, which the event log does not say), the range's first day, where the
    step began. The range itself is no partition: Dagster knows no such key, and no input was
    ever stored for it. NothingToReproduceError if the range is no days of the asset's.
    """
    run = instance.get_run_by_id(run_id)
    tags = run.tags if run is not None else {}
    if "dagster/partition" in tags:
        return tags["dagster/partition"]
    start, end = tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)
    if not (start and end):
        return None  # an unpartitioned run
    span = f"{start}...{end}"
    days = range_days(asset, start, end)
    if not days:
        try:
            count = str(len(run_days(tags)))
        except ValueError:
            count = "N"  # not days: the user counts them
        raise NothingToReproduceError(
            f"run {run_id} ran {asset.key.to_user_string()} for the partition range {span}, "
            "which is no days of the asset's partitions in these definitions, so no single day "
            "of it can be reproduced. Rerun the days, each in a run of its own (`ml-platform "
            f"materialize{dataset_option(asset)} --start {start} --days {count} --force`), "
            "then reproduce the run of a day that fails."
        )
    if len(days) == 1:
        return days[0]
    failed = [day for day in failed_partitions(instance, run_id, step) if day in days]
    if failed:
        day, others = failed[0], failed[1:]
        python_logger.info(
            f"run {run_id} covered the days {span}; step {step} failed on {len(failed)} of "
            f"them: reproducing {day}, the first"
            + (f" (the others that failed: {', '.join(others)})" if others else "")
        )
        return day
    day, others = days[0], days[1:]
    python_logger.info(
        f"run {run_id} covered the days {span}; the failure of step {step} names no day (an "
        f"error raised out of the step, which stops at the first day that raises): reproducing "
        f"{day}, the range's first, where the step began"
        + (
            f". Should it not fail, one of {', '.join(others)} did: rerun each in a run of its "
            f"own (`ml-platform materialize{dataset_option(asset)} --start DAY --force`) and "
            "reproduce the run that fails"
            if others
            else ""
        )
    )
    return day


def failed_target(instance: dg.DagsterInstance, run_id: str, defs: dg.Definitions) -> Target:
    """The first failed asset step of the run, as an asset of `defs`, for one partition.

    A run of a partition range is reproduced for one of its days (`failed_day`).
    """
    diagnosis = diagnose_run(instance, run_id)
    if not diagnosis.failed_steps:
        raise NothingToReproduceError(
            f"run {diagnosis.run_id} is {diagnosis.status} and has no failed step to reproduce"
        )
    step = diagnosis.failed_steps[0].step
    run = instance.get_run_by_id(diagnosis.run_id)
    for asset in defs.assets or []:
        if isinstance(asset, dg.AssetsDefinition) and asset.op.name == step:
            return Target(
                run_id=diagnosis.run_id,
                asset=asset,
                partition=failed_day(instance, diagnosis.run_id, step, asset),
                step_started=step_started(instance, diagnosis.run_id, step),
                diagnosis=diagnosis,
                tags=dict(run.tags) if run else {},
            )
    raise NothingToReproduceError(
        f"run {run_id} failed in step {step}, which is no asset of these definitions "
        "(another code location, or the asset was renamed since)"
    )


@dataclasses.dataclass(frozen=True)
class InputRead:
    """One input partition of the failed step: what the run read and what is stored now."""

    asset_key: dg.AssetKey
    partition: str | None
    read: dg.EventLogRecord | None  # the last materialisation before the step started
    stored: dg.EventLogRecord | None  # the last materialisation now
    # Loaded through the IO manager, which hands the rerun a sample; a dependency the asset
    # reads from the lake itself (validated_data's raw_data) comes whole.
    sampled: bool = True

    @property
    def name(self) -> str:
        """`asset partition P` for messages."""
        where = f" partition {self.partition}" if self.partition else ""
        return f"{self.asset_key.to_user_string()}{where}"

    @property
    def rows(self) -> int | None:
        """Rows of the version the run read, as its materialisation recorded them."""
        if self.read is None or self.read.asset_materialization is None:
            return None
        value = self.read.asset_materialization.metadata.get("dagster/row_count")
        return int(value.value) if value is not None else None  # type: ignore[arg-type]

    def change(self) -> str | None:
        """How the stored version differs from the one the run read; None if it does not."""
        if self.read is None and self.stored is None:
            return None  # not stored then, not stored now: the rerun meets the same absence
        if self.read is None:
            return (
                f"{self.name} was not stored when the run read it; it is now ({_by(self.stored)})"
            )
        if self.stored is None:
            return f"{self.name} was stored when the run read it ({_by(self.read)}); it is gone"
        if self.read.storage_id == self.stored.storage_id:
            return None
        # Another materialisation is another file of the lake, whatever its data version says:
        # Dagster derives that from the code version and the upstream assets' versions, so a
        # day landed again (raw_data reads the landing zone, no asset) keeps the same one.
        return (
            f"{self.name} changed since the run read it: it read the version "
            f"{_by(self.read)}, the lake now holds the one {_by(self.stored)}"
        )


def _by(record: dg.EventLogRecord | None) -> str:
    if record is None:
        return "-"
    when = dt.datetime.fromtimestamp(record.timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"materialised by run {record.run_id[:8]} at {when}"


def upstream_partitions(
    asset: dg.AssetsDefinition, upstream: dg.AssetsDefinition | None, key: dg.AssetKey, day: str
) -> Sequence[str | None]:
    """The partitions of input `key` that the asset's step of partition `day` reads."""
    if upstream is None or upstream.partitions_def is None or asset.partitions_def is None:
        return [None]
    mapping = asset.get_partition_mapping(key)
    if mapping is None:
        return [day]
    result = mapping.get_upstream_mapped_partitions_result_for_partitions(
        asset.partitions_def.subset_with_partition_keys([day]),
        asset.partitions_def,
        upstream.partitions_def,
    )
    return sorted(result.partitions_subset.get_partition_keys())


def inputs_read(
    instance: dg.DagsterInstance, target: Target, defs: dg.Definitions
) -> list[InputRead]:
    """Each input partition the failed step loaded, then and now."""
    by_key = {
        key: a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition) for key in a.keys
    }
    reads = []
    for input_def in target.asset.op.input_defs:
        key = target.asset.keys_by_input_name.get(input_def.name)
        # A dependency without a value counts too: validated_data reads the raw_data parse its
        # dependency staged from the lake. The asset's own past is not an input.
        if key is None or key in target.asset.keys:
            continue
        for partition in upstream_partitions(
            target.asset, by_key.get(key), key, target.partition or ""
        ):
            wanted = [partition] if partition is not None else None
            before = dg.AssetRecordsFilter(
                asset_key=key, asset_partitions=wanted, before_timestamp=target.step_started
            )
            now = dg.AssetRecordsFilter(asset_key=key, asset_partitions=wanted)
            read = next(iter(instance.fetch_materializations(before, limit=1).records), None)
            stored = next(iter(instance.fetch_materializations(now, limit=1).records), None)
            sampled = not input_def.dagster_type.is_nothing
            reads.append(InputRead(key, partition, read, stored, sampled))
    return reads


def pinned_versions(
    instance: dg.DagsterInstance,
    target: Target,
    reads: Sequence[InputRead],
    contract: Contract | None,
) -> dict[str, dict[str, str]]:
    """The versions the failed step read, for `SampleIOManager.pinned`.

    Its inputs, and for validated_data the reference days of its history gate, as the instance
    recorded them when the step started.
    """
    records: dict[dg.AssetKey, dict[str, DayRecord]] = {}
    for read in reads:
        if read.read is not None and read.partition is not None:
            records.setdefault(read.asset_key, {})[read.partition] = DayRecord.of(read.read)
    if contract is not None and target.partition is not None:
        key = asset_key(contract.name, "validated_data")
        if key in target.asset.keys:
            references = reference_days(
                contract.history_reference,
                dt.date.fromisoformat(target.partition),
                contract.partitions.start_date,
            )
            days = [day.isoformat() for day in references]
            records[key] = day_records(instance, key, days, before=target.step_started)
    return {
        key.to_user_string(): {
            day: record.lake_key or "" for day, record in by_day.items() if record.accepted
        }
        for key, by_day in records.items()
    }


def configured(resource: Any, instance: dg.DagsterInstance) -> Any:
    """A resource with its config (environment variables) resolved.

    Through `build_resources` with the instance at hand: `process_config_and_initialize` would
    enter an ephemeral instance that it never leaves.
    """
    with dg.build_resources({"resource": resource}, instance=instance) as built:
        return built.resource


def landed_file_change(
    instance: dg.DagsterInstance, target: Target, defs: dg.Definitions, contract: Contract
) -> str | None:
    """How the landed file a raw-data step reads differs from the one the run read, if it does."""
    if "landing" not in target.asset.required_resource_keys or target.partition is None:
        return None
    landing = (defs.resources or {}).get("landing")
    if not isinstance(landing, LandingStore):
        return None
    zone = configured(landing, instance)
    name = contract.landing.file_name(target.partition)
    # One look-up, not a listing of the zone (10,000s of files); a refused entry (a link put in
    # the file's place) is no file the run could have read.
    entry = zone.find(name)
    if entry is not None and entry.refused is not None:
        return f"the landed file {zone.path_for(name)} is no readable file now: {entry.refused}"
    failure = target.diagnosis.failed_steps[0] if target.diagnosis else None
    missing_then = failure is not None and any(
        "MissingLandingFileError" in link for link in failure.chain
    )
    if entry is None:
        return None if missing_then else f"the landed file {zone.path_for(name)} is gone"
    if missing_then:
        return f"the landed file {zone.path_for(name)} had not landed when the run ran; it has now"
    # The file in place when the step started is the one it read. Not the version the landing
    # sensor listed (the run's tag): a file delivered again between the tick and the run is
    # what the run read, and one put back as it was listed after the run is not what it read.
    # raw_data records the bytes it read only for a day it recorded, never in a failed step.
    if entry.modified <= target.step_started + zone.modified_slack_seconds():
        return None
    when = dt.datetime.fromtimestamp(entry.modified, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"the landed file {zone.path_for(name)} was replaced at {when}, after the run read it"


def lost_files(
    instance: dg.DagsterInstance, target: Target, defs: dg.Definitions, reads: Sequence[InputRead]
) -> list[str]:
    """The inputs still recorded as the run read them whose files the lake no longer holds.

    The record outlives its file when the lake loses it (a clean-up, a lifecycle rule, a
    restore that left it out): the rerun would stop on the missing file, not on the run's
    error. Unless the run stopped on that same absence: then the rerun meets it again.
    """
    lake = (defs.resources or {}).get("lake")
    if not isinstance(lake, LakeStorage):
        return []
    storage = configured(lake, instance)
    failure = target.diagnosis.failed_steps[0] if target.diagnosis else None
    chain = failure.chain if failure is not None else ()
    lost = []
    for read in reads:
        if read.read is None or read.change() is not None:
            continue
        record = DayRecord.of(read.read)
        if not record.accepted or record.lake_key is None or storage.exists(record.lake_key):
            continue
        if any("MissingPartitionError" in link and read.name in link for link in chain):
            continue
        lost.append(
            f"{read.name} is gone from the lake: its file {storage.uri(record.lake_key)}, "
            f"{_by(read.read)}, which the run read, no longer exists"
        )
    return lost


def check_inputs_unchanged(
    instance: dg.DagsterInstance, target: Target, defs: dg.Definitions, contract: Contract | None
) -> list[InputRead]:
    """The step's inputs, or InputsChangedError if any is not the version the run read."""
    reads = inputs_read(instance, target, defs)
    changes = [c for c in (r.change() for r in reads) if c is not None]
    changes += lost_files(instance, target, defs, reads)
    if contract is not None:
        landed = landed_file_change(instance, target, defs, contract)
        if landed is not None:
            changes.append(landed)
    if changes:
        shown = "; ".join(changes[:3]) + (
            f"; and {len(changes) - 3} more" if len(changes) > 3 else ""
        )
        dataset = dataset_option(target.asset)
        rerun = (
            f"Rerun the day (`ml-platform materialize{dataset} --start {target.partition} --force`)"
            if target.partition
            else "Rerun the asset"
        )
        raise InputsChangedError(
            f"cannot reproduce run {target.run_id}: {shown}. A rerun on the data recorded now "
            f"would say nothing about that failure. {rerun} to see whether it still fails, "
            "then reproduce that run."
        )
    return reads


def scaled_contract(contract: Contract, fraction: float) -> tuple[Contract, str]:
    """The contract with its volume expectations scaled to a sample of `fraction` of the rows.

    Row-count bounds scale with the sample; the history gate's count statistics (row and
    distinct counts) are left out, as the reference days are whole days. Returns the contract
    and a sentence saying what changed.
    """
    bounds = contract.quality.row_count
    low = math.floor(bounds.min * fraction)
    high = math.ceil(bounds.max * fraction) if bounds.max is not None else None
    history = contract.quality.history
    left_out = [s for s in history.statistics if s in COUNT_STATISTICS]
    quality = contract.quality.model_copy(
        update={
            "row_count": bounds.model_copy(update={"min": low, "max": high}),
            "history": history.model_copy(
                update={"statistics": [s for s in history.statistics if s not in left_out]}
            ),
        }
    )
    shown = f"{bounds.min}..{bounds.max if bounds.max is not None else '-'}"
    note = (
        f"volume expectations scaled to the sample ({fraction:.1%} of the rows): "
        f"quality.row_count {shown} -> {low}..{high if high is not None else '-'}"
    )
    if history.enabled and left_out:
        note += f"; the history gate leaves out {', '.join(left_out)} (whole days' counts)"
    return contract.model_copy(update={"quality": quality}), note


def without_retries(asset: dg.AssetsDefinition) -> dg.AssetsDefinition:
    """The same asset without its retry policy: a reproduction runs the step once.

    `execute_in_process` always retries by the op's policy, so the op is rebuilt without one.
    """
    op = asset.op
    if op.retry_policy is None:
        return asset
    bare = dg.OpDefinition(
        compute_fn=op.compute_fn,
        name=op.name,
        ins=op.ins,
        outs=op.outs,
        description=op.description,
        config_schema=op.config_schema,
        required_resource_keys=op.required_resource_keys,
        tags=op.tags,
        pool=op.pool,
    )
    return dg.AssetsDefinition(
        keys_by_input_name=asset.keys_by_input_name,
        keys_by_output_name=asset.keys_by_output_name,
        node_def=bare,
        specs=list(asset.specs),
        check_specs_by_output_name=asset.check_specs_by_output_name,
        can_subset=asset.can_subset,
        backfill_policy=asset.backfill_policy,
    )


def not_reproduced_advice(classification: Classification | None, sample_rows: int) -> str:
    """What to do when the rerun on the sample succeeded, by the run's failure class."""
    if classification is not None and "DagsterExecutionInterruptedError" in classification.reason:
        return "the run was interrupted (Ctrl-C, SIGTERM), not broken: rerun the day"
    if classification is not None and classification.failure_class == RESOURCE_EXHAUSTION:
        reason = classification.reason
        if out_of_disk(reason):
            return (
                f"the run ran out of disk ({reason}); a sample of {sample_rows} rows needs far "
                "less. Free space or give the lake's volume more (see `df` on the lake "
                "directory, or the S3 quota), then rerun the day"
            )
        return (
            f"the run ran out of memory ({reason}); a sample of {sample_rows} rows needs far "
            "less. Give the step more memory (its peak and suggested request: `ml-platform "
            "health`), or fewer days per run, then rerun the day"
        )
    return f"try a larger --sample (now {sample_rows} rows per input partition)"


def reproduce(
    instance: dg.DagsterInstance,
    run_id: str,
    defs: dg.Definitions,
    scratch_dir: Path,
    sample_rows: int = DEFAULT_SAMPLE_ROWS,
    contract: Contract | None = None,
) -> Target:
    """Rerun the run's failed asset on sampled real inputs; its exception propagates as raised.

    With `contract` (the one `defs` were built from by `build_definitions`), the definitions
    are rebuilt with the volume expectations scaled to the sample, and a raw-data step's landed
    file is compared with the one the run read. InputsChangedError if an input is no longer
    what the run read. Returns the target when the rerun succeeds (the sample did not
    reproduce the failure).
    """
    target = failed_target(instance, run_id, defs)
    reads = check_inputs_unchanged(instance, target, defs, contract)
    sizes = [r.rows for r in reads if r.rows and r.sampled]
    largest = max(sizes, default=0)
    if contract is not None and largest > sample_rows:
        from ml_platform.definitions import build_definitions

        scaled, note = scaled_contract(contract, sample_rows / largest)
        # The scaled contract's assets on the caller's resources: the lake and landing zone
        # the run used, wherever `defs` put them.
        resources = dict(defs.resources or {})
        defs = build_definitions(scaled)
        python_logger.info(note)
    else:
        resources = dict(defs.resources or {})
    lake = resources.get("lake")
    io_manager = resources.get("io_manager")
    if not isinstance(lake, LakeStorage) or not isinstance(io_manager, LakeIOManager):
        raise NothingToReproduceError(
            "reproduce needs the lake storage and the LakeIOManager in the definitions"
        )
    overlay = OverlayStorage(lake=configured(lake, instance), write_dir=str(scratch_dir))
    resources["lake"] = overlay
    if "mlflow" in resources:
        # The runs, versions and aliases the steps write: a scratch MLflow, never the live one
        # (a reproduced registered_model meets no live champion in it).
        scratch_mlflow = MlflowStores(lake=LocalStorage(base_dir=str(scratch_dir)))
        resources["mlflow"] = scratch_mlflow
        resources["model_registry"] = ModelRegistryResource(stores=scratch_mlflow)
    resources["io_manager"] = SampleIOManager(
        storage=overlay,
        sample_rows=sample_rows,
        pinned=pinned_versions(instance, target, reads, contract),
    )
    python_logger.info(
        f"reproducing run {target.run_id}: {target.asset.key.to_user_string()} partition "
        f"{target.partition or '-'} on {sample_rows} rows per input partition"
        + (f" of the {len(reads)} it read, each unchanged since" if reads else "")
        + ", without retries"
    )
    assets = [
        without_retries(a) if a.op.name == target.asset.op.name else a
        for a in defs.assets or []
        if isinstance(a, dg.AssetsDefinition)
    ]
    day_error: Exception | None = None
    with dg.DagsterInstance.ephemeral() as scratch_instance:
        try:
            dg.materialize(
                assets,
                selection=list(target.asset.keys),
                partition_key=target.partition,
                resources=resources,
                instance=scratch_instance,
                raise_on_error=True,
                run_config=QUIET,
            )
        except dg.Failure as failure:
            # A step fails naming its failed days (`steps.each_day`), from the day's own error:
            # that error, where it was raised, is what the user came to debug.
            cause = failure.__cause__
            if FAILED_PARTITIONS not in failure.metadata or not isinstance(cause, Exception):
                raise
            day_error = cause
    if day_error is not None:
        raise day_error  # outside the handler: its own traceback and chain, nothing added
    return target
