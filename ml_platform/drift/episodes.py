"""Drift episodes: a feature's lasting move told once, not every drifted day.

A feature that moves with the weather drifts on some ordinary days whatever the test; a day's
verdict is the day's weather, kept and plotted (`features_drift`), and what a person is told
about is an episode. Per feature, a state machine over its judged days (`drift.episodes`):

- an episode opens on the day when `open_days` of the feature's last `window` judged days
  drifted, or on the day itself when the day drifted where the reference never was (its
  level beyond the reference's whole range and 3 reference sd away, or half its rows in
  categories the reference never had: `FeatureVerdict.unseen`);
- it closes on the first day that ends `close_days` quiet days in a row, and the counting
  starts afresh, so a closed episode does not reopen from the days that opened it.

A day with no verdict (a rejected delivery, no reference yet, a feature not tested) is not
judged: it neither counts toward an episode nor toward its end. A feature the contract stops
testing, or computes otherwise (another kind, source or transform), ends its episode saying so.
The state of day D is a pure function of the state of the judged day before and D's verdicts
(and the contract), so it is carried in the records of an asset whose days depend on their day
before (`registry.monitoring`): the same in a one-day run and in any split of a backfill.
"""

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from ml_platform.contracts.model import DriftEpisodeSpec, redefined


@dataclasses.dataclass(frozen=True)
class FeatureDay:
    """One feature's drift verdict on one day, as an episode needs it.

    Attributes:
        drifted: the day's calibrated verdict was drift.
        effect: the day's distance from the reference (KS D or Jensen-Shannon distance).
        usual: the largest of the feature's day-to-day distances in the reference window
            (its usual range), or None when not calibrated.
        unseen: nearly all the day's values lie where the reference never was.
        effect_name: 'ks_d' or 'js_distance'.
    """

    drifted: bool
    effect: float
    usual: float | None = None
    unseen: bool = False
    effect_name: str = "ks_d"


@dataclasses.dataclass(frozen=True)
class Episode:
    """An episode of one feature: since when it moved, how far, and whether it ended."""

    feature: str
    since: str  # the first drifted day of the days that opened it
    opened: str  # the day it opened
    drift_days: int  # drifted days so far
    largest: float  # the largest distance of its days
    largest_day: str
    usual: float | None  # the feature's usual day-to-day distance on that day
    effect_name: str
    closed: str | None = None
    # Why it ended, when not because the feature settled back: the contract stopped judging it.
    stopped: str | None = None
    # Whether the serving champion leans on the feature (pages); None: not known.
    leaned_on: bool | None = None
    importance: float | None = None
    # Why the champion's importance could not be measured (its metric undefined on the day).
    unmeasured: str | None = None

    def describe(self) -> str:
        """One line: the feature, since when, how far against its usual range."""
        usual = f" against its usual up to {self.usual:.3f}" if self.usual is not None else ""
        text = (
            f"{self.feature} since {self.since} ({self.drift_days} drifted day(s)): "
            f"{self.effect_name} up to {self.largest:.3f} on {self.largest_day}{usual}"
        )
        if self.closed and self.stopped:
            return f"{text}, ended {self.closed}: {self.stopped}"
        return text + (f", back since {self.closed}" if self.closed else "")

    def leaning(self) -> str:
        """Whether the serving champion leans on the feature, in words."""
        if self.unmeasured is not None:
            return (
                f"how much the champion leans on it could not be measured ({self.unmeasured}): "
                "told as if it did"
            )
        if self.importance is None:
            return "no serving champion to lean on it"
        leaned = "leans on it" if self.leaned_on else "barely uses it"
        return f"the champion {leaned} ({self.importance:.0%} of its permutation importance)"

    def to_json(self) -> dict[str, Any]:
        """For a day's stored record."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Episode":
        """From `to_json`."""
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class FeatureState:
    """Where one feature stands after a judged day."""

    # The last `window` judged days: (day, drifted, distance).
    recent: tuple[tuple[str, bool, float], ...] = ()
    quiet: int = 0  # quiet days in a row inside an open episode
    episode: Episode | None = None
    # How the contract computed the feature (`Contract.feature_definitions`) on the days the
    # state counts; None: not recorded (a state stored before definitions were).
    definition: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        """For a day's stored record."""
        stored: dict[str, Any] = {
            "recent": [list(pair) for pair in self.recent],
            "quiet": self.quiet,
            "episode": self.episode.to_json() if self.episode else None,
        }
        if self.definition is not None:
            stored["definition"] = dict(self.definition)
        return stored

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "FeatureState":
        """From `to_json`."""
        episode = data.get("episode")
        return cls(
            recent=tuple(
                (str(day), bool(drifted), float(effect))
                for day, drifted, effect in data.get("recent", [])
            ),
            quiet=int(data.get("quiet", 0)),
            episode=Episode.from_json(episode) if episode else None,
            definition=dict(data["definition"]) if data.get("definition") else None,
        )


@dataclasses.dataclass(frozen=True)
class DayEpisodes:
    """The episodes after one day: each feature's state, and what opened or closed that day."""

    states: dict[str, FeatureState]
    opened: list[Episode]
    closed: list[Episode]

    @property
    def open(self) -> list[Episode]:
        """Episodes open at the end of the day, by feature."""
        return [s.episode for _, s in sorted(self.states.items()) if s.episode is not None]

    def states_json(self) -> dict[str, Any]:
        """Each feature's state, for the day's stored record."""
        return {feature: state.to_json() for feature, state in sorted(self.states.items())}


def states_from_json(data: Mapping[str, Any] | None) -> dict[str, FeatureState]:
    """The states a day's record stored (`DayEpisodes.states_json`); none for no record."""
    return {feature: FeatureState.from_json(v) for feature, v in (data or {}).items()}


NOT_MONITORED = "the contract no longer tests the feature for drift"
REDEFINED = "the contract computes the feature otherwise: its drift is judged afresh"


def advance(
    day: str,
    verdicts: Mapping[str, FeatureDay],
    before: Mapping[str, FeatureState],
    spec: DriftEpisodeSpec,
    monitored: Collection[str] | None = None,
    definitions: Mapping[str, Mapping[str, str]] | None = None,
) -> DayEpisodes:
    """The state of every feature after `day`, from the state before it and the day's verdicts.

    A feature without a verdict on `day` keeps its state: the day is not judged for it. A
    feature no longer among `monitored` (removed from the contract, or excluded from drift)
    will never be judged again: its open episode ends on `day`, saying so, and its state goes;
    a verdict of it on `day` (a drift report made before the contract changed) is left out.
    A feature the contract now computes otherwise than its state's days (`definitions`, the
    contract's; the state records the one it counted) is another series: its open episode
    ends on `day` saying so, and its counting starts afresh.
    """
    states = dict(before)
    opened: list[Episode] = []
    closed: list[Episode] = []
    ended = set(states) - set(monitored) if monitored is not None else set()
    if definitions is not None:
        # Its old days' drift says nothing of the new values: counted on, the episode would
        # stay open while the new definition's reference fills (no verdict), then close as
        # "back", or the old days would open one.
        recorded = {f: s.definition for f, s in states.items() if s.definition is not None}
        renewed = set(redefined(recorded, definitions)) - ended
    else:
        renewed = set()
    for feature in sorted(ended | renewed):
        episode = states.pop(feature).episode
        if episode is not None:
            stopped = NOT_MONITORED if feature in ended else REDEFINED
            closed.append(dataclasses.replace(episode, closed=day, stopped=stopped))
    for feature, today in verdicts.items():
        if monitored is not None and feature not in monitored:
            # Counting it again would reopen the episode just ended, and end it again the
            # next day: told every day for as long as older reports judge it.
            continue
        state = states.get(feature, FeatureState())
        recent = (*state.recent, (day, today.drifted, today.effect))[-spec.window :]
        episode, quiet = state.episode, state.quiet
        if episode is None:
            drifted_days = [(d, effect) for d, drifted, effect in recent if drifted]
            lasting = len(drifted_days) >= spec.open_days
            if lasting or (today.drifted and today.unseen):
                # Since the drift that lasted, or since the day that moved it at once.
                counted = drifted_days if lasting else [(day, today.effect)]
                largest_day, largest = max(counted, key=lambda pair: pair[1])
                episode = Episode(
                    feature=feature,
                    since=counted[0][0],
                    opened=day,
                    drift_days=len(counted),
                    largest=largest,
                    largest_day=largest_day,
                    usual=today.usual,
                    effect_name=today.effect_name,
                )
                opened.append(episode)
                quiet = 0
        elif today.drifted:
            quiet = 0
            episode = dataclasses.replace(episode, drift_days=episode.drift_days + 1)
            if today.effect > episode.largest:
                episode = dataclasses.replace(
                    episode, largest=today.effect, largest_day=day, usual=today.usual
                )
        else:
            quiet += 1
            if quiet >= spec.close_days:
                closed.append(dataclasses.replace(episode, closed=day))
                # Counting starts afresh: the days that opened it do not open the next.
                episode, quiet, recent = None, 0, ()
        states[feature] = FeatureState(recent=recent, quiet=quiet, episode=episode)
    if definitions is not None:
        states = {
            feature: dataclasses.replace(state, definition=dict(definitions[feature]))
            if feature in definitions
            else state
            for feature, state in states.items()
        }
    return DayEpisodes(states=states, opened=opened, closed=closed)


def feature_days(report: Mapping[str, Any]) -> dict[str, FeatureDay]:
    """The judged features of a stored drift report (`DriftReport.to_json`), by name.

    A day that was not evaluated (no reference) or a feature that was skipped has no verdict.
    """
    if not report.get("evaluated"):
        return {}
    return {
        v["feature"]: FeatureDay(
            drifted=v["status"] == "drift",
            effect=float(v["effect"]),
            usual=v.get("day_to_day_high"),
            unseen=bool(v.get("unseen", False)),
            effect_name=v["effect_name"],
        )
        for v in report.get("features", [])
        if v["status"] != "skipped" and v.get("effect") is not None
    }


def replay(
    days: Iterable[tuple[str, Mapping[str, FeatureDay]]], spec: DriftEpisodeSpec
) -> list[Episode]:
    """Every episode of a series of judged days, in order of opening (closed or still open).

    What the daily states add up to over a series: for tests, benchmarks and `health`.
    """
    states: dict[str, FeatureState] = {}
    episodes: list[Episode] = []
    for day, verdicts in days:
        result = advance(day, verdicts, states, spec)
        states = result.states
        for ended in result.closed:
            index = next(
                i
                for i, e in enumerate(episodes)
                if e.feature == ended.feature and e.opened == ended.opened and e.closed is None
            )
            episodes[index] = ended
        episodes += result.opened
    for state in states.values():
        if state.episode is not None:
            index = next(
                i
                for i, e in enumerate(episodes)
                if e.feature == state.episode.feature and e.opened == state.episode.opened
            )
            episodes[index] = state.episode
    return episodes
