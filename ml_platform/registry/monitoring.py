"""champion_performance: the serving champion scored on each day's labelled rows, and its decay.

registered_model compares a candidate with the champion on the candidate's held-out rows; that
says nothing about how the model users are served does on the days it serves them. This asset
answers that: the serving champion of day D is the champion the registrations of the days before
D left, as Dagster recorded registered_model's days before D (`registry.chain`; this asset
depends on registered_model's day before). It was trained before D's
rows came in, so its metrics on D's labelled rows are its performance on data it never saw.
Plotted across partitions in the UI, they show when to retrain.

The same step follows each feature's drift episodes (`drift.episodes`): the day's drift report
advances the state the day before left (`drift/episodes.py`), which the day's record carries to
the next. The `drift_episode` check fails (WARN) while an episode is open and names what opened
or closed that day; an opened episode says whether the serving champion leans on the feature
(its permutation importance on the day's labelled rows), which decides whether it pages.

A rerun of past days (a corrected file re-landed, a fixed feature) leaves the days recorded
after them as they were: each carried the episode states, and counted the decay streak, of the
earlier version. Dagster follows no self-dependency of an asset of more than 100 partitions to
show them stale, so the rerun's last day names them (`stale_later_days` in its record and
metadata, and in its checks' descriptions, with the range to materialise); a range through the
latest day carries the new states through.

The `champion_decay` check fails (WARN) when the champion misses the contract's value
thresholds on `evaluation.decay_days` days in a row: one bad day is noise, a streak is decay.
The streak reads accepted days only: a day without a stored record (a tombstone: its features
were rejected) neither counts nor breaks it, and the look-back stops after `DECAY_LOOKBACK`
times `decay_days` days. A day with no champion yet, or no labelled rows, breaks a streak; a
day with fewer labelled rows than `evaluation.min_holdout_rows` (the least a candidate is judged
on) is too few to judge, neither counted nor a break; a contract without value thresholds has
nothing to decay from.
"""

import dataclasses
import datetime as dt
import functools
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.drift.detect import tested_features
from ml_platform.drift.episodes import (
    DayEpisodes,
    Episode,
    FeatureState,
    advance,
    feature_days,
    states_from_json,
)
from ml_platform.evaluation.assets import non_finite_predictions
from ml_platform.evaluation.metrics import (
    LOWER_IS_BETTER,
    Predictions,
    importance_shares,
    predict_holdout,
    primary_metric,
    score_of,
    undefined_why,
)
from ml_platform.platform.datasets import asset_key, dataset_name, writer_pool
from ml_platform.platform.formats import FORMAT_KEY
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.retries import STORAGE_RETRY_POLICY
from ml_platform.platform.runbook import check_description
from ml_platform.platform.sizes import request_metadata, step_tags
from ml_platform.platform.steps import (
    chained_backfill_policy,
    daily_check_spec,
    each_day,
    previous_day_input,
)
from ml_platform.registry.chain import RecordedChain, fed_champion, unloadable_champion
from ml_platform.registry.store import ModelRegistryResource, RegistryError
from ml_platform.training.model import TrainedModel, labelled

CHAMPION_PERFORMANCE = "champion_performance"
# A decay streak looks back at most this many times its length in days (tombstones are skipped).
DECAY_LOOKBACK = 4
DECAY_CHECK = "champion_decay"
EPISODE_CHECK = "drift_episode"
OPEN_EPISODES_KEY = "open_drift_episodes"
EPISODES_KEY = "drift_episodes"
# A feature's episode state is carried from the latest stored day at most this many days back;
# after a longer gap it starts afresh.
EPISODE_LOOKBACK = 28
# What a day's record says about its champion.
SCORED = "scored"
NO_CHAMPION = "no_champion"
NO_LABELLED_ROWS = "no_labelled_rows"
TOO_FEW_LABELLED_ROWS = "too_few_labelled_rows"
UNSCORABLE = "predictions_not_finite"
# The recorded days after a rerun's that still hold what they read from its earlier version.
STALE_KEY = "stale_later_days"


def threshold_results(
    values: dict[str, float], thresholds: dict[str, float], undefined: Iterable[str] = ()
) -> dict[str, dict[str, Any]]:
    """Each value threshold of the contract against the champion's metric: met, missed or None.

    mae and rmse are maximums, the others minimums; a metric the task lacks misses its bound,
    as in the promotion verdict. A metric the day's rows cannot define (`undefined`, or not a
    finite number: ROC AUC on a day of one class, R² on one row) is neither met nor missed
    (`met: None`): the day says nothing of the champion on it.
    """
    results = {}
    unknown = set(undefined)
    for metric, bound in thresholds.items():
        value = float(values.get(metric, math.nan))
        lower = metric in LOWER_IS_BETTER
        met: bool | None = bool(value <= bound if lower else value >= bound)
        if metric in values and (metric in unknown or not math.isfinite(value)):
            met = None
        results[metric] = {
            "value": value,
            "bound": bound,
            "direction": "max" if lower else "min",
            "met": met,
        }
    return results


def undefined_metrics(predictions: Predictions) -> dict[str, str]:
    """The metrics the day's labelled rows cannot define, each with why (`undefined_why`)."""
    metrics = ("roc_auc", "recall", "f1") if predictions.task == "classification" else ("r2",)
    found = {m: undefined_why(m, predictions.labels, "labelled rows") for m in metrics}
    return {metric: why for metric, why in found.items() if why}


def judged(thresholds: dict[str, dict[str, Any]]) -> bool | None:
    """Whether the champion meets every threshold; None when none is missed and one is unknown."""
    met = [t["met"] for t in thresholds.values()]
    if False in met:
        return False
    return None if None in met else True


def champion_record(
    contract: Contract,
    day: str,
    champion_version: str | None,
    features: pd.DataFrame,
    load: Callable[[str], TrainedModel],
) -> dict[str, Any]:
    """The record of day D: the serving champion's metrics on D's labelled rows, if it has both."""
    rows = labelled(features, contract)
    record: dict[str, Any] = {
        "partition": day,
        "task": contract.label.task,
        "champion_version": champion_version,
        "labelled_rows": len(rows),
        "metrics": {},
        "intervals": {},
        "thresholds": {},
        "meets_thresholds": None,
    }
    if champion_version is None:
        return {
            **record,
            "status": NO_CHAMPION,
            "note": f"no champion served {day} yet (the first model): nothing to score",
        }
    if rows.empty:
        return {
            **record,
            "status": NO_LABELLED_ROWS,
            "note": f"{day} has no labelled rows yet: champion {champion_version} not scored",
        }
    spec = contract.evaluation
    if len(rows) < spec.min_holdout_rows:
        # The least a candidate is judged on (`judge_candidate`): the metrics and intervals of a
        # handful of rows say nothing of the champion, and one far-off row would count as a
        # bad day towards decay.
        counted = "1 labelled row" if len(rows) == 1 else f"{len(rows)} labelled rows"
        return {
            **record,
            "status": TOO_FEW_LABELLED_ROWS,
            "note": (
                f"champion {champion_version} not judged on {day}: its {counted} are too few "
                f"to judge a model on (at least {spec.min_holdout_rows}, contract "
                "evaluation.min_holdout_rows)"
            ),
        }
    champion = load(champion_version)
    predictions = predict_holdout(champion, rows)
    if predictions.non_finite or predictions.overflowing_labels():
        unscorable = predictions.overflowing_labels() or non_finite_predictions(champion, rows)
        # No metric exists for an infinite prediction: the day is told, not scored.
        return {
            **record,
            "status": UNSCORABLE,
            "note": f"champion {champion_version} cannot be scored on {day}: {unscorable}",
        }
    scores = score_of(predictions, spec.bootstrap_samples, contract.training.random_seed)
    undefined = undefined_metrics(predictions)
    thresholds = threshold_results(scores.values, spec.value_thresholds, undefined)
    meets = judged(thresholds)
    unknown = {m: undefined.get(m, "not a finite number") for m, t in thresholds.items()}
    unknown = {m: why for m, why in unknown.items() if thresholds[m]["met"] is None}
    if meets is None:
        why = "; ".join(f"{metric} is undefined ({reason})" for metric, reason in unknown.items())
        verdict = f"cannot be judged against the value thresholds: {why}"
    else:
        verdict = ("meets" if meets else "misses") + " the value thresholds"
    return {
        **record,
        "status": SCORED,
        "metrics": scores.values,
        "intervals": {name: list(bounds) for name, bounds in scores.intervals.items()},
        "thresholds": thresholds,
        "meets_thresholds": meets,
        "note": f"champion {champion_version} on {len(rows)} labelled rows of {day}: {verdict}",
    }


def missed_thresholds(record: dict[str, Any] | None) -> bool:
    """Whether a day's record shows the champion scored and missing a value threshold."""
    return (
        record is not None
        and record.get("status") == SCORED
        and record.get("meets_thresholds") is False
    )


def previous_days(day: str, count: int) -> list[str]:
    """The `count` days before `day`, newest first."""
    first = dt.date.fromisoformat(day)
    return [(first - dt.timedelta(days=i)).isoformat() for i in range(1, count + 1)]


def decay_standing(record: dict[str, Any] | None) -> str:
    """What a day's record is to the decay streaks of the days after it."""
    if record is None or record.get("status") == TOO_FEW_LABELLED_ROWS:
        return "skipped"
    return "missed" if missed_thresholds(record) else "break"


def days_apart(first: str, last: str) -> int:
    """The days from `first` to `last`."""
    return (dt.date.fromisoformat(last) - dt.date.fromisoformat(first)).days


def carried_days(day: str, later: Iterable[str], gap: int) -> list[str]:
    """The `later` stored days whose episode states carry `day`'s: each from the one before it.

    A day reads the state of the latest stored day at most `gap` days before it; after a longer
    gap it started afresh, and so did every day after it.
    """
    carried: list[str] = []
    previous = day
    for later_day in sorted(later):
        if days_apart(previous, later_day) > gap:
            break
        carried.append(later_day)
        previous = later_day
    return carried


def without_definitions(states: dict[str, Any] | None) -> dict[str, Any]:
    """A day's stored episode states without the definitions they record.

    An earlier version stored before definitions were recorded carried the same states.
    """
    return {
        feature: {k: v for k, v in state.items() if k != "definition"}
        for feature, state in (states or {}).items()
    }


def stale_note(key: dg.AssetKey, day: str, stale: list[str], check: str) -> str:
    """What the later days of a rerun day still hold from its earlier version, and the rerun.

    `check` is what they hold it for: `drift_episode` (their states) or `champion_decay`.
    """
    if not stale:
        return ""
    held = (
        "the drift episode states they carried"
        if check == EPISODE_CHECK
        else "the decay streaks they counted"
    )
    asset = key.to_user_string()
    span = f"{stale[0]}...{stale[-1]}"
    which = (
        f"The record of {stale[0]} still holds"
        if len(stale) == 1
        else f"The records of {len(stale)} later days, {stale[0]} to {stale[-1]}, still hold"
    )
    return (
        f" {which} {held} from the earlier version of {day}: materialise {asset} for {span} as "
        f"one range (the asset's Materialize, or `dagster asset materialize -m "
        f"ml_platform.definitions --select {asset} --partition-range {span}`) to carry this "
        "one through."
    )


def _against_bounds(record: dict[str, Any]) -> str:
    """Each metric of a scored record with its bound: `rmse 1.2000 (at most 1.0)`."""
    words = {"max": "at most", "min": "at least"}
    parts = [
        f"{metric} {t['value']:.4f} ({words[t['direction']]} {t['bound']})"
        for metric, t in record["thresholds"].items()
    ]
    return ", ".join(parts)


def decay_check(
    contract: Contract,
    record: dict[str, Any],
    earlier: dict[str, dict[str, Any] | None],
    stale: str = "",
) -> dg.AssetCheckResult:
    """`champion_decay` of a day: fails when the champion missed on `decay_days` days in a row.

    `earlier` holds the stored records of the days before (None or absent: no accepted record,
    a tombstone, skipped, as a day of too few labelled rows is); the streak looks back
    `DECAY_LOOKBACK * decay_days` days at most. `stale` (`stale_note`) ends the description.
    """
    needed = contract.evaluation.decay_days
    day = record["partition"]
    streak = [record] if missed_thresholds(record) else []
    if streak:
        for previous in previous_days(day, DECAY_LOOKBACK * needed):
            if len(streak) >= needed:
                break
            found = earlier.get(previous)
            if found is None or found.get("status") == TOO_FEW_LABELLED_ROWS:
                continue
            if not missed_thresholds(found):
                break
            streak.append(found)
    days = [r["partition"] for r in reversed(streak)]
    metadata: dict[str, Any] = {
        "streak_days": len(streak),
        "decay_days": needed,
        "champion_version": record["champion_version"] or "none",
        "status": record["status"],
    }
    metadata.update({f"champion_{metric}": float(v) for metric, v in record["metrics"].items()})
    if len(streak) >= needed:
        versions = sorted({r["champion_version"] for r in streak})
        detail = "; ".join(f"{r['partition']}: {_against_bounds(r)}" for r in reversed(streak))
        description = (
            f"The model is decaying: retrain or look at the data. Champion "
            f"{', '.join(versions)} missed the contract's value thresholds on {len(streak)} days "
            f"in a row ({days[0]} to {days[-1]}): {detail}.{stale}"
        )
        return dg.AssetCheckResult(
            check_name=DECAY_CHECK,
            passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            description=description,
            metadata={**metadata, "days": ", ".join(days)},
        )
    if record["status"] == UNSCORABLE:
        return dg.AssetCheckResult(
            check_name=DECAY_CHECK,
            passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            description=(
                f"{record['note']}. The day's values are far outside anything the champion "
                "learnt from: bound the column in the contract (columns[].min / max) so the "
                "gate rejects them, fix the file upstream and re-land the day. A day without "
                f"a score breaks a decay streak.{stale}"
            ),
            metadata=metadata,
        )
    if record["status"] == TOO_FEW_LABELLED_ROWS:
        description = (
            f"{record['note'][0].upper()}{record['note'][1:]}: neither a good day nor a bad "
            "one, it neither counts toward nor breaks a decay streak."
        )
    elif record["status"] != SCORED:
        description = f"{record['note']}; a day without a score breaks a decay streak."
    elif record["meets_thresholds"] is None:
        description = (
            f"{record['note'][0].upper()}{record['note'][1:]}. Nothing to fix: the day says "
            "nothing of the champion, and breaks a decay streak."
        )
    elif record["meets_thresholds"]:
        description = (
            f"Champion {record['champion_version']} meets the value thresholds on {day}: "
            f"{_against_bounds(record)}."
        )
    else:
        description = (
            f"Champion {record['champion_version']} missed the value thresholds on "
            f"{len(streak)} day(s) in a row ({days[0]} to {days[-1]}: {_against_bounds(record)} on "
            f"{day}), fewer than the {needed} that mean decay: watch the next days."
        )
    return dg.AssetCheckResult(
        check_name=DECAY_CHECK,
        passed=True,
        severity=dg.AssetCheckSeverity.WARN,
        description=description + stale,
        metadata=metadata,
    )


def with_importance(
    episodes: DayEpisodes,
    shares: dict[str, float] | None,
    page_importance: float,
    unmeasured: str | None = None,
) -> DayEpisodes:
    """The day's opened episodes with how much the serving champion leans on their feature.

    `shares` are the champion's importance shares on the day's rows (None: no champion to
    measure them of: the episode touches no serving model and pages nobody). `unmeasured` says
    why a serving champion's shares could not be measured (its metric undefined on the day's
    rows, or too few labelled rows): then whether it leans on the feature is not known, and
    the episode is told as if it did.
    """
    if not episodes.opened:
        return episodes
    states = dict(episodes.states)
    opened = []
    for episode in episodes.opened:
        share = None if shares is None else shares.get(episode.feature, 0.0)
        leaned = dataclasses.replace(
            episode,
            importance=share,
            leaned_on=unmeasured is not None
            or (share is not None and share >= page_importance and share > 0),
            unmeasured=unmeasured,
        )
        opened.append(leaned)
        states[episode.feature] = dataclasses.replace(states[episode.feature], episode=leaned)
    return DayEpisodes(states=states, opened=opened, closed=episodes.closed)


def told_before(
    day: str, episode: Episode, closing: bool, earlier: Mapping[str, FeatureState] | None
) -> bool:
    """Whether the day's earlier version told the same opening, or closing, of the episode.

    `earlier`: the states the earlier version stored (None: the day's first version).
    """
    if earlier is None:
        return False
    state = earlier.get(episode.feature)
    if closing:
        return state is None or state.episode is None
    return state is not None and state.episode is not None and state.episode.opened == day


def episode_check(
    day: str,
    episodes: DayEpisodes,
    judged: bool,
    stale: str = "",
    earlier: Mapping[str, FeatureState] | None = None,
) -> dg.AssetCheckResult:
    """`drift_episode` of a day: fails (WARN) while a feature's drift lasts, names the news.

    Its metadata `opened` and `closed` hold the episodes that began or ended that day (JSON),
    from which the alert rules tell people once per episode: not those the day's earlier
    version (`earlier`, its stored states) told already, when the day is rerun. `stale`
    (`stale_note`) ends the description.
    """
    opened = [e for e in episodes.opened if not told_before(day, e, False, earlier)]
    closed = [e for e in episodes.closed if not told_before(day, e, True, earlier)]
    news = []
    if episodes.opened:
        news.append(
            "Drift episode opened: "
            + "; ".join(f"{e.describe()}; {e.leaning()}" for e in episodes.opened)
            + "."
        )
    if episodes.closed:
        news.append("Drift episode closed: " + "; ".join(e.describe() for e in episodes.closed))
    still = [e for e in episodes.open if e not in episodes.opened]
    if still:
        news.append("Still drifting: " + "; ".join(e.describe() for e in still) + ".")
    if not news:
        news.append(
            f"No drift episode open on {day}."
            if judged
            else f"{day} has no drift verdict (no reference yet): episodes carried unchanged."
        )
    elif len(opened) + len(closed) < len(episodes.opened) + len(episodes.closed):
        news.append("Told before, when the day first ran: not told again.")
    return dg.AssetCheckResult(
        check_name=EPISODE_CHECK,
        passed=not episodes.open,
        severity=dg.AssetCheckSeverity.WARN,
        description=" ".join(news) + stale,
        metadata={
            "open_episodes": len(episodes.open),
            "open_features": ", ".join(e.feature for e in episodes.open) or "none",
            "opened": dg.MetadataValue.json([e.to_json() for e in opened]),
            "closed": dg.MetadataValue.json([e.to_json() for e in closed]),
        },
    )


def registered_day_before(dataset: str) -> dg.AssetDep:
    """The dependency on registered_model of the day before, whose record says who served D."""
    # Dropping the day before the first partition is what the flag does; it is marked beta.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        mapping = dg.TimeWindowPartitionMapping(
            start_offset=-1, end_offset=-1, allow_nonexistent_upstream_partitions=True
        )
    return dg.AssetDep(asset_key(dataset, "registered_model"), partition_mapping=mapping)


def build_champion_performance(
    contract: Contract, partitions: dg.PartitionsDefinition
) -> dg.AssetsDefinition:
    """The champion_performance asset of a dataset, with its `champion_decay` check."""
    key = asset_key(contract.name, CHAMPION_PERFORMANCE)
    lookback = DECAY_LOOKBACK * contract.evaluation.decay_days

    @dg.asset(
        name=CHAMPION_PERFORMANCE,
        key_prefix=contract.name,
        pool=writer_pool(contract.name, CHAMPION_PERFORMANCE),
        partitions_def=partitions,
        backfill_policy=chained_backfill_policy(),
        group_name=dataset_name(contract.name, "evaluation"),
        kinds={"scikitlearn", "json"},
        metadata={FORMAT_KEY: "json", **request_metadata(contract, CHAMPION_PERFORMANCE)},
        op_tags=step_tags(contract, CHAMPION_PERFORMANCE),
        retry_policy=STORAGE_RETRY_POLICY,
        ins={
            "features": dg.AssetIn(asset_key(contract.name, "features")),
            # Kept for the decay streak only: a day's check reads the records of the days
            # before, which must be stored first. The registry's dependency below does not order
            # this asset's own runs: when registered_model takes a range in two runs, the second
            # range's monitoring could otherwise run beside the first's and read its days before
            # too early.
            "prev": previous_day_input(key),
            # The day's drift verdicts, which advance the drift episodes.
            "drift_report": dg.AssetIn(asset_key(contract.name, "drift_report")),
        },
        # The serving champion of D is what the registrations of the days before left: in the
        # registry once registered_model has run for the day before (and, in order, for the
        # days before it).
        deps=[registered_day_before(contract.name)],
        check_specs=[
            daily_check_spec(
                DECAY_CHECK,
                key,
                partitions,
                description=check_description(
                    DECAY_CHECK,
                    "The serving champion meets the contract's value thresholds on the day's "
                    "labelled rows on at least one of the last "
                    f"{contract.evaluation.decay_days} days; otherwise the model is decaying.",
                ),
            ),
            daily_check_spec(
                EPISODE_CHECK,
                key,
                partitions,
                description=check_description(
                    EPISODE_CHECK,
                    "No feature is in a drift episode: "
                    f"{contract.drift.episodes.open_days} of its last "
                    f"{contract.drift.episodes.window} judged days drifted (or one day drifted "
                    "to categories the reference never had), until "
                    f"{contract.drift.episodes.close_days} quiet days in a row.",
                ),
            ),
        ],
    )
    def _champion_performance(
        context: dg.AssetExecutionContext,
        features: Any,
        drift_report: Any,
        model_registry: ModelRegistryResource,
        io_manager: dg.ResourceParam[LakeIOManager],
    ) -> Iterator:
        """The serving champion of day D scored on D's labelled rows: metrics and intervals.

        The serving champion is the one the registrations of the days before D left, as
        Dagster recorded registered_model's latest day before D, trained before D. Each metric has a
        bootstrap 95 % interval; the record says which value thresholds it meets. The
        `champion_<metric>` metadata plot the champion's performance across days. The first day
        (no champion yet) and a day without labelled rows are recorded as such.
        `champion_decay` warns when the champion misses the value thresholds on
        `evaluation.decay_days` accepted days in a row.
        """
        registry = model_registry.for_dataset(contract.name)
        registered = asset_key(contract.name, "registered_model")
        first_day = contract.partitions.start_date.isoformat()
        chain = RecordedChain(context.instance, registered, first_day)
        chain.prefetch(context.partition_keys[0], context.partition_keys[-1])

        def stored(day: str) -> dict[str, Any] | None:
            # Only an accepted day has a file: a tombstone reads as None and is skipped.
            value: dict[str, Any] | None = io_manager.load_recorded(
                context.instance, key, day, "json"
            )
            return value

        # A champion serves many days in a row: a range's step loads each version once.
        @functools.cache
        def load(version: str) -> TrainedModel:
            return registry.load(version)

        # The features the contract tests for drift: an episode of any other one has ended.
        monitored = {feature.name for feature in tested_features(contract)}

        def episodes_before(day: str) -> dict[str, Any] | None:
            # The state the latest stored day before left (one query, one read).
            versions = io_manager.recorded_versions(
                context.instance, key, previous_days(day, EPISODE_LOOKBACK), "json"
            )
            latest = max(versions, default=None)
            found = stored(latest) if latest else None
            return found.get("drift_episodes") if found else None

        # The accepted days recorded after the step's: each read, when it ran, the states and
        # records of the days before it, which a rerun of past days replaces (two queries a
        # step; no read of a day when the step reaches the latest day).
        last_day = context.partition_keys[-1]
        after = sorted(d for d in context.instance.get_materialized_partitions(key) if d > last_day)
        later = list(io_manager.recorded_versions(context.instance, key, after, "json"))
        # The step's days whose decay standing (missed, skipped, a break) its rerun changed.
        restanding: list[str] = []
        # The step's days recorded before: a rerun of them (one query a step).
        rerun = io_manager.recorded_versions(context.instance, key, context.partition_keys, "json")

        def stale_later_days(
            day: str, record: dict[str, Any], read_before: dict[str, Any] | None
        ) -> dict[str, list[str]]:
            """The later days that hold what this day's earlier version left them."""
            stale: dict[str, list[str]] = {EPISODE_CHECK: [], DECAY_CHECK: []}
            if not later:
                return stale
            earlier = stored(day)
            if decay_standing(earlier) != decay_standing(record):
                restanding.append(day)
            if day != last_day:
                return stale
            # What the next days carried: the earlier version's states, or (a day recorded for
            # the first time, or accepted after a rejection) those of the stored day before.
            carried = earlier.get("drift_episodes") if earlier else read_before
            if without_definitions(carried) != without_definitions(record["drift_episodes"]):
                stale[EPISODE_CHECK] = carried_days(day, later, EPISODE_LOOKBACK)
            # A later day's streak looked back at the step's days only when it missed.
            stale[DECAY_CHECK] = [
                d
                for d in later
                if any(0 < days_apart(c, d) <= lookback for c in restanding)
                and missed_thresholds(stored(d))
            ]
            return stale

        def day_of_champion_performance(
            day: str, features: pd.DataFrame, drift_report: dict[str, Any]
        ) -> Iterator:
            version = chain.before(day)["champion"]

            def scorable(version: str) -> TrainedModel:
                try:
                    champion = load(version)
                except RegistryError as exc:
                    # Its files lost: the same named stop as registered_model's.
                    raise unloadable_champion(CHAMPION_PERFORMANCE, day, version, exc) from None
                # A contract change can leave the champion without a feature it learnt: the
                # same named stop as registered_model's, not a KeyError classed as a bug.
                return fed_champion(CHAMPION_PERFORMANCE, day, version, champion, contract)

            record = champion_record(contract, day, version, features, scorable)
            judged = feature_days(drift_report)
            spec = contract.drift.episodes
            read_before = episodes_before(day)
            episodes = advance(
                day,
                judged,
                states_from_json(read_before),
                spec,
                monitored,
                contract.feature_definitions,
            )
            rows = labelled(features, contract)
            shares, unmeasured = None, None
            least = contract.evaluation.min_holdout_rows
            if episodes.opened and version is not None and len(rows) < least:
                # A champion serves the day whether or not its labels are in; shuffling a
                # handful of rows measures nothing (one row shuffled changes no prediction).
                unmeasured = (
                    f"{len(rows)} labelled row(s) of {day} are too few: at least {least}, "
                    "contract evaluation.min_holdout_rows"
                )
            elif episodes.opened and version is not None:
                metric = primary_metric(contract)
                seed = contract.training.random_seed
                shares = importance_shares(scorable(version), rows, metric, seed)
                if shares is None:
                    unmeasured = f"{metric} is undefined on the {len(rows)} labelled rows of {day}"
            episodes = with_importance(episodes, shares, spec.page_importance, unmeasured)
            record["drift_episodes"] = episodes.states_json()
            stale = record[STALE_KEY] = stale_later_days(day, record, read_before)
            notes = {check: stale_note(key, day, days, check) for check, days in stale.items()}
            for note in filter(None, notes.values()):
                context.log.warning(f"{CHAMPION_PERFORMANCE} {day}:{note}")
            # A rerun day's openings and closings were told when it first ran: paging them
            # again (a file re-landed weeks after) is about nothing a person can act on now.
            news = episodes.opened or episodes.closed
            first_version = stored(day) if day in rerun and news else None
            told = states_from_json(first_version.get("drift_episodes")) if first_version else None
            yield episode_check(day, episodes, bool(judged), notes[EPISODE_CHECK], told)
            # The days before matter only to a day that missed.
            earlier = (
                {d: stored(d) for d in previous_days(day, lookback)}
                if missed_thresholds(record)
                else {}
            )
            yield decay_check(contract, record, earlier, notes[DECAY_CHECK])
            metadata: dict[str, Any] = {
                f"champion_{metric}": dg.MetadataValue.float(float(value))
                for metric, value in record["metrics"].items()
            }
            stale_days = sorted(set(stale[EPISODE_CHECK]) | set(stale[DECAY_CHECK]))
            if stale_days:
                metadata[STALE_KEY] = ", ".join(stale_days)
            yield dg.MaterializeResult(
                value=record,
                metadata={
                    **metadata,
                    "champion_version": version or "none",
                    "status": record["status"],
                    "labelled_rows": record["labelled_rows"],
                    "meets_thresholds": (
                        "n/a"
                        if record["meets_thresholds"] is None
                        else str(record["meets_thresholds"]).lower()
                    ),
                    # What `ml-platform health` lists: the episodes open at the end of the day.
                    OPEN_EPISODES_KEY: len(episodes.open),
                    EPISODES_KEY: "\n".join(e.describe() for e in episodes.open) or "none",
                },
            )

        yield from each_day(
            context, day_of_champion_performance, features=features, drift_report=drift_report
        )

    return _champion_performance
