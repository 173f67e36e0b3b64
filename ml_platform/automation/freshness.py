"""Late data: a day whose delivery has not arrived, and been accepted, by its deadline.

A contract's `freshness:` says when day D's file is due: `expected_by` on day D+1 in the dataset's
timezone; it is late `grace_minutes` after that. A day is fresh when its delivery arrived and was
accepted (validated_data's recorded verdict); a recorded rejection does not make it fresh, unless
it rejected a correction and the day keeps the delivery it accepted before. A file that came in
time is being run, not late, until VERDICT_ALLOWANCE after the deadline; a file still without a
verdict then makes its day late: its run failed or never ran. Only the days whose deadline fell
within the last `lookback_days` are watched. A file arrived when its content did: the sensor
keeps when it first saw each watched day's content (`first_arrivals`), so a chmod or touch after
the deadline does not make a file that came in time late.

The judgement (`judge_days`) is a pure function of the time, the contract, the files found in
the landing zone and the recorded verdicts. Three things use it:

- Dagster's own freshness machinery shows the dataset overdue in the UI: raw_data gets a cron
  `FreshnessPolicy` (`with_freshness_policy`), which the freshness daemon evaluates against
  raw_data's latest materialisation, any day. It cannot tell a rejected delivery from an accepted
  one, nor one day from another: the per-day verdict is the platform's, reported into Dagster
  as an observation of the day's partition of raw_data (metadata `freshness`: late or fresh),
  which the asset's Events list shows. Not as a check evaluation: Dagster 1.13 stores one
  runless evaluation per check and partition, and a second one (the day's resolution) fails
  on the storage's unique index.
- `freshness_sensor` (one per dataset with a `freshness:` section, running by default) alerts
  once per late day (WARNING: dataset, day, expected file, landing location, owners, runbook
  "data did not arrive") and once more when the day's delivery has been accepted (RESOLVED). The
  days it warned of live in its cursor, so a restart neither repeats nor forgets them.
- `ml-platform landing-status` lists the late days.
"""

import dataclasses
import datetime as dt
import json
import time
import zoneinfo
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from ml_platform.automation.alerts import RESOLVED, WARNING, Alert, DeliveryState, Notifier
from ml_platform.automation.landing_sensor import LANDING_SENSOR
from ml_platform.contracts import Contract
from ml_platform.contracts.model import FreshnessSpec
from ml_platform.ingestion.landing import LandedObject, LandingStore
from ml_platform.platform.datasets import asset_key, dataset_name
from ml_platform.platform.records import DayRecord, day_records
from ml_platform.platform.rejected import rerun_command

FRESHNESS_SENSOR = "freshness_sensor"
# The metadata entry of raw_data's observations of a watched day: LATE, then FRESH.
FRESHNESS_ENTRY = "freshness"
LATE = "late"
RUNBOOK_SECTION = "data-did-not-arrive"
FRESH = "fresh"  # arrived and accepted
MISSING = "missing"  # no file in the landing zone, and none accepted
REFUSED = "refused"  # an entry of the expected name that is never read (a link, a directory)
REJECTED = "rejected"  # its delivery was judged and rejected
AWAITING = "awaiting verdict"  # a file is there, not judged yet
# How long a landed file may await its verdict after the later of its landing and the deadline:
# past that, its run failed or never ran (the landing sensor stopped), and a day whose file came
# in time is late too, saying so. Judging takes a sensor tick (30 s), the queue (one training run
# at a time: behind other datasets' days or a weekly retrain, minutes each) and validated_data,
# early in the run; two hours is far beyond that. It is time that passes, like the grace, and
# well under a day, the shortest lookback, so such a day turns late while it is still watched.
VERDICT_ALLOWANCE = dt.timedelta(hours=2)


@dataclasses.dataclass(frozen=True)
class DayFreshness:
    """One watched day: when its file was due, what the landing zone and the record say."""

    day: str
    file_name: str
    due: dt.datetime  # expected_by on the next day, in the dataset's timezone
    # due + grace: from then on the day is late until fresh (a file that landed by then and
    # awaits its verdict: VERDICT_ALLOWANCE later)
    late_at: dt.datetime
    state: str  # FRESH | MISSING | REFUSED | REJECTED | AWAITING
    late: bool
    overdue: dt.timedelta  # how long after `due` it is (zero when not late)
    landed_at: dt.datetime | None  # when the file became readable; None if none is there
    # the recorded verdict and reason, why an entry is refused, or why no verdict came
    reason: str
    run_id: str | None  # the run that recorded the day's latest verdict


def timezone_of(contract: Contract) -> zoneinfo.ZoneInfo:
    """The zone the contract's days and deadlines are in (its partitions' zone)."""
    return zoneinfo.ZoneInfo(contract.event_time.timezone)


def deadlines(contract: Contract, spec: FreshnessSpec, day: str) -> tuple[dt.datetime, dt.datetime]:
    """When the file of `day` is due, and when it is late: expected_by on the next day, + grace."""
    next_day = dt.date.fromisoformat(day) + dt.timedelta(days=1)
    zone = timezone_of(contract)
    due = dt.datetime.combine(next_day, spec.expected_time, tzinfo=zone)
    # The grace is time that passes, added in UTC: added to the wall clock, it would be an hour
    # longer (or shorter) on the night the clocks change.
    grace = dt.timedelta(minutes=spec.grace_minutes)
    return due, (due.astimezone(dt.UTC) + grace).astimezone(zone)


def watched_days(contract: Contract, now: dt.datetime) -> list[str]:
    """The partition days whose deadline (due + grace) fell within the last lookback_days."""
    spec = contract.freshness
    if spec is None:
        return []
    today = now.astimezone(timezone_of(contract)).date()
    first, last = contract.partitions.start_date, contract.partitions.end_date
    days = []
    # A grace of up to a day puts a deadline up to two days after its day.
    for back in range(spec.lookback_days + 3, 0, -1):
        day = today - dt.timedelta(days=back)
        if day < first or (last is not None and day > last):
            continue
        _, late_at = deadlines(contract, spec, day.isoformat())
        if now - dt.timedelta(days=spec.lookback_days) < late_at <= now:
            days.append(day.isoformat())
    return days


def judge_days(
    contract: Contract,
    now: dt.datetime,
    landed: Mapping[str, LandedObject],
    records: Mapping[str, DayRecord],
) -> list[DayFreshness]:
    """Each watched day as of `now`: its state, and whether it is late.

    `landed` holds the landing zone's entry of each day's expected file that is there, and
    `records` validated_data's latest record of each judged day. A recorded acceptance makes a day
    fresh even when its file has since been removed from the zone. A file that is there and not
    judged yet is late when it arrived after the deadline; one that came in time is being run,
    and not late, for VERDICT_ALLOWANCE after the deadline. A file still without a verdict
    VERDICT_ALLOWANCE after the later of its landing and the deadline has its reason say so: its
    run failed or never ran.
    """
    spec = contract.freshness
    if spec is None:
        return []
    zone = timezone_of(contract)
    judged = []
    for day in watched_days(contract, now):
        due, late_at = deadlines(contract, spec, day)
        entry = landed.get(day)
        record = records.get(day)
        landed_at = dt.datetime.fromtimestamp(entry.modified, zone) if entry else None
        reason = f"{record.verdict}: {record.reason}".rstrip(": ") if record else ""
        # Accepted, unchanged, or a rejected correction that kept the delivery the day accepted
        # before: the data arrived and is in use (the rejection is alerted as a rejection).
        if record is not None and record.accepted:
            state = FRESH
        elif entry is not None and entry.refused is not None:
            state, reason = REFUSED, entry.refused
        elif record is not None:
            state = REJECTED
        elif entry is not None:
            state = AWAITING
        else:
            state = MISSING
        late = state != FRESH
        if state == AWAITING and landed_at is not None:
            # Compared as instants: two times of one zone compare by their wall clocks. The
            # allowance is added in UTC, as the grace is (`deadlines`).
            since = max(landed_at, late_at, key=lambda when: when.timestamp())
            verdict_by = (since.astimezone(dt.UTC) + VERDICT_ALLOWANCE).astimezone(zone)
            stalled = now.timestamp() >= verdict_by.timestamp()
            late = stalled or landed_at.timestamp() > late_at.timestamp()
            if stalled:
                sensor = dataset_name(contract.name, LANDING_SENSOR)
                reason = (
                    f"no verdict was recorded by {moment(verdict_by)}: its run failed or never "
                    f"ran (is {sensor} running?); see the day's runs, or run it: "
                    f"{rerun_command(contract.name, [day])}"
                )
        judged.append(
            DayFreshness(
                day=day,
                file_name=contract.landing.file_name(day),
                due=due,
                late_at=late_at,
                state=state,
                late=late,
                overdue=now - due if late else dt.timedelta(0),
                landed_at=landed_at,
                reason=reason,
                run_id=record.run_id if record else None,
            )
        )
    return judged


def first_arrivals(
    landed: Mapping[str, LandedObject], arrived: dict[str, list[Any]]
) -> dict[str, LandedObject]:
    """Each day's entry as it arrived: `modified` when its content was first seen.

    An entry's `modified` is its content's arrival only until its metadata changes: locally it
    is the later of mtime and ctime (a file moved in keeps an old mtime), and a chmod, chown or
    touch moves the ctime, S3's LastModified moves with a copy onto itself. So the first time
    of each day's content (day -> [content key, time]) is kept in `arrived`, and an entry whose
    content key is unchanged keeps it: a chmod after the deadline does not make a file that
    came in time late. A new content arrives anew; a day with no entry is forgotten.
    """
    found = {}
    for day in list(arrived):
        if day not in landed:
            del arrived[day]
    for day, entry in landed.items():
        first = arrived.get(day)
        if first is not None and first[0] == entry.content_key:
            entry = dataclasses.replace(entry, modified=min(float(first[1]), entry.modified))
        arrived[day] = [entry.content_key, entry.modified]
        found[day] = entry
    return found


def day_freshness(
    contract: Contract,
    zone: LandingStore,
    instance: dg.DagsterInstance,
    now: dt.datetime,
    arrived: dict[str, list[Any]] | None = None,
) -> list[DayFreshness]:
    """The watched days of `contract` from its landing zone and Dagster's records, as of `now`.

    One look-up per watched day's expected file, whatever the size of the zone. `arrived`, the
    sensor's memory of when each day's content first was seen (`first_arrivals`), is updated.
    """
    days = watched_days(contract, now)
    landed = {}
    for day in days:
        entry = zone.find(contract.landing.file_name(day))
        if entry is not None:
            landed[day] = entry
    if arrived is not None:
        landed = first_arrivals(landed, arrived)
    records = day_records(instance, asset_key(contract.name, "validated_data"), days)
    return judge_days(contract, now, landed, records)


def how_long(delta: dt.timedelta) -> str:
    """A duration as a person says it: '2 d 3 h', '3 h 5 min', '12 min'."""
    minutes = max(0, int(delta.total_seconds() // 60))
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    if days:
        return f"{days} d {hours} h"
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


def moment(when: dt.datetime) -> str:
    """A time as alerts and the CLI write it: '2013-03-05 06:00 EST'."""
    return when.strftime("%Y-%m-%d %H:%M %Z")


def what_is_there(status: DayFreshness, location: str) -> str:
    """What the landing zone and the record hold of a day, in one clause."""
    if status.state == MISSING:
        return f"no file {status.file_name} in {location}"
    if status.state == REFUSED:
        return f"{status.file_name} is there but is never read: {status.reason}"
    if status.state == REJECTED:
        there = "is there but" if status.landed_at else "is no longer there; it"
        return f"{status.file_name} {there} was rejected ({status.reason})"
    landed = moment(status.landed_at) if status.landed_at else "?"
    if status.state == AWAITING and status.reason:
        return f"{status.file_name} landed {landed} but {status.reason}"
    if status.state == AWAITING:
        return f"{status.file_name} landed {landed} and awaits its verdict"
    return f"{status.file_name} landed {landed} and was accepted"


def status_line(status: DayFreshness, location: str) -> str:
    """One line of `ml-platform landing-status` for a late day."""
    return (
        f"{status.day}: due {moment(status.due)}, {how_long(status.overdue)} late: "
        f"{what_is_there(status, location)}"
    )


def late_alert(
    contract: Contract, status: DayFreshness, location: str, runbook: str, now: float
) -> Alert:
    """The one WARNING of a late day: what was expected, where, by when, and what is there."""
    return Alert(
        severity=WARNING,
        rule="data_late",
        title=(
            f"{contract.name}: no accepted delivery for {status.day} by {moment(status.due)} "
            f"({how_long(status.overdue)} late)"
        ),
        cause=(
            f"expected {status.file_name} (pattern {contract.landing.file_pattern}) in "
            f"{location}; {what_is_there(status, location)}"
        ),
        subject=f"{location.rstrip('/')}/{status.file_name}",
        failure_class=None,
        run_id=status.run_id,
        partition=status.day,
        run_url=None,
        runbook=runbook,
        page=True,
        occurred_at=now,
        owners=tuple(contract.owners),
        dataset=contract.name,
    )


def arrived_alert(
    contract: Contract, status: DayFreshness, location: str, runbook: str, now: float
) -> Alert:
    """The RESOLVED that follows a late day's WARNING once its delivery was accepted."""
    return Alert(
        severity=RESOLVED,
        rule="data_arrived",
        title=f"{contract.name}: the delivery of {status.day} arrived and was accepted",
        cause=f"{what_is_there(status, location)}, after its deadline {moment(status.due)}",
        subject=f"{location.rstrip('/')}/{status.file_name}",
        failure_class=None,
        run_id=status.run_id,
        partition=status.day,
        run_url=None,
        runbook=runbook,
        page=True,
        occurred_at=now,
        owners=tuple(contract.owners),
        dataset=contract.name,
    )


def freshness_observation(
    contract: Contract, status: DayFreshness, location: str
) -> dg.AssetObservation:
    """What Dagster records on raw_data's partition of a day that turned late, or fresh again."""
    fresh = status.state == FRESH
    description = (
        f"Fresh again: {what_is_there(status, location)}."
        if fresh
        else (
            f"Late: no accepted delivery for {status.day} by {moment(status.due)}: "
            f"{what_is_there(status, location)}. See docs/runbook.md#{RUNBOOK_SECTION}"
        )
    )
    return dg.AssetObservation(
        asset_key=asset_key(contract.name, "raw_data"),
        partition=status.day,
        description=description,
        metadata={
            FRESHNESS_ENTRY: FRESH if fresh else LATE,
            "state": status.state,
            "expected_file": f"{location.rstrip('/')}/{status.file_name}",
            "due": moment(status.due),
            "late_from": moment(status.late_at),
            "landed_at": moment(status.landed_at) if status.landed_at else "-",
        },
    )


def freshness_policy(contract: Contract, today: dt.date | None = None) -> dg.FreshnessPolicy | None:
    """Dagster's cron policy for raw_data: materialised between midnight and the deadline.

    The deadline is expected_by + grace each day, in the dataset's timezone; a delivery for day
    D can come once D is over, so the window opens at midnight (Dagster allows 1 minute to 24 h).
    A dataset whose last partition (`partitions.end_date`) was due before `today` (the day the
    definitions load, in its timezone) expects no more files: it has no policy, which would
    otherwise show raw_data failing its freshness every day from then on.
    """
    spec = contract.freshness
    if spec is None:
        return None
    last = contract.partitions.end_date
    today = today or dt.datetime.now(timezone_of(contract)).date()
    if last is not None and last + dt.timedelta(days=1) < today:
        return None
    start = dt.datetime.combine(dt.date(2000, 1, 1), spec.expected_time)
    deadline = start + dt.timedelta(minutes=spec.grace_minutes)
    window = deadline - dt.datetime(2000, 1, 1)
    return dg.FreshnessPolicy.cron(
        deadline_cron=f"{deadline.minute} {deadline.hour} * * *",
        lower_bound_delta=min(max(window, dt.timedelta(minutes=1)), dt.timedelta(days=1)),
        timezone=contract.event_time.timezone,
    )


def with_freshness_policy(
    assets: Sequence[dg.AssetsDefinition], contract: Contract
) -> list[dg.AssetsDefinition]:
    """`assets` with the contract's freshness policy on raw_data (unchanged without one)."""
    policy = freshness_policy(contract)
    if policy is None:
        return list(assets)
    raw = asset_key(contract.name, "raw_data")

    def apply(spec: dg.AssetSpec) -> dg.AssetSpec:
        return dg.apply_freshness_policy(spec, policy) if spec.key == raw else spec

    return list(dg.map_asset_specs(apply, assets))


@dataclasses.dataclass
class FreshnessCursor:
    """The sensor's memory: late days warned of, first arrivals, alert delivery.

    `warned`: day -> when it was warned of; `arrived`: day -> [content key, time] of the day's
    file content when first seen (`first_arrivals`).
    """

    warned: dict[str, float] = dataclasses.field(default_factory=dict)
    delivery: DeliveryState = dataclasses.field(default_factory=DeliveryState)
    arrived: dict[str, list[Any]] = dataclasses.field(default_factory=dict)

    def dumps(self) -> str:
        """For the sensor's cursor."""
        return json.dumps(
            {"warned": self.warned, "delivery": self.delivery.to_json(), "arrived": self.arrived}
        )

    @classmethod
    def loads(cls, text: str | None) -> "FreshnessCursor":
        """From the sensor's cursor (None: the first tick)."""
        data: dict[str, Any] = json.loads(text) if text else {}
        return cls(
            warned=dict(data.get("warned", {})),
            delivery=DeliveryState.from_json(data.get("delivery")),
            arrived=dict(data.get("arrived", {})),
        )


def build_freshness_sensors(
    contract: Contract, *, minimum_interval_seconds: int = 30
) -> list[dg.SensorDefinition]:
    """The dataset's freshness sensor, running by default; none without a `freshness:` section."""
    spec = contract.freshness
    if spec is None:
        return []

    @dg.sensor(
        name=dataset_name(contract.name, FRESHNESS_SENSOR),
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Alerts once per day of {contract.name} whose delivery has not arrived and been "
            "accepted by the contract's freshness deadline, and once when it has; records both "
            f"on the day of raw_data. See docs/runbook.md#{RUNBOOK_SECTION}."
        ),
    )
    def freshness_sensor(
        context: dg.SensorEvaluationContext, landing: LandingStore, notifier: Notifier
    ) -> dg.SensorResult:
        now = time.time()
        cursor = FreshnessCursor.loads(context.cursor)
        location = str(landing.path_for(""))
        runbook = notifier.runbook(RUNBOOK_SECTION)
        statuses = day_freshness(
            contract,
            landing,
            context.instance,
            dt.datetime.fromtimestamp(now, dt.UTC),
            arrived=cursor.arrived,
        )
        alerts = []
        for status in statuses:
            if status.late and status.day not in cursor.warned:
                alerts.append(late_alert(contract, status, location, runbook, now))
                cursor.warned[status.day] = now
            elif status.state == FRESH and status.day in cursor.warned:
                alerts.append(arrived_alert(contract, status, location, runbook, now))
                del cursor.warned[status.day]
            else:
                continue
            context.instance.report_runless_asset_event(
                freshness_observation(contract, status, location)
            )
        watched = {status.day for status in statuses}
        for day in sorted(set(cursor.warned) - watched):
            context.log.info(f"{day} is no longer watched (past {spec.lookback_days} day(s))")
            del cursor.warned[day]
        cursor.delivery = notifier.deliver(alerts, cursor.delivery, context.log, now=now)
        late = [s.day for s in statuses if s.late]
        summary = (
            f"{len(statuses)} day(s) watched, {len(late)} late"
            + (f" ({', '.join(late)})" if late else "")
            + f"; {len(alerts)} alert(s) raised"
        )
        return dg.SensorResult(cursor=cursor.dumps(), skip_reason=summary)

    return [freshness_sensor]
