"""The landing sensor: a new or corrected landed file runs its day.

The landing sensor walks the zone (a local directory or an S3 prefix) a page at a time across
ticks, and requests at most MAX_REQUESTS_PER_TICK runs a tick, so a tick stays short however
many files have landed, and remembers in its cursor what it has already handled:

- `seen`: entry -> version digest for every entry of the zone at its last listing. A file is
  new when its version differs from the one seen, whatever its modification time: a file
  prepared elsewhere and moved in (`mv`, `cp -p`, `rsync -t`) keeps an older mtime, so no
  watermark on mtime can see it. Versions are S3 ETags, or locally inode, size and ctime,
  which a rename, a copy and an in-place rewrite each change. The map is stored compressed,
  with 6-byte digests of the versions (about 11 bytes a file: 10,000 files, about 110 kB).
- `walk`: where the current walk is (the name to list after). Entries of `seen` in a listed
  range that the listing no longer holds were deleted and are forgotten.
- `walked`: a complete walk has been made. During the first walk after the sensor is turned
  on, a file whose day was materialised after the file became readable is not rerun, nor one
  whose bytes are those its day accepted (its ctime moved by a chmod of the zone, or a copy).
- `pending`: files of days that are not partitions yet (today's file, landed early). One of a
  day more than a day ahead of today is logged at WARNING and named in the tick's reason,
  once, as waiting for its day: a wrong date looks just like it.

A version says that a file may have changed, its bytes that it did: a file seen before under
another version whose bytes hash to what raw_data last accepted for its day (`content_sha256`)
runs nothing. A local version moves with a chmod or chown (they set the ctime), and a file can
be sent again as it was; neither is a new delivery, and a chmod of the zone must not rerun
every day of it. Reading is bounded per tick (CONTENT_BUDGET_SECONDS); files left uncompared
keep their old version and are compared on the next walk.

So a re-landed (changed) file runs its day again, an unchanged file never does, and a deleted
file does nothing. Each request's run_key names the day, the file, its version and when it
became readable: the daemon never launches the same request twice, and a corrected file gets a
new run, as does an earlier version put back after a correction. A file whose name
carries no valid date, and an entry the zone refuses to read (a symbolic link, a directory, a
FIFO or device, an S3 key with `..` segments or an absolute-looking name), is logged and alerted
once per content, and runs nothing: it is remembered by its content key (locally inode and
size, on S3 the ETag), so a chmod or touch of it alerts nothing again. Dagster's `get_objects`
is not used: it lists the whole bucket on every call and its `since_key` misses overwritten
files (dagster-io/dagster#22892).
"""

import base64
import bisect
import dataclasses
import datetime as dt
import hashlib
import json
import time
import zlib
from collections.abc import Sequence
from typing import Any

import dagster as dg

from ml_platform.automation.alerts import WARNING, Alert, DeliveryState, Notifier, one_line
from ml_platform.automation.jobs import day_run_tags, day_runs_in_flight
from ml_platform.contracts import Contract
from ml_platform.ingestion.landing import (
    LANDED_FILE_TAG,
    LANDED_VERSION_TAG,
    LandedObject,
    LandingStore,
    own_files,
    scan_landing,
    shown_name,
)
from ml_platform.platform.datasets import asset_key, dataset_name
from ml_platform.platform.records import ACCEPTED, UNCHANGED, day_records
from ml_platform.platform.rejected import rerun_command

LANDING_SENSOR = "landing_sensor"

# Clock skew between this host and the storage, plus S3 stamping an upload with its start: what
# a cursor written before versions were kept per file allowed for.
SLACK_SECONDS = 300.0
PAGE_SIZE = 1000
PAGES_PER_TICK = 5
# Dagster validates the partition of every run request a tick returns (about 1 ms each on two
# cores, more than the sensor's own work): 5,000 requests made a 6-9 s tick, 2,000 stay near 2 s.
MAX_REQUESTS_PER_TICK = 2000
TICK_BUDGET_SECONDS = 15.0
# 48 bits: two versions of one file share a digest once in 10^14 replacements.
DIGEST_BYTES = 6
# The metadata entry in which raw_data records the sha256 of the bytes it read.
CONTENT_ENTRY = "content_sha256"
# How long a tick may spend reading replaced files to compare their bytes (a chmod of a large
# zone replaces every version at once): the rest are compared on the next walk.
CONTENT_BUDGET_SECONDS = 10.0
CONTENT_CHUNK_BYTES = 1 << 20
# The digest remembered for a file first seen on the first walk and left uncompared: no version
# digests to it, so the next walk finds the file changed and compares its bytes then.
UNCOMPARED = bytes(DIGEST_BYTES)


def version_digest(version: str) -> bytes:
    """A short fixed-size stand-in for a file version, to keep the cursor compact."""
    data = version.encode("utf-8", "surrogateescape")
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def pack_seen(seen: dict[str, bytes]) -> str:
    """The name -> digest map, compressed: the sorted names as JSON, a line break, the digests.

    Day file names share most of their characters and compress to 2-3 bytes each; the digests
    do not compress. 10,000 files pack into about 110 kB (base85).
    """
    names = sorted(seen)
    # JSON escapes line breaks inside names, so the first line break ends the names.
    data = json.dumps(names, separators=(",", ":")).encode("ascii") + b"\n"
    data += b"".join(seen[name] for name in names)
    return base64.b85encode(zlib.compress(data, 6)).decode("ascii")


def unpack_seen(packed: str) -> dict[str, bytes]:
    """The map `pack_seen` packed."""
    data = zlib.decompress(base64.b85decode(packed))
    cut = data.index(b"\n")
    names = json.loads(data[:cut])
    digests = data[cut + 1 :]
    return {
        name: digests[i * DIGEST_BYTES : (i + 1) * DIGEST_BYTES] for i, name in enumerate(names)
    }


@dataclasses.dataclass
class LandingCursor:
    """The landing sensor's memory between ticks (see the module docstring)."""

    walked: bool = False  # a complete walk has been made
    seen: dict[str, bytes] = dataclasses.field(default_factory=dict)  # name -> version digest
    walk: dict[str, Any] | None = None  # {"after": name | None}
    # name -> [version, day, modified]
    pending: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    delivery: DeliveryState = dataclasses.field(default_factory=DeliveryState)
    # From a cursor of the mtime-watermark kind: the walk that replaces it takes files last
    # modified well before it as handled, as that cursor did, instead of rerunning the zone.
    legacy_watermark: float | None = None

    def dumps(self) -> str:
        """The cursor string stored by Dagster."""
        return json.dumps(
            {
                "v": 2,
                "walked": self.walked,
                "seen": pack_seen(self.seen),
                "walk": self.walk,
                "pending": self.pending,
                "delivery": self.delivery.to_json(),
                "legacy_watermark": self.legacy_watermark,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def loads(cls, cursor: str | None) -> "LandingCursor":
        """The cursor of a tick; a fresh one before the first tick."""
        if not cursor:
            return cls()
        data = json.loads(cursor)
        delivery = DeliveryState.from_json(data.get("delivery"))
        if data.get("v", 1) == 1:
            # Its versions were mtime and size: the next walk records versions afresh, with
            # the first walk's rule for days already materialised.
            return cls(
                pending=data["pending"], delivery=delivery, legacy_watermark=data["watermark"]
            )
        return cls(
            walked=data["walked"],
            seen=unpack_seen(data["seen"]),
            walk=data["walk"],
            pending=data["pending"],
            delivery=delivery,
            legacy_watermark=data.get("legacy_watermark"),
        )

    def is_new(self, obj: LandedObject, digest: bytes) -> bool:
        """Whether this version of the entry has not been handled yet."""
        known = self.seen.get(obj.name)
        if known is not None:
            return known != digest
        return not (
            self.legacy_watermark is not None
            and obj.modified < self.legacy_watermark - SLACK_SECONDS
        )


@dataclasses.dataclass(frozen=True)
class WalkStep:
    """What one tick of the walk found."""

    changed: list[LandedObject]  # new or changed entries (refused ones included), in name order
    listed: int  # entries listed in this tick
    pages: int
    completed: bool  # the walk reached the end of the zone
    # The changed entries seen before under another version: name -> that version's digest
    replaced: dict[str, bytes] = dataclasses.field(default_factory=dict)


def remember_content(cursor: LandingCursor, obj: LandedObject) -> None:
    """Remember an entry that runs nothing (a misfit, a refused entry) by its content key.

    Its version moves with a chmod, a chown or a touch (they set the ctime), which changes
    nothing that is alerted: the entry is new again, and alerted again, only when its content
    key changes (`walk_landing`). Only such entries: a file that runs its day is remembered by
    its version, whose bytes are then compared with those accepted.
    """
    cursor.seen[obj.name] = version_digest(obj.content_key)


def forget_deleted(
    cursor: LandingCursor, known: list[str], after: str | None, end: str | None, listed: set[str]
) -> None:
    """Forget the entries named in (after, end] (to the zone's end if None) no longer listed."""
    low = bisect.bisect_right(known, after) if after is not None else 0
    high = bisect.bisect_right(known, end) if end is not None else len(known)
    for name in known[low:high]:
        if name not in listed:
            cursor.seen.pop(name, None)
            cursor.pending.pop(name, None)


def walk_landing(
    zone: LandingStore,
    cursor: LandingCursor,
    *,
    page_size: int = PAGE_SIZE,
    max_pages: int = PAGES_PER_TICK,
    max_changed: int = MAX_REQUESTS_PER_TICK,
    budget_seconds: float = TICK_BUDGET_SECONDS,
) -> WalkStep:
    """List the next pages of the zone and return the entries not handled yet; updates `cursor`.

    Stops after `max_changed` such entries, mid-page if need be: the walk goes on after the
    last entry it handled. An entry remembered by its content key (`remember_content`) is new
    only when that changed, not with every version.
    """
    if cursor.walk is None:
        cursor.walk = {"after": None}
    known = sorted(cursor.seen)
    changed: list[LandedObject] = []
    replaced: dict[str, bytes] = {}
    listed = pages = 0
    completed = False
    clock = time.monotonic()
    while (
        pages < max_pages
        and len(changed) < max_changed
        and time.monotonic() - clock < budget_seconds
    ):
        before = cursor.walk["after"]
        objects, after = zone.list_page(before, page_size)
        pages += 1
        handled: set[str] = set()
        for i, obj in enumerate(objects):
            if len(changed) == max_changed:
                after = objects[i - 1].name
                break
            listed += 1
            handled.add(obj.name)
            digest = version_digest(obj.version)
            seen = cursor.seen.get(obj.name)
            if seen not in (None, digest) and seen == version_digest(obj.content_key):
                continue  # an entry that only alerts, with its content unchanged
            if cursor.is_new(obj, digest):
                changed.append(obj)
                if obj.name in cursor.seen:
                    replaced[obj.name] = cursor.seen[obj.name]
            cursor.seen[obj.name] = digest
        forget_deleted(cursor, known, before, after, handled)
        cursor.walk["after"] = after
        if after is None:
            completed = True
            break
    if completed:
        cursor.walked = True
        cursor.walk = None
        cursor.legacy_watermark = None
    return WalkStep(
        changed=changed, listed=listed, pages=pages, completed=completed, replaced=replaced
    )


def materialised_after(
    instance: dg.DagsterInstance,
    asset_key: dg.AssetKey,
    day: str,
    modified: float,
    slack_seconds: float,
) -> bool:
    """Whether `asset_key` was materialised for `day` after the file became readable.

    Then that materialisation read this very file (a replacement would be newer), so a file
    found when the sensor is first turned on does not rerun a day someone already ran (e.g.
    the days `make run` landed and materialised).
    """
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[day]), limit=1
    ).records
    return bool(records) and records[0].timestamp > modified + slack_seconds


def content_sha256(landing: LandingStore, name: str, day: str, deadline: float) -> str | None:
    """The sha256 of a landed file's bytes, or None if more remain to read at `deadline`.

    Read a chunk at a time: a file of gigabytes is never held, nor read past the tick's budget
    (a tick that overran the daemon's timeout would fail, and be tried again, for ever).
    """
    digest = hashlib.sha256()
    with landing.open_file(name, day) as stream:
        chunk = stream.read(CONTENT_CHUNK_BYTES)
        while chunk:
            digest.update(chunk)
            chunk = stream.read(CONTENT_CHUNK_BYTES)
            if chunk and time.monotonic() >= deadline:
                return None
    return digest.hexdigest()


def same_bytes_as_accepted(
    instance: dg.DagsterInstance,
    landing: LandingStore,
    dataset: str,
    first_key: dg.AssetKey,
    replaced: list[tuple[str, LandedObject]],
    log: Any,
    *,
    budget_seconds: float = CONTENT_BUDGET_SECONDS,
) -> tuple[set[str], set[str]]:
    """Of the replaced files (day, entry), those whose bytes the day's latest record accepted.

    Returns those names, and the names left uncompared when the budget ran out. A local version
    is inode, size and ctime, which a chmod or chown moves too; and the same file can be sent
    again. Neither is a new delivery: only a file whose bytes differ from those `first_key`
    last accepted for its day reruns it. A file that cannot be read here is run: the run says
    what is wrong with it, naming file, partition and reason. So is a day with a run queued or
    running: it may record other bytes (a correction's) after this look at the record. The
    first file is always read, so every tick settles one: when that file alone outlasts the
    budget, it is run rather than left to be tried again for ever.
    """
    records = day_records(instance, first_key, [day for day, _ in replaced])
    same: set[str] = set()
    deferred: set[str] = set()
    deadline = time.monotonic() + budget_seconds
    tried = 0
    for day, obj in replaced:
        record = records.get(day)
        if record is None or record.verdict not in (ACCEPTED, UNCHANGED):
            continue
        recorded = record.metadata.get(CONTENT_ENTRY)
        if recorded is None:
            continue
        if tried and time.monotonic() >= deadline:
            deferred.add(obj.name)
            continue
        tried += 1
        try:
            found = content_sha256(landing, obj.name, day, deadline)
        except Exception as exc:
            log.warning(
                f"{shown_name(str(landing.path_for(obj.name)))} (partition {day}) could not be "
                f"read to compare with the delivery accepted: {type(exc).__name__}: {exc}; "
                "its run reads it"
            )
            continue
        if found is None:
            if tried > 1:
                deferred.add(obj.name)
            continue
        if found == recorded and not day_runs_in_flight(instance, dataset, day):
            same.add(obj.name)
    return same, deferred


def build_landing_sensor(
    contract: Contract,
    partitions: dg.TimeWindowPartitionsDefinition,
    job_name: str,
    *,
    minimum_interval_seconds: int = 30,
    page_size: int = PAGE_SIZE,
    pages_per_tick: int = PAGES_PER_TICK,
    max_requests_per_tick: int = MAX_REQUESTS_PER_TICK,
    content_budget_seconds: float = CONTENT_BUDGET_SECONDS,
    first_asset: str = "raw_data",
    other_datasets: Sequence[Contract] = (),
) -> dg.SensorDefinition:
    """The sensor that runs `job_name` for the day of each new or corrected landed file.

    Files named by the pattern of one of `other_datasets` (served from the same landing zone)
    are theirs: this dataset's sensor neither runs nor reports them.
    """
    first_key = asset_key(contract.name, first_asset)

    @dg.sensor(
        name=dataset_name(contract.name, LANDING_SENSOR),
        job_name=job_name,
        minimum_interval_seconds=minimum_interval_seconds,
        description=(
            "Runs the day of every new or corrected file in the landing zone (local directory "
            "or S3 prefix), whatever its modification time; alerts on files that fit no "
            "partition and on entries it never reads (links, non-regular files, unsafe keys)."
        ),
    )
    def landing_sensor(
        context: dg.SensorEvaluationContext, landing: LandingStore, notifier: Notifier
    ) -> dg.SensorResult:
        now = time.time()
        cursor = LandingCursor.loads(context.cursor)
        first_walk = not cursor.walked
        step = walk_landing(
            landing,
            cursor,
            page_size=page_size,
            max_pages=pages_per_tick,
            max_changed=max_requests_per_tick,
        )
        refused = {obj.name: obj.refused for obj in step.changed if obj.refused is not None}
        readable = [obj.name for obj in step.changed if obj.refused is None]
        scan = scan_landing(contract, own_files(contract, readable, other_datasets))
        by_name = {obj.name: obj for obj in step.changed}
        for name in refused:
            cursor.pending.pop(name, None)
        for name in [*refused, *scan.problems]:
            remember_content(cursor, by_name[name])
        # Daily keys are ISO dates, so "is a partition" is a range test, once per tick instead
        # of a partition-set computation per file.
        first_day = partitions.get_first_partition_key()
        last_day = partitions.get_last_partition_key()

        def is_partition(day: str) -> bool:
            return first_day is not None and last_day is not None and first_day <= day <= last_day

        # Today's file and tomorrow's (a day that has begun somewhere east) wait as a matter of
        # course; a file of a later day waits days or more, which its sender should hear of.
        newest = last_day or (contract.partitions.start_date - dt.timedelta(days=1)).isoformat()
        horizon = (dt.date.fromisoformat(newest) + dt.timedelta(days=2)).isoformat()
        early: list[str] = []
        ready: list[tuple[str, LandedObject]] = []
        for day, name in sorted(scan.days.items()):
            obj = by_name[name]
            waited = cursor.pending.pop(name, None)
            if is_partition(day):
                ready.append((day, obj))
                continue
            cursor.pending[name] = [obj.version, day, obj.modified]
            if day > horizon and waited is None:
                early.append(f"{name} waits for its day {day}")
                context.log.warning(
                    f"{landing.path_for(name)} is for {day}, more than a day ahead (the latest "
                    f"day that has ended is {newest}): it waits for its day and runs once that "
                    "has ended. If its date is wrong, rename it to the day it holds."
                )
            else:
                context.log.info(f"{name}: day {day} is not a partition yet; will run it then")
        for name, (version, day, modified) in sorted(cursor.pending.items()):
            if is_partition(day):
                ready.append((day, LandedObject(name=name, modified=modified, version=version)))
                del cursor.pending[name]

        # One query for the days that have any materialisation; only those need a closer look.
        materialised = context.instance.get_materialized_partitions(first_key)
        read_already = {
            obj.name
            for day, obj in ready
            if first_walk
            and day in materialised
            and materialised_after(
                context.instance, first_key, day, obj.modified, landing.modified_slack_seconds()
            )
        }
        for day, obj in ready:
            if obj.name in read_already:
                context.log.info(f"{obj.name}: {day} was materialised from this file already")
        ready = [(day, obj) for day, obj in ready if obj.name not in read_already]
        # A file of a day materialised before is compared by its bytes as a replaced one is,
        # whether or not its name was seen before: on the first walk a chmod or chown of the
        # zone, or its copy to a new volume (rsync -a), moves every ctime past its day's run,
        # and turning the sensor on then must not rerun them all; later, a file removed and sent
        # again unchanged (an archive and resend, an S3 delete then put) is no new delivery.
        replaced = [
            (day, obj) for day, obj in ready if obj.name in step.replaced or day in materialised
        ]
        same, deferred = (
            same_bytes_as_accepted(
                context.instance,
                landing,
                contract.name,
                first_key,
                replaced,
                context.log,
                budget_seconds=content_budget_seconds,
            )
            if replaced
            else (set(), set())
        )
        for day, obj in replaced:
            if obj.name in deferred:
                # Its old version kept (none on the first walk): the next walk finds it changed
                # and compares it then.
                cursor.seen[obj.name] = step.replaced.get(obj.name, UNCOMPARED)
            elif obj.name in same:
                context.log.info(
                    f"{obj.name}: a new version with the bytes already accepted for {day} (a "
                    f"chmod, or the same file sent again): not rerun; to rerun the day: "
                    f"{rerun_command(contract.name, [day])} --force"
                )
        ready = [(day, obj) for day, obj in ready if obj.name not in same | deferred]

        requests = []
        for day, obj in sorted(ready, key=lambda pair: pair[0]):
            requests.append(
                dg.RunRequest(
                    # The time too: an S3 version is the content's ETag, and a file put back
                    # as it was before a correction must run again, under a key not yet used.
                    run_key=f"{day}|{obj.name}|{obj.version}|{obj.modified}",
                    partition_key=day,
                    tags={
                        LANDED_FILE_TAG: str(landing.path_for(obj.name)),
                        LANDED_VERSION_TAG: obj.version,
                        **day_run_tags(contract.name, day),
                    },
                )
            )

        alerts = []
        # A refused name may not be UTF-8: messages, logs and alerts carry it escaped.
        problems = {
            shown_name(name): reason for name, reason in {**scan.problems, **refused}.items()
        }
        if problems:
            for name, reason in scan.problems.items():
                context.log.warning(f"{landing.path_for(name)} belongs to no partition: {reason}")
            for name, reason in refused.items():
                # The reason only: nothing behind a refused entry is read, so none of it shows.
                where = shown_name(str(landing.path_for(name)))
                context.log.warning(f"{where} is refused: {reason}")
            names = sorted(problems)
            shown = "; ".join(f"{n}: {problems[n]}" for n in names[:5])
            more = f" (and {len(names) - 5} more)" if len(names) > 5 else ""
            title = (
                f"{len(names)} landed file(s) of {contract.name} refused or fit no partition"
                if refused
                else f"{len(names)} landed file(s) fit no partition of {contract.name}"
            )
            alerts.append(
                Alert(
                    severity=WARNING,
                    rule="landing_misfit",
                    title=title,
                    cause=one_line(shown + more, limit=1000),
                    subject=", ".join(names[:5]) + more,
                    failure_class="data",
                    run_id=None,
                    partition=None,
                    run_url=None,
                    runbook=notifier.runbook("landing-file-fits-no-partition"),
                    page=True,
                    occurred_at=now,
                    owners=tuple(contract.owners),
                    dataset=contract.name,
                )
            )
        cursor.delivery = notifier.deliver(alerts, cursor.delivery, context.log, now=now)

        position = (cursor.walk or {}).get("after")
        walk = (
            "walk complete"
            if step.completed
            else f"walk continues after {shown_name(str(position))}"
        )
        summary = (
            f"listed {step.listed} file(s) in {step.pages} page(s); {len(step.changed)} new or "
            f"changed; {len(requests)} run(s) requested; {len(scan.problems)} misfit(s); "
            f"{len(refused)} refused; {walk}" + "".join(f"; {line}" for line in early)
        )
        context.log.info(summary)
        return dg.SensorResult(
            run_requests=requests,
            cursor=cursor.dumps(),
            skip_reason=None if requests else summary,
        )

    return landing_sensor
