"""The landing zone: where upstream systems drop one file per day, and the `land` command.

Files are written the way a careful upstream system writes them: to a temporary name first,
then renamed, so a reader never sees half a file.

Only regular files directly in the zone are read. A symbolic link (even one pointing inside
the zone), a directory, a FIFO or a device, and an S3 key with `.` or `..` segments, an
absolute-looking name or one below a folder of the zone are refused with the reason: listings
report them (`refused`), and opening one raises `RefusedLandingFileError` before a byte behind
it is read, so a link to `/etc/...` or to a file outside the zone can neither be ingested nor
quoted in an error. A local file still being written in place when it is read is not taken for
the whole file (`LandedFileChangedError`).
"""

import bisect
import contextlib
import dataclasses
import datetime as dt
import errno
import os
import re
import stat as stat_module
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.ingestion.flights import flights_for_day
from ml_platform.ingestion.synthetic import Drift, file_bytes, generate_day
from ml_platform.platform.failures import CONFIGURATION, runbook_link
from ml_platform.platform.storage import write_atomically
from ml_platform.platform.storage_errors import PermanentStorageError, storage_errno

# The run tags of a run for a landed file: which file and which version of it the run reads.
LANDED_FILE_TAG = "ml_platform/landed_file"
LANDED_VERSION_TAG = "ml_platform/landed_version"


class MissingLandingFileError(FileNotFoundError):
    """No file has landed for a partition day."""


class LandingZoneMissingError(FileNotFoundError):
    """The landing zone's directory does not exist: a path mistyped or a volume not mounted."""


class LandedFileChangedError(OSError):
    """A landed file changed while it was read: still being written in place.

    An OSError, since waiting fixes it: the step's retry policy reads the file again.
    """


class RefusedLandingFileError(ValueError):
    """A landing zone entry that is not read: a link, not a regular file, or an unsafe name."""


@dataclasses.dataclass(frozen=True)
class LandedObject:
    """One entry of the landing zone as a listing sees it."""

    name: str  # file name relative to the zone (the key below the S3 prefix)
    # When the content became readable here, seconds since the epoch: S3 LastModified; locally
    # the later of mtime and ctime, since a file moved in (`mv`, `cp -p`, `rsync -t`) keeps an
    # older mtime but gets a new ctime.
    modified: float
    # Changes whenever the content is replaced, whatever its mtime: S3 ETag; locally inode,
    # size and ctime (a rename, a copy and an in-place rewrite each change one of them).
    version: str
    refused: str | None = None  # why the entry is never read (a link, not a regular file...)
    # Changes only when the bytes may have, not with metadata: locally inode and size (a chmod,
    # chown or touch moves the ctime, so the version, and leaves both; a same-size rewrite in
    # place is not told); empty: the version, which on S3 (the ETag) is the content's already.
    content: str = ""

    @property
    def content_key(self) -> str:
        """What tells this content from another one of the same name (see `content`)."""
        return self.content or self.version


LINK_REASON = (
    "it is a symbolic link, and links in the landing zone are never followed: put the file "
    "itself in the zone (mv or cp it there)"
)
DIRECTORY_REASON = "it is a directory: the landing zone's day files are read from the zone only"
SPECIAL_REASON = (
    "it is not a regular file (a FIFO, socket or device): land the day's data as a plain file"
)


def unsafe_name_reason(name: str) -> str | None:
    """Why a name below the zone is never read, or None if it may be.

    A name that could address something outside the zone, and one below a folder of the zone
    (an S3 key with a `/` after the prefix): only what is directly in the zone is read, as a
    local zone lists a sub-directory as refused.

    S3 does not resolve `..`, but anything that maps keys to paths (a sync to disk, a proxy, a
    later copy of the zone) would; an absolute-looking key (`/etc/passwd` below an empty
    prefix, or `//x` below `incoming/`) reads as a path from the root.
    """
    if not name:
        return "its name is empty"
    if name.startswith("/") or name.startswith("\\") or re.match(r"^[A-Za-z]:[\\/]", name):
        return "its name is an absolute path: day files are named relative to the zone"
    segments = re.split(r"[\\/]", name)
    if any(segment in {".", ".."} for segment in segments):
        return "its name has a '.' or '..' segment, which could address files outside the zone"
    if any(ord(char) < 32 for char in name):
        return "its name holds a control character"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        # A name written by a system of another encoding (latin-1 over SMB or FTP): Python
        # holds its undecodable bytes as surrogates, which no alert, log or cursor can carry.
        return "its name is not valid UTF-8: rename it in UTF-8"
    folder, below, _ = name.rpartition("/")
    if below:
        # An S3 key below the prefix's own "folders" (what upstream archived in `processed/`),
        # as a local zone's sub-directory: not a day file of the zone, whatever its name says.
        return (
            f"it is below a folder of the zone ('{folder}/'): day files are read from the zone "
            "itself, not from its folders"
        )
    return None


def shown_name(name: str) -> str:
    r"""A name as messages show it: bytes that are not UTF-8 as `\xNN` escapes."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


class LandingStore(dg.ConfigurableResource):
    """Where day files land: the interface the assets and the landing sensor use.

    Implemented by a local directory (`LandingZone`) and an S3 prefix (`S3LandingZone`,
    `ml_platform.ingestion.s3_landing`); `zones.landing_store` picks one by the settings, as
    `platform.locations.lake_storage` does for the lake.
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

    def entries(self) -> list[LandedObject]:
        """Every entry of the zone, readable or refused, in name order (all pages)."""
        found: list[LandedObject] = []
        after: str | None = None
        while True:
            page, after = self.list_page(after, 1000)
            found.extend(page)
            if after is None:
                return found

    def list_page(self, after: str | None, limit: int) -> tuple[list[LandedObject], str | None]:
        """Up to `limit` entries whose names sort after `after`, in name order.

        Returns the entries and the name to continue after, or None when the listing is
        complete. A sensor walks a large zone a page per tick with this instead of listing it
        whole. Entries that are never read carry the reason in `refused`.
        """
        raise NotImplementedError

    def find(self, file_name: str) -> LandedObject | None:
        """The entry of this name as a listing reports it, or None when nothing is there.

        One look-up, whatever the size of the zone: what a check of a few expected day files
        (the freshness sensor's) needs instead of a listing.
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
            "Land it first (e.g. `ml-platform land --dataset <dataset> "
            f"--start {partition} --days 1`) or check the upstream delivery."
        )

    def not_allowed(
        self, file_name: str, partition: str, exc: BaseException
    ) -> PermanentStorageError | None:
        """The error for a landed file the platform may not read, or None if `exc` is no refusal.

        Not the day's verdict: the file may be fine, the credentials or modes are not, and
        retrying does not change them (the step fails at once, classed configuration).
        """
        if storage_errno(exc) not in (errno.EACCES, errno.EPERM):
            return None
        return PermanentStorageError(
            f"{self.path_for(file_name)} (partition {partition}) may not be read: "
            f"{type(exc).__name__}: {exc}. Retrying cannot help: give the platform's user read "
            "access to the landing zone (the file's owner and mode, or the S3 credentials' "
            "policy: s3:GetObject on the landing prefix, deploy/iam-policy.json), then rerun "
            f"the day. Runbook: {runbook_link(CONFIGURATION)}"
        )

    def refused(self, file_name: str, partition: str, reason: str) -> RefusedLandingFileError:
        """The error for a day whose landed entry is not read, naming file, partition, reason."""
        return RefusedLandingFileError(
            f"{self.path_for(file_name)} (partition {partition}) is refused: {reason}. Nothing "
            "was read from it; replace it with the day's file and the sensor runs the day."
        )


class LandingZone(LandingStore):
    """A local directory where day files land (the embedded default)."""

    base_dir: str

    def path_for(self, file_name: str) -> Path:
        """Where a landed file of this name lives."""
        return Path(self.base_dir) / file_name

    @contextlib.contextmanager
    def open_file(self, file_name: str, partition: str) -> Iterator[IO[bytes]]:
        """The landed file opened for reading; a clear error naming file and partition if absent.

        Refuses, before reading a byte, a name that leaves the zone, a symbolic link (even to a
        file inside the zone), and anything that is not a regular file: the file is opened with
        O_NOFOLLOW and checked on the open descriptor, so swapping it for a link between the
        check and the read does not help either.
        """
        reason = unsafe_name_reason(file_name)
        if reason is not None:
            raise self.refused(file_name, partition, reason)
        path = self.path_for(file_name)
        zone = Path(self.base_dir).resolve()
        if not path.parent.resolve().is_relative_to(zone):
            raise self.refused(file_name, partition, "its folder resolves outside the zone")
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused right after.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            # A zone that is not there (a volume not mounted) is no day not landed: recorded
            # as such, every day run meanwhile would be rejected, its upstream team told to
            # deliver a file that is there all along.
            if not os.path.isdir(self.base_dir):
                raise self._zone_missing() from exc
            raise self.missing(file_name, partition) from exc
        except OSError as exc:
            # ELOOP is O_NOFOLLOW meeting a link, ENXIO a socket; lstat says which without
            # touching what a link points at.
            reason = local_object(file_name, os.lstat(path)).refused
            if reason is not None:
                raise self.refused(file_name, partition, reason) from None
            stop = self.not_allowed(file_name, partition, exc)
            if stop is not None:
                raise stop from exc
            raise
        try:
            before = os.fstat(fd)
            mode = before.st_mode
            if not stat_module.S_ISREG(mode):
                reason = DIRECTORY_REASON if stat_module.S_ISDIR(mode) else SPECIAL_REASON
                raise self.refused(file_name, partition, reason)
            os.set_blocking(fd, True)
            handle = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        with handle:
            try:
                yield handle
            except Exception as exc:
                # A cut-off file fails the parse: the writer at work is the reason, not the file.
                self._check_unchanged(handle, before, file_name, partition, exc)
                raise
            self._check_unchanged(handle, before, file_name, partition)

    def _check_unchanged(
        self,
        handle: IO[bytes],
        before: os.stat_result,
        file_name: str,
        partition: str,
        failure: Exception | None = None,
    ) -> None:
        """Raise LandedFileChangedError if the open file changed since `before`.

        A file written in place (scp, cp, most FTP servers) is read as far as it had arrived:
        rows that end at a line break pass every check, and the day would be accepted from
        part of its file. A rename into the zone never changes the open file, so only a writer
        still at work is met here.
        """
        after = os.fstat(handle.fileno())
        if (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns):
            return
        raise LandedFileChangedError(
            f"{self.path_for(file_name)} (partition {partition}) changed while it was read "
            f"(from {before.st_size} to {after.st_size} bytes): it is still being written in "
            "place. The step reads it again; upstream should write to a dot-file and rename it "
            "into the zone, which readers never see half-written."
        ) from failure

    def _zone_missing(self) -> LandingZoneMissingError:
        """The error for a zone whose directory is missing: not an empty zone.

        Read as empty, it would make the landing sensor forget every file it had seen (and run
        them all again once the volume is back), and the freshness sensor call every day late.
        """
        return LandingZoneMissingError(
            f"the landing zone {self.base_dir} does not exist: create or mount it, or point "
            "ML_PLATFORM_LANDING_DIR (or --landing-dir) at the directory files land in"
        )

    def _entry_names(self) -> list[str]:
        """Names of every entry in the zone but dot-files (files still being written), sorted."""
        try:
            with os.scandir(self.base_dir) as entries:
                return sorted(e.name for e in entries if not e.name.startswith("."))
        except FileNotFoundError as exc:
            raise self._zone_missing() from exc

    def modified_slack_seconds(self) -> float:
        """One second: `modified` is the later of mtime and ctime, which a rename also sets."""
        return 1.0

    def find(self, file_name: str) -> LandedObject | None:
        """The entry's lstat as a listing reports it (never followed), or None if absent."""
        try:
            found = os.lstat(self.path_for(file_name))
        except FileNotFoundError:
            if not os.path.isdir(self.base_dir):
                raise self._zone_missing() from None
            return None
        return local_object(file_name, found)

    def list_page(self, after: str | None, limit: int) -> tuple[list[LandedObject], str | None]:
        """Up to `limit` entries after `after` in name order, each with its version.

        Names come from one directory read (cheap even for 100 000 entries); only the entries
        of the page are lstat-ed, never followed. A file removed between the read and the
        lstat is left out. Links, directories, FIFOs and devices are listed as refused.
        """
        names = self._entry_names()
        start = bisect.bisect_right(names, after) if after is not None else 0
        page = names[start : start + limit]
        objects = []
        for name in page:
            try:
                found = os.lstat(os.path.join(self.base_dir, name))
            except FileNotFoundError:
                continue  # deleted since the directory was read: deleted files do nothing
            objects.append(local_object(name, found))
        more = start + limit < len(names)
        return objects, (page[-1] if more and page else None)


def local_object(name: str, found: os.stat_result) -> LandedObject:
    """A local entry as the listing reports it, from its lstat."""
    mode = found.st_mode
    if stat_module.S_ISREG(mode):
        refused = unsafe_name_reason(name)
    elif stat_module.S_ISLNK(mode):
        refused = LINK_REASON
    elif stat_module.S_ISDIR(mode):
        refused = DIRECTORY_REASON
    else:
        refused = SPECIAL_REASON
    return LandedObject(
        name=name,
        modified=max(found.st_mtime, found.st_ctime),
        # Not the mtime: a file moved in with `mv`, `cp -p` or `rsync -t` keeps an old one.
        # A rename or a copy gives a new inode or ctime, an in-place rewrite a new ctime.
        version=f"{found.st_ino}-{found.st_size}-{found.st_ctime_ns}",
        refused=refused,
        # A link's size is the length of the path it holds; a directory's moves with what is
        # filed in it, which is nothing the zone reads: the folder itself is what is there.
        content=(
            f"{found.st_ino}" if stat_module.S_ISDIR(mode) else f"{found.st_ino}-{found.st_size}"
        ),
    )


@dataclasses.dataclass(frozen=True)
class LandingScan:
    """Landed files mapped to partition days, and the files that map to none."""

    days: dict[str, str]  # partition day -> file name
    problems: dict[str, str]  # file name -> why it belongs to no partition


def file_name_pattern(contract: Contract) -> re.Pattern[str]:
    """The contract's file pattern as a regular expression; the `date` group holds the day."""
    return pattern_regex(contract.landing.file_pattern)


def pattern_regex(file_pattern: str, flags: int = 0) -> re.Pattern[str]:
    """A file pattern (`{date}` once) as a regular expression; the `date` group holds the day."""
    prefix, suffix = file_pattern.split("{date}")
    return re.compile(re.escape(prefix) + r"(?P<date>.*)" + re.escape(suffix) + "$", flags)


def own_files(
    contract: Contract, file_names: Iterable[str], served: Iterable[Contract] = ()
) -> list[str]:
    """The names that are not another served dataset's.

    Datasets served together may share a landing zone; a file named by another dataset's
    pattern (whatever date it carries) is that dataset's to run or report. A name both patterns
    match (`sales_returns_2024-01-01.csv` fits `sales_{date}.csv` too, its "date" being
    `returns_2024-01-01`) belongs to the pattern that spells more of it: sales_returns'. A name
    no dataset's pattern fits, even in another letter case (a `notes.txt` left in the zone), is
    reported once, by the first of the datasets by name, not paged to every team of the zone.
    """
    own = file_name_pattern(contract)
    spelled = literal_length(contract)
    served = [c for c in served if c.name != contract.name]
    others = [(file_name_pattern(c), literal_length(c)) for c in served]
    # Misnamed in letter case or Unicode form: the misfit is told to the dataset it fits.
    own_loosely = loose_pattern(contract)
    others_loosely = [(loose_pattern(c), literal_length(c)) for c in served]
    reports_strays = all(contract.name < c.name for c in served)

    def theirs(name: str) -> bool:
        mine = own.match(name) is not None
        if any(o.match(name) and (not mine or length > spelled) for o, length in others):
            return True
        if mine:
            return False
        folded = unicodedata.normalize("NFC", name)
        if own_loosely.match(folded) is not None:
            return any(o.match(folded) and length > spelled for o, length in others_loosely)
        return any(o.match(folded) for o, _ in others_loosely) or not reports_strays

    return [name for name in file_names if not theirs(name)]


def loose_pattern(contract: Contract) -> re.Pattern[str]:
    """The contract's file pattern matching whatever the letter case (names taken as NFC)."""
    return pattern_regex(unicodedata.normalize("NFC", contract.landing.file_pattern), re.IGNORECASE)


def literal_length(contract: Contract) -> int:
    """How many characters of a file name the contract's pattern spells out (all but the date)."""
    return len(contract.landing.file_pattern) - len("{date}")


def scan_landing(contract: Contract, file_names: Iterable[str]) -> LandingScan:
    """Map file names to partition days by the contract's pattern; explain every misfit."""
    pattern = file_name_pattern(contract)
    first, last = contract.partitions.start_date, contract.partitions.end_date
    days: dict[str, str] = {}
    problems: dict[str, str] = {}
    for name in file_names:
        match = pattern.match(name)
        day = iso_day(match["date"]) if match else None
        if day is None:
            problems[name] = misfit_reason(contract, name)
        elif day < first:
            problems[name] = f"it is for {day}, before the first partition {first}"
        elif last is not None and day > last:
            problems[name] = f"it is for {day}, after the last partition {last}"
        else:
            days[day.isoformat()] = name
    return LandingScan(days=days, problems=problems)


def iso_day(text: str) -> dt.date | None:
    """The day `text` writes as YYYY-MM-DD, or None (another format, or no day at all)."""
    try:
        day = dt.date.fromisoformat(text)
    except ValueError:
        return None
    # fromisoformat also reads 20240101 and 2024-W01-1, which name no file of the pattern.
    return day if text == day.isoformat() else None


def misfit_reason(contract: Contract, name: str) -> str:
    """Why a landed file's name gives no day by the contract's pattern, as precisely as known."""
    pattern = contract.landing.file_pattern
    expected = f"expected {pattern} with the day as YYYY-MM-DD"
    match = file_name_pattern(contract).match(name)
    if match is None:
        # A Windows export's `.CSV`, a name from macOS with its accents as separate marks
        # (NFD): the day is right there, and the file reads as not landed.
        found = loose_pattern(contract).match(unicodedata.normalize("NFC", name))
        day = iso_day(found["date"]) if found else None
        if day is not None:
            meant = contract.landing.file_name(day.isoformat())
            return (
                f"its name differs from {meant} in letter case or Unicode form (accents as "
                f"separate marks, as macOS writes them); names are matched exactly: rename it "
                f"{meant}"
            )
    elif re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", match["date"]):
        return (
            f"its name carries no parsable date: {match['date']} is no date of the calendar "
            f"({expected})"
        )
    return f"its name carries no parsable date: {expected}"


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
        try:
            # lstat, never followed: nothing a link points at is read, and a link (which
            # raw_data refuses) is replaced by the file even when its target holds the bytes.
            found: os.stat_result | None = os.lstat(path)
        except FileNotFoundError:
            found = None
        if found is not None and stat_module.S_ISREG(found.st_mode) and path.read_bytes() == data:
            status = "unchanged"
        else:
            status = "replaced" if found is not None else "written"
            write_atomically(path, data)
        if progress is not None:
            progress(
                f"[{i:>{len(str(len(days)))}}/{len(days)}] {day} {path.name}: "
                f"{len(frame)} rows {status}"
            )
        yield day, path, status
