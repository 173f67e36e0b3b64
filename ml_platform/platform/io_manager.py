"""The IO manager of every asset: a value to a file of the lake, and back.

Assets never touch paths. The IO manager turns (asset, partition) into a key, serialises the
value in the asset's declared format (`formats`) and hands it to the lake storage, which
replaces an object atomically; a reader reads the version of a day that Dagster records.
"""

import collections
import io
import uuid
from collections.abc import Sequence
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from ml_platform.platform.formats import EXTENSIONS, FORMAT_KEY, deserialise_from, serialise_into
from ml_platform.platform.inputs import WINDOW_KEY, DailyInput
from ml_platform.platform.observability import record_bytes_read
from ml_platform.platform.records import LAKE_KEY, DayRecord, day_records, recorded_lake_keys
from ml_platform.platform.storage import LakeStorage
from ml_platform.platform.storage_errors import (
    CorruptLakeFileError,
    LakeStorageError,
    MissingPartitionError,
    partition_errors,
)


class LakeIOManager(dg.ConfigurableIOManager):
    """Stores each version of an asset partition as its own file in lake storage.

    Asset keys start with their dataset (`flights/raw_data`), so one IO manager serves every
    dataset of the code location. A daily asset's step (`steps.each_day`) stores each version of
    a day at `<dataset>/<asset>/<day>/<run id>-<attempt>.<ext>` (`version_key`), and the day's
    materialisation names it (`lake_key`): a file is never overwritten, and a reader reads the
    version Dagster records, so a run that failed or was killed before recording a day leaves a
    file no reader sees, which `sweep` then deletes. Days recorded before versions had their own
    files are read at `<dataset>/<asset>/<day>.<ext>` (`key`), where an unpartitioned value lives.

    The format comes from the asset's `ml_platform/format` metadata. A partitioned input loads
    as a `DailyInput`, each day read when the step asks for it. A window input (declared with
    `ml_platform/window` metadata) holds the window's accepted, stored partitions only: a
    missing or rejected day is a hole in the window, which the asset reading it judges. Any
    other input whose day has no accepted version raises MissingPartitionError naming it when read.
    """

    storage: LakeStorage
    # The days a running step has computed but Dagster records only when the step ends: the
    # file of each accepted one (None for a rejected one), which the step's later days read as
    # recorded (`steps.each_day` keeps it).
    _step_versions: dict[tuple[dg.AssetKey, str], str | None] = PrivateAttr(default_factory=dict)

    def key(self, asset_key: dg.AssetKey, partition: str, fmt: str) -> str:
        """Storage key of an unpartitioned value, or of a day recorded before versions."""
        return "/".join([*asset_key.path, f"{partition}.{EXTENSIONS[fmt]}"])

    def version_key(self, asset_key: dg.AssetKey, day: str, fmt: str, version: str) -> str:
        """Storage key of one version of a day: `version` is `<run id>-<attempt>`."""
        return "/".join([*asset_key.path, day, f"{version}.{EXTENSIONS[fmt]}"])

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        """Store an asset's output: a partition as a version of its own, as `each_day` does."""
        fmt = _format_of(context.definition_metadata, context.asset_key)
        # An unpartitioned asset in a run of a day (rejected_days in the daily job) has the
        # run's partition key, not one of its own: it is stored once, not per day.
        partition = context.partition_key if context.has_asset_partitions else None
        if partition is not None:
            version = f"{context.run_id}-{uuid.uuid4().hex[:8]}"
            key = self.version_key(context.asset_key, partition, fmt, version)
        else:
            key = self.key(context.asset_key, "all", fmt)
        with partition_errors(context.asset_key, partition):
            context.add_output_metadata(self.store_at(key, fmt, obj))

    def store_at(self, key: str, fmt: str, obj: Any) -> dict[str, Any]:
        """Store a value under `key`; its `path`, `lake_key` and `stored_bytes` metadata.

        Steps of a range of days (`steps.each_day`) store each day's version through this as
        they go, under its `version_key`. A storage error names the object; the caller, which
        knows them, adds the asset and the partition (`partition_errors`).
        """
        size = self.storage.write_with(key, lambda handle: serialise_into(obj, fmt, handle))
        return {
            "path": dg.MetadataValue.path(self.storage.uri(key)),
            LAKE_KEY: key,
            "stored_bytes": size,
        }

    def recorded_key(self, record: DayRecord, asset_key: dg.AssetKey, day: str, fmt: str) -> str:
        """The lake file of an accepted day's record."""
        return record.lake_key or self.key(asset_key, day, fmt)

    def records(
        self, instance: dg.DagsterInstance, asset_key: dg.AssetKey, days: Sequence[str]
    ) -> dict[str, DayRecord]:
        """Dagster's latest record of each of `days`: what every read of the lake goes by."""
        return day_records(instance, asset_key, days)

    def recorded_versions(
        self, instance: dg.DagsterInstance, asset_key: dg.AssetKey, days: Sequence[str], fmt: str
    ) -> dict[str, str]:
        """The lake file of each of `days` whose latest record accepted it (stored or not).

        A day the running step has computed counts as recorded (`step_computed`), and only the
        other days are asked of Dagster: a range's later days read the days before them (a
        drift episode's state, a decay streak) without a query each, whose cost grows with the
        event log.
        """
        computed = {
            day: self._step_versions[asset_key, day]
            for day in days
            if (asset_key, day) in self._step_versions
        }
        others = [day for day in days if day not in computed]
        versions = {
            day: self.recorded_key(record, asset_key, day, fmt)
            for day, record in (self.records(instance, asset_key, others) if others else {}).items()
            if record.accepted
        }
        versions.update({day: key for day, key in computed.items() if key is not None})
        return dict(sorted(versions.items()))

    def step_computed(self, asset_key: dg.AssetKey, day: str, key: str | None) -> None:
        """A running step computed `day`: its accepted version's file, or None if rejected."""
        self._step_versions[asset_key, day] = key

    def step_ended(self, asset_key: dg.AssetKey, days: Sequence[str]) -> None:
        """The step of `days` ended: Dagster's record of them is the one to read."""
        for day in days:
            self._step_versions.pop((asset_key, day), None)

    def stored_versions(
        self, instance: dg.DagsterInstance, asset_key: dg.AssetKey, days: Sequence[str], fmt: str
    ) -> dict[str, str]:
        """Those of `recorded_versions` whose file is in storage: one listing of the asset.

        One listing request (a page per 1000 objects on S3) instead of one per day.
        """
        recorded = self.recorded_versions(instance, asset_key, days, fmt)
        if not recorded:
            return {}
        stored = set(self.storage.list_keys("/".join(asset_key.path)))
        return {day: key for day, key in sorted(recorded.items()) if key in stored}

    def load_recorded(
        self, instance: dg.DagsterInstance, asset_key: dg.AssetKey, day: str, fmt: str
    ) -> Any | None:
        """The day's accepted version as Dagster records it, or None: a tombstone, or no record.

        For code that reads days no input maps, e.g. the days before of a drift episode.
        """
        return self._load_version(
            asset_key, day, fmt, self.recorded_versions(instance, asset_key, [day], fmt).get(day)
        )

    def load_of(
        self, record: DayRecord | None, asset_key: dg.AssetKey, day: str, fmt: str
    ) -> Any | None:
        """The day's version that a record read already (`records`) accepted, or None.

        For a step that reads many days no input maps (the reference days of a drift check):
        one query of Dagster for all of them, and what it reads is what that query recorded.
        """
        if record is None or not record.accepted:
            return None
        return self._load_version(
            asset_key, day, fmt, self.recorded_key(record, asset_key, day, fmt)
        )

    def _load_version(self, asset_key: dg.AssetKey, day: str, fmt: str, key: str | None) -> Any:
        with partition_errors(asset_key, day):
            if key is None or not self.storage.exists(key):
                return None
            return self.load_key(key, fmt, what=f"{asset_key.to_user_string()} partition {day}")

    def load_input(self, context: dg.InputContext) -> Any:
        """An upstream partition or window of partitions as a `DailyInput`, read on access.

        One day or a range of days alike: the step (`steps.each_day`) reads each day's input
        when it computes the day, so a day whose input Dagster records as rejected becomes a
        verdict of that day, not a failure of the step. A window holds the stored days that
        Dagster records as accepted: a rejected or missing day is a hole, which the asset
        reading it judges.
        """
        upstream = context.upstream_output
        assert upstream is not None, "the lake IO manager only loads asset inputs"
        fmt = _format_of(upstream.definition_metadata, context.asset_key)
        # The step's `bytes_read` metadata (steps.day_metrics) counts what loads here.
        reader = context.op_def.name
        if not context.has_asset_partitions:
            with partition_errors(context.asset_key, None):
                return self.load_key(self.key(context.asset_key, "all", fmt), fmt, reader)
        days = sorted(context.asset_partition_keys)
        window_days = context.definition_metadata.get(WINDOW_KEY)
        if window_days:
            span = f"{days[0]}...{days[-1]}" if days else None
            with partition_errors(context.asset_key, span):
                versions = self.stored_versions(context.instance, context.asset_key, days, fmt)
            days = list(versions)
        else:
            versions = self.recorded_versions(context.instance, context.asset_key, days, fmt)

        def load(day: str) -> Any:
            if day not in versions:
                raise MissingPartitionError(
                    f"{context.asset_key.to_user_string()} partition {day} is not in storage "
                    "(Dagster records no accepted version of it): materialise it first."
                )
            what = f"{context.asset_key.to_user_string()} partition {day}"
            with partition_errors(context.asset_key, day):
                return self.load_key(versions[day], fmt, reader, what)

        return DailyInput(days, load, window_days, context.asset_key)

    def load_key(
        self, key: str, fmt: str, reader: str | None = None, what: str | None = None
    ) -> Any:
        """The value stored under `key` (`what`, for messages); MissingPartitionError if none."""
        if not self.storage.exists(key):
            raise MissingPartitionError(
                f"{what or key} is not in storage (expected {self.storage.uri(key)}): "
                "materialise it first."
            )
        with self.storage.open_read(key) as handle:
            size = handle.seek(0, io.SEEK_END)
            handle.seek(0)
            try:
                value = deserialise_from(handle, fmt)
            except MemoryError:
                raise  # short of memory: nothing is said of the bytes
            except OSError as exc:
                if isinstance(exc, LakeStorageError) or exc.errno is not None:
                    raise  # reading failed, not the bytes: storage errors keep their classes
                # An OSError without an errno is no system call's: it is the reader's own, for
                # bytes it cannot decode (pyarrow's "Corrupt snappy compressed data").
                raise self._corrupt(key, fmt, what, exc) from exc
            except Exception as exc:
                if fmt == "joblib" and isinstance(exc, ImportError | AttributeError):
                    # Unpickling looks up each class the file holds by module and name: whole
                    # bytes naming a class this code no longer has (moved in ml_platform, or in
                    # a library's private modules by an upgrade), not a damaged file.
                    raise self._unloadable(key, what, exc) from exc
                # Each format's reader raises its own error for bytes it cannot decode
                # (ArrowInvalid, JSONDecodeError, EOFError, UnpicklingError, ...).
                raise self._corrupt(key, fmt, what, exc) from exc
        if reader is not None:
            record_bytes_read(reader, size)
        return value

    def _unloadable(self, key: str, what: str | None, exc: Exception) -> dg.Failure:
        """The error of a stored joblib file whose classes this code does not have."""
        return dg.Failure(
            description=(
                f"{what or key} cannot be read: {self.storage.uri(key)} was written by code "
                f"whose classes this code does not have ({type(exc).__name__}: {exc}): "
                "ml_platform or a library it pickles (scikit-learn) changed since. Retrying "
                "reads the same bytes: materialise the day again with this code, or read "
                "the file with the versions that wrote it"
            ),
            allow_retries=False,
        )

    def _corrupt(
        self, key: str, fmt: str, what: str | None, exc: Exception
    ) -> CorruptLakeFileError:
        """The error of a stored file whose bytes its format's reader cannot decode."""
        return CorruptLakeFileError(
            f"{what or key} cannot be read: {self.storage.uri(key)} is not a whole "
            f"{fmt} file ({type(exc).__name__}: {exc}). It was damaged after the run "
            "that wrote it (a partial copy or restore, a disk or bucket fault); "
            "retrying reads the same bytes: materialise the day again, which rewrites "
            "it, or restore the file"
        )

    def sweep(
        self, instance: dg.DagsterInstance, asset_key: dg.AssetKey, days: Sequence[str]
    ) -> list[str]:
        """Delete the versions of `days` that no materialisation records; the keys deleted.

        Such a file is what a run left when it failed or was killed between storing a day and
        recording it; a process killed while it wrote a version leaves part of one
        (`LakeStorage.partial_writes`), which goes too. Only a run this instance records as
        ended loses its files: a run still going may yet record them, and a file of a run the
        instance does not know (another instance's, or one from before the instance was
        replaced) is not this instance's to judge.
        """
        folder = "/".join(asset_key.path)
        wanted = set(days)

        def of_days(keys: list[str]) -> dict[str, list[str]]:
            by_day: dict[str, list[str]] = collections.defaultdict(list)
            for key in keys:
                parts = key[len(folder) + 1 :].split("/")
                if len(parts) == 2 and parts[0] in wanted:
                    by_day[parts[0]].append(key)
            return by_day

        def ended_runs(keys: list[str]) -> list[str]:
            ended = []
            for key in keys:
                # `<run id>-<n>.<ext>`, or `.<run id>-<n>.<ext>.<random>.tmp` for a partial write.
                name = key.rsplit("/", 1)[1].lstrip(".")
                run = instance.get_run_by_id(name.split(".", 1)[0].rsplit("-", 1)[0])
                if run is not None and run.is_finished:
                    ended.append(key)
            return ended

        # What an ended run's killed process was still writing: no run records it, nor will.
        partial = of_days(self.storage.partial_writes(folder))
        deleted = ended_runs(sorted(k for keys in partial.values() for k in keys))
        for key in deleted:
            self.storage.delete(key)
        by_day = of_days(self.storage.list_keys(folder))
        if not by_day:
            return deleted
        ended = ended_runs(sorted(k for keys in by_day.values() for k in keys))
        # The records are read after the runs are seen ended, not before: an ended run records
        # nothing more, whereas a run that records its day and ends between a read of the
        # records and a look at the run would lose a file it recorded (a concurrent writer of
        # the same days, or the sweep sensor, sweeping while it finishes).
        recorded = recorded_lake_keys(instance, asset_key, sorted(by_day))
        for key in ended:
            if key not in recorded:
                self.storage.delete(key)
                deleted.append(key)
        return deleted


def _format_of(metadata: Any, asset_key: dg.AssetKey) -> str:
    fmt = (metadata or {}).get(FORMAT_KEY)
    if fmt not in EXTENSIONS:
        raise ValueError(
            f"asset {asset_key.to_user_string()} declares no lake format; "
            f"set metadata {{'{FORMAT_KEY}': one of {sorted(EXTENSIONS)}}}"
        )
    return str(fmt)
