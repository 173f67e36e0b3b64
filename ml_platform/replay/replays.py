"""A replay: a changed contract run over past days as a dataset of its own, beside the live one.

`ml-platform replay CONTRACT --start D --days N --name NAME` keeps the changed contract as it was
written, in a folder of the replays directory (`Settings.replays_dir`), with what the replay is:

    <replays>/<name>/contract.yaml   the changed contract, byte for byte
    <replays>/<name>/replay.yaml     of: <live dataset>, start: D, days: N

The code location serves it as the dataset `<live>__replay_<name>`: every asset, group, job,
pool, lake folder, MLflow experiment and registered model carries that name, so nothing the live
dataset owns is written. It reads the live dataset's landed files (the same `landing`, which a
replay may not change), read-only as every dataset reads them. It has no sensor, schedule or
freshness policy (it runs only when launched) and its alerts page no one.
"""

import dataclasses
import datetime as dt
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import yaml

from ml_platform.contracts import Contract, ContractError, load_contract
from ml_platform.platform.rejected import DAY_ASSETS

# The dataset name of a replay: `<live>__replay_<name>`.
MARK = "__replay_"
CONTRACT_FILE = "contract.yaml"
REPLAY_FILE = "replay.yaml"
NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# The assets a replay computes over the days before it, which its first days look back on.
WARM_UP_ASSETS = ("raw_data", "validated_data", "features", "drift_report")


def _day_keys(first: dt.date, count: int) -> list[str]:
    return [(first + dt.timedelta(days=i)).isoformat() for i in range(count)]


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

    @property
    def dataset(self) -> str:
        """The replay's dataset name."""
        return self.contract.name

    @property
    def day_keys(self) -> list[str]:
        """The replayed days, as partition keys, in order."""
        return _day_keys(self.start, self.days)

    @property
    def warm_up_keys(self) -> list[str]:
        """The days before the replay its first days look back on, as partition keys.

        The first day's model trains on the window ending that day, its gate and drift check
        compare it with the days before: those days' data, computed under the replay's
        contract, make its first days judged as the live chain's were. Never before the
        dataset's first day.
        """
        c = self.contract
        back = [c.training.window_days - 1]
        for reference in (c.history_reference, c.drift.reference):
            if reference.mode == "previous_days":
                back.append(reference.days)
        first = max(c.partitions.start_date, self.start - dt.timedelta(days=max(back)))
        return _day_keys(first, (self.start - first).days)

    def backfill_ranges(self) -> dict[str, tuple[str, str]]:
        """The days of each day asset the replay's backfill computes, by asset name.

        Every day asset over the replayed days; the data assets (up to the drift report, which
        a model reads for a blocking feature) over the warm-up days too.
        """
        days, warm_up = self.day_keys, self.warm_up_keys
        ranges = dict.fromkeys(DAY_ASSETS, (days[0], days[-1]))
        if warm_up:
            for name in WARM_UP_ASSETS:
                ranges[name] = (warm_up[0], days[-1])
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


def create_replay(
    root: str | Path,
    changed_file: str | Path,
    live: Contract,
    name: str,
    start: dt.date,
    days: int,
) -> Replay:
    """Keep `changed_file` as replay `name` of `live` over `days` days from `start`.

    A replay of that name already there is an error: each replay's records belong to the
    contract it ran (`ml-platform replay remove NAME` first).
    """
    if not NAME.match(name):
        raise ReplayError(f"replay name {name!r}: use lower-case letters, digits and _")
    if days < 1:
        raise ReplayError(f"--days {days}: a replay runs at least one day")
    first = live.partitions.start_date
    if start < first:
        raise ReplayError(f"--start {start}: the dataset's days begin on {first}")
    changed_file = Path(changed_file)
    try:
        changed = load_contract(changed_file)
    except ContractError as exc:
        raise ReplayError(str(exc)) from exc
    contract = _renamed(changed, live, name, str(changed_file))
    folder = Path(root) / name
    if folder.exists():
        raise ReplayError(
            f"a replay named '{name}' exists ({folder}): remove it first "
            f"(`ml-platform replay remove {name}`) or choose another --name"
        )
    folder.mkdir(parents=True)
    shutil.copyfile(changed_file, folder / CONTRACT_FILE)
    plan = {"of": live.name, "start": start.isoformat(), "days": days}
    (folder / REPLAY_FILE).write_text(yaml.safe_dump(plan, sort_keys=False))
    return Replay(name, live.name, start, days, contract, folder)


def read_replay(folder: Path, live: Contract) -> Replay:
    """The replay kept in `folder`, a replay of `live`."""
    plan = yaml.safe_load((folder / REPLAY_FILE).read_text())
    contract = _renamed(load_contract(folder / CONTRACT_FILE), live, folder.name, str(folder))
    return Replay(
        folder.name,
        live.name,
        dt.date.fromisoformat(str(plan["start"])),
        int(plan["days"]),
        contract,
        folder,
    )


def load_replays(root: str | Path | None, served: Sequence[Contract]) -> list[Replay]:
    """The replays in `root` of the datasets `served`, by name; none without a directory.

    A replay of a dataset the code location does not serve is left out: its comparison would
    have no live chain to read.
    """
    if root is None or not Path(root).is_dir():
        return []
    live = {c.name: c for c in served}
    replays = []
    for folder in sorted(p for p in Path(root).iterdir() if (p / REPLAY_FILE).is_file()):
        of = str(yaml.safe_load((folder / REPLAY_FILE).read_text())["of"])
        if of in live:
            replays.append(read_replay(folder, live[of]))
    return replays


def find_replay(root: str | Path | None, name: str, served: Sequence[Contract]) -> Replay:
    """Replay `name` of one of the datasets `served`."""
    for replay in load_replays(root, served):
        if replay.name == name:
            return replay
    raise ReplayError(f"no replay named '{name}' in {root}: `ml-platform replay list` lists them")
