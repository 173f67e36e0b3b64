"""The lake's storage: one interface (`LakeStorage`) for every read and write of the lake.

A local directory is the embedded default; S3 is the production backend behind the same
interface (`ml_platform.platform.s3`), chosen by the settings' lake location
(`locations.lake_storage`), its client from `dagster_aws.s3.S3Resource`. Every write replaces
an object whole, so a reader sees the previous version or the new one, never a mix. A backend's
error names the object it failed on (`storage_errors.LakeStorageError`).
"""

import contextlib
import errno
import io
import itertools
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import dagster as dg
from botocore.exceptions import BotoCoreError, ClientError

from ml_platform.platform.storage_errors import (
    LakeStorageError,
    MissingLakeObjectError,
    UnsafeLakeKeyError,
    storage_error,
)


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a mix."""
    write_file_atomically(path, lambda handle: handle.write(data))


def write_file_atomically(path: Path, write: Callable[[IO[bytes]], object]) -> int:
    """Let `write` fill a file that replaces `path` whole, as `write_atomically`; its size.

    Durable once it returns: the file's bytes and its name in its folder (and the names of
    the folders it created) are on disk, so a power loss after the run records the day
    cannot take the recorded file away, nor bring back the one it replaced.
    """
    created = list(itertools.takewhile(lambda folder: not folder.exists(), path.parents))
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created as a plain write creates a file (rw-rw-rw- less the umask), not as mkstemp does
    # (owner only): the file it becomes is read by others as one written in place would be (a
    # lake day by another account, the CSV `ml-platform score` writes).
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
            size = handle.tell()
        os.replace(tmp, path)
        # A rename is a change of the folder, which the file's fsync does not write: sync
        # the folder, then each folder created for it in its own parent, deepest first.
        for folder in [path.parent, *(folder.parent for folder in created)]:
            fsync_folder(folder)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return size


def fsync_folder(folder: Path) -> None:
    """Write a folder's entries (a rename, a new name) to disk.

    POSIX opens a folder to fsync it; Windows cannot open one at all (no O_DIRECTORY), so
    there it is left to the file system.
    """
    directory = getattr(os, "O_DIRECTORY", None)
    if directory is None:
        return
    fd = os.open(folder, os.O_RDONLY | directory)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LakeStorage(dg.ConfigurableResource):
    """Where the lake's objects live: the interface every lake read and write goes through.

    Implemented by a local directory (`LocalStorage`, the embedded default) and an S3 prefix
    (`S3Storage`, production); `locations.lake_storage` picks one by the settings. Keys are
    relative, '/'-separated (`<dataset>/<asset>/<day>/<version>.<ext>`, `LakeIOManager`), and
    every write replaces an object whole, so a reader sees the previous version or the new one,
    never a mix.
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

    def partial_writes(self, prefix: str) -> list[str]:
        """Keys of what writes cut short left below a folder (a killed process), sorted.

        None here: a backend whose write is one request leaves nothing of a write cut short.
        """
        return []

    @contextlib.contextmanager
    def naming(self, doing: str, key: str) -> Iterator[None]:
        """Raise the block's storage errors as `LakeStorageError`s that name the object.

        A missing object (FileNotFoundError) stays one, so readers tell "not stored" from
        "storage failed" by it; a read's is a `MissingLakeObjectError` naming the key, which
        `partition_errors` fails at once (waiting does not store it again). Every read, write,
        deletion and listing goes through here, so a key that would leave the lake
        (`check_key`) is refused before it touches storage.
        """
        check_key(doing, key)
        try:
            yield
        except MissingLakeObjectError:
            raise
        except FileNotFoundError as exc:
            if doing != "reading":
                raise
            raise MissingLakeObjectError(
                errno.ENOENT,
                f"{doing} {self.uri(key)} failed: no object is stored under lake key {key!r}",
            ) from exc
        except LakeStorageError:
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
                str(p.relative_to(base)) for p in files_below(folder) if not p.name.startswith(".")
            )

    def partial_writes(self, prefix: str) -> list[str]:
        """The temporary files below a folder that a process killed mid-write left, sorted.

        `write_file_atomically` removes its temporary file when a write fails, but a process
        killed (SIGKILL, the OOM killer, a lost node) leaves it: a day's worth of bytes each.
        """
        base = Path(self.base_dir)
        folder = self._path(prefix)
        with self.naming("listing", prefix):
            if not folder.is_dir():
                return []
            return sorted(
                str(p.relative_to(base))
                for p in files_below(folder)
                if p.name.startswith(".") and p.name.endswith(".tmp")
            )


def files_below(folder: Path) -> Iterator[Path]:
    """Every file below `folder`, at any depth; a folder it may not read raises, never skipped.

    Not `Path.rglob`, which passes over a folder it is refused (PermissionError) as if it were
    empty: a day folder another account made with a mode that shuts the platform out would be
    listed as "not stored" (a hole in every window) instead of the refusal to fix. A folder
    deleted while it is walked held nothing any more. Links to folders are not followed, as
    `rglob` did not.
    """

    def refused(exc: OSError) -> None:
        if isinstance(exc, FileNotFoundError):
            return
        # The message names the folder below the listed one that could not be read.
        raise type(exc)(exc.errno, f"{exc.strerror}: {exc.filename}") from exc

    for top, _, names in os.walk(folder, onerror=refused):
        for name in names:
            path = Path(top) / name
            if path.is_file():
                yield path


def check_key(doing: str, key: str) -> None:
    """Refuse a key that would name an object outside the lake (UnsafeLakeKeyError).

    A key is relative and '/'-separated, without empty, '.' or '..' parts; a folder's may end
    with '/', and the empty one is the whole lake. Checked as text, for both backends: a local
    path joined with '/etc/passwd' or '../..' is outside the lake directory, and an S3 server
    or proxy that normalises '..' in a path reaches outside the prefix.
    """
    name = key.rstrip("/")
    if name and any(part in {"", ".", ".."} for part in name.split("/")):
        raise UnsafeLakeKeyError(
            f"{doing} lake key {key!r} refused: it would name an object outside the lake. A "
            "lake key is a relative '/'-separated path without empty, '.' or '..' parts; one "
            "that a materialisation records (its lake_key metadata) was not written by the "
            "platform: materialise the day again, which records a key of its own"
        )


def is_missing_key(exc: Exception) -> bool:
    """Whether a botocore ClientError says the object (or its key) does not exist."""
    code = getattr(exc, "response", {}).get("Error", {}).get("Code")
    return code in {"NoSuchKey", "404", "NotFound"}
