"""The chain of champions as Dagster recorded it: what each day's registered_model left.

Each accepted day of registered_model records, in its materialisation's metadata, the aliases
it left (`champion`, `challenger`). That record, never the registry's aliases as they are now,
says which champion a day met (the one the latest recorded day before it left) and what the
aliases must be before a step judges anything (what the latest recorded day says).
A step that failed after moving aliases recorded no day (a step's days are recorded together,
at its end), so its moves are undone before its retry or the next run judges again: a day's
decision is the same whatever attempts failed before it.

The champion is scored by two steps, registered_model (against each candidate) and
champion_performance (on each day's rows): both first make sure the contract still feeds it
(`fed_champion`), and stop the same way when it does not, or when its files are lost from the
registry (`unloadable_champion`).
"""

import dataclasses
import datetime as dt
from collections.abc import Mapping

import dagster as dg

from ml_platform.contracts import Contract
from ml_platform.contracts.model import described, redefined
from ml_platform.platform.records import DayRecord, day_records
from ml_platform.registry.store import ALIASES, DamagedVersionError, RegistryError
from ml_platform.training.model import TrainedModel

# Days asked of Dagster at once when looking back for the latest recorded day.
LOOKBACK_DAYS = 31


class ChampionFeaturesError(dg.Failure):
    """The contract no longer feeds the champion what it learnt from: it cannot be scored.

    A contract change under the serving champion (a feature dropped or renamed, computed from
    another source or transform, made numeric from categorical; the label's task changed), met
    by either step that scores it (`step`: registered_model or champion_performance). Not
    retried: every later day meets the same champion until a person chooses the way out, which
    the message names.
    """

    def __init__(self, step: str, champion: str, unfed: list[str], day: str, contract: Contract):
        super().__init__(
            description=(
                f"{step} {day}: the champion {champion} cannot be scored under the contract of "
                f"'{contract.name}': {'; '.join(unfed)}. So it can be scored neither against a "
                "candidate (registered_model) nor on a day's rows (champion_performance), and "
                f"every later day stops here too, whatever the wait. Either put the contract "
                f"back as the champion learnt it and rerun the days from {day}, or make the "
                "change a dataset of its own (a contract with a new `name`: its registry starts "
                "empty, so its first eligible model is promoted). `ml-platform replay promote` "
                "does not help: it changes the live contract, not the champion, which moves "
                "only by registered_model's rule (docs/replay.md)"
            ),
            metadata={"champion": champion, "unfed": unfed},
            allow_retries=False,
        )


def unloadable_champion(step: str, day: str, version: str, exc: RegistryError) -> dg.Failure:
    """The stop of a step whose champion cannot be loaded from the registry, never retried.

    Its files lost or damaged in the artifact store (`DamagedVersionError`: the message names
    the file, what is wrong and the rerun that restores it), or its model version gone from the
    registry. Either is a stored artifact lost, which no wait brings back: a data failure, as
    the runbook classes a registry entry that is missing. Raised from None, as a gate's stop
    is: a cause recorded with it would class the run as a code bug, and its message is here.
    """
    if isinstance(exc, DamagedVersionError):
        what = f"the champion {version} cannot be loaded: {exc}"
    else:
        what = (
            f"the champion {version}, which the record of registered_model names, is not in "
            f"the registry ({exc}): its model version was deleted in MLflow, or the platform "
            "reads another MLflow store than the one that registered it. Check the MLflow URIs "
            "of the code location, else restore MLflow's store from a backup "
            "(docs/runbook.md#a-registered-models-files-are-lost)"
        )
    return dg.Failure(
        description=f"{step} {day}: {what}",
        metadata={"champion": version, "registry_error": str(exc)},
        allow_retries=False,
    )


def learnt_definitions(model: TrainedModel) -> dict[str, dict[str, str]]:
    """How each feature of `model` was computed when it trained, by name.

    A model trained before definitions were recorded says only each feature's kind, as its
    preprocessing treats it (the `numeric` and `categorical` parts of its ColumnTransformer).
    """
    if model.feature_definitions:
        return model.feature_definitions
    preprocess = model.pipeline.named_steps["preprocess"]
    return {
        column: {"kind": kind} for kind, _, columns in preprocess.transformers for column in columns
    }


def unfed(model: TrainedModel, contract: Contract) -> list[str]:
    """What the contract no longer feeds `model` as it learnt it, in words; empty: all of it."""
    learnt = learnt_definitions(model)
    return unfed_definitions(model.task, {name: learnt[name] for name in model.features}, contract)


def unfed_definitions(
    task: str, learnt: Mapping[str, Mapping[str, str]], contract: Contract
) -> list[str]:
    """What the contract no longer feeds a `task` model that learnt `learnt` (name: definition).

    A feature dropped or renamed, or computed from another source or by another transform: the
    model would score values it never learnt. A categorical feature made numeric: its encoder
    would read every number as a category it never saw. A numeric feature made categorical
    is no reason: its categories are the same numbers as text, which the model reads as it
    learnt them. A feature added is none: the model never reads it. Its label may be renamed:
    it never reads it to predict. Its task must be the contract's, whose metrics judge it.
    """
    found = []
    if task != contract.task:
        found.append(f"it is a {task} model, and the contract's label is for {contract.task}")
    now = contract.feature_definitions
    if missing := [name for name in learnt if name not in now]:
        found.append(f"it needs the feature(s) {missing}, which the contract no longer provides")
    for name in redefined(learnt, now):
        was, then = learnt[name], now[name]
        if was["kind"] == "numeric" and all(was[k] == then[k] for k in was if k != "kind"):
            continue  # made categorical, nothing else: the same numbers as text
        found.append(
            f"it learnt the feature {name} as {described(was)}, which the contract now computes "
            f"as {described(then)}"
        )
    return found


def fed_champion(
    step: str, day: str, version: str, champion: TrainedModel, contract: Contract
) -> TrainedModel:
    """The champion's model, which the contract must feed as it learnt (`unfed`).

    It is scored against the contract's label, whatever the label was called when it trained:
    its predictions never read the label, and the days it serves are judged by the contract's.
    """
    if found := unfed(champion, contract):
        raise ChampionFeaturesError(step, version, found, day, contract)
    return dataclasses.replace(champion, label=contract.label_name)


def says_aliases(record: DayRecord | None) -> bool:
    """Whether a record says where the aliases were after its day: an accepted, judged day.

    A tombstone judged nothing. A day recorded unchanged (its inputs' re-deliveries were
    rejected) repeats the aliases of the record it kept (`each_day`'s `carried`).
    """
    return record is not None and record.accepted and ALIASES[0] in record.metadata


def aliases_of(record: DayRecord | None) -> dict[str, str | None]:
    """The aliases an accepted day's record says its registration left (none: no record)."""
    if record is None:
        return dict.fromkeys(ALIASES)
    return {
        alias: (None if record.metadata.get(alias, "none") == "none" else record.metadata[alias])
        for alias in ALIASES
    }


class RecordedChain:
    """The aliases each recorded day of registered_model left, looked up by the day after.

    `first_day` is the dataset's first partition: nothing before it is ever recorded.
    """

    def __init__(self, instance: dg.DagsterInstance, key: dg.AssetKey, first_day: str):
        self.instance = instance
        self.key = key
        self.first_day = first_day
        # Each day asked for so far: its accepted record, or None.
        self._known: dict[str, DayRecord | None] = {}
        # The days asked for that Dagster records nothing of (not even a tombstone).
        self._absent: set[str] = set()

    def _fetch(self, days: list[str]) -> None:
        wanted = [d for d in days if d not in self._known]
        if wanted:
            found = day_records(self.instance, self.key, wanted)
            for day in wanted:
                record = found.get(day)
                self._known[day] = record if says_aliases(record) else None
                if record is None:
                    self._absent.add(day)

    def unrecorded(self, day: str) -> bool:
        """Whether Dagster records nothing of the day: it never ran, or its runs failed."""
        self._fetch([day])
        return day in self._absent

    def prefetch(self, first: str, last: str) -> None:
        """Ask Dagster once for the days a step will look up (the look-back before `first` too)."""
        start = max(self.first_day, _shift(first, -LOOKBACK_DAYS))
        self._fetch(_days(start, last))

    def recorded(self, day: str) -> DayRecord | None:
        """The day's record that says the aliases, as it was when first asked for (or None)."""
        self._fetch([day])
        return self._known[day]

    def latest_after(self, day: str, last: str) -> tuple[str, DayRecord] | None:
        """The latest day after `day` (to `last`) with an accepted record, and that record."""
        later = _days(_shift(day, 1), last)
        found = day_records(self.instance, self.key, later) if later else {}
        accepted = [(d, record) for d, record in found.items() if says_aliases(record)]
        return max(accepted, key=lambda item: item[0]) if accepted else None

    def before(self, day: str) -> dict[str, str | None]:
        """The aliases the latest recorded day before `day` left: the champion `day` met."""
        end = _shift(day, -1)
        while end >= self.first_day:
            start = max(self.first_day, _shift(end, -(LOOKBACK_DAYS - 1)))
            days = _days(start, end)
            self._fetch(days)
            for earlier in reversed(days):
                record = self._known[earlier]
                if record is not None:
                    return aliases_of(record)
            end = _shift(start, -1)
        return aliases_of(None)


def _shift(day: str, days: int) -> str:
    return (dt.date.fromisoformat(day) + dt.timedelta(days=days)).isoformat()


def _days(first: str, last: str) -> list[str]:
    start, end = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    return [(start + dt.timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]
