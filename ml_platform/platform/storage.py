"""The lake's storage: one interface (`LakeStorage`) for every read and write of the lake.

A local directory is the embedded default; S3 is the production backend behind the same
interface, chosen by the settings' lake location (`at_location`), its client from
`dagster_aws.s3.S3Resource`. Every write replaces an object whole, so a reader sees the previous
version or the new one, never a mix. A backend's error names the object it failed on
(`storage_errors.LakeStorageError`).
"""

import contextlib
import io
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import dagster as dg
from botocore.exceptions import BotoCoreError, ClientError
from dagster_aws.s3 import S3Resource
from pydantic import Field, PrivateAttr

from ml_platform.platform.settings import Location, Settings, parse_s3_url
from ml_platform.platform.storage_errors import LakeStorageError, storage_error


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
