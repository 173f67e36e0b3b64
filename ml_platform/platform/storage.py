"""The lake: one storage abstraction for every asset, and the IO manager that uses it.

Assets never touch paths. The IO manager turns (asset, partition) into a key, serialises the
value in the asset's declared format and hands bytes to the storage backend, which replaces a
partition atomically. A local directory is the embedded default; S3 is the production backend
behind the same interface (`LakeStorage`), chosen by the settings' lake location
(`at_location`), its client from `dagster_aws.s3.S3Resource`.

A storage error names what failed where: the backend names the object (`LakeStorageError`),
and the step or IO manager that knows it adds the asset and the partition (`partition_errors`).
An error that waiting cannot fix (a full disk, a read-only file system, a permission refused)
then fails the step at once (`PermanentStorageError`) instead of being retried.
"""

import collections
import contextlib
import dataclasses
import datetime as dt
import errno
import io
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

import dagster as dg
import joblib
import pandas as pd
from botocore.exceptions import BotoCoreError, ClientError
from dagster_aws.s3 import S3Resource
from pydantic import Field, PrivateAttr

from ml_platform.platform.failures import CONFIGURATION, RESOURCE_EXHAUSTION, runbook_link
from ml_platform.platform.observability import record_bytes_read
from ml_platform.platform.records import LAKE_KEY, DayRecord, day_records, recorded_lake_keys
from ml_platform.platform.settings import Location, Settings, parse_s3_url

FORMAT_KEY = "ml_platform/format"
# An input with this metadata (the window's length in days) receives its partitions as a
# mapping (`WindowPartitions`, each partition loaded when read), even when the window holds a
# single partition (the first day), so the asset always sees one type. It holds only the
# window's partitions that are stored: a day rejected by its gates (or not materialised yet) is
# a hole the asset judges (`training.assets.window_coverage`).
WINDOW_KEY = "ml_platform/window"
EXTENSIONS = {"parquet": "parquet", "joblib": "joblib", "json": "json"}


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a mix."""
    write_file_atomically(path, lambda handle: handle.write(data))


def write_file_atomically(path: Path, write: Callable[[IO[bytes]], object]) -> int:
    """Let `write` fill a file that replaces `path` whole, as `write_atomically`; its size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
            size = handle.tell()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return size


REFUSED = (
    "the platform's user is not allowed to: fix the owner and mode of the lake directory, or "
    "the S3 credentials' policy (deploy/iam-policy.json)",
    CONFIGURATION,
)
# Storage errors that waiting does not fix, and what to do instead. The storage retry policy
# would spend about 22 s on each before failing with the same error: a full disk stays full, a
# read-only mount read-only, a refused permission refused.
PERMANENT_STORAGE_ERRORS = {
    errno.ENOSPC: (
        "the disk it is written to is full: free space on the lake's volume (or, for an S3 "
        "lake, in the temporary directory) or give it more",
        RESOURCE_EXHAUSTION,
    ),
    errno.EDQUOT: (
        "the disk quota of the platform's user is used up: free space or raise the quota",
        RESOURCE_EXHAUSTION,
    ),
    errno.EROFS: (
        "the lake's file system is mounted read-only: mount it read-write, or point "
        "ML_PLATFORM_LAKE_DIR at a writable volume",
        CONFIGURATION,
    ),
    errno.EACCES: REFUSED,
    errno.EPERM: REFUSED,
}
# S3's answers that mean a permission refused, read as EACCES.
S3_PERMISSION_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"})


class LakeStorageError(OSError):
    """A lake read or write failed: the message says what was done to which object, and why.

    An OSError with the cause's errno (EACCES for S3's AccessDenied), so that the failure
    classifier reads a full disk as `[Errno 28]`; the cause stays chained. Retried by the
    storage retry policy, unless `partition_errors` finds that waiting cannot help.
    """


class PartitionStorageError(LakeStorageError):
    """A `LakeStorageError` that also names the asset and the partition it was for."""


class PermanentStorageError(dg.Failure):
    """A lake error that waiting does not fix (`PERMANENT_STORAGE_ERRORS`): never retried.

    The message names the object, the asset and the partition, what to do and the runbook
    section; the storage error stays chained, so the run is classed by it.
    """

    def __init__(self, message: str):
        super().__init__(description=message, allow_retries=False)


def storage_errno(exc: BaseException) -> int | None:
    """The errno of a storage error: an OSError's own, EACCES for S3's permission refusals."""
    if isinstance(exc, OSError):
        return exc.errno
    if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in (
        S3_PERMISSION_CODES
    ):
        return errno.EACCES
    return None


def storage_error(
    doing: str, what: str, exc: BaseException, kind: type[OSError] = LakeStorageError
) -> OSError:
    """`exc` as a `kind` of error that says what was done to what ("writing s3://..."), and why."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return os_error(
        kind, storage_errno(exc), f"{doing} {what} failed: {type(exc).__name__}: {reason}"
    )


def os_error(kind: type[OSError], code: int | None, message: str) -> OSError:
    """An OSError of class `kind` with errno `code` (shown as `[Errno N]`) when there is one."""
    return kind(code, message) if code else kind(message)


@contextlib.contextmanager
def partition_errors(asset_key: dg.AssetKey, partition: str | None) -> Iterator[None]:
    """Name the asset and partition in storage errors of the block; fail now if waiting cannot help.

    An error with an errno of `PERMANENT_STORAGE_ERRORS` becomes a `PermanentStorageError`, any
    other `LakeStorageError` a `PartitionStorageError` (retried). A missing object
    (FileNotFoundError, `MissingPartitionError`) and errors that are not storage errors go
    through as they are.
    """
    where = asset_key.to_user_string() + (f" partition {partition}" if partition else "")
    try:
        yield
    except PartitionStorageError:
        raise
    except OSError as exc:
        if exc.errno in PERMANENT_STORAGE_ERRORS:
            advice, failure_class = PERMANENT_STORAGE_ERRORS[exc.errno]
            raise PermanentStorageError(
                f"{where}: {exc}. Retrying cannot help: {advice}, then rerun the day. "
                f"Runbook: {runbook_link(failure_class)}"
            ) from exc
        if isinstance(exc, LakeStorageError):
            raise os_error(
                PartitionStorageError, exc.errno, f"{where}: {exc.strerror or exc}"
            ) from exc
        raise


class MissingPartitionError(dg.Failure, FileNotFoundError):
    """An upstream partition an asset needs has never been materialised.

    A `dg.Failure` that forbids retries: waiting does not store the partition, materialising
    it does, and the message says which.
    """

    def __init__(self, message: str):
        super().__init__(description=message, allow_retries=False)


class LakeStorage(dg.ConfigurableResource):
    """Where the lake's objects live: the interface every lake read and write goes through.

    Implemented by a local directory (`LocalStorage`, the embedded default) and an S3 prefix
    (`S3Storage`, production); `at_location` picks one by the settings. Keys are relative,
    '/'-separated (`<dataset>/<asset>/<day>/<version>.<ext>`, `LakeIOManager`), and every write
    replaces an object whole, so a reader sees the previous version or the new one, never a mix.
    """

    def uri(self, key: str) -> str:
        """Where an object lives, for metadata and messages."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        """Whether an object is stored under `key`."""
        raise NotImplementedError

    def write_bytes(self, key: str, data: bytes) -> None:
        """Store `data` under `key`, replacing any previous version atomically."""
        raise NotImplementedError

    def read_bytes(self, key: str) -> bytes:
        """The bytes stored under `key`; FileNotFoundError naming it when there are none."""
        raise NotImplementedError

    def write_with(self, key: str, write: Callable[[IO[bytes]], object]) -> int:
        """Store what `write` writes to a binary file under `key`, atomically; its size in bytes.

        The lake's backends stream it to their storage, so a day's parquet file is not also
        held in memory as bytes (60 MB at 1M rows). This default, for a backend that only
        stores bytes, collects them first.
        """
        buffer = io.BytesIO()
        write(buffer)
        data = buffer.getvalue()
        self.write_bytes(key, data)
        return len(data)

    @contextlib.contextmanager
    def open_read(self, key: str) -> Iterator[IO[bytes]]:
        """The object under `key` as a seekable binary file; FileNotFoundError naming it if absent.

        The lake's backends hand a file, which a parquet reader reads a column at a time; this
        default, for a backend that only reads bytes, holds them in memory.
        """
        yield io.BytesIO(self.read_bytes(key))

    def delete(self, key: str) -> None:
        """Remove the object under `key`, if there is one."""
        raise NotImplementedError

    def list_keys(self, prefix: str) -> list[str]:
        """Keys of the objects under a prefix (a folder), sorted; dot-files are left out."""
        raise NotImplementedError

    @contextlib.contextmanager
    def naming(self, doing: str, key: str) -> Iterator[None]:
        """Raise the block's storage errors as `LakeStorageError`s that name the object.

        A missing object (FileNotFoundError) goes through as it is: its message names it, and
        readers tell "not stored" from "storage failed" by it.
        """
        try:
            yield
        except (FileNotFoundError, LakeStorageError):
            raise
        except (OSError, BotoCoreError, ClientError) as exc:
            raise storage_error(doing, self.uri(key), exc) from exc


class LocalStorage(LakeStorage):
    """Lake storage in a local directory; each write replaces the object atomically."""

    base_dir: str

    def _path(self, key: str) -> Path:
        return Path(self.base_dir) / key

    def uri(self, key: str) -> str:
        """The absolute path of the object."""
        return str(self._path(key).resolve())

    def exists(self, key: str) -> bool:
        """Whether a file is stored under `key`."""
        with self.naming("looking up", key):
            return self._path(key).is_file()

    def write_bytes(self, key: str, data: bytes) -> None:
        """Write to a temporary file beside the target, then rename it over the target."""
        with self.naming("writing", key):
            write_atomically(self._path(key), data)

    def read_bytes(self, key: str) -> bytes:
        """The file's bytes."""
        with self.naming("reading", key):
            return self._path(key).read_bytes()

    def write_with(self, key: str, write: Callable[[IO[bytes]], object]) -> int:
        """Let `write` fill a temporary file beside the target, then rename it over the target."""
        with self.naming("writing", key):
            return write_file_atomically(self._path(key), write)

    @contextlib.contextmanager
    def open_read(self, key: str) -> Iterator[IO[bytes]]:
        """The file itself, opened for reading."""
        with self.naming("reading", key), self._path(key).open("rb") as handle:
            yield handle

    def delete(self, key: str) -> None:
        """Remove the file, if there is one."""
        with self.naming("deleting", key):
            self._path(key).unlink(missing_ok=True)

    def list_keys(self, prefix: str) -> list[str]:
        """Keys of the files below a folder, sorted, skipping temporary dot-files."""
        base = Path(self.base_dir)
        folder = self._path(prefix)
        with self.naming("listing", prefix):
            if not folder.is_dir():
                return []
            return sorted(
                str(p.relative_to(base))
                for p in folder.rglob("*")
                if p.is_file() and not p.name.startswith(".")
            )


def is_missing_key(exc: Exception) -> bool:
    """Whether a botocore ClientError says the object (or its key) does not exist."""
    code = getattr(exc, "response", {}).get("Error", {}).get("Code")
    return code in {"NoSuchKey", "404", "NotFound"}


class S3Prefix(dg.ConfigurableResource):
    """An S3 prefix and the `S3Resource` whose client reaches it: what S3 lake and landing share.

    Credentials come from the boto3 chain the `S3Resource` uses, never from this configuration.
    """

    url: str = Field(description="s3://bucket/prefix")
    s3: S3Resource

    _client: Any = PrivateAttr(default=None)

    @property
    def bucket(self) -> str:
        """The bucket of the prefix."""
        return parse_s3_url(self.url)[0]

    @property
    def prefix(self) -> str:
        """The key prefix: empty or ending with '/'."""
        return parse_s3_url(self.url)[1]

    def client(self) -> Any:
        """The S3 client of the `S3Resource`, created once per resource instance."""
        if self._client is None:
            self._client = self.s3.get_client()
        return self._client


class S3Storage(S3Prefix, LakeStorage):
    """Lake storage below an S3 prefix (production; any S3-compatible endpoint).

    A PUT replaces an object whole, so readers see the old version or the new one, as with
    the local directory.
    """

    def uri(self, key: str) -> str:
        """The s3:// URI of the object."""
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def exists(self, key: str) -> bool:
        """Whether an object is stored under `key` (one listing request).

        Not HEAD: without an unconditional s3:ListBucket, which the least-privilege policy
        (deploy/iam-policy.json) does not grant, AWS answers HEAD of a missing key with 403.
        """
        full = self.prefix + key
        with self.naming("looking up", key):
            response = self.client().list_objects_v2(Bucket=self.bucket, Prefix=full, MaxKeys=1)
        return any(item["Key"] == full for item in response.get("Contents", []))

    def write_bytes(self, key: str, data: bytes) -> None:
        """One PUT: S3 makes the new object visible whole or not at all."""
        with self.naming("writing", key):
            self.client().put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)

    def _get_object(self, key: str) -> Any:
        """The object's GET response; FileNotFoundError naming its URI when there is none."""
        with self.naming("reading", key):
            try:
                return self.client().get_object(Bucket=self.bucket, Key=self.prefix + key)
            except ClientError as exc:
                if is_missing_key(exc):
                    raise FileNotFoundError(f"no object at {self.uri(key)}") from exc
                raise

    def read_bytes(self, key: str) -> bytes:
        """The object's bytes; FileNotFoundError naming its URI when there is none."""
        response = self._get_object(key)
        with self.naming("reading", key):
            return response["Body"].read()

    def write_with(self, key: str, write: Callable[[IO[bytes]], object]) -> int:
        """Spool what `write` writes to a local temporary file, then PUT it from there.

        One PUT still replaces the object whole; the spool keeps the bytes on disk, not in
        memory, while the SDK streams them.
        """
        with self.naming("writing", key), tempfile.TemporaryFile() as spool:
            write(spool)
            size = spool.tell()
            spool.seek(0)
            self.client().put_object(Bucket=self.bucket, Key=self.prefix + key, Body=spool)
        return size

    @contextlib.contextmanager
    def open_read(self, key: str) -> Iterator[IO[bytes]]:
        """The object downloaded to a local temporary file (a parquet reader needs to seek)."""
        response = self._get_object(key)
        with self.naming("reading", key), tempfile.TemporaryFile() as spool:
            with contextlib.closing(response["Body"]) as body:
                shutil.copyfileobj(body, spool, 1 << 20)
            spool.seek(0)
            yield spool

    def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error in S3."""
        with self.naming("deleting", key):
            self.client().delete_object(Bucket=self.bucket, Key=self.prefix + key)

    def list_keys(self, prefix: str) -> list[str]:
        """Keys of the objects below a folder, sorted, listed page by page."""
        folder = self.prefix + prefix.strip("/") + "/"
        keys: list[str] = []
        paginator = self.client().get_paginator("list_objects_v2")
        with self.naming("listing", prefix):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=folder):
                for item in page.get("Contents", []):
                    key = item["Key"][len(self.prefix) :]
                    if not key.rsplit("/", 1)[-1].startswith(".") and not key.endswith("/"):
                        keys.append(key)
        return sorted(keys)


R = TypeVar("R", bound=dg.ConfigurableResource)


def s3_resource(settings: Settings) -> S3Resource:
    """The one `S3Resource` of the code location: endpoint and region from the settings."""
    return S3Resource(**settings.s3_config)


def at_location(
    location: Location, local: Callable[..., R], remote: Callable[..., R], s3: S3Resource
) -> R:
    """The resource for a location: `local(base_dir=...)` for a directory, else `remote`.

    The one rule for the landing zone and the lake alike; `remote` takes the S3 URL and the
    shared `S3Resource`. Values from the environment stay `EnvVar`s.
    """
    if location.kind == "s3":
        return remote(url=location.config(), s3=s3)
    return local(base_dir=location.config())


def serialise(value: Any, fmt: str) -> bytes:
    """Bytes of `value` in a lake format."""
    buffer = io.BytesIO()
    serialise_into(value, fmt, buffer)
    return buffer.getvalue()


def serialise_into(value: Any, fmt: str, handle: IO[bytes]) -> None:
    """Write `value` in a lake format to a binary file."""
    if fmt not in EXTENSIONS:
        raise ValueError(f"unknown lake format '{fmt}'")
    if fmt == "parquet":
        value.to_parquet(handle, index=False)
    elif fmt == "joblib":
        joblib.dump(value, handle)
    else:
        handle.write(json.dumps(value, indent=2, sort_keys=True, default=str).encode())


def deserialise(data: bytes, fmt: str) -> Any:
    """The value stored as `data` in a lake format."""
    return deserialise_from(io.BytesIO(data), fmt)


def deserialise_from(handle: IO[bytes], fmt: str) -> Any:
    """The value stored in a lake format in a seekable binary file."""
    if fmt == "parquet":
        # Column by column, not the whole file buffered first (pre_buffer), and each Arrow
        # column freed once converted (self_destruct, which needs a block per column): the same
        # frame, with a peak of about 2 x its size instead of 3 x (at 1M rows a day).
        return pd.read_parquet(
            handle,
            pre_buffer=False,
            to_pandas_kwargs={"self_destruct": True, "split_blocks": True},
        )
    if fmt == "joblib":
        return joblib.load(handle)
    if fmt == "json":
        return json.load(handle)
    raise ValueError(f"unknown lake format '{fmt}'")


# In-memory size of the loaded window partitions a step keeps for reuse. A day's model and
# evaluation read their window several times (a counting pass, the preprocessing's statistics,
# the held-out rows): a window of small days (a flights day is 0.2 MB) is read once, a window of
# big days (a 1M-row synthetic day is 100 MB) keeps one day at a time, so a step's memory does
# not grow with its window.
WINDOW_CACHE_BYTES = 64 * 1024 * 1024


def value_bytes(value: Any) -> float:
    """In-memory size of a loaded partition: a frame's, else unknown (infinite)."""
    if isinstance(value, pd.DataFrame):
        return float(value.memory_usage(deep=True).sum())
    return float("inf")


@dataclasses.dataclass
class LoadedPartition:
    """A partition as loaded, and what was computed from that load (`PartitionCache.derived`)."""

    value: Any
    size: float
    derived: dict[Hashable, Any] = dataclasses.field(default_factory=dict)


class PartitionCache:
    """Partitions loaded on request; the latest kept while they fit `max_bytes`, the last always.

    `rows[key]` remembers the rows of every frame loaded, for the step's `rows_in` metadata.
    """

    def __init__(self, load: Callable[[str], Any], max_bytes: float = WINDOW_CACHE_BYTES):
        self.load = load
        self.max_bytes = max_bytes
        self.kept: collections.OrderedDict[str, LoadedPartition] = collections.OrderedDict()
        self.rows: dict[str, int] = {}

    def get(self, key: str) -> Any:
        """The partition, loaded now unless it is kept."""
        return self._entry(key).value

    def derived(self, key: str, name: Hashable, compute: Callable[[Any], Any]) -> Any:
        """`compute(partition)`, computed once for each load of the partition.

        A range step's days read the same window partitions: a partition's hash or label counts
        are computed once while it is kept. They live and go with the loaded value, so they are
        always those of the rows the step reads: a partition evicted and rewritten (by another
        run, a re-landed file) is loaded again and its values computed again.
        """
        entry = self._entry(key)
        if name not in entry.derived:
            entry.derived[name] = compute(entry.value)
        return entry.derived[name]

    def _entry(self, key: str) -> LoadedPartition:
        if key in self.kept:
            self.kept.move_to_end(key)
            return self.kept[key]
        value = self.load(key)
        if isinstance(value, pd.DataFrame):
            self.rows[key] = len(value)
        entry = self.kept[key] = LoadedPartition(value, value_bytes(value))
        while len(self.kept) > 1 and sum(e.size for e in self.kept.values()) > self.max_bytes:
            self.kept.popitem(last=False)
        return entry


class WindowPartitions(Mapping[str, Any]):
    """A window input: its stored partitions by key, each loaded when it is read.

    What a model or evaluation step receives for its feature window. Only stored partitions are
    keys (a hole is left out); reading one loads it from the lake unless the cache still holds
    it, so a step that reads its window a day at a time holds about one day (`PartitionCache`).
    """

    def __init__(self, keys: Sequence[str], cache: PartitionCache):
        self.keys_ = sorted(keys)
        self.cache = cache

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys_:
            raise KeyError(key)
        return self.cache.get(key)

    def derived(self, key: str, name: Hashable, compute: Callable[[Any], Any]) -> Any:
        """`compute` of partition `key`, once for each load of it (`PartitionCache.derived`)."""
        if key not in self.keys_:
            raise KeyError(key)
        return self.cache.derived(key, name, compute)

    def __contains__(self, key: object) -> bool:
        # Mapping's own asks for the value, which would load the partition.
        return key in self.keys_

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_)

    def __len__(self) -> int:
        return len(self.keys_)

    @property
    def rows_read(self) -> int:
        """Rows of the partitions read so far (each counted once)."""
        return sum(self.cache.rows.get(key, 0) for key in self.keys_)


class DailyInput(WindowPartitions):
    """An upstream asset's partitions for a range step, each loaded when a day first asks for it.

    `for_day(day)` is what a one-day step would have received: the day's value, or for a window
    input (`window_days`) the `WindowPartitions` of the window's partitions ending that day (of
    a window input, `keys` are only the stored partitions, so a hole is left out as in a one-day
    step). Loaded window partitions are kept within `WINDOW_CACHE_BYTES`, so a sliding window of
    small days reads each partition once; other inputs keep the last partition loaded.
    """

    def __init__(
        self,
        keys: Sequence[str],
        load: Callable[[str], Any],
        window_days: int | None = None,
        asset_key: dg.AssetKey | None = None,
    ):
        super().__init__(keys, PartitionCache(load, WINDOW_CACHE_BYTES if window_days else 0))
        self.window_days = window_days
        # The upstream asset, whose record of a missing day says whether it was rejected.
        self.asset_key = asset_key

    def for_day(self, day: str) -> Any:
        """The value a one-day step of `day` gets for this input."""
        if self.window_days is None:
            return self[day]
        first = (dt.date.fromisoformat(day) - dt.timedelta(days=self.window_days - 1)).isoformat()
        return WindowPartitions([key for key in self.keys_ if first <= key <= day], self.cache)


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
        partition = context.partition_key if context.has_partition_key else None
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

        A day the running step has computed counts as recorded (`step_computed`).
        """
        versions = {
            day: self.recorded_key(record, asset_key, day, fmt)
            for day, record in self.records(instance, asset_key, days).items()
            if record.accepted
        }
        for day in days:
            if (asset_key, day) in self._step_versions:
                key = self._step_versions[asset_key, day]
                if key is None:
                    versions.pop(day, None)
                else:
                    versions[day] = key
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

        For code that reads days no input maps, e.g. the reference days of a drift check.
        """
        key = self.recorded_versions(instance, asset_key, [day], fmt).get(day)
        with partition_errors(asset_key, day):
            if key is None or not self.storage.exists(key):
                return None
            return self.load_key(key, fmt)

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
            value = deserialise_from(handle, fmt)
        if reader is not None:
            record_bytes_read(reader, size)
        return value

    def sweep(
        self, instance: dg.DagsterInstance, asset_key: dg.AssetKey, days: Sequence[str]
    ) -> list[str]:
        """Delete the versions of `days` that no materialisation records; the keys deleted.

        Such a file is what a run left when it failed or was killed between storing a day and
        recording it. Only a run this instance records as ended loses its files: a run still
        going may yet record them, and a file of a run the instance does not know (another
        instance's, or one from before the instance was replaced) is not this instance's to judge.
        """
        folder = "/".join(asset_key.path)
        wanted = set(days)
        by_day: dict[str, list[str]] = collections.defaultdict(list)
        for key in self.storage.list_keys(folder):
            parts = key[len(folder) + 1 :].split("/")
            if len(parts) == 2 and parts[0] in wanted:
                by_day[parts[0]].append(key)
        if not by_day:
            return []
        recorded = recorded_lake_keys(instance, asset_key, sorted(by_day))
        deleted = []
        for key in sorted(k for keys in by_day.values() for k in keys if k not in recorded):
            run_id = key.rsplit("/", 1)[1].split(".", 1)[0].rsplit("-", 1)[0]
            run = instance.get_run_by_id(run_id)
            if run is not None and run.is_finished:
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
