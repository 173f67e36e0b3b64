"""The live chain and a replay side by side over the replayed days, from what Dagster recorded.

For each chain and day: whether the day's data was accepted (and if not, where and why), what
the registry decided, the champion serving after the day, the serving champion's metric on the
day's labelled rows (champion_performance: the champion chosen up to the day before, scored on
the day it served, i.e. its next-day metric), whether drift was found, and what training cost.
The summary sets the two chains' next-day metric against each other on the days both scored,
with a paired bootstrap interval over those days (the promotion rule's kind of interval, over
days instead of rows). It says which chain did better only from `MIN_PAIRED_DAYS` paired days
on, and never when the replay changed the label or the task: the two metrics are then measured
on different targets. Its notes say where the chains' days are not alike, the warm-up days
before the first day among them (`WarmUp`).
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence

import dagster as dg
import numpy as np

from ml_platform.contracts.model import LabelRule, LabelSpec
from ml_platform.evaluation.metrics import LOWER_IS_BETTER
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.observability import STEP_PREFIX
from ml_platform.platform.records import ACCEPTED, UNCHANGED, DayRecord, day_records
from ml_platform.platform.rejected import DAY_ASSETS, first_sentence, where_rejected
from ml_platform.registry.assets import PROMOTE

# The assets whose records the comparison reads, of both chains.
COMPARED = DAY_ASSETS
# The assets that judge a warm-up day's data, whose verdicts the comparison reads.
WARM_UP_GATES = ("raw_data", "validated_data")
NOT_RECORDED, REJECTED = "not recorded", "rejected"
INTERVAL_SEED = 0
# The fewest days both champions were scored on that the interval may judge. A bootstrap over
# one day has a zero-width interval and one over two has at most three means, so any difference
# of a day or two's noise would look "clear of 0"; about a week of days, each a day of rows, is
# the least the day-to-day spread of a next-day metric shows itself over (and a week has each
# weekday once).
MIN_PAIRED_DAYS = 7


@dataclasses.dataclass(frozen=True)
class ChainDay:
    """One day of one chain, as recorded."""

    day: str
    # Where and why the day's data was rejected; None when accepted (or not recorded).
    rejected: str | None
    # The registry's decision on the day's candidate; None when nothing was judged.
    decision: str | None
    champion: str | None
    # The serving champion's metric on the day's labelled rows; None when it was not scored.
    metric: float | None
    drifted: bool | None
    train_seconds: float | None
    peak_mb: float | None
    # What of the day the chain has no record of: None when every day asset recorded it (or it
    # was rejected, which every asset after the rejecting one records), else "not recorded"
    # (never run) or the assets missing (a run that failed part way).
    unrecorded: str | None = None
    # The weekly full retrain the day's registration judged before its own candidate, and
    # what it did ("full-2024-01-07: promoted"); None when there was none.
    weekly: str | None = None
    # Where and why a re-delivery of the day was rejected while its earlier accepted version,
    # and all that was computed from it, was kept (the day's figures are that version's).
    kept: str | None = None


def _number(record: DayRecord | None, name: str) -> float | None:
    value = record.metadata.get(name) if record is not None else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _text(record: DayRecord | None, name: str) -> str | None:
    value = record.metadata.get(name) if record is not None else None
    return None if value in (None, "none") else str(value)


def outcome_record(
    instance: dg.DagsterInstance, key: dg.AssetKey, day: str, latest: DayRecord
) -> DayRecord:
    """The record of the outcome a day's latest record stands for.

    A day recorded `unchanged` (a re-delivery rejected upstream) kept its earlier outcome, but
    its record repeats only the entries its readers need (the registry's aliases): the
    decision, the score and the cost are in the latest record before it that computed the day.
    """
    if latest.verdict != UNCHANGED:
        return latest
    cursor = None
    while True:
        result = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[day]), limit=100, cursor=cursor
        )
        for record in result.records:
            found = DayRecord.of(record)
            if found.verdict != UNCHANGED:
                return found
        if not result.has_more:
            return latest
        cursor = result.cursor


def read_chain(
    instance: dg.DagsterInstance, dataset: str, days: Sequence[str], metric: str
) -> dict[str, ChainDay]:
    """Each of `days` of `dataset`'s chain as Dagster's records hold its outcome."""
    records = {}
    for name in COMPARED:
        key = asset_key(dataset, name)
        latest = day_records(instance, key, days)
        records[name] = {day: outcome_record(instance, key, day, r) for day, r in latest.items()}
    chain = {}
    for day in days:
        of_day = {name: records[name][day] for name in COMPARED if day in records[name]}
        found = where_rejected(day, of_day)
        registered = of_day.get("registered_model")
        drift = _number(of_day.get("drift_report"), "drifting_features")
        missing = [name for name in COMPARED if name not in of_day]
        weekly = _text(registered, "weekly_candidate")
        where = f"{found.asset}: {found.verdict}: {found.reason}" if found else None
        chain[day] = ChainDay(
            day=day,
            rejected=None if found and found.kept else where,
            decision=_text(registered, "decision"),
            champion=_text(registered, "champion"),
            metric=_number(of_day.get("champion_performance"), f"champion_{metric}"),
            drifted=None if drift is None else drift > 0,
            train_seconds=_number(of_day.get("model"), f"{STEP_PREFIX}wall_seconds"),
            peak_mb=_number(of_day.get("model"), f"{STEP_PREFIX}peak_rss_mb"),
            unrecorded=_unrecorded(missing) if missing and not found else None,
            weekly=f"{weekly}: {_text(registered, 'weekly_outcome')}" if weekly else None,
            kept=where if found and found.kept else None,
        )
    return chain


@dataclasses.dataclass(frozen=True)
class WarmUp:
    """The replay's warm-up days, and those its gates judged otherwise than the live chain's.

    The replay computes the days before its first day that its days look back on, but not the
    days those look back on: their history gate judges them against fewer reference days than
    the live chain's did (with too few it passes), besides any rule the replay changed. A
    warm-up day one chain accepted and the other did not makes the replay's first days train
    on, and be gated and checked for drift against, other days than the live chain's.
    """

    # The replay's first day; its warm-up days, in order.
    first_day: str
    days: list[str]
    # Each day judged otherwise: (live, replay), each "accepted", "not recorded" or
    # "rejected, <asset>: <verdict>: <reason>".
    differing: dict[str, tuple[str, str]]


def _judged(day: str, records: Mapping[str, DayRecord]) -> str:
    """Whether `day`'s data is history its later days read, from its raw and validated records."""
    validated = records.get("validated_data")
    if validated is None:
        return NOT_RECORDED
    # A rejected re-delivery keeps the earlier accepted version: the day is still history.
    if validated.accepted:
        return ACCEPTED
    found = where_rejected(day, records)
    if found is None:
        return REJECTED
    return f"{REJECTED}, {found.asset}: {found.verdict}: {first_sentence(found.reason)}"


def read_warm_up(
    instance: dg.DagsterInstance,
    live_dataset: str,
    replay_dataset: str,
    days: Sequence[str],
    first_day: str,
) -> WarmUp:
    """The warm-up `days` of both chains as their data gates judged them (`WarmUp`)."""
    judged: dict[str, dict[str, str]] = {}
    for dataset in (live_dataset, replay_dataset):
        records: dict[str, dict[str, DayRecord]] = {}
        for name in WARM_UP_GATES:
            key = asset_key(dataset, name)
            latest = day_records(instance, key, days)
            records[name] = {d: outcome_record(instance, key, d, r) for d, r in latest.items()}
        judged[dataset] = {
            day: _judged(day, {n: of[day] for n, of in records.items() if day in of})
            for day in days
        }

    def kind(said: str) -> str:
        return said.split(",", 1)[0]

    differing = {
        day: (judged[live_dataset][day], judged[replay_dataset][day])
        for day in days
        if kind(judged[live_dataset][day]) != kind(judged[replay_dataset][day])
    }
    return WarmUp(first_day, list(days), differing)


def _unrecorded(missing: Sequence[str]) -> str:
    """What a day that is not rejected lacks, in words."""
    if len(missing) == len(COMPARED):
        return "not recorded"
    return f"no record of {', '.join(missing)}"


@dataclasses.dataclass(frozen=True)
class ChainSummary:
    """A chain's days in a few numbers."""

    days: int
    rejected: list[str]
    promotions: int
    scored: int
    mean_metric: float | None
    drift_days: int
    train_seconds: float
    peak_mb: float | None
    # The days it has no whole record of, the days it judged a weekly full retrain on, and the
    # days it kept an earlier delivery of.
    unrecorded: list[str]
    weekly: list[str]
    kept: list[str]

    @classmethod
    def of(cls, chain: Mapping[str, ChainDay]) -> "ChainSummary":
        """The summary of one chain's days."""
        rows = list(chain.values())
        scores = [r.metric for r in rows if r.metric is not None]
        peaks = [r.peak_mb for r in rows if r.peak_mb is not None]
        return cls(
            days=len(rows),
            rejected=[r.day for r in rows if r.rejected],
            promotions=sum(r.decision == PROMOTE for r in rows),
            scored=len(scores),
            mean_metric=float(np.mean(scores)) if scores else None,
            drift_days=sum(bool(r.drifted) for r in rows),
            train_seconds=round(sum(r.train_seconds or 0.0 for r in rows), 2),
            peak_mb=max(peaks) if peaks else None,
            unrecorded=[r.day for r in rows if r.unrecorded],
            weekly=[r.day for r in rows if r.weekly],
            kept=[r.day for r in rows if r.kept],
        )


@dataclasses.dataclass(frozen=True)
class PairedDifference:
    """Replay minus live on the days both champions were scored, with a bootstrap interval."""

    days: int
    mean: float | None
    low: float | None
    high: float | None


def paired_difference(
    live: Mapping[str, ChainDay], replay: Mapping[str, ChainDay], samples: int
) -> PairedDifference:
    """The replay's next-day metric minus the live one's, averaged over the days both scored.

    The interval is the 2.5th to 97.5th percentile of the mean over `samples` resamples of
    those days (seeded: the same records give the same interval).
    """
    pairs = [(replay[d].metric, live[d].metric) for d in live if d in replay]
    differences = np.array(
        [r - v for r, v in pairs if r is not None and v is not None], dtype="float64"
    )
    if not len(differences):
        return PairedDifference(0, None, None, None)
    rng = np.random.default_rng(INTERVAL_SEED)
    means = differences[rng.integers(0, len(differences), (samples, len(differences)))].mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return PairedDifference(len(differences), float(differences.mean()), float(low), float(high))


def _rule(rule: LabelRule | None) -> str:
    # Every digit a contract may hold: `:g` keeps six, and "> 1000000" and "> 1000001" would
    # read as one rule, the two targets as the same.
    return "none" if rule is None else f"{rule.op} {rule.value:.15g}"


def target_change(live: LabelSpec, replay: LabelSpec) -> str | None:
    """How the replay's target differs from the live chain's, in words; None: the same target.

    The task, the label's source column and its rule make the target; its name and description
    do not.
    """
    changes = [
        f"{what} {was} -> {now}"
        for what, was, now in (
            ("task", live.task, replay.task),
            ("label source", live.source, replay.source),
            ("label rule", _rule(live.rule), _rule(replay.rule)),
        )
        if was != now
    ]
    return ", ".join(changes) or None


def verdict(difference: PairedDifference, metric: str, changed_target: str | None = None) -> str:
    """What the interval says, in words.

    No verdict when the chains' targets differ (`changed_target`, from `target_change`) or when
    fewer than `MIN_PAIRED_DAYS` days were scored by both: each says so instead.
    """
    if changed_target:
        return (
            f"the two chains are measured on different targets ({changed_target}): their "
            f"{metric} cannot be compared, no verdict"
        )
    if difference.mean is None or difference.low is None or difference.high is None:
        return f"no day has both champions' {metric}: nothing to compare yet"
    if difference.days < MIN_PAIRED_DAYS:
        return (
            f"too few days scored to tell: {difference.days} day(s) have both champions' "
            f"{metric}, a verdict needs {MIN_PAIRED_DAYS}"
        )
    better = "lower" if metric in LOWER_IS_BETTER else "higher"
    if difference.low > 0 or difference.high < 0:
        side = "higher" if difference.low > 0 else "lower"
        word = "better" if side == better else "worse"
        return f"the replay's serving champion did {word} ({side} {metric}, interval clear of 0)"
    return f"no clear difference in {metric} (the interval holds 0)"


def _listed(days: Sequence[str], most: int = 5) -> str:
    """Days in a sentence, the first `most` of them."""
    shown = ", ".join(days[:most])
    return shown + (f" and {len(days) - most} more" if len(days) > most else "")


def notes(
    live: Mapping[str, ChainDay],
    replay: Mapping[str, ChainDay],
    warm_up: WarmUp | None = None,
    live_change: str | None = None,
) -> list[str]:
    """What the reader must know before trusting the figures: the chains' days are not alike.

    A chain with days it has no whole record of (never run, or a run that failed part way)
    counts them in none of its figures, which would otherwise read as days without rejection,
    promotion or score. A chain that rejected a re-delivery of a day kept its earlier delivery,
    while the other chain may have read the file landed later. Weekly full retrains judged on
    different days make the serving champions come from different candidates: the replay's
    backfill runs the weekly retrain only on the days it is given (`Replay.live_weekly_days`).
    Warm-up days judged otherwise (`warm_up`, see `WarmUp`) make the replay's first days look
    back on other days. A live contract whose first day or timezone changed since the replay
    was made (`live_change`, `Replay.live_change`) may have recorded its days under either.
    """
    said = []
    if live_change:
        said.append(
            f"The live contract's partitions changed since the replay was made ({live_change}): "
            "the live chain's records of these days may be from before the change or after it, "
            "while the replay ran the contract it was made from; a day of one chain may not "
            "hold, or look back on, the hours and days of the other's."
        )
    if warm_up is not None and warm_up.differing:
        differing = list(warm_up.differing.items())
        shown = "; ".join(
            f"{day} (live: {was}; replay: {now})" for day, (was, now) in differing[:5]
        )
        more = f"; and {len(differing) - 5} more" if len(differing) > 5 else ""
        said.append(
            f"Not like for like before the first day: {len(differing)} of the replay's "
            f"{len(warm_up.days)} warm-up day(s) (the days before {warm_up.first_day} its days "
            f"look back on) were judged otherwise than in the live chain: {shown}{more}. The "
            "replay computed none of the days before its warm-up, so their gates judged them "
            "against fewer reference days than the live chain's (too few pass), or by the "
            "replay's changed rules: its first days train on, and are gated and checked for "
            "drift against, other days than the live chain's."
        )
    for side, chain in (("live", live), ("replay", replay)):
        summary = ChainSummary.of(chain)
        if summary.unrecorded:
            said.append(
                f"The {side} chain has no whole record of {len(summary.unrecorded)} of the "
                f"{summary.days} day(s) ({_listed(summary.unrecorded)}): they count in none of "
                "its figures and in no paired difference; the lines below say what is missing."
            )
        if summary.kept:
            said.append(
                f"The {side} chain kept an earlier delivery of {len(summary.kept)} day(s) "
                f"({_listed(summary.kept)}) whose re-delivery it rejected: its figures of those "
                "days are the earlier delivery's, which the other chain may not have read (a "
                "replay reads the files landed when it runs)."
            )
    live_weekly, replay_weekly = ChainSummary.of(live).weekly, ChainSummary.of(replay).weekly
    if live_weekly != replay_weekly:
        said.append(
            "Not like for like: the live chain judged a weekly full retrain on "
            f"{len(live_weekly)} day(s) ({_listed(live_weekly) or 'none'}), the replay on "
            f"{len(replay_weekly)} ({_listed(replay_weekly) or 'none'}); a serving champion may "
            "come from a weekly candidate the other chain never had."
        )
    return said


def _value(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def summary_rows(
    live: ChainSummary, replay: ChainSummary, metric: str
) -> list[tuple[str, str, str]]:
    """(what, live, replay) lines of the summary table."""
    return [
        ("days", str(live.days), str(replay.days)),
        ("rejected days", str(len(live.rejected)), str(len(replay.rejected))),
        ("promotions", str(live.promotions), str(replay.promotions)),
        (f"mean next-day {metric}", _value(live.mean_metric), _value(replay.mean_metric)),
        ("days scored", str(live.scored), str(replay.scored)),
        ("days not wholly recorded", str(len(live.unrecorded)), str(len(replay.unrecorded))),
        ("weekly retrains judged", str(len(live.weekly)), str(len(replay.weekly))),
        ("drift alarm days", str(live.drift_days), str(replay.drift_days)),
        ("training seconds", f"{live.train_seconds:.1f}", f"{replay.train_seconds:.1f}"),
        ("training peak MB", _value(live.peak_mb, 0), _value(replay.peak_mb, 0)),
    ]


def render_summary(
    live_name: str,
    replay_name: str,
    live: Mapping[str, ChainDay],
    replay: Mapping[str, ChainDay],
    metric: str,
    difference: PairedDifference,
    changed_target: str | None = None,
    caveats: Sequence[str] | None = None,
) -> str:
    """The comparison's summary as markdown: what the interval says, then a table of both.

    With `changed_target` (see `target_change`) no difference is shown: each chain's figures
    are on its own target. `caveats` are the `notes` shown; by default those of the days alone.
    """
    said = f"**{verdict(difference, metric, changed_target)}**"
    if changed_target:
        headline = f"{said}: each chain's {metric} below is on its own target."
    else:
        headline = (
            f"{said}: replay minus live, mean {_value(difference.mean)} over {difference.days} "
            f"day(s), 95% interval {_value(difference.low)} to {_value(difference.high)}."
        )
    lines = [
        f"# {replay_name} against {live_name}",
        "",
        headline,
        "",
        *(f"{note}\n" for note in (notes(live, replay) if caveats is None else caveats)),
        f"| | {live_name} (live) | {replay_name} (replay) |",
        "|---|---:|---:|",
        *(
            f"| {what} | {a} | {b} |"
            for what, a, b in summary_rows(ChainSummary.of(live), ChainSummary.of(replay), metric)
        ),
    ]
    return "\n".join(lines) + "\n"


def render_days(live: Mapping[str, ChainDay], replay: Mapping[str, ChainDay], metric: str) -> str:
    """A line a day of both chains as markdown: decision (or rejection), champion, metric."""
    lines = [
        f"| day | live: decision | live: champion | live: {metric} | replay: decision "
        f"| replay: champion | replay: {metric} |",
        "|---|---|---|---:|---|---|---:|",
    ]

    def one_line(text: str) -> str:
        # A reason may run over lines (the history gate's) and hold a `|`: a cell is one line.
        return first_sentence(text).replace("|", "\\|")

    def cells(row: ChainDay | None) -> str:
        if row is None or row.unrecorded == "not recorded":
            return "not recorded | | "
        decision = f"rejected ({one_line(row.rejected)})" if row.rejected else row.decision or "—"
        if row.unrecorded:
            decision += f" ({row.unrecorded})"
        if row.kept:
            decision += f" (re-delivery rejected, earlier version kept: {one_line(row.kept)})"
        if row.weekly:
            decision += f"; weekly {one_line(row.weekly)}"
        drift = " (drift)" if row.drifted else ""
        return f"{decision}{drift} | {row.champion or '—'} | {_value(row.metric)}"

    for day in sorted(set(live) | set(replay)):
        lines.append(f"| {day} | {cells(live.get(day))} | {cells(replay.get(day))} |")
    return "\n".join(lines) + "\n"
