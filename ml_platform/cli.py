"""`ml-platform`: land and materialise days, check contracts, diagnose and reproduce failures."""

import argparse
import contextlib
import datetime as dt
import math
import os
import shutil
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ml_platform.contracts import (
    Contract,
    ContractError,
    DatasetChoiceError,
    choose,
    load_contract,
    load_contracts,
)
from ml_platform.ingestion.synthetic import BYTE_FAULTS, FAULTS, Drift
from ml_platform.platform.settings import Location, Settings, SettingsError

if TYPE_CHECKING:
    import dagster as dg

    from ml_platform.automation.launch import Webserver
    from ml_platform.replay.replays import Replay

# The exit code of a command whose days' data was rejected (a data verdict), no run failing.
REJECTED_EXIT = 3
R = TypeVar("R")
DATASET_HELP = (
    "the dataset's name, or a contract file; default: the only dataset of the code location "
    "(ML_PLATFORM_CONTRACTS, narrowed by ML_PLATFORM_DATASET)"
)


def _date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a YYYY-MM-DD date: {text!r}") from exc


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from exc
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, not {value}")
    return value


def _count(text: str) -> int:
    """A number of days or rows: a whole number of at least one."""
    return _whole(text, 1)


def _lines(text: str) -> int:
    """A number of log lines to show: a whole number, zero or more."""
    return _whole(text, 0)


def _span(text: str) -> float:
    """A look-back in days: a number above zero."""
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    try:
        # The look-back's first instant must be a date (year 1 or later): `inf` or 1e9 days
        # would fail deep in the instance's query instead.
        dt.datetime.now(dt.UTC) - dt.timedelta(days=value)
    except OverflowError:
        raise argparse.ArgumentTypeError(
            f"must reach back no further than the year 1, not {text} days"
        ) from None
    return value


def _days(start: dt.date, count: int) -> list[dt.date]:
    return [start + dt.timedelta(days=i) for i in range(count)]


def _past_the_calendar(args: argparse.Namespace) -> str | None:
    """Why `--start` and `--days` name days no date can hold; None if they can all be dated.

    Each type is checked alone: only together do they run past 9999-12-31, and every command
    would then stop on an OverflowError traceback.
    """
    start, count = getattr(args, "start", None), getattr(args, "days", None)
    if not isinstance(start, dt.date) or not isinstance(count, int):
        return None
    if (dt.date.max - start).days >= count - 1:
        return None
    return (
        f"argument --days: {count} day(s) from {start} run past {dt.date.max}, the last day a "
        "date can be"
    )


@contextlib.contextmanager
def configured(resource: R) -> Iterator[R]:
    """`resource` with its `EnvVar` fields resolved, for a command that runs outside a run.

    Through `build_resources`, which closes what it opened when the block ends:
    `process_config_and_initialize` leaves an ephemeral instance entered until it is garbage
    collected, and Dagster later loads definitions against that instance's storage.
    """
    import dagster as dg

    with dg.build_resources({"resource": resource}) as resources:
        yield resources.resource


class InstanceError(Exception):
    """The Dagster instance of DAGSTER_HOME cannot be opened; `code` is the command's exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def home_instance() -> Iterator["dg.DagsterInstance"]:
    """The Dagster instance of DAGSTER_HOME, or an `InstanceError` saying why it cannot open.

    Dagster raises what its parts raise (YAML's, its config's, the storage driver's); the user
    needs which instance, and whether to fix its configuration (exit 2: no DAGSTER_HOME, a
    dagster.yaml that does not parse or configures what is not installed) or its storage
    (exit 1: a database that does not answer, which may come back).
    """
    import dagster as dg
    from sqlalchemy.exc import OperationalError

    home = Settings().dagster_home
    if not home:
        raise InstanceError(
            "DAGSTER_HOME is not set: set it to the directory of the Dagster instance the "
            "webserver and daemon use (where its dagster.yaml is)",
            2,
        )
    try:
        opened = dg.DagsterInstance.get()
    except StopRequested:
        raise
    except Exception as exc:
        # A database that refused the connection (after Dagster's own retries) is the one
        # failure here a restart of the storage mends; any other is in the configuration.
        chain: BaseException | None = exc
        while chain is not None and not isinstance(chain, OperationalError):
            chain = chain.__cause__ or chain.__context__
        code = 1 if chain is not None else 2
        fix = (
            "set DAGSTER_HOME to the instance the webserver and daemon use, or fix its dagster.yaml"
            if code == 2
            else "is the storage its dagster.yaml names up and reachable from here?"
        )
        raise InstanceError(
            f"the Dagster instance at {home} cannot be opened ({type(exc).__name__}: {exc}): {fix}",
            code,
        ) from exc
    with opened as instance:
        yield instance


def _landing_dir(args: argparse.Namespace, settings: Settings) -> str:
    """`--landing-dir`, else the settings' local landing directory.

    None set, or an S3 one, is a `SettingsError`: a configuration error (exit 2), as `main` says.
    """
    if args.landing_dir:
        return str(args.landing_dir)
    return settings.landing.local_dir()


def dataset_of(args: argparse.Namespace, settings: Settings) -> Contract:
    """The dataset a command acts on: `--dataset` (a name or a contract file), else the only one.

    Names are those of the code location's contracts (ML_PLATFORM_CONTRACTS, narrowed by
    ML_PLATFORM_DATASET); several and no `--dataset` is an error listing them.
    """
    name = args.dataset
    if name and Path(name).suffix in {".yaml", ".yml"}:
        return load_contract(name)
    return choose(load_contracts(settings.contracts_dir, settings.dataset), name)


def _land_refusal(args: argparse.Namespace, contract: Contract, days: list[dt.date]) -> str | None:
    """Why `land`'s switches cannot do what they say for these days; None if they can.

    Each would otherwise be a traceback half-way (a source the platform cannot generate) or,
    worse, good files landed in silence where the user asked for damaged or drifted ones.
    """
    kind = contract.source.kind
    if kind == "external":
        return (
            f"{contract.name} is delivered by an external system (its contract's source: "
            "external): the platform cannot generate its days; copy its files into the "
            "landing zone as upstream delivers them"
        )
    switches = [
        name
        for name, given in (
            ("--drift-feature", args.drift_feature),
            ("--drift-from", args.drift_from),
            ("--fault", args.fault),
            ("--fault-day", args.fault_day),
        )
        if given
    ]
    if switches and kind != "synthetic":
        return (
            f"{', '.join(switches)}: switches of the synthetic dataset only, not of {contract.name}"
        )
    if args.drift_from and not args.drift_feature:
        return "--drift-from is the first day --drift-feature drifts: name the feature"
    if args.drift_feature and not math.isfinite(args.drift_sd):
        return f"--drift-sd must be a finite number of standard deviations, not {args.drift_sd}"
    if args.fault_day and not args.fault:
        return "--fault-day names the days --fault damages: choose the fault with --fault"
    if stray := sorted(set(args.fault_day or ()) - set(days)):
        return (
            f"--fault-day {', '.join(d.isoformat() for d in stray)} is no day landed "
            f"({days[0]} to {days[-1]}): it would damage nothing"
        )
    return None


def land(args: argparse.Namespace) -> int:
    """Write day files into the landing zone as an upstream system would."""
    from ml_platform.ingestion.landing import LandingZone, land_days

    settings = Settings()
    contract = dataset_of(args, settings)
    zone = LandingZone(base_dir=_landing_dir(args, settings))
    days = _days(args.start, args.days)
    if (refused := _land_refusal(args, contract, days)) is not None:
        print(f"error: {refused}; nothing landed", file=sys.stderr)
        return 2
    drift = None
    if args.drift_feature:
        try:
            drift = Drift(args.drift_feature, args.drift_sd, args.drift_from or args.start)
        except ValueError as exc:  # a feature the synthetic source has no drift for
            print(f"error: --drift-feature: {exc}; nothing landed", file=sys.stderr)
            return 2
    fault_days = set(args.fault_day) if args.fault_day else None
    # A day before the partitions' start or after their end is never read: its file would be
    # alerted as a misfit (the source has no rows for it, so it would be empty besides). A day
    # that has not ended yet may land early, as upstream delivers it.
    start, end = contract.partitions.start_date, contract.partitions.end_date
    never = [d.isoformat() for d in days if d < start or (end is not None and d > end)]
    if never:
        last = f" to {end}" if end is not None else " on"
        print(
            f"error: {', '.join(never[:3])}{' ...' if len(never) > 3 else ''} "
            f"({len(never)} of {len(days)} day(s)) are no days of {contract.name}, whose "
            f"partitions run from {start}{last}; nothing landed",
            file=sys.stderr,
        )
        return 2
    print(f"landing {len(days)} day(s) of {contract.name} into {zone.base_dir}", flush=True)
    for _ in land_days(
        contract,
        zone,
        days,
        drift=drift,
        fault=args.fault,
        fault_days=fault_days,
        progress=lambda m: print(m, flush=True),
    ):
        pass
    return 0


def landing_status(args: argparse.Namespace) -> int:
    """Map landed files to days; name misfits, refused entries and late days, with the reason.

    Refused: links, non-regular files and unsafe S3 keys, which nothing reads. Files named for
    another dataset of the code location are left to it. The zone is the
    code location's (a directory, or the S3 prefix of ML_PLATFORM_LANDING_URL) unless
    --landing-dir names a directory. With a `freshness:` section, the days whose delivery has
    not arrived and been accepted by the deadline are listed from the instance's records.
    """
    from ml_platform.ingestion.landing import LandingZoneMissingError, own_files, scan_landing
    from ml_platform.ingestion.zones import landing_store

    settings = Settings()
    contract = dataset_of(args, settings)
    served = load_contracts(settings.contracts_dir, settings.dataset)
    location = settings.landing
    if location.kind == "local" or args.landing_dir:
        location = Location.directory(_landing_dir(args, settings))
    source = landing_store(location, settings)
    with configured(source) as zone:
        try:
            entries = zone.entries()
        except LandingZoneMissingError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        refused = {e.name: e.refused for e in entries if e.refused is not None}
        readable = [e.name for e in entries if e.refused is None]
        # Files of the other datasets of the code location are theirs, not misfits of this one.
        scan = scan_landing(contract, own_files(contract, readable, served))
        days = sorted(scan.days)
        span = f" ({days[0]} to {days[-1]})" if days else ""
        print(f"{zone.path_for('')}: {len(days)} day file(s) of {contract.name}{span}")
        for name, reason in scan.problems.items():
            print(
                f"error: {zone.path_for(name)} belongs to no partition: {reason}", file=sys.stderr
            )
        for name, reason in refused.items():
            print(f"error: {zone.path_for(name)} is refused: {reason}", file=sys.stderr)
        late: list[str] = []
        if contract.freshness is not None:
            from ml_platform.automation.freshness import day_freshness, status_line, watched_days

            now = dt.datetime.now(dt.UTC)
            statuses = []
            # Days past the dataset's last partition, or long ago, need no instance to judge.
            if watched_days(contract, now):
                with home_instance() as instance:
                    statuses = day_freshness(contract, zone, instance, now)
            late = [status_line(s, str(zone.path_for(""))) for s in statuses if s.late]
            print(f"{len(late)} late day(s) (docs/runbook.md#data-did-not-arrive)")
            for line in late:
                print(f"late: {line}")
    return 1 if scan.problems or refused or late else 0


def day_outcome(instance: "dg.DagsterInstance", run_id: str, dataset: str) -> tuple[str, bool]:
    """What a successful day's run did, and whether the day's data was rejected.

    `promoted`, `kept champion (challenger)` or `rejected: <reason>` (a rejected candidate,
    an outcome of an accepted day) as registered_model recorded it; or, for a day an asset
    rejected, `REJECTED by <asset>: <verdict>: <reason>`. Read from the run's materialisations
    in the instance, whoever executed the run.
    """
    import dagster as dg

    from ml_platform.platform.datasets import asset_key
    from ml_platform.platform.records import ACCEPTED, UNCHANGED
    from ml_platform.platform.rejected import DAY_ASSETS, first_sentence

    records = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
    ).records
    metadata = {
        m.asset_key: m.metadata
        for m in (r.event_log_entry.asset_materialization for r in records)
        if m is not None
    }
    for name in DAY_ASSETS:
        meta = metadata.get(asset_key(dataset, name), {})
        verdict = meta.get("verdict")
        if verdict is not None and verdict.value not in (ACCEPTED, UNCHANGED):
            reason = meta.get("reason")
            text = first_sentence(str(reason.value) if reason else "")
            kept = meta.get("kept_previous_version") is not None
            where = f"{name} (earlier accepted version kept)" if kept else name
            return f"REJECTED by {where}: {verdict.value}: {text}", True
    outcome = metadata.get(asset_key(dataset, "registered_model"), {}).get("outcome")
    if outcome is not None:
        return str(outcome.value), False
    return "materialised", False


def run_errors(instance: "dg.DagsterInstance", run_id: str) -> list[str]:
    """Each failed step of a finished run and the first line of its error."""
    from ml_platform.platform.run_events import run_outcome

    outcome = run_outcome(instance, run_id, succeeded=False)
    if outcome is None:
        return []
    errors = []
    for failure in outcome.step_failures:
        message = failure.message.strip()
        first = next((line for line in message.splitlines() if line.strip()), message)
        errors.append(f"{failure.step}: {first.strip()}")
    if not errors and outcome.run_message:
        errors.append(outcome.run_message.strip().splitlines()[0])
    return errors


class StopRequested(Exception):
    """SIGINT or SIGTERM arrived."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into StopRequested for the whole command.

    The command only launches runs and watches them; their steps execute in run workers, so a
    signal can stop the command at any point and the command then terminates its run.
    """
    if threading.current_thread() is not threading.main_thread():
        # Only the main thread can take signals: a caller's thread leaves them to the caller.
        yield
        return

    def stop(signum: int, frame: types.FrameType | None) -> None:
        raise StopRequested(signum)

    previous = {n: signal.signal(n, stop) for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# How often the command looks at the run it follows, and at the daemon while the run is queued.
POLL_SECONDS = 0.5
QUEUE_CHECK_SECONDS = 30.0
# How long a launched run may take to appear in DAGSTER_HOME's instance.
APPEAR_SECONDS = 30.0
# How long a terminated run may take to be recorded as ended.
TERMINATE_SECONDS = 120.0


def follow(
    instance: "dg.DagsterInstance", webserver: "Webserver", run_id: str, own: bool = True
) -> "dg.DagsterRun":
    """Wait for a run to end; the run as the instance recorded it.

    A run that the webserver launched but this instance never sees means the two are not the
    same instance; a run left queued with no daemon to take it is canceled if it is the
    command's `own`, not waited on forever. Either is a `LaunchError`.
    """
    import dagster as dg

    from ml_platform.automation.launch import FINISHED, LaunchError

    launched = time.monotonic()
    checked = launched
    while True:
        run = instance.get_run_by_id(run_id)
        now = time.monotonic()
        if run is None:
            if now - launched > APPEAR_SECONDS:
                raise LaunchError(
                    f"the webserver at {webserver.url} launched run {run_id}, but the instance of "
                    "DAGSTER_HOME has no such run: the command and the webserver must share one "
                    "instance (DAGSTER_HOME)"
                )
        elif run.status in FINISHED:
            return run
        elif run.status == dg.DagsterRunStatus.QUEUED and now - checked > QUEUE_CHECK_SECONDS:
            checked = now
            try:
                webserver.check_queue()
            except LaunchError as problem:
                if not own:
                    # Another's run (a sensor's, another terminal's) is not ours to cancel.
                    raise LaunchError(f"{problem}. Run {run_id} is still queued") from problem
                # The problem is what the user must fix; whether the run left the queue is
                # said beside it, never in its place.
                try:
                    withdraw(instance, webserver, run_id)
                except LaunchError as kept:
                    raise LaunchError(f"{problem}. Run {run_id} is still queued: {kept}") from kept
                raise LaunchError(f"{problem}. Run {run_id} was canceled") from problem
        time.sleep(POLL_SECONDS)


def withdraw(instance: "dg.DagsterInstance", webserver: "Webserver", run_id: str) -> None:
    """Terminate the command's run through the webserver, or cancel it from the queue.

    A webserver that no longer answers cannot terminate anything; a run still queued is then
    canceled by the instance's own run coordinator, as the webserver would have done. Raises
    `LaunchError` if neither could.
    """
    import dagster as dg

    from ml_platform.automation.launch import LaunchError

    try:
        webserver.terminate(run_id)
    except LaunchError:
        run = instance.get_run_by_id(run_id)
        queued = run is not None and run.status == dg.DagsterRunStatus.QUEUED
        if not (queued and instance.run_coordinator.cancel_run(run_id)):
            raise


def terminated(instance: "dg.DagsterInstance", webserver: "Webserver", run_id: str) -> str:
    """Terminate the command's run and wait until it is recorded ended; its status, in words."""
    from ml_platform.automation.launch import FINISHED, LaunchError

    try:
        withdraw(instance, webserver, run_id)
    except LaunchError as exc:
        return f"not terminated: {exc}"
    deadline = time.monotonic() + TERMINATE_SECONDS
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.status in FINISHED:
            return f"terminated, recorded {run.status.value}"
        time.sleep(POLL_SECONDS)
    return f"terminated, not recorded ended after {TERMINATE_SECONDS:.0f}s: see it in the UI (Runs)"


def outside_partitions(contract: Contract, days: list[str]) -> str | None:
    """Which of `days` are no partitions of the dataset, and which days are; None if all are.

    Asked before anything else: no run can do such a day, whatever webserver or daemon answers.
    """
    from ml_platform.platform.partitions import daily_partitions

    partitions = daily_partitions(contract)
    outside = [day for day in days if not partitions.has_partition_key(day)]
    if not outside:
        return None
    first, last = partitions.get_first_partition_key(), partitions.get_last_partition_key()
    # The days are consecutive and so are the partitions: the misfits lie before, after, or both.
    before = [day for day in outside if first is not None and day < first]
    groups = [g for g in (before, outside[len(before) :]) if g]
    shown = ", ".join(g[0] if len(g) == 1 else f"{g[0]} to {g[-1]}" for g in groups)
    if first is None:
        span = f"whose first day, {contract.partitions.start_date}, has not ended yet"
    else:
        span = f"whose days run from {first} to {last}"
    ends = (
        ""
        if contract.partitions.end_date is not None
        else f"; a day is one once it has ended ({contract.event_time.timezone})"
    )
    return (
        f"{shown} ({len(outside)} of {len(days)} day(s)) are no partitions of {contract.name}, "
        f"{span} (its contract's partitions:){ends}"
    )


def launched_by(run: "dg.DagsterRun") -> str:
    """Who launched a run, in words: its sensor or schedule, else the UI or a command."""
    for tag, what in (("dagster/sensor_name", "sensor"), ("dagster/schedule_name", "schedule")):
        if tag in run.tags:
            return f"launched by the {what} {run.tags[tag]}"
    return "launched from the UI or another command"


def materialize(args: argparse.Namespace) -> int:
    """Launch the daily job's run of each day through the instance, one day after the other.

    Each day is a run of the dataset's daily job launched through the Dagster webserver
    (`ML_PLATFORM_DAGSTER_URL`), as the UI's Materialize launches it: it waits in the
    instance's queue while another run writes its assets (dagster.yaml), and a run worker
    started by the run launcher executes it. The command launches a day once the day before
    has ended, so the days run in date order, as the chain of the registry needs.

    One line a day says what the day did to the registry: `promoted`, `kept champion
    (challenger)` or `rejected: <reason>` (a rejected candidate is an outcome, not a failure),
    or that the day's data was rejected (`REJECTED by <asset>: <verdict>: <reason>`). Days
    already accepted are skipped unless `--force`; a rejected day is not done, so it runs again.
    A day whose run is already queued or running (the landing sensor's, another `materialize`'s)
    is not launched again unless `--force`: the command follows that run and reports it as its
    own, except that a signal leaves it to go on.
    Exit codes: 0 every day accepted; 3 some day's data rejected (a data verdict) and no run
    failed; 1 some day's run failed (a software or infrastructure failure), or no webserver or
    daemon to run it; 2 a day that is no partition of the dataset (nothing launched). Ctrl-C
    (SIGINT) or SIGTERM terminates the day's run, no later day runs, and the exit code is 130
    or 143 (128 + the signal's number), as shells expect. A command killed
    outright (SIGKILL) leaves its run to the instance: the run goes on, or run monitoring
    records it failed.
    """
    import dagster as dg

    from ml_platform.automation.jobs import day_run_tags, day_runs_in_flight
    from ml_platform.automation.launch import LaunchError, Webserver
    from ml_platform.definitions import DAILY_JOB
    from ml_platform.platform.datasets import asset_key, dataset_name
    from ml_platform.platform.records import done_days
    from ml_platform.platform.rejected import rerun_command

    settings = Settings()
    contract = dataset_of(args, settings)
    job = dataset_name(contract.name, DAILY_JOB)
    webserver = Webserver(settings.dagster_url)
    days = [d.isoformat() for d in _days(args.start, args.days)]
    outside = outside_partitions(contract, days)
    if outside is not None:
        print(f"error: {outside}; nothing launched", file=sys.stderr)
        return 2
    failed = []
    rejected = []
    with stop_signals(), home_instance() as instance:

        def done(among: list[str]) -> set[str]:
            # A day is done once its last stages accepted it: a multi-run backfill materialises
            # the evaluation, the registry and the champion's monitoring in separate runs, and
            # a rejected day (recorded, but not accepted) is not done.
            return set.intersection(
                *(
                    done_days(instance, asset_key(contract.name, name), among)
                    for name in ("evaluation_report", "registered_model", "champion_performance")
                )
            )

        i, prefix = 0, ""
        run_id: str | None = None  # the run of the day in progress
        own = True  # whether the command launched it
        finished: str | None = None  # the last day whose run ended
        try:
            already = done(days)
            if args.force or set(days) - already:
                webserver.wait_until_up(args.wait)
            for i, day in enumerate(days, start=1):
                prefix = f"[{i:>{len(str(len(days)))}}/{len(days)}] {day}"
                if day in already and not args.force:
                    print(f"{prefix} already materialised (use --force to rerun)", flush=True)
                    continue
                started = time.perf_counter()
                # A second run of the day would wait for this one in the queue, then compute
                # the same day again.
                in_flight = [] if args.force else day_runs_in_flight(instance, contract.name, day)
                own = not in_flight
                if own:
                    tags = {"dagster/partition": day, **day_run_tags(contract.name, day)}
                    run_id = webserver.launch(job, tags)
                else:
                    run_id = in_flight[0].run_id  # the newest: it ends after any earlier one
                    print(
                        f"{prefix} following run {run_id} ({launched_by(in_flight[0])}), "
                        "already queued or running; --force launches another after it",
                        flush=True,
                    )
                run = follow(instance, webserver, run_id, own=own)
                seconds = time.perf_counter() - started
                finished, run_id = day, None
                if run.status != dg.DagsterRunStatus.SUCCESS:
                    # Later days may still succeed (a bad day does not spoil tomorrow's data),
                    # so go on and report every failed day at the end.
                    failed.append(day)
                    errors = "; ".join(run_errors(instance, run.run_id)) or run.status.value
                    print(
                        f"{prefix} FAILED in {seconds:.1f}s: {errors} (run {run.run_id}; open it "
                        "in the Dagster UI, Runs, or `ml-platform diagnose RUN_ID`)",
                        file=sys.stderr,
                        flush=True,
                    )
                    continue
                outcome, was_rejected = day_outcome(instance, run.run_id, contract.name)
                if was_rejected:
                    rejected.append(day)
                print(f"{prefix} {outcome} ({seconds:.1f}s, run {run.run_id[:8]})", flush=True)
        except StopRequested as stop:
            if run_id is not None and not own:
                print(
                    f"{prefix} stopped by {stop}: run {run_id}, not launched by this command, "
                    f"goes on; {len(days) - i} later day(s) not run",
                    file=sys.stderr,
                    flush=True,
                )
            elif run_id is not None:
                status = terminated(instance, webserver, run_id)
                print(
                    f"{prefix} stopped by {stop}: run {run_id} {status}; "
                    f"{len(days) - i} later day(s) not run",
                    file=sys.stderr,
                    flush=True,
                )
            else:
                after = f"after {finished}" if finished else "before the first day"
                print(
                    f"stopped by {stop} between runs ({after}); no run was cut short",
                    file=sys.stderr,
                )
            return 128 + stop.signum
        except LaunchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    if rejected:
        print(
            f"{len(rejected)} of {len(days)} day(s) rejected: {', '.join(rejected)}; once their "
            f"files are corrected: {rerun_command(contract.name, rejected)}",
            file=sys.stderr,
        )
    if failed:
        print(f"{len(failed)} of {len(days)} day(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return REJECTED_EXIT if rejected else 0


# How often `ml-platform replay` looks at its backfill.
BACKFILL_POLL_SECONDS = 5.0
REPLAY_ACTIONS = ("promote", "remove", "list")


def replay(args: argparse.Namespace) -> int:
    """`replay CONTRACT`, `replay promote NAME`, `replay remove NAME`, `replay list`."""
    from ml_platform.replay.replays import ReplayError

    try:
        if args.what == "list":
            if args.replay_name:
                raise ReplayError(
                    f"`ml-platform replay list` lists every replay, not '{args.replay_name}'"
                )
            return replay_list(args)
        if args.what in REPLAY_ACTIONS:
            if not args.replay_name:
                raise ReplayError(f"`ml-platform replay {args.what} NAME`: name the replay")
            return replay_promote(args) if args.what == "promote" else replay_remove(args)
        if args.replay_name:
            # The parser takes a second word for promote and remove; after a contract it would
            # be dropped, and the replay named after the file instead.
            raise ReplayError(
                f"`ml-platform replay {args.what} {args.replay_name}`: '{args.what}' is taken as "
                f"the changed contract (not one of {', '.join(REPLAY_ACTIONS)}); name the replay "
                f"with --name {args.replay_name}"
            )
        return replay_run(args)
    except ReplayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _replays_root(settings: Settings) -> str:
    from ml_platform.replay.replays import ReplayError

    root = settings.replays_dir
    if root is None:
        raise ReplayError(
            "no replays directory: set ML_PLATFORM_REPLAYS_DIR (or DAGSTER_HOME) to the same "
            "value the code location runs with"
        )
    return root


def _left_behind(settings: Settings, contracts: list[Contract]) -> Callable[[str], list[str]]:
    """What a replay dataset has in the instance, the lake and MLflow (`lifecycle.left_behind`)."""
    from ml_platform.definitions import build_definitions
    from ml_platform.replay.lifecycle import left_behind
    from ml_platform.replay.replays import ReplayError

    def left(dataset: str) -> list[str]:
        if settings.dagster_home is None:
            raise ReplayError(
                "DAGSTER_HOME is not set: the instance whose records a replay leaves cannot be "
                "read; set it as the webserver's"
            )
        resources = build_definitions(contracts, settings).resources or {}
        with home_instance() as instance:
            return left_behind(dataset, instance, resources["lake"], resources["mlflow"])

    return left


def _live_file(settings: Settings, live: str) -> Path:
    """The file of the live contract `live` the settings serve (a replay's `promote` writes it).

    ML_PLATFORM_DATASET's, when it is a contract file's path (`load_contracts` serves it alone).
    """
    from ml_platform.contracts.catalog import contract_file

    if settings.dataset and Path(settings.dataset).suffix in {".yaml", ".yml"}:
        return Path(settings.dataset)
    return contract_file(settings.contracts_dir, live)


def _kept_replay(
    args: argparse.Namespace, settings: Settings, contracts: list[Contract]
) -> "Replay":
    """Keep the replay of `args`; one the code location would not load with is not kept.

    Nor is one whose name an earlier replay's records, lake files or MLflow entries still carry.
    """
    from ml_platform.definitions import build_definitions
    from ml_platform.replay.replays import ReplayError, create_replay, load_replays

    live = choose(contracts, load_contract(args.what).name)
    name = args.name or "".join(c if c.isalnum() else "_" for c in Path(args.what).stem.lower())
    root = _replays_root(settings)
    left = _left_behind(settings, contracts)
    made = create_replay(
        root,
        args.what,
        live,
        name,
        args.start,
        args.days,
        left_behind=left,
        live_file=_live_file(settings, live.name),
    )
    try:
        # The code location serves the replay beside the live datasets: it must still load.
        build_definitions(contracts, settings, replays=load_replays(made.folder.parent, contracts))
    except Exception as exc:
        shutil.rmtree(made.folder)
        raise ReplayError(
            f"the code location does not load with replay '{made.name}': {exc}; not kept"
        ) from exc
    print(f"replay '{made.name}' of {live.name}: dataset {made.dataset}, kept in {made.folder}")
    return made


def _compared(webserver: "Webserver", run_id: str, key: "dg.AssetKey") -> dict | None:
    """The metadata of the comparison run `run_id` made; None (the error printed) if it failed."""
    import dagster as dg

    with home_instance() as instance:
        run = follow(instance, webserver, run_id)
        if run.status != dg.DagsterRunStatus.SUCCESS:
            errors = "; ".join(run_errors(instance, run_id)) or run.status.value
            print(f"error: the comparison failed: {errors} (run {run_id})", file=sys.stderr)
            return None
        event = instance.get_latest_materialization_event(key)
    recorded = event.asset_materialization if event else None
    return dict(recorded.metadata) if recorded else {}


def replay_run(args: argparse.Namespace) -> int:
    """Run a changed contract over past days as a replay, then compare it with the live chain.

    The replay is kept in the replays directory, the webserver loads it (its assets appear in
    the UI as their own dataset), its days run as one backfill through the daemon, as the UI's
    Materialize of a range, and its `replay_comparison` is materialised once that ends. Prints
    the comparison's summary and where the whole of it is. Ctrl-C or SIGTERM stops the command;
    a backfill it launched goes on in the daemon.
    """
    from ml_platform.automation.launch import BACKFILL_DONE, LaunchError, Webserver
    from ml_platform.platform.datasets import asset_key, dataset_name
    from ml_platform.replay.assets import REPLAY_COMPARISON, REPLAY_COMPARISON_JOB
    from ml_platform.replay.replays import ReplayError

    if args.start is None:
        raise ReplayError("`ml-platform replay CONTRACT --start DAY --days N`: give the first day")
    settings = Settings()
    contracts = load_contracts(settings.contracts_dir, settings.dataset)
    webserver = Webserver(settings.dagster_url)
    backfill_id = None
    try:
        with stop_signals():
            webserver.wait_until_up(args.wait)
            made = _kept_replay(args, settings, contracts)
            webserver.reload_workspace()
            with home_instance() as instance:
                # The weekly full retrains the live chain's registry judged on these days: the
                # replay's champions meet the same kinds of candidates.
                weekly = made.live_weekly_days(instance)
            ranges = made.backfill_ranges(weekly)
            backfill_id = webserver.backfill(
                {asset_key(made.dataset, name): days for name, days in ranges.items()}
            )
            warm_up = made.warm_up_days(weekly)
            print(
                f"backfill {backfill_id}: {made.days} day(s) from {made.start}"
                + (f", their data from {warm_up[0]}" if warm_up else "")
                + (f", the weekly retrains of {', '.join(weekly)}" if weekly else ""),
                flush=True,
            )
            status = webserver.backfill_status(backfill_id)
            while status not in BACKFILL_DONE:
                time.sleep(BACKFILL_POLL_SECONDS)
                status = webserver.backfill_status(backfill_id)
            print(f"backfill {backfill_id}: {status}", flush=True)
            run_id = webserver.launch(dataset_name(made.dataset, REPLAY_COMPARISON_JOB), {})
            key = asset_key(made.dataset, REPLAY_COMPARISON)
            metadata = _compared(webserver, run_id, key)
            if metadata is None:
                return 1
    except StopRequested as stop:
        going = f"backfill {backfill_id} goes on (the UI's Backfills can cancel it)"
        print(f"stopped by {stop}; {going if backfill_id else 'nothing launched'}", file=sys.stderr)
        return 128 + stop.signum
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(str(metadata["summary"].value))
    print(f"the whole comparison: {metadata['path'].value} (in the UI: {key.to_user_string()})")
    return 0 if status == "COMPLETED_SUCCESS" else 1


def replay_list(args: argparse.Namespace) -> int:
    """The replays the code location serves."""
    from ml_platform.replay.replays import load_replays

    settings = Settings()
    contracts = load_contracts(settings.contracts_dir, settings.dataset)
    found = load_replays(_replays_root(settings), contracts)
    for r in found:
        print(f"{r.name}: {r.dataset}, {r.days} day(s) from {r.start}, contract {r.contract_file}")
    if not found:
        print("no replays")
    return 0


def replay_promote(args: argparse.Namespace) -> int:
    """Make a replay's contract the live dataset's contract file."""
    from ml_platform.replay.lifecycle import promote_replay
    from ml_platform.replay.replays import find_replay

    settings = Settings()
    contracts = load_contracts(settings.contracts_dir, settings.dataset)
    found = find_replay(_replays_root(settings), args.replay_name, contracts)
    target = promote_replay(found, _live_file(settings, found.live))
    print(
        f"{target} is now replay '{found.name}''s contract: review and commit it; {found.live} "
        "runs it from its next day (its champion moves only by the registry's rule)"
    )
    return 0


def replay_remove(args: argparse.Namespace) -> int:
    """Remove a replay: its records, lake files, MLflow entries and its folder."""
    from ml_platform.automation.launch import LaunchError, Webserver
    from ml_platform.definitions import defs
    from ml_platform.replay.lifecycle import remove_replay
    from ml_platform.replay.replays import find_replay

    settings = Settings()
    contracts = load_contracts(settings.contracts_dir, settings.dataset)
    # A replay whose folder was deleted by hand is found by what it left.
    left = _left_behind(settings, contracts)
    found = find_replay(_replays_root(settings), args.replay_name, contracts, left_behind=left)
    definitions = defs()
    keys = [
        key
        for key in definitions.resolve_asset_graph().get_all_asset_keys()
        if key.path[0] == found.dataset
    ]
    resources = definitions.resources or {}
    with home_instance() as instance:
        removed = remove_replay(found, instance, keys, resources["lake"], resources["mlflow"])
    print(
        f"removed replay '{found.name}': records of {removed.assets} asset(s), "
        f"{removed.lake_objects} lake object(s), its MLflow experiment and registered model"
    )
    try:
        Webserver(settings.dagster_url).reload_workspace()
    except LaunchError as exc:
        print(f"the UI still lists it until the code location reloads ({exc})", file=sys.stderr)
    return 0


def rejected(args: argparse.Namespace) -> int:
    """List the dataset's rejected days (where, verdict, reason) and the command to rerun them.

    Exit code 0 when no day is rejected, 3 otherwise (as `materialize`).
    """
    from ml_platform.platform.partitions import daily_partitions
    from ml_platform.platform.rejected import rejected_days, rerun_command

    settings = Settings()
    contract = dataset_of(args, settings)
    if args.start is not None:
        days = [d.isoformat() for d in _days(args.start, args.days or 1)]
        # No run records a verdict on a day that is no partition: "none rejected" would
        # pass for a look at days never checked (a mistyped year).
        if (outside := outside_partitions(contract, days)) is not None:
            print(f"error: {outside}", file=sys.stderr)
            return 2
    else:
        days = list(daily_partitions(contract).get_partition_keys())
        days = days[-args.days :] if args.days else days
    with home_instance() as instance:
        found = rejected_days(instance, contract.name, days)
    if not found:
        print(f"{contract.name}: no rejected day among {len(days)} day(s)")
        return 0
    print(f"{contract.name}: {len(found)} rejected day(s)")
    for day in found:
        print(f"  {day.line()}")
    print(f"once their files are corrected: {rerun_command(contract.name, [d.day for d in found])}")
    return REJECTED_EXIT


def score(args: argparse.Namespace) -> int:
    """Score a file of rows with a registered model, to see the model is real."""
    from ml_platform.contracts.schema import type_rows
    from ml_platform.features.transforms import build_features
    from ml_platform.ingestion.assets import read_landed_file
    from ml_platform.platform.locations import lake_storage
    from ml_platform.platform.storage import write_file_atomically
    from ml_platform.platform.tracking import MlflowStores
    from ml_platform.registry.chain import unfed
    from ml_platform.registry.store import ModelRegistry, RegistryError

    settings = Settings()
    contract = dataset_of(args, settings)
    # The code location's lake, a directory or S3; resolving it fails naming a missing variable.
    stores = MlflowStores(lake=lake_storage(settings.lake, settings), **settings.mlflow_config)
    with configured(stores) as resolved:
        registry = ModelRegistry(resolved, contract.name)
        alias = args.alias or "champion"
        version = args.version or registry.alias(alias)
        if version is None:
            raise SystemExit(f"error: alias '{alias}' points to no version yet")
        try:
            # Only a whole version loads: one whose registration never finished is refused.
            model = registry.load(version)
            number = registry.model_version(version).version
            served_as = f"models:/{contract.name}/{number}"
        except RegistryError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if found := unfed(model, contract):
        # The same contract change that stops registered_model and champion_performance.
        print(
            f"error: {version} cannot be scored under the contract of '{contract.name}': "
            f"{'; '.join(found)}. Score with a version trained under it (--version), or see "
            "docs/runbook.md, Configuration",
            file=sys.stderr,
        )
        return 2
    # Read as raw_data reads a day: ids above 2**53 keep every digit, NFD headers match.
    raw = read_landed_file(
        args.file.read_bytes(),
        args.file.name,
        "scoring",
        text_columns=[c.name for c in contract.columns if c.dtype == "str"],
        int_columns=[c.name for c in contract.columns if c.dtype == "int"],
        declared=contract.column_names,
    )
    features = build_features(type_rows(raw, contract, where=str(args.file)), contract)
    scored = raw.assign(prediction=model.predict(features).to_numpy())
    if contract.task == "classification":
        scored["probability"] = model.score(features).to_numpy()
    output = args.output or args.file.with_name(f"{args.file.stem}.scored.csv")
    # Whole or not at all: a write cut short (a full disk) never leaves half a file, nor
    # replaces an earlier good one.
    try:
        write_file_atomically(
            Path(output), lambda handle: scored.to_csv(handle, index=False, encoding="utf-8")
        )
    except OSError as exc:
        print(f"error: the scores could not be written to {output}: {exc}", file=sys.stderr)
        return 1
    summary = scored["prediction"].describe().to_dict()
    print(
        f"{len(scored)} rows scored by {version} ({alias if not args.version else 'pinned'}"
        f", {served_as}) -> {output}; prediction mean {summary['mean']:.4f}"
    )
    return 0


def check_contract(args: argparse.Namespace) -> int:
    """Load a contract and report every problem in it."""
    contract = load_contract(args.contract)
    print(
        f"{args.contract}: contract '{contract.name}' is valid "
        f"({len(contract.columns)} columns, {len(contract.features)} features, "
        f"{contract.task})"
    )
    return 0


def init_contract(args: argparse.Namespace) -> int:
    """Write a draft contract inferred from sample day files."""
    from ml_platform.validation.infer import InferenceError, draft_contract

    try:
        text = draft_contract(args.samples, args.name)
    except InferenceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    output = args.output or Path(f"{args.name}.yaml")
    try:
        # A contract of that name may be one a person has edited since: never lost unasked.
        with output.open("w" if args.force else "x", encoding="utf-8") as handle:
            handle.write(text)
    except FileExistsError:
        print(
            f"error: {output} exists (a contract edited since it was drafted?): choose another "
            "file with -o, or --force to replace it",
            file=sys.stderr,
        )
        return 2
    print(
        f"wrote {output}: choose the label there (uncomment one `label:` line), then run "
        f"`ml-platform check-contract {output}`"
    )
    return 0


def diagnose(args: argparse.Namespace) -> int:
    """Explain a failed run from the instance's event log: step, last lines, class, runbook."""
    from ml_platform.troubleshooting.diagnose import (
        AmbiguousRunIdError,
        RunEventsGoneError,
        RunNotFoundError,
        diagnose_run,
        tag_failure_class,
    )

    settings = Settings()
    contracts = load_contracts(settings.contracts_dir, settings.dataset)
    with home_instance() as instance:
        try:
            diagnosis = diagnose_run(instance, args.run_id, lines=args.lines, contracts=contracts)
        except (RunNotFoundError, AmbiguousRunIdError, RunEventsGoneError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        tag_failure_class(instance, diagnosis)
    print(diagnosis.render())
    return 0


def reproduce(args: argparse.Namespace) -> int:
    """Rerun a failed run's asset in this process on a sample of the inputs the run read."""
    import logging
    import pdb
    import tempfile

    from ml_platform.definitions import build_definitions
    from ml_platform.troubleshooting.diagnose import (
        AmbiguousRunIdError,
        RunEventsGoneError,
        RunNotFoundError,
    )
    from ml_platform.troubleshooting.reproduce import NothingToReproduceError, not_reproduced_advice
    from ml_platform.troubleshooting.reproduce import reproduce as rerun

    # What reproduce decides (inputs, sample, scaled expectations) goes to the terminal; the
    # instance's storage (alembic, SQLite) and Dagster's own INFO lines stay out of it.
    said = logging.StreamHandler(sys.stderr)
    said.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("ml_platform.troubleshooting.reproduce")
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    settings = Settings()
    contract = dataset_of(args, settings)
    defs = build_definitions(contract, settings)
    try:
        with home_instance() as instance, tempfile.TemporaryDirectory() as scratch:
            try:
                target = rerun(
                    instance,
                    args.run_id,
                    defs,
                    Path(scratch),
                    sample_rows=args.sample,
                    contract=contract,
                )
            # No such run id or an ambiguous prefix, no events of the run left, no failed asset
            # step, or inputs replaced since the run read them. Not every LookupError: an
            # asset's own KeyError (a missing column) is what the user came to debug.
            except (
                RunNotFoundError,
                AmbiguousRunIdError,
                RunEventsGoneError,
                NothingToReproduceError,
            ) as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            except Exception:
                if not args.pdb:
                    raise  # the asset's own exception and traceback, as the step raised it
                pdb.post_mortem(sys.exc_info()[2])
                return 1
    finally:
        logger.removeHandler(said)
    classification = target.diagnosis.classification if target.diagnosis else None
    print(
        f"not reproduced: {target.asset.key.to_user_string()} partition {target.partition} "
        f"succeeded on {args.sample} rows per input partition; "
        f"{not_reproduced_advice(classification, args.sample)}",
        file=sys.stderr,
    )
    return 1


def health(args: argparse.Namespace) -> int:
    """Summarise the last N days of runs: success rates, durations, checks, memory requests."""
    from ml_platform.troubleshooting.health import pipeline_health

    with home_instance() as instance:
        print(pipeline_health(instance, args.days).render())
    return 0


def pools(args: argparse.Namespace) -> int:
    """Store each pool's limit in the instance before the queue meets a run of it.

    Run where the daemon starts, before it does (`make serve`, the daemon's container), and
    again after a dataset is added: `ml_platform/platform/pools.py` says why.
    """
    from ml_platform.definitions import defs
    from ml_platform.platform.pools import PoolLimitError, pools_of, store_pool_limits

    declared = pools_of(defs())
    with home_instance() as instance:
        try:
            stored = store_pool_limits(instance, declared)
        except PoolLimitError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(
        f"{len(declared)} pool(s): limits stored for {len(stored)}"
        + (f" ({', '.join(stored)})" if stored else "")
        + f", {len(declared) - len(stored)} had one already"
    )
    return 0


def resources(args: argparse.Namespace) -> int:
    """Each stage's request, its recorded median and p95 use, and the request they advise.

    With `--write`, the advice replaces the `resources:` section of the dataset's contract file
    (`--contract`, else the file the code location reads), every other byte kept.
    """
    from ml_platform.contracts.catalog import contract_file
    from ml_platform.contracts.editing import editable_contract, render_resources, replace_resources
    from ml_platform.contracts.model import parse_contract
    from ml_platform.platform.storage import write_file_atomically
    from ml_platform.troubleshooting.sizing import advised_resources, render, stage_uses

    if args.contract is not None and not args.write:
        # Read alone, the table is the served contract's: the file named would be ignored.
        print(
            "error: --contract names the file --write writes; add --write, or read a contract "
            "file with --dataset FILE",
            file=sys.stderr,
        )
        return 2
    settings = Settings()
    contract = dataset_of(args, settings)
    path = None
    if args.write:
        if args.contract is not None:
            path = args.contract
        elif args.dataset and Path(args.dataset).suffix in {".yaml", ".yml"}:
            path = Path(args.dataset)
        else:
            path = contract_file(settings.contracts_dir, contract.name)
        path = editable_contract(path)
        # The file written is the one advised on: its request and its bounds, which may differ
        # from the served contract's (a copy being edited), are the ones kept.
        written = load_contract(path)
        if written.name != contract.name:
            raise ContractError(str(path), [f"this is not the contract of '{contract.name}'"])
        contract = written
    with home_instance() as instance:
        uses = stage_uses(instance, contract, args.days)
        where = instance.root_directory
    print(render(contract, uses, args.days))
    if not any(use.peaks_mb for use in uses):
        # Most often another instance than the runs' (DAGSTER_HOME): a section rewritten from
        # nothing would claim to be advice.
        print(
            f"no stage of {contract.name} recorded its use in the last {args.days:g} day(s) of "
            f"the Dagster instance at {where}: materialise days first, or set DAGSTER_HOME to "
            "the instance they ran on" + ("; the contract is left as it is" if args.write else ""),
            file=sys.stderr,
        )
        return 1 if args.write else 0
    if path is None:
        return 0
    note = (
        f"Advised by `ml-platform resources --write` on {dt.date.today().isoformat()} from the\n"
        f"days recorded in the last {args.days:g} day(s). Review before committing."
    )
    section = render_resources(advised_resources(contract, uses), note)
    # As bytes: text mode would turn a CRLF file's line endings into LF everywhere.
    text = replace_resources(path.read_bytes().decode(), section, str(path))
    parse_contract(text, str(path))  # a section that would not load is never written
    # Whole or not at all: a full disk or a kill half way would leave a contract cut short.
    write_file_atomically(path, lambda handle: handle.write(text.encode()))
    print(f"wrote the resources: section of {path}")
    return 0


def _wait_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS for the webserver and its daemon to answer (default: not at all)",
    )


def parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    top = argparse.ArgumentParser(prog="ml-platform", description=__doc__)
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("land", help="land day files of a dataset into the landing zone")
    p.add_argument("--dataset", help=DATASET_HELP)
    p.add_argument("--start", type=_date, required=True, help="first day, YYYY-MM-DD")
    p.add_argument("--days", type=_count, default=1, help="number of consecutive days")
    p.add_argument("--landing-dir", help="default: $ML_PLATFORM_LANDING_DIR")
    p.add_argument("--drift-feature", help="synthetic only: feature to shift")
    p.add_argument("--drift-sd", type=float, default=0.2, help="shift in standard deviations")
    p.add_argument("--drift-from", type=_date, help="first drifted day (default: --start)")
    p.add_argument(
        "--fault", choices=sorted([*FAULTS, *BYTE_FAULTS]), help="synthetic only: damage the files"
    )
    p.add_argument(
        "--fault-day",
        type=_date,
        action="append",
        help="only damage this day (repeatable; default: every landed day)",
    )
    p.set_defaults(func=land)

    p = sub.add_parser("landing-status", help="map landed files to days; report misfits")
    p.add_argument("--dataset", help=DATASET_HELP)
    p.add_argument("--landing-dir", help="default: $ML_PLATFORM_LANDING_DIR")
    p.set_defaults(func=landing_status)

    p = sub.add_parser(
        "materialize", help="run days of the whole graph through the Dagster webserver and daemon"
    )
    p.add_argument("--start", type=_date, required=True, help="first day, YYYY-MM-DD")
    p.add_argument("--days", type=_count, default=1, help="number of consecutive days")
    p.add_argument("--force", action="store_true", help="rerun days already accepted")
    _wait_option(p)
    p.add_argument("--dataset", help=DATASET_HELP)
    p.set_defaults(func=materialize)

    p = sub.add_parser(
        "replay",
        help="run a changed contract over past days beside the live chain and compare; "
        "`replay promote NAME`, `replay remove NAME`, `replay list`",
    )
    p.add_argument("what", help="the changed contract file, or promote, remove or list")
    p.add_argument("replay_name", nargs="?", help="the replay to promote or remove")
    p.add_argument("--start", type=_date, help="first day to replay, YYYY-MM-DD")
    p.add_argument("--days", type=_count, default=1, help="number of consecutive days")
    p.add_argument("--name", help="the replay's name (default: the contract file's name)")
    _wait_option(p)
    p.set_defaults(func=replay)

    p = sub.add_parser("rejected", help="list rejected days and the command that reruns them")
    p.add_argument("--dataset", help=DATASET_HELP)
    p.add_argument("--start", type=_date, help="first day, YYYY-MM-DD (default: every day)")
    p.add_argument(
        "--days",
        type=_count,
        help="number of consecutive days (default: 1 from --start; without it, the last N days)",
    )
    p.set_defaults(func=rejected)

    p = sub.add_parser("score", help="score a file with a registered model")
    p.add_argument("file", type=Path, help="a file in the dataset's landed format (CSV)")
    # One model or the other: given both, the alias would be silently ignored.
    which = p.add_mutually_exclusive_group()
    which.add_argument("--alias", choices=["champion", "challenger"], help="default: champion")
    which.add_argument("--version", help="a registered version instead of an alias")
    p.add_argument("--output", type=Path, help="default: FILE.scored.csv beside the input")
    p.add_argument("--dataset", help=DATASET_HELP)
    p.set_defaults(func=score)

    p = sub.add_parser("diagnose", help="explain a failed run: step, last log lines, class")
    p.add_argument(
        "run_id",
        help="the run's id or a unique prefix of it, e.g. the 8 characters `materialize` prints",
    )
    p.add_argument("--lines", type=_lines, default=15, help="log lines to show before the failure")
    p.set_defaults(func=diagnose)

    p = sub.add_parser("reproduce", help="rerun a failed asset in-process on sampled inputs")
    p.add_argument("run_id", help="the failed run's id or a unique prefix of it")
    # A sample of no rows fails the step on no data: a failure of its own, not the run's.
    p.add_argument("--sample", type=_count, default=100, help="rows per input partition")
    p.add_argument("--pdb", action="store_true", help="open the debugger where it raised")
    p.add_argument("--dataset", help=DATASET_HELP)
    p.set_defaults(func=reproduce)

    p = sub.add_parser(
        "pools", help="store each pool's limit in the instance before the daemon starts"
    )
    p.set_defaults(func=pools)

    p = sub.add_parser("health", help="success rates, durations, checks, memory requests")
    p.add_argument("--days", type=_span, default=7, help="look back this many days")
    p.set_defaults(func=health)

    p = sub.add_parser(
        "resources", help="each stage's request, its recorded use and the request it advises"
    )
    p.add_argument("--dataset", help=DATASET_HELP)
    p.add_argument(
        "--days", type=_span, default=30, help="read materialisations of the last N days"
    )
    p.add_argument(
        "--write", action="store_true", help="put the advice into the contract's resources:"
    )
    p.add_argument(
        "--contract",
        type=Path,
        help="the contract file to write (default: the dataset's file in the code location's "
        "contracts directory)",
    )
    p.set_defaults(func=resources)

    p = sub.add_parser("check-contract", help="validate a contract file")
    p.add_argument("contract", help="bundled contract name or path")
    p.set_defaults(func=check_contract)

    p = sub.add_parser("init-contract", help="draft a contract from sample day files")
    p.add_argument("samples", nargs="+", type=Path, help="sample day files (CSV), one per day")
    p.add_argument("--name", required=True, help="dataset name: lowercase letters, digits, _")
    p.add_argument("-o", "--output", type=Path, help="default: NAME.yaml")
    p.add_argument("--force", action="store_true", help="replace the output file if it exists")
    p.set_defaults(func=init_contract)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `ml-platform`."""
    top = parser()
    args = top.parse_args(argv)
    if (past := _past_the_calendar(args)) is not None:
        top.error(past)
    try:
        code = int(args.func(args))
        # Within reach of the handler below: a reader gone (`| head`) would otherwise be met
        # by Python's flush at exit, which prints its own traceback and exits 120.
        sys.stdout.flush()
        return code
    except (ContractError, DatasetChoiceError, SettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except InstanceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:
        # The output's reader went away (`| head`): stop as a program SIGPIPE ends, without a
        # traceback, and without another when Python flushes standard output on exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        # Ctrl-C in a command that does not watch runs (land, health, ...): what it did so far
        # is whole (files land atomically), so a traceback would only alarm.
        print("stopped by SIGINT", file=sys.stderr)
        return 128 + signal.SIGINT
    except StopRequested as stop:
        # A signal outside the part of a command that handles it (while the instance opens,
        # or a second Ctrl-C while a run is being terminated): stopped, as shells expect.
        print(f"stopped by {stop}", file=sys.stderr)
        return 128 + stop.signum


if __name__ == "__main__":
    sys.exit(main())
