"""A replay: a changed contract run over past days as a dataset of its own, beside the live one.

`ml-platform replay CONTRACT --start D --days N --name NAME` keeps the changed contract as it was
written, in a folder of the replays directory (`Settings.replays_dir`), with what the replay is:

    <replays>/<name>/contract.yaml   the changed contract, byte for byte
    <replays>/<name>/replay.yaml     of: <live dataset>, start: D, days: N, and the live
                                     contract's digest, partitions and label it was made
                                     against

The code location serves it as the dataset `<live>__replay_<name>`: every asset, group, job,
pool, lake folder, MLflow experiment and registered model carries that name, so nothing the live
dataset owns is written. It reads the live dataset's landed files (the same `landing`, which a
replay may not change), read-only as every dataset reads them. It has no sensor, schedule or
freshness policy (it runs only when launched) and its alerts page no one.

A replay folder that cannot be read as a replay of the live contract (its replay.yaml
half-written, a folder name the name pattern refuses, a live contract whose `landing` changed
since, or whose partitions no longer hold the replay's days) is not served: the code location
logs why and serves the live datasets and the other replays, and `ml-platform replay remove
NAME` still removes it from its folder alone. A folder
deleted by hand leaves the records, lake files and MLflow entries made under the replay's dataset
name: a new replay of that name is refused until `ml-platform replay remove NAME`, which finds
them by the name alone, removes them.
"""

import dataclasses
import datetime as dt
import hashlib
import logging
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import dagster as dg
import pydantic
import yaml

from ml_platform.contracts import Contract, ContractError, load_contract
from ml_platform.contracts.model import LabelSpec
from ml_platform.contracts.reference import reference_days
from ml_platform.platform.datasets import REPLAY_MARK, asset_key
from ml_platform.platform.partitions import daily_partitions
from ml_platform.platform.records import day_records
from ml_platform.platform.rejected import DAY_ASSETS
from ml_platform.registry.store import version_day
from ml_platform.replay.comparison import outcome_record, target_change

logger = logging.getLogger(__name__)

MARK = REPLAY_MARK
CONTRACT_FILE = "contract.yaml"
REPLAY_FILE = "replay.yaml"
NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# The assets a replay computes over the days before it, which its first days look back on.
WARM_UP_ASSETS = ("raw_data", "validated_data", "features", "drift_report")
# The weekly full retrain, which the replay runs on the days the live chain's registry took one.
FULL_RETRAIN_ASSETS = ("full_model", "full_evaluation_report")
ONE_DAY = dt.timedelta(days=1)


def _day_keys(first: dt.date, count: int) -> list[str]:
    return [(first + dt.timedelta(days=i)).isoformat() for i in range(count)]


def _runs(keys: Sequence[str]) -> list[tuple[str, str]]:
    """Sorted day keys as (first, last) runs of consecutive days."""
    runs: list[tuple[str, str]] = []
    for key in keys:
        if runs and dt.date.fromisoformat(key) - dt.date.fromisoformat(runs[-1][1]) == ONE_DAY:
            runs[-1] = (runs[-1][0], key)
        else:
            runs.append((key, key))
    return runs


class ReplayError(ValueError):
    """A replay that cannot be made, found or promoted; the message says why and what to do."""


def replay_dataset(live: str, name: str) -> str:
    """The dataset name of replay `name` of dataset `live`."""
    return f"{live}{MARK}{name}"


@dataclasses.dataclass(frozen=True)
class Replay:
    """One replay: its name, the live dataset, its days and its contract under its own name."""

    name: str
    live: str
    start: dt.date
    days: int
    # The changed contract, named `<live>__replay_<name>`.
    contract: Contract
    folder: Path
    # The live contract's label: the comparison gives no verdict when the replay's differs.
    live_label: LabelSpec
    # The sha256 of the live contract file the replay was made against: `promote` refuses to
    # write over a live contract changed since. None: a replay made before it was recorded.
    live_sha256: str | None = None
    # The live dataset's first day: no warm-up day is before it (the live chain had none).
    live_start: dt.date | None = None
    # How the live contract's first day or timezone changed since the replay was made, in
    # words (its days still live days): the comparison says so. None: unchanged, or unknown.
    live_change: str | None = None
    # The live contract's label when the replay was made, the one the live chain's records of
    # the replayed days were judged on, when the live label differs since (a label change
    # promoted, say). None: unchanged, or unknown.
    live_label_was: LabelSpec | None = None

    @property
    def dataset(self) -> str:
        """The replay's dataset name."""
        return self.contract.name

    @property
    def changed_target(self) -> str | None:
        """How the replay's target differs from the live chain's, in words; None: the same.

        Set against the live label the replay was made against: the live chain's records of
        the replayed days were judged on it, whatever the live contract says now. A live label
        changed since is said too: a day of it rerun since is judged on the new one, so which
        target a live record is on cannot be told.
        """
        changes = [target_change(self.live_label_was or self.live_label, self.contract.label)]
        if self.live_label_was is not None:
            since = target_change(self.live_label_was, self.live_label)
            if since:
                changes.append(
                    f"the live label changed since the replay was made ({since}): the live "
                    "chain's records of these days may be on either target"
                )
        return "; ".join(change for change in changes if change) or None

    @property
    def day_keys(self) -> list[str]:
        """The replayed days, as partition keys, in order."""
        return _day_keys(self.start, self.days)

    def warm_up_days(self, weekly: Sequence[str] = ()) -> list[str]:
        """The days before the replay its days look back on, as partition keys, in order.

        The first day's model trains on the window ending that day, its gate and drift check
        compare it with their reference days: those days' data, computed under the replay's
        contract, make its days judged as the live chain's were. A `previous_days` reference
        looks back from each day; a `baseline` one reads its fixed days, which may lie long
        before the replayed ones (the days between are not needed). Each of the `weekly` days
        (see `live_weekly_days`) trains a full retrain on the `full_window_days` ending it.
        Never before the dataset's first day, nor before the live one's: the live chain had no
        day before it, and it has no landed file to read (`create_replay` refuses a replay
        whose days look back on one).
        """
        c = self.contract
        first_day = max(c.partitions.start_date, self.live_start or c.partitions.start_date)
        back = [c.training.window_days - 1]
        needed: set[dt.date] = set()
        for reference in (c.history_reference, c.drift.reference):
            if reference.mode == "previous_days":
                back.append(reference.days)
            else:
                for i in range(self.days):
                    day = self.start + dt.timedelta(days=i)
                    needed.update(reference_days(reference, day, first_day))
        first = max(first_day, self.start - dt.timedelta(days=max(back)))
        needed.update(first + dt.timedelta(days=i) for i in range((self.start - first).days))
        for key in weekly:
            last = dt.date.fromisoformat(key)
            needed.update(
                day
                for day in (last - dt.timedelta(days=i) for i in range(c.training.full_window_days))
                if day >= first_day
            )
        return sorted(day.isoformat() for day in needed if day < self.start)

    def live_weekly_days(self, instance: dg.DagsterInstance) -> list[str]:
        """The days of the weekly full retrains the live chain judged on the replayed days.

        The live registry takes the weekly candidate of the day before a day when the weekly
        job made one (`registered_model` records it as `weekly_candidate`): the replay retrains
        on the same days, so both chains' champions meet the same kinds of candidates. A day
        that is no partition of the replay's contract (before a `start_date` it moved) is left
        out, and the comparison says the chains differ there.
        """
        key = asset_key(self.live, "registered_model")
        records = day_records(instance, key, self.day_keys)
        # A day recorded unchanged (a re-delivery rejected) kept the weekly candidate it judged.
        outcomes = [outcome_record(instance, key, day, r) for day, r in records.items()]
        partitions = daily_partitions(self.contract)
        days = {
            version_day(str(record.metadata["weekly_candidate"]))
            for record in outcomes
            if isinstance(record.metadata.get("weekly_candidate"), str)
        }
        return sorted(day for day in days if partitions.has_partition_key(day))

    def backfill_ranges(self, weekly: Sequence[str] = ()) -> dict[str, list[tuple[str, str]]]:
        """The days of each day asset the replay's backfill computes, by asset name, as runs.

        Every day asset over the replayed days; the data assets (up to the drift report, which
        a model reads for a blocking feature) over the warm-up days too, a baseline reference
        apart from the replayed days a (first, last) range of its own: the days between are
        not computed. With `weekly` days (`live_weekly_days`), the weekly full retrain on those
        days, and the data of its longer window.
        """
        days = self.day_keys
        ranges = {name: [(days[0], days[-1])] for name in DAY_ASSETS}
        # The warm-up days are all before the replayed ones: together, in order.
        with_warm_up = _runs([*self.warm_up_days(weekly), *days])
        for name in WARM_UP_ASSETS:
            ranges[name] = with_warm_up
        if weekly:
            for name in FULL_RETRAIN_ASSETS:
                ranges[name] = _runs(sorted(set(weekly)))
        return ranges

    @property
    def contract_file(self) -> Path:
        """The changed contract as its author wrote it."""
        return self.folder / CONTRACT_FILE


def _renamed(changed: Contract, live: Contract, name: str, where: str) -> Contract:
    """`changed` as the replay's dataset, checked against the live contract it replays."""
    if changed.name != live.name:
        raise ReplayError(
            f"{where} is the contract of dataset '{changed.name}', not of '{live.name}': a "
            "replay runs a changed copy of the live dataset's contract (keep its name)"
        )
    if changed.landing != live.landing:
        raise ReplayError(
            f"{where} changes `landing`: a replay reads the live dataset's landed files, so its "
            "landing section must be the live contract's"
        )
    # Validated when loaded; only the name changes, to one the name pattern accepts.
    return changed.model_copy(update={"name": replay_dataset(live.name, name)})


def _bounds(contract: Contract) -> str:
    """The days of `contract`'s partitions, first to last (the last ended day if it has no end)."""
    partitions = daily_partitions(contract)
    first, last = partitions.get_first_partition_key(), partitions.get_last_partition_key()
    if first is None or last is None:
        return f"none yet (the first, {contract.partitions.start_date}, has not ended)"
    return f"{first} to {last}"


def _days_outside(start: dt.date, days: int, live: Contract, changed: Contract) -> str | None:
    """What of the replayed days is not a day of both contracts' partitions; None: nothing.

    The replay's backfill runs them under the changed contract and the comparison reads the live
    chain's records of them: a day either contract does not have (past an `end_date`, before a
    `start_date` the change moved, not ended yet) fails the backfill's launch after the replay
    is kept.
    """
    both = [daily_partitions(live), daily_partitions(changed)]
    outside = [
        key
        for key in _day_keys(start, days)
        if not all(partitions.has_partition_key(key) for partitions in both)
    ]
    if not outside:
        return None
    return (
        f"{len(outside)} of the {days} day(s) are outside the partitions, the first "
        f"{outside[0]} and the last {outside[-1]}: the live contract's partitions are "
        f"{_bounds(live)}, the changed contract's {_bounds(changed)}"
    )


def _partitions_of(contract: Contract) -> dict[str, str | None]:
    """What makes `contract`'s days: its first and last day and its timezone, as text."""
    p = contract.partitions
    return {
        "start_date": p.start_date.isoformat(),
        "end_date": p.end_date.isoformat() if p.end_date else None,
        "timezone": contract.event_time.timezone,
    }


def _partitions_change(
    recorded: object, live: Contract, fields: Sequence[str] = ("start_date", "end_date", "timezone")
) -> str | None:
    """How `fields` of the live contract's partitions differ from `recorded`, in words.

    None when they do not, or when nothing was recorded (a replay made by an older version).
    """
    if not isinstance(recorded, dict):
        return None
    now = _partitions_of(live)
    changes = [
        f"{field} {recorded.get(field) or 'none'} -> {now[field] or 'none'}"
        for field in fields
        if field in recorded and str(recorded[field] or "") != str(now[field] or "")
    ]
    return ", ".join(changes) or None


def _warm_up_before(replay: Replay, first: dt.date) -> list[str]:
    """The replay's warm-up days (its contract's alone) before `first`, in order."""
    looked_back = dataclasses.replace(replay, live_start=None).warm_up_days()
    return [day for day in looked_back if dt.date.fromisoformat(day) < first]


def _before_live_start(replay: Replay, live: Contract) -> str | None:
    """What of the replay's warm-up days is before the live dataset's first day; None: none.

    A changed contract with an earlier `start_date` lets its first days look back on days the
    live chain never had: their files were never landed for it (the backfill would fail them
    as missing files), and the live chain's first days looked back on none of them.
    """
    first = live.partitions.start_date
    early = _warm_up_before(replay, first)
    if not early:
        return None
    # The first start whose look-back (the training window, previous-days references) stays
    # within the live days; a baseline before the live first day no start avoids.
    later = replay.start + (first - dt.date.fromisoformat(early[0]))
    fix = (
        f"start the replay on or after {later}"
        if not _warm_up_before(dataclasses.replace(replay, start=later), first)
        else f"move the changed contract's baseline reference on or after {first}"
    )
    return (
        f"{len(early)} of the replay's warm-up day(s), the days its first days look back on, are "
        f"before the live dataset's first day {first}: the first {early[0]} and the last "
        f"{early[-1]} (the changed contract starts on {replay.contract.partitions.start_date}). "
        "The live chain has no such day to set them against, nor a landed file of it to read: "
        f"{fix}, or keep the live start_date"
    )


def create_replay(
    root: str | Path,
    changed_file: str | Path,
    live: Contract,
    name: str,
    start: dt.date,
    days: int,
    left_behind: Callable[[str], Sequence[str]] | None = None,
    live_file: str | Path | None = None,
) -> Replay:
    """Keep `changed_file` as replay `name` of `live` over `days` days from `start`.

    A replay of that name already there is an error: each replay's records belong to the
    contract it ran (`ml-platform replay remove NAME` first). So is one whose folder is gone but
    whose dataset `left_behind` (`lifecycle.left_behind`: what a dataset has in the instance, the
    lake and MLflow, in words) says has records, files or MLflow entries: an earlier replay's,
    which the new one would read as its own past. Every day is checked first, against both
    contracts' partitions, and so are the warm-up days before them (never before the live
    dataset's first day): nothing is kept for a replay that cannot run. `live_file`, the live
    contract's file, is recorded by its digest: `promote` compares it with the file then; the
    live contract's partitions are recorded too: the code location checks them when it loads.
    """
    if not NAME.match(name):
        raise ReplayError(f"replay name {name!r}: use lower-case letters, digits and _")
    if days < 1:
        raise ReplayError(f"--days {days}: a replay runs at least one day")
    changed_file = Path(changed_file)
    try:
        changed = load_contract(changed_file)
    except ContractError as exc:
        raise ReplayError(str(exc)) from exc
    contract = _renamed(changed, live, name, str(changed_file))
    outside = _days_outside(start, days, live, changed)
    if outside:
        raise ReplayError(f"--start {start} --days {days}: {outside}; replay days within both")
    folder = Path(root) / name
    replay = Replay(
        name,
        live.name,
        start,
        days,
        contract,
        folder,
        live.label,
        live_start=live.partitions.start_date,
    )
    early = _before_live_start(replay, live)
    if early:
        raise ReplayError(f"--start {start} --days {days}: {early}")
    if folder.exists():
        of = _replayed(folder) if folder.is_dir() else None
        raise ReplayError(
            f"a replay named '{name}' exists ({folder}"
            + (f", a replay of {of}" if of and of != live.name else "")
            + f"): remove it first (`ml-platform replay remove {name}`"
            + (f" where {of} is served" if of and of != live.name else "")
            + ") or choose another --name"
        )
    left = left_behind(contract.name) if left_behind is not None else []
    if left:
        raise ReplayError(
            f"an earlier replay named '{name}' of {live.name} left {'; '.join(left)} (its folder "
            "deleted by hand, or kept by an older version): a new replay of that name would read "
            f"them as its own past (its registry's chain, its comparison). Remove them first "
            f"(`ml-platform replay remove {name}`) or choose another --name"
        )
    digest = file_sha256(Path(live_file)) if live_file is not None else None
    plan: dict[str, object] = {"of": live.name, "start": start.isoformat(), "days": days}
    if digest is not None:
        plan["live_sha256"] = digest
    # The code location checks the replay against them when it loads: a live contract whose
    # days changed since is said by what changed.
    plan["live_partitions"] = _partitions_of(live)
    # The label its records of the replayed days were judged on: the comparison sets the
    # replay's against it, even once the live contract's label changed (a replay promoted).
    plan["live_label"] = live.label.model_dump(mode="json")
    try:
        folder.mkdir(parents=True)
    except OSError as exc:
        # Not made here (made meanwhile by another replay of the name, say): not ours to remove.
        raise ReplayError(f"replay '{name}': {folder} cannot be made ({exc})") from exc
    try:
        shutil.copyfile(changed_file, folder / CONTRACT_FILE)
        (folder / REPLAY_FILE).write_text(yaml.safe_dump(plan, sort_keys=False))
    except OSError as exc:
        # A replay written in part (a full disk) is no replay, and its folder would hold the
        # name until `replay remove`: nothing of it is kept.
        shutil.rmtree(folder, ignore_errors=True)
        raise ReplayError(
            f"replay '{name}' could not be written to {folder} ({exc}): nothing is kept; once "
            "that is fixed, run the command again"
        ) from exc
    return dataclasses.replace(replay, live_sha256=digest)


def file_sha256(path: Path) -> str:
    """The sha256 of `path`'s bytes, in hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _plan(folder: Path) -> dict:
    """The replay.yaml of `folder` (of, start, days); a ReplayError says what is wrong with it."""
    path = folder / REPLAY_FILE
    try:
        plan = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ReplayError(f"{path} cannot be read: {exc}") from exc
    missing = [k for k in ("of", "start", "days") if not isinstance(plan, dict) or k not in plan]
    if missing:
        raise ReplayError(f"{path} lacks {', '.join(missing)} (written only in part?)")
    return plan


def read_replay(folder: Path, live: Contract) -> Replay:
    """The replay kept in `folder`, a replay of `live`; a ReplayError says why it is not one."""
    if not NAME.match(folder.name):
        raise ReplayError(
            f"replay name {folder.name!r} (its folder's): use lower-case letters, digits and _"
        )
    plan = _plan(folder)
    if str(plan["of"]) != live.name:
        raise ReplayError(f"{folder / REPLAY_FILE} replays '{plan['of']}', not '{live.name}'")
    try:
        start, days = dt.date.fromisoformat(str(plan["start"])), int(plan["days"])
    except (TypeError, ValueError) as exc:
        raise ReplayError(
            f"{folder / REPLAY_FILE}: start must be a day (YYYY-MM-DD) and days a number ({exc})"
        ) from exc
    if days < 1:
        raise ReplayError(f"{folder / REPLAY_FILE}: days {days}; a replay runs at least one day")
    try:
        changed = load_contract(folder / CONTRACT_FILE)
    except (ContractError, OSError) as exc:
        raise ReplayError(str(exc)) from exc
    contract = _renamed(changed, live, folder.name, str(folder))
    outside = _days_outside(start, days, live, changed)
    if outside:
        # The live contract's days moved since (an edited start_date or end_date): the
        # comparison would set the replay's days against days the live chain no longer has.
        change = _partitions_change(plan.get("live_partitions"), live)
        raise ReplayError(
            (
                f"the live contract's partitions changed since the replay was made ({change})"
                if change
                else "its days are no longer all days of the live contract"
            )
            + f": {outside}; the live chain no longer runs these days, so they cannot be "
            "compared"
        )
    digest = plan.get("live_sha256")
    was = None
    if plan.get("live_label") is not None:
        try:
            was = LabelSpec.model_validate(plan["live_label"])
        except pydantic.ValidationError as exc:
            raise ReplayError(
                f"{folder / REPLAY_FILE}: live_label is not a contract's label ({exc})"
            ) from exc
    return Replay(
        folder.name,
        live.name,
        start,
        days,
        contract,
        folder,
        live.label,
        str(digest) if digest is not None else None,
        live_start=live.partitions.start_date,
        live_change=_partitions_change(
            plan.get("live_partitions"), live, ("start_date", "timezone")
        ),
        live_label_was=None if was == live.label else was,
    )


@dataclasses.dataclass(frozen=True)
class BrokenReplay:
    """A replay folder of a served dataset that cannot be read as its replay: it is not served.

    What `find_replay` gives for it, so that `ml-platform replay remove NAME` removes it, and
    what it wrote while it was served, from its folder alone.
    """

    name: str
    live: str
    folder: Path
    # Why it cannot be read.
    reason: str

    @property
    def dataset(self) -> str:
        """The dataset name it was (or would have been) served as."""
        return replay_dataset(self.live, self.name)

    @property
    def contract_file(self) -> Path:
        """The changed contract as its author wrote it, if it is there."""
        return self.folder / CONTRACT_FILE


def _replayed(folder: Path) -> str | None:
    """The dataset the replay in `folder` replays, from what can be read of it; None: unknown.

    Its replay.yaml says; else its contract, which keeps the live dataset's name.
    """
    for file, field in ((REPLAY_FILE, "of"), (CONTRACT_FILE, "name")):
        try:
            document = yaml.safe_load((folder / file).read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(document, dict) and isinstance(document.get(field), str):
            return str(document[field])
    return None


def _kept(
    root: str | Path | None, served: Sequence[Contract]
) -> Iterable[tuple[Path, str | None, Replay | ReplayError]]:
    """Each replay folder in `root` of a dataset `served` (or of one it cannot tell), read.

    A folder holding a replay.yaml or a contract.yaml is a replay's, whole or in part; each
    comes with the dataset it replays and its replay, or the error that says why it is not one.
    """
    if root is None or not Path(root).is_dir():
        return
    live = {c.name: c for c in served}
    for folder in sorted(Path(root).iterdir()):
        if not folder.is_dir() or not any(
            (folder / file).exists() for file in (REPLAY_FILE, CONTRACT_FILE)
        ):
            continue
        of = _replayed(folder)
        if of is None:
            yield folder, None, ReplayError("it names no dataset that it replays")
        elif of in live:
            try:
                yield folder, of, read_replay(folder, live[of])
            except ReplayError as exc:
                yield folder, of, exc


def load_replays(root: str | Path | None, served: Sequence[Contract]) -> list[Replay]:
    """The replays in `root` of the datasets `served`, by name; none without a directory.

    A replay of a dataset the code location does not serve is left out: its comparison would
    have no live chain to read. A folder that cannot be read as a replay (see `read_replay`) is
    left out too, with an error in the log that says why and how to remove it: one stale replay
    must not take the live datasets' assets, sensors and schedules down with it.
    """
    replays = []
    for folder, of, read in _kept(root, served):
        if isinstance(read, Replay):
            replays.append(read)
            if read.live_change:
                logger.warning(
                    f"replay '{read.name}' of {read.live} in {folder}: the live contract's "
                    f"partitions changed since the replay was made ({read.live_change}); its "
                    "days are still live days and it is served, and its comparison says so"
                )
            continue
        # Deleting the folder of a replay whose dataset is known would leave the records, lake
        # files and MLflow entries it made, which a new replay of that name reads as its own
        # past (its registry's chain, its comparison): `remove` takes them with the folder.
        fix = (
            f"run `ml-platform replay remove {folder.name}`, which removes what it made with its "
            "folder (deleting the folder by hand leaves that behind)"
            if of
            else "delete the folder"
        )
        logger.error(
            f"replay '{folder.name}'{f' of {of}' if of else ''} in {folder} is not served, it "
            f"cannot be read: {read}. The live datasets and the other replays are served; {fix}."
        )
    return replays


def find_replay(
    root: str | Path | None,
    name: str,
    served: Sequence[Contract],
    left_behind: Callable[[str], Sequence[str]] | None = None,
) -> Replay | BrokenReplay:
    """Replay `name` of one of the datasets `served`; a `BrokenReplay` when it cannot be read.

    With `left_behind` (see `create_replay`), a replay whose folder is gone is found by what it
    left, a `BrokenReplay` whose folder does not exist: `ml-platform replay remove NAME` removes
    it.
    """
    for folder, of, read in _kept(root, served):
        if folder.name != name:
            continue
        if isinstance(read, Replay):
            return read
        if of is None:
            raise ReplayError(
                f"replay '{name}' cannot be read ({read}), so what it wrote cannot be told: "
                f"delete its folder {folder}"
            )
        return BrokenReplay(name, of, folder, str(read))
    kept = Path(root) / name if root is not None else None
    of = _replayed(kept) if kept is not None and kept.is_dir() else None
    if kept is not None and of is not None:
        # Kept beside the replays of the datasets served, it is none of theirs: said, or the
        # name would look free to `replay remove` and taken to `replay CONTRACT --name`.
        raise ReplayError(
            f"replay '{name}' in {kept} replays '{of}', a dataset these settings do not serve "
            f"(ML_PLATFORM_CONTRACTS, ML_PLATFORM_DATASET): run the command where {of} is served"
        )
    if left_behind is not None and kept is not None and NAME.match(name):
        left = {c.name: left_behind(replay_dataset(c.name, name)) for c in served}
        left = {live: said for live, said in left.items() if said}
        if left and kept.exists():
            # Not a replay's folder: removing what the replay left would delete it too.
            raise ReplayError(
                f"replay '{name}' left what it made, and {kept} is no replay's folder (no "
                f"{REPLAY_FILE} or {CONTRACT_FILE}): move it away, then remove the replay"
            )
        if len(left) > 1:
            raise ReplayError(
                f"replays named '{name}' of {' and '.join(left)} left what they made, their "
                "folders gone: set ML_PLATFORM_DATASET to the dataset whose replay to remove"
            )
        if left:
            [(live, said)] = left.items()
            gone = f"its folder {kept} is gone, it left {'; '.join(said)}"
            return BrokenReplay(name, live, kept, gone)
    raise ReplayError(f"no replay named '{name}' in {root}: `ml-platform replay list` lists them")
