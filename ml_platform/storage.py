"""The lake: one storage abstraction for every asset, and the IO manager that uses it.

Assets never touch paths. The IO manager turns (asset, partition) into a key, serialises the
value in the asset's declared format and hands bytes to the storage backend, which replaces a
partition atomically. A local directory is the embedded default; S3 is the production backend
behind the same interface.
"""

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import dagster as dg
import joblib
import pandas as pd

from ml_platform.observability import record_bytes_read

FORMAT_KEY = "ml_platform/format"
# An input with this metadata receives its partitions as a dict, even when the window holds a
# single partition (the first day), so the asset always sees one type.
WINDOW_KEY = "ml_platform/window"
EXTENSIONS = {"parquet": "parquet", "joblib": "joblib", "json": "json"}


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class MissingPartitionError(FileNotFoundError):
    """An upstream partition an asset needs has never been materialised."""


class LocalStorage(dg.ConfigurableResource):
    """Lake storage in a local directory; each write replaces the object atomically."""

    base_dir: str

    def _path(self, key: str) -> Path:
        return Path(self.base_dir) / key

    def uri(self, key: str) -> str:
        """Where an object lives, for metadata and messages."""
        return str(self._path(key).resolve())

    def exists(self, key: str) -> bool:
        """Whether an object is stored under `key`."""
        return self._path(key).is_file()

    def write_bytes(self, key: str, data: bytes) -> None:
        """Store `data` under `key`, replacing any previous version atomically."""
        write_atomically(self._path(key), data)

    def read_bytes(self, key: str) -> bytes:
        """The bytes stored under `key`."""
        return self._path(key).read_bytes()

    def delete(self, key: str) -> None:
        """Remove the object under `key`, if there is one."""
        self._path(key).unlink(missing_ok=True)

    def list_keys(self, prefix: str) -> list[str]:
        """Keys of the objects under a prefix (a folder), sorted."""
        base = Path(self.base_dir)
        folder = self._path(prefix)
        if not folder.is_dir():
            return []
        return sorted(
            str(p.relative_to(base))
            for p in folder.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )


def serialise(value: Any, fmt: str) -> bytes:
    """Bytes of `value` in a lake format."""
    if fmt == "parquet":
        buffer = io.BytesIO()
        value.to_parquet(buffer, index=False)
        return buffer.getvalue()
    if fmt == "joblib":
        buffer = io.BytesIO()
        joblib.dump(value, buffer)
        return buffer.getvalue()
    if fmt == "json":
        return json.dumps(value, indent=2, sort_keys=True, default=str).encode()
    raise ValueError(f"unknown lake format '{fmt}'")


def deserialise(data: bytes, fmt: str) -> Any:
    """The value stored as `data` in a lake format."""
    if fmt == "parquet":
        return pd.read_parquet(io.BytesIO(data))
    if fmt == "joblib":
        return joblib.load(io.BytesIO(data))
    if fmt == "json":
        return json.loads(data)
    raise ValueError(f"unknown lake format '{fmt}'")


class LakeIOManager(dg.ConfigurableIOManager):
    """Stores each asset partition as `<dataset>/<asset>/<partition>.<ext>` in lake storage.

    The format comes from the asset's `ml_platform/format` metadata. A range of upstream
    partitions loads as a dict of partition key to value; a partition that was never
    materialised raises an error that names it instead of being skipped.
    """

    storage: LocalStorage
    dataset: str

    def key(self, asset_key: dg.AssetKey, partition: str, fmt: str) -> str:
        """Storage key of one asset partition."""
        return "/".join([self.dataset, *asset_key.path, f"{partition}.{EXTENSIONS[fmt]}"])

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        """Store the output of one partition (or of an unpartitioned asset)."""
        fmt = _format_of(context.definition_metadata, context.asset_key)
        partition = context.partition_key if context.has_partition_key else "all"
        key = self.key(context.asset_key, partition, fmt)
        data = serialise(obj, fmt)
        self.storage.write_bytes(key, data)
        context.add_output_metadata(
            {"path": dg.MetadataValue.path(self.storage.uri(key)), "stored_bytes": len(data)}
        )

    def load_input(self, context: dg.InputContext) -> Any:
        """Load one upstream partition, or a dict of them for a partition range."""
        upstream = context.upstream_output
        assert upstream is not None, "the lake IO manager only loads asset inputs"
        fmt = _format_of(upstream.definition_metadata, context.asset_key)
        # The step's `bytes_read` metadata (observability.step_metrics) counts what loads here.
        reader = context.op_def.name
        if not context.has_asset_partitions:
            return self._load(context.asset_key, "all", fmt, reader)
        keys = sorted(context.asset_partition_keys)
        if context.definition_metadata.get(WINDOW_KEY) is True:
            return {key: self._load(context.asset_key, key, fmt, reader) for key in keys}
        if len(keys) != 1:
            raise ValueError(
                f"input {context.name} spans {len(keys)} partitions of "
                f"{context.asset_key.to_user_string()}; declare it with metadata "
                f"{{'{WINDOW_KEY}': True}} to receive them as a dict"
            )
        return self._load(context.asset_key, keys[0], fmt, reader)

    def load_partition(self, asset_key: dg.AssetKey, partition: str, fmt: str) -> Any:
        """One stored partition; MissingPartitionError naming it if it was never stored.

        For code that reads partitions no input maps, e.g. the reference days of a drift check.
        """
        return self._load(asset_key, partition, fmt)

    def _load(
        self, asset_key: dg.AssetKey, partition: str, fmt: str, reader: str | None = None
    ) -> Any:
        key = self.key(asset_key, partition, fmt)
        if not self.storage.exists(key):
            raise MissingPartitionError(
                f"{asset_key.to_user_string()} partition {partition} is not in storage "
                f"(expected {self.storage.uri(key)}): materialise it first."
            )
        data = self.storage.read_bytes(key)
        if reader is not None:
            record_bytes_read(reader, len(data))
        return deserialise(data, fmt)


def _format_of(metadata: Any, asset_key: dg.AssetKey) -> str:
    fmt = (metadata or {}).get(FORMAT_KEY)
    if fmt not in EXTENSIONS:
        raise ValueError(
            f"asset {asset_key.to_user_string()} declares no lake format; "
            f"set metadata {{'{FORMAT_KEY}': one of {sorted(EXTENSIONS)}}}"
        )
    return str(fmt)
