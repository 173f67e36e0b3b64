"""A dataset's rejected days, as Dagster records them, and the command that reruns them."""

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence

import dagster as dg

from ml_platform.platform.datasets import REPLAY_MARK, asset_key
from ml_platform.platform.records import ACCEPTED, UNCHANGED, DayRecord, day_records
from ml_platform.platform.steps import Verdict

# The daily assets in the order a day flows through them: the first one whose record rejects
# the day is where it was rejected (the ones after it record "no accepted input").
DAY_ASSETS = (
    "raw_data",
    "validated_data",
    "features",
    "drift_report",
    "model",
    "evaluation_report",
    "registered_model",
    "champion_performance",
)


@dataclasses.dataclass(frozen=True)
class RejectedDay:
    """A day some asset recorded with a data verdict, and where and why."""

    day: str
    asset: str
    verdict: str
    reason: str
    # An earlier accepted version of the day was kept (a rejected re-delivery).
    kept: bool

    def line(self) -> str:
        """One line of a listing: the day, where and why it was rejected."""
        kept = " (earlier accepted version kept)" if self.kept else ""
        return f"{self.day}  {self.asset}: {self.verdict}{kept}: {first_sentence(self.reason)}"


def first_sentence(text: str, limit: int = 240) -> str:
    """The reason's first line, cut to `limit` characters: one line a day in a listing."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def is_rejection(record: DayRecord) -> bool:
    """Whether a day's record is a data verdict (a tombstone or a kept earlier version)."""
    return record.verdict not in (ACCEPTED, UNCHANGED)


def where_rejected(day: str, records: Mapping[str, DayRecord]) -> RejectedDay | None:
    """The first asset of `DAY_ASSETS` whose record of `day` rejects it, if any.

    A "no accepted input" record points at an asset before it; it is the answer only when that
    asset's record is not among `records` (it was not read).
    """
    found = [(name, r) for name, r in records.items() if is_rejection(r)]
    origin = [(n, r) for n, r in found if r.verdict != Verdict.NO_ACCEPTED_INPUT] or found
    if not origin:
        return None
    name, record = origin[0]
    kept = record.accepted
    return RejectedDay(day, name, record.verdict, record.reason, kept)


def rejected_days(
    instance: dg.DagsterInstance,
    dataset: str,
    days: Sequence[str],
    assets: Sequence[str] = DAY_ASSETS,
) -> list[RejectedDay]:
    """The days of `days` that an asset of `assets` rejected, in day order."""
    by_asset = {name: day_records(instance, asset_key(dataset, name), days) for name in assets}
    rejected = []
    for day in days:
        records = {name: by_asset[name][day] for name in assets if day in by_asset[name]}
        found = where_rejected(day, records)
        if found is not None:
            rejected.append(found)
    return rejected


def rerun_command(dataset: str, days: Sequence[str]) -> str:
    """The command that reruns `days`: materialize skips the days already accepted between.

    A replay's days are not the command's (it serves the live datasets): they are rerun from
    the UI, then compared again.
    """
    first, last = min(days), max(days)
    if REPLAY_MARK in dataset:
        return (
            f"in the UI, materialise {dataset}'s assets for {first} to {last} again (a range "
            f"of its daily assets), then its {dataset}_replay_comparison_job"
        )
    count = (dt.date.fromisoformat(last) - dt.date.fromisoformat(first)).days + 1
    return f"ml-platform materialize --dataset {dataset} --start {first} --days {count}"
