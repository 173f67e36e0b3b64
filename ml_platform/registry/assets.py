"""registered_model: the one ordered step that decides the champion and moves the aliases.

evaluation_report judges each day's candidate alone (value thresholds, trivial baseline):
`reject` or `eligible`. registered_model takes the days in date order, in one step (a range of
days is one run, `chained_backfill_policy`; each day depends on its own day before, so a range
registered in two runs is registered in order). For each day it:

1. takes the weekly full retrain of the day before, when `full_evaluation_report` recorded one
   (the weekly job trains and evaluates it; the chain judges it on the next day, before that
   day's own candidate, the same way);
2. takes the day's daily candidate;

and for each candidate: a rejected one is recorded as not registered (the champion stays); an
eligible one is scored, with the champion it meets, on the candidate's held-out rows with the
same bootstrap samples (a paired bootstrap, `evaluation.metrics.compare_with_champion`), and is
promoted or registered as challenger. The champion a day meets is the one the registrations of
the days before left, as Dagster recorded them (`ml_platform.registry.chain`), never whatever
the aliases say now: a day's decision is the same whether the days ran one by one or in ranges
of any split, a re-run of a day meets what its first run met, and before judging anything a
step points the aliases at what the latest recorded day says, undoing the moves of an attempt
that failed before recording its days (so a retry decides as the uninterrupted run did). An
alias never moves back to an older day's model: when the champion is a later day's version (a
past day re-landed and retrained), the candidate is recorded as not promoted. Nor does a rerun
of a past day register again a version an alias serves (the alias would follow the name to its
new version, behind the day's record). A day before the latest recorded one is judged so against
the aliases that day left, whether it is rerun alone or in a range that reruns the latest too.

Nothing upstream reads the registry. A rejected candidate is an outcome of the day, not a failure
of the run; the check `rejection_streak` warns once several candidates in a row were rejected.
"""

import contextlib
import datetime as dt
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.evaluation.metrics import (
    Comparison,
    Paired,
    compare_with_champion,
    recorded_scores,
    render_comparison,
    score_model,
    split_of,
)
from ml_platform.platform.datasets import asset_key, dataset_name, writer_pool
from ml_platform.platform.formats import FORMAT_KEY
from ml_platform.platform.inputs import DailyInput, WindowPartitions
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.records import DayRecord, day_records
from ml_platform.platform.retries import STORAGE_RETRY_POLICY
from ml_platform.platform.runbook import check_description
from ml_platform.platform.sizes import request_metadata, step_tags
from ml_platform.platform.steps import (
    chained_backfill_policy,
    daily_check_spec,
    each_day,
    previous_day_input,
    retryable,
)
from ml_platform.registry.chain import (
    RecordedChain,
    aliases_of,
    fed_champion,
    says_aliases,
    unloadable_champion,
)
from ml_platform.registry.store import (
    ALIASES,
    DamagedVersionError,
    ModelRegistryResource,
    RegistryError,
    environment_manifest,
    version_day,
)
from ml_platform.training.assets import window_input
from ml_platform.training.model import TrainedModel

REGISTERED_MODEL = "registered_model"
REJECTION_STREAK_CHECK = "rejection_streak"
# The candidates the chain judges: the daily model, and the weekly full retrain.
DAILY = "daily"
FULL = "full"
MODEL_OF_KIND = {DAILY: "model", FULL: "full_model"}
EVALUATION_OF_KIND = {DAILY: "evaluation_report", FULL: "full_evaluation_report"}
# The decisions of a candidate, beside the evaluation's `reject`.
PROMOTE = "promote"
CHALLENGER = "challenger"
REJECT = "reject"
SUPERSEDED = "superseded"
# A streak looks back at most this many times its length in days: a day without an accepted
# record (a tombstone) neither counts nor ends it, so the look-back needs a bound.
STREAK_LOOKBACK = 4


def outcome_line(decision: str, cause: str) -> str:
    """What a day's verdict did to the registry, in the words `ml-platform materialize` prints."""
    if decision == PROMOTE:
        return "promoted"
    if decision == CHALLENGER:
        return "kept champion (challenger)"
    if decision == SUPERSEDED:
        return f"not promoted: {cause}"
    return f"rejected: {cause}"


@contextlib.contextmanager
def registry_errors(doing: str) -> Iterator[None]:
    """An error of the registry's store that waiting cannot fix, as a failure never retried.

    For the step's own calls, outside its days (each day's are `each_day`'s to judge): the retry
    policy retries whatever else a step raises, and a refusal (a permission, a read-only store,
    a bad request) meets every attempt the same, after the step judged its days again.
    """
    try:
        yield
    except (dg.Failure, RegistryError):
        raise  # said already, or the caller's to say (a version that is not whole)
    except Exception as exc:
        if retryable(exc):
            raise  # an outage, a timeout: the retry policy tries again
        raise dg.Failure(
            description=(
                f"registered_model: {doing} failed, which no retry changes: "
                f"{type(exc).__name__}: {exc}. Fix the registry's store (its URI, credentials, "
                "permissions; docs/runbook.md), then rerun the day"
            ),
            allow_retries=False,
        ) from exc


def day_before(day: str, days: int = 1) -> str:
    """The day `days` days before `day`."""
    return (dt.date.fromisoformat(day) - dt.timedelta(days=days)).isoformat()


def rejected_in_a_row(
    decision_of: Callable[[str], str | None], day: str, decision: str, limit: int
) -> list[str]:
    """The days ending `day` whose candidates were rejected in a row, at most `limit`.

    `decision_of(d)` is the decision recorded for an earlier day, or None when the day has no
    accepted record (a tombstone: its data was rejected upstream, or it never ran): such a day
    neither counts nor ends the streak. The look-back stops after `STREAK_LOOKBACK * limit`
    days; any other decision ends the streak.
    """
    if decision != REJECT:
        return []
    streak = [day]
    for back in range(1, STREAK_LOOKBACK * limit + 1):
        if len(streak) >= limit:
            break
        earlier = day_before(day, back)
        recorded = decision_of(earlier)
        if recorded is None:
            continue
        if recorded != REJECT:
            break
        streak.append(earlier)
    return sorted(streak)


def streak_check(
    streak: list[str], limit: int, champion: str | None, cause: str
) -> dg.AssetCheckResult:
    """The rejections in a row as a WARN check: it fails once there are `limit` of them."""
    metadata: dict[str, Any] = {
        "rejected_in_a_row": len(streak),
        "alert_at": limit,
        "days": ", ".join(streak),
    }
    if len(streak) < limit:
        return dg.AssetCheckResult(
            check_name=REJECTION_STREAK_CHECK,
            passed=True,
            severity=dg.AssetCheckSeverity.WARN,
            description=f"{len(streak)} candidate(s) rejected in a row; the alert is at {limit}.",
            metadata=metadata,
        )
    serving = f"champion {champion} has served all along" if champion else "there is no champion"
    return dg.AssetCheckResult(
        check_name=REJECTION_STREAK_CHECK,
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            f"{len(streak)} candidates in a row were rejected ({streak[0]} to {streak[-1]}), so "
            f"{serving}; the last one: {cause}. Read "
            "these days' data checks and evaluation reports: if their data is sound, the model no "
            "longer meets the contract's value thresholds; retrain on a longer window "
            "(weekly_retrain_job), revisit the features, or revise the thresholds."
        ),
        metadata=metadata,
    )


def day_before_input(key: dg.AssetKey, window_days: int | None = None) -> dg.AssetIn:
    """An input of the day before (or of the `window_days` days ending the day before)."""
    # Dropping the days before the first partition is what the flag does; it is marked beta.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        mapping = dg.TimeWindowPartitionMapping(
            start_offset=-(window_days or 1),
            end_offset=-1,
            allow_nonexistent_upstream_partitions=True,
        )
    return dg.AssetIn(key, partition_mapping=mapping)


def features_input(dataset: str, window_days: int, full_window_days: int) -> dg.AssetIn:
    """The features of the daily candidate's window (ending D) and the weekly one's (ending D-1).

    One input (an asset can be an input once): its `for_day` is the daily window, and
    `full_window` cuts the weekly candidate's out of it.
    """
    return window_input(dataset, window_days, reach_days=full_window_days + 1)


def full_window(features: DailyInput, last: str, days: int) -> WindowPartitions:
    """The accepted, stored feature partitions of the `days` days ending `last`."""
    first = day_before(last, days - 1)
    return WindowPartitions([key for key in features if first <= key <= last], features.cache)


def comparison_fields(
    contract: Contract, comparison: Comparison, candidate: Any, champion: Any
) -> dict[str, Any]:
    """The stored numbers of a comparison: metrics of both models, improvements, intervals."""
    thresholds = contract.evaluation.change_thresholds
    return {
        "metrics": candidate.values,
        "champion_metrics": champion.values if champion is not None else None,
        "improvements": {
            metric: {"improvement": gain, "low": low, "high": high, "threshold": thresholds[metric]}
            for metric, (gain, low, high) in comparison.improvements.items()
        },
        "reasons": comparison.reasons,
    }


def build_registered_model(
    contract: Contract, partitions: dg.PartitionsDefinition
) -> dg.AssetsDefinition:
    """The registry asset of a dataset: the daily and weekly candidates, judged in date order."""
    dataset = contract.name
    key = asset_key(dataset, REGISTERED_MODEL)
    full_days = contract.training.full_window_days
    limit = contract.evaluation.rejection_streak

    @dg.asset(
        name=REGISTERED_MODEL,
        key_prefix=dataset,
        pool=writer_pool(dataset, REGISTERED_MODEL),
        partitions_def=partitions,
        backfill_policy=chained_backfill_policy(),
        group_name=dataset_name(dataset, "registry"),
        kinds={"scikitlearn"},
        metadata={FORMAT_KEY: "json", **request_metadata(contract, REGISTERED_MODEL)},
        op_tags=step_tags(contract, REGISTERED_MODEL),
        retry_policy=STORAGE_RETRY_POLICY,
        ins={
            "model": dg.AssetIn(key=asset_key(dataset, MODEL_OF_KIND[DAILY])),
            "evaluation": dg.AssetIn(key=asset_key(dataset, EVALUATION_OF_KIND[DAILY])),
            "features": features_input(dataset, contract.training.window_days, full_days),
            "full_model": day_before_input(asset_key(dataset, MODEL_OF_KIND[FULL])),
            "full_evaluation": day_before_input(asset_key(dataset, EVALUATION_OF_KIND[FULL])),
            # The chain: a day is registered once the day before is, whatever the runs.
            "prev": previous_day_input(key),
        },
        check_specs=[
            daily_check_spec(
                REJECTION_STREAK_CHECK,
                key,
                partitions,
                description=check_description(
                    REJECTION_STREAK_CHECK,
                    f"Fewer than {limit} candidates in a row were rejected (contract "
                    "evaluation.rejection_streak).",
                ),
            )
        ],
    )
    def _registered_model(
        context: dg.AssetExecutionContext,
        model: Any,
        evaluation: Any,
        features: Any,
        full_model: Any,
        full_evaluation: Any,
        model_registry: ModelRegistryResource,
    ) -> Iterator:
        """Each day's decision on the champion, in date order: promoted, challenger or rejected.

        The day's candidates in order: the weekly full retrain of the day before (when the
        weekly job evaluated one), then the daily model of day D. A candidate its evaluation
        rejected is not registered. An eligible one is scored with the champion it meets (the
        one the days before left, or the weekly candidate just promoted) on the candidate's
        held-out rows, with the same bootstrap samples: it is promoted when the improvement's
        95 % interval clears the contract's change thresholds, else registered as challenger;
        the first model is promoted. It is registered with its lineage manifest (`daily-D`,
        `full-D`; registering a day again replaces its version); the day's record says which
        alias it moved and where the aliases were after it. An alias never moves back to an
        older day's model: when the champion is a later day's version, the candidate is
        recorded as not promoted; so is the candidate of a past day whose version an alias
        serves (`supersedes`).

        The stored value and metadata say what each candidate did (`outcome`), the champion it
        met, the improvement and its paired interval, and the champion after the day
        (`champion_after`). The check `rejection_streak` fails once the contract's
        `evaluation.rejection_streak` daily candidates in a row were rejected.
        """
        registry = model_registry.for_dataset(dataset)
        # Every day's daily window, and the weekly candidates' windows ending the day before.
        feature_days: DailyInput = features
        store: LakeIOManager = context.resources.io_manager
        spec = contract.evaluation
        seed = contract.training.random_seed
        run_id = context.run.run_id
        # The weekly candidates the weekly job evaluated on the days before the step's days.
        full_key = asset_key(dataset, EVALUATION_OF_KIND[FULL])
        weekly = day_records(
            context.instance, full_key, [day_before(day) for day in context.partition_keys]
        )

        days = list(context.partition_keys)
        chain = RecordedChain(context.instance, key, contract.partitions.start_date.isoformat())
        # The step's days as recorded before it (a superseded rerun keeps its day's record).
        chain.prefetch(days[0], days[-1])
        # The latest day from the step's first on that is recorded already, if any (with its
        # record): its aliases are the live ones as the step starts, which the step's days
        # before it are judged against (`supersedes`), whatever range they are rerun in.
        latest = chain.latest_after(
            day_before(days[0]), partitions.get_last_partition_key() or days[-1]
        )
        # That day when it is after the step's: the step reruns the past, and the live aliases
        # are that day's, which it never moves.
        past = latest if latest is not None and latest[0] > days[-1] else None
        # The aliases the step's first day meets: what the latest recorded day before it left.
        met_first = chain.before(days[0])
        live = aliases_of(past[1]) if past is not None else met_first
        started = aliases_of(latest[1]) if latest is not None else met_first
        # The chain is judged in day order: a day judged while the day before it never ran (or
        # its run failed) meets an older champion than it would in order. Said, not hidden.
        gap = day_before(days[0])
        if gap >= chain.first_day and chain.unrecorded(gap):
            context.log.warning(
                f"registered_model: {gap} has no record (it never ran, or its run failed), so "
                f"{days[0]} is judged against the champion the latest recorded day before it "
                f"left ({met_first['champion'] or 'none'}); a decision of {gap} recorded later "
                f"is a rerun of the past. To judge the days in order, run {gap} first"
            )

        def cannot_set(aliases: dict[str, str | None], exc: RegistryError) -> dg.Failure:
            """The stop of a step whose aliases cannot point at the versions the record says.

            A version lost or damaged is a lost artifact, as `unloadable_champion` says: raised
            from None, it is classed as data; its error names the rerun that restores it.
            """
            way_out = (
                ""
                if isinstance(exc, DamagedVersionError)
                else "; rerun registered_model for the latest recorded day or fix the registry "
                "(docs/runbook.md)"
            )
            return dg.Failure(
                description=(
                    f"registered_model: the aliases cannot be set to {aliases} ({exc}){way_out}"
                ),
                metadata={"registry_error": str(exc)},
                allow_retries=False,
            )

        # Each day meets the aliases the record says, never what MLflow's say now: an attempt
        # that moved them and then failed to record its days left moves no record shows. The
        # step sets them back before it judges, and to what its days leave once they are
        # judged (`move_aliases`).
        with registry_errors("reading the aliases"):
            now = registry.aliases()
        found = {alias: now[alias] for alias in live}
        # What MLflow's aliases should be: what the latest recorded day left, which is one of
        # the step's own days when it reruns the latest ones.
        recorded_now = live if past is not None else chain.before(day_before(days[-1], -1))
        if found != recorded_now:
            context.log.warning(
                f"registered_model: the aliases were {found}, which no recorded day left (a "
                f"run failed after moving them); they are set back to {recorded_now} before "
                f"the days are judged from {met_first}, and then set to what the days leave"
            )
            # At once, not only once the days are judged: were this attempt to fail too,
            # serving would stay on a model no recorded decision chose.
            try:
                with registry_errors("setting the aliases back"):
                    registry.set_aliases(recorded_now)
            except RegistryError as exc:
                # A recorded version that is damaged now: rerunning its day (this step, maybe)
                # is the repair, so the days are judged still; the aliases move once, at the end.
                context.log.warning(f"{cannot_set(recorded_now, exc).description}")
        # Where the aliases point as the step judges its days: this step is their one writer.
        current = dict(live)
        # The platform names registered so far, listed once a step and kept as it registers.
        with registry_errors("listing the versions"):
            names = set(registry.versions())
        # Each champion's model, loaded once a step (a champion serves many days in a row).
        loaded: dict[str, TrainedModel] = {}
        # The aliases each day this step judged left: what its next day meets.
        judged_after: dict[str, dict[str, str | None]] = {}

        def kept(day: str, earlier: DayRecord) -> None:
            """A day recorded unchanged (its re-delivery rejected upstream) keeps its decision.

            The aliases its earlier record says it left are what its next day meets and, unless
            the step reruns the past, where the step leaves them.
            """
            if not says_aliases(earlier):
                return  # an earlier record that says nothing leaves nothing
            judged_after[day] = aliases_of(earlier)
            if past is None:
                current.update(judged_after[day])

        def aliases_met(day: str) -> dict[str, str | None]:
            """The aliases the days before `day` left: this step's, else Dagster's record.

            A day of the step it did not judge (rejected upstream in this run) leaves nothing,
            whatever an earlier run recorded for it; one recorded unchanged leaves what it did.
            """
            earlier = [d for d in judged_after if d < day]
            return dict(judged_after[max(earlier)] if earlier else chain.before(days[0]))

        def met_on_record(day: str, otherwise: str | None) -> str | None:
            """The champion the day's daily candidate met, as its record says (else `otherwise`)."""
            earlier = chain.recorded(day)
            if earlier is None:
                return otherwise
            met = earlier.metadata.get("champion_met", "none")
            return None if met == "none" else str(met)

        def decision_of(day: str) -> str | None:
            value = store.load_recorded(context.instance, key, day, "json")
            return None if value is None else str(value["decision"])

        def load_champion(day: str, version: str) -> TrainedModel:
            if version in loaded:
                return loaded[version]
            try:
                loaded[version] = registry.load(version)
                return loaded[version]
            except RegistryError as exc:
                raise unloadable_champion(REGISTERED_MODEL, day, version, exc) from None

        def scorable_champion(day: str, version: str) -> TrainedModel:
            """The champion's model, which must find its features among the contract's."""
            return fed_champion(
                REGISTERED_MODEL, day, version, load_champion(day, version), contract
            )

        def moves_back(alias: str, version: str) -> str | None:
            """The later day's version `alias` points at, if moving it to `version` goes back."""
            now = current[alias]
            if now is not None and version_day(now) > version_day(version):
                return now
            return None

        def supersedes(day: str, version: str) -> tuple[str, str | None] | None:
            """Why the eligible `version` of `day` is superseded (not judged again), or None.

            (reason, the live alias that serves it, if one does). A day before the latest
            recorded one is a rerun of the past, judged against the aliases that day left (the
            live ones as the step starts), alone or in any range: its candidate is superseded
            when the champion is a later day's model, or when an alias serves `version`, which
            registering it again would move to the new version behind the day's record.
            """
            if latest is not None and day < latest[0]:
                champion = started["champion"]
                if champion is not None and version_day(champion) > version_day(version):
                    later: str | None = champion
                else:
                    for alias in ALIASES:
                        if started[alias] == version:
                            return (
                                f"{version} is the live {alias}, as a later day ({latest[0]}) "
                                "left it, and a rerun of a past day never changes what the "
                                "aliases serve"
                            ), alias
                    return None
            else:
                later = moves_back("champion", version)
                if later is None:
                    return None
            return (
                f"the champion {later} is a later day's model than {version}, and an alias "
                "never moves back to an older day's model"
            ), None

        def recorded_manifest(day: str, version: str) -> dict[str, Any] | None:
            """The lineage manifest of `version` as the day's latest record keeps it, if it does."""
            value = store.load_recorded(context.instance, key, day, "json")
            for candidate in (value or {}).get("candidates", []):
                if candidate.get("candidate") == version and candidate.get("manifest"):
                    return dict(candidate["manifest"])
            return None

        def restored(
            day: str,
            version: str,
            serving: str,
            candidate_of: Callable[[], tuple[TrainedModel, Mapping[str, pd.DataFrame]]],
        ) -> dict[str, Any]:
            """A rerun of the day that registered `version`, which an alias serves, makes it whole.

            Its files lost from the artifact store (a clean-up, a partial restore) stop every
            later day that loads it; they are written again from the day's stored model, only
            when it is the model registered (`ModelRegistry.restore` checks the checksum). The
            record keeps the manifest, from which a later loss of the file is restored again.
            """
            manifest = recorded_manifest(day, version)

            def source() -> tuple[TrainedModel, pd.DataFrame]:
                model, window = candidate_of()
                try:
                    _, holdout = split_of(model, window, contract)
                except ValueError as exc:
                    raise dg.Failure(description=str(exc), allow_retries=False) from exc
                return model, next(holdout.chunks()).head(5)

            try:
                written = registry.restore(version, source, manifest)
            except RegistryError as exc:
                # A lost artifact no wait brings back: a data failure, named (see chain.py).
                raise dg.Failure(
                    description=(
                        f"registered_model {day}: {version}, the live {serving}, cannot be "
                        f"made whole again: {exc}"
                    ),
                    metadata={"version": version, "registry_error": str(exc)},
                    allow_retries=False,
                ) from None
            kept = {"manifest": manifest} if manifest is not None else {}
            if not written:
                return kept
            context.log.warning(
                f"registered_model {day}: {version}, the live {serving}, had lost files in the "
                f"registry's artifact store; {', '.join(written)} written again from the stored "
                f"model of {version_day(version)}, whose checksum is the registered one"
            )
            return {**kept, "restored": written}

        def judged(
            day: str,
            kind: str,
            evaluation: dict[str, Any],
            champion: str | None,
            candidate_of: Callable[[], tuple[TrainedModel, Mapping[str, pd.DataFrame]]],
        ) -> dict[str, Any]:
            """One candidate's decision, registration and alias move, as its stored record.

            `candidate_of()` gives its model and feature window, read only when it is eligible.
            """
            version = evaluation.get("version") or f"{kind}-{evaluation['partition']}"
            # Reports stored before the verdict had a one-line cause fall back to its reasons.
            cause = evaluation.get("cause") or "; ".join(evaluation["reasons"])
            record: dict[str, Any] = {
                "version": None,
                "kind": kind,
                "candidate": version,
                "alias": None,
                "registered": False,
                "champion_met": champion,
            }
            if evaluation["decision"] == REJECT:
                return {**record, "decision": REJECT, "reason": cause}
            superseded = supersedes(day, version)
            if superseded is not None:
                reason, serving = superseded
                record = {**record, "decision": SUPERSEDED, "reason": reason, "serving": serving}
                if serving is None:
                    return record
                return {**record, **restored(day, version, serving, candidate_of)}
            model, window = candidate_of()
            try:
                _, holdout = split_of(model, window, contract)
            except ValueError as exc:
                # The model and its window disagree: only rematerialising the model fixes that.
                raise dg.Failure(description=str(exc), allow_retries=False) from exc
            champion_scores = (
                score_model(scorable_champion(day, champion), holdout, spec.bootstrap_samples, seed)
                if champion is not None
                else None
            )
            # The evaluation scored the candidate on these rows already; its draws pair with
            # the champion's when the samples are the same (an evaluation stored before it kept
            # its draws, or of other rows, is scored again).
            recorded = recorded_scores(evaluation)
            candidate: Paired = (
                recorded
                if recorded is not None
                and (champion_scores is None or recorded.pairing == champion_scores.pairing)
                else score_model(model, holdout, spec.bootstrap_samples, seed)
            )
            comparison = compare_with_champion(contract, candidate, champion_scores)
            decision = comparison.decision
            manifest = {
                "dataset": dataset,
                "partition": version_day(version),
                "kind": kind,
                "asset": REGISTERED_MODEL,
                "registered_on": day,
                "run_id": run_id,
                "input_partitions": model.window,
                "input_data_versions": model.data_versions,
                "estimator": model.estimator,
                # The contract's model section as it applied (defaults filled in).
                "model_settings": contract.model.model_dump(),
                "hyperparameters": model.hyperparameters,
                "trained_for": model.progress,
                "metrics": evaluation["metrics"],
                "decision": decision,
                "reason": comparison.cause,
                "champion_met": champion,
                **environment,
            }
            example = next(holdout.chunks()).head(5)
            number = registry.upsert(version, model, manifest, example, model.mlflow_run_id)
            names.add(version)
            loaded.pop(version, None)
            target = "champion" if decision == PROMOTE else "challenger"
            alias: str | None = None
            kept = moves_back(target, version)
            if past is not None:
                note = (
                    f"{past[0]} is registered already: a rerun of a past day moves no alias, "
                    f"they stay where {past[0]} left them"
                )
            elif kept is not None:
                note = f"{target} stays {kept}, a later day's model"
            elif target == "challenger" and current["champion"] == version:
                # A re-run of the champion's own day that no longer beats the one before it.
                note = f"{version} is the champion already"
            else:
                note = ""
                alias = target
                # MLflow's alias moves once the step's days are all judged (`move_aliases`).
                current[alias] = version
            comparison_md = (
                render_comparison(version, candidate, champion_scores, champion, comparison)
                if champion is not None and champion_scores is not None
                else None
            )
            return {
                **record,
                **comparison_fields(contract, comparison, candidate, champion_scores),
                "version": version,
                "mlflow_version": number,
                "alias": alias,
                "alias_note": note,
                "registered": True,
                "decision": decision,
                "reason": comparison.cause,
                "comparison_markdown": comparison_md,
                "manifest": manifest,
            }

        def weekly_candidate(day: str, champion: str | None) -> dict[str, Any] | None:
            """The weekly candidate of the day before `day` judged, if the weekly job made one."""
            before = day_before(day)
            recorded = weekly.get(before)
            if recorded is None or not recorded.accepted:
                return None
            report: dict[str, Any] = full_evaluation[before]
            return judged(
                day,
                FULL,
                report,
                champion,
                lambda: (full_model[before], full_window(feature_days, before, full_days)),
            )

        def day_of_registered_model(
            day: str,
            model: TrainedModel,
            evaluation: dict[str, Any],
            features: Mapping[str, pd.DataFrame],
        ) -> Iterator:
            met = aliases_met(day)
            before = champion = met["champion"]
            candidates = []
            full = weekly_candidate(day, champion)
            if full is not None:
                candidates.append(full)
                if full["decision"] == PROMOTE:
                    champion = full["version"]
                elif full["decision"] == SUPERSEDED:
                    # Not judged again: the day's own candidate meets the champion it met on the
                    # day's first run, as the days after it did.
                    champion = met_on_record(day, champion)
            daily = judged(day, DAILY, evaluation, champion, lambda: (model, features))
            candidates.append(daily)
            for candidate in candidates:
                candidate["outcome"] = outcome_line(candidate["decision"], candidate["reason"])
                if candidate.get("restored"):
                    candidate["outcome"] += (
                        f"; its lost files restored ({', '.join(candidate['restored'])}) from "
                        f"the stored model of {version_day(candidate['candidate'])}"
                    )
            streak = rejected_in_a_row(decision_of, day, daily["decision"], limit)
            if past is not None or any(c["decision"] == SUPERSEDED for c in candidates):
                # A rerun of the past: the day leaves what its decisions would have moved, or
                # what its record says where a candidate was not judged again.
                after = aliases_left(met, candidates, chain.recorded(day))
            else:
                after = {alias: current[alias] for alias in met}
            if past is None:
                # The step moves the aliases: its next day meets what this one left.
                current.update(after)
            judged_after[day] = after
            champion_after = after["champion"]
            yield streak_check(streak, limit, champion_after, daily["reason"])
            outcome = daily["outcome"]
            if full is not None:
                outcome += f"; weekly {full['candidate']}: {full['outcome']}"
            value = {
                "partition": day,
                **daily,
                "outcome": outcome,
                "champion_before": before,
                "champion_after": champion_after,
                "challenger_after": after["challenger"],
                "candidates": candidates,
                "rejected_in_a_row": len(streak),
            }
            metadata: dict[str, Any] = {
                "version": daily["version"] or f"none: {not_registered(daily)}",
                "alias": daily["alias"] or "none",
                "decision": daily["decision"],
                "outcome": outcome,
                "champion_met": daily["champion_met"] or "none",
                "champion": champion_after or "none",
                "challenger": after["challenger"] or "none",
                "rejected_in_a_row": len(streak),
                "registered_versions": len(names),
            }
            for name, gain in daily.get("improvements", {}).items():
                metadata[f"improvement_{name}"] = dg.MetadataValue.float(gain["improvement"])
                metadata[f"improvement_{name}_low"] = dg.MetadataValue.float(gain["low"])
                metadata[f"improvement_{name}_high"] = dg.MetadataValue.float(gain["high"])
            for name, metric in (daily.get("champion_metrics") or {}).items():
                metadata[f"champion_{name}"] = dg.MetadataValue.float(metric)
            if full is not None:
                metadata["weekly_candidate"] = full["candidate"]
                metadata["weekly_outcome"] = full["outcome"]
            if daily.get("comparison_markdown"):
                metadata["comparison"] = dg.MetadataValue.md(daily["comparison_markdown"])
            if daily["registered"]:
                metadata["git_commit"] = daily["manifest"]["git_commit"]
                metadata.update(
                    model_registry.stores.model_version_link(dataset, daily["mlflow_version"])
                )
            yield dg.MaterializeResult(value=value, metadata=metadata)

        def move_aliases() -> None:
            """MLflow's aliases to where the step's last day left them, in one write.

            Once every day of the step is judged and before any is recorded: an attempt that
            fails on a day moves nothing; one that fails after this records nothing, and the
            next step sets them back before it judges. A rerun of the past leaves them where
            the latest recorded day did.
            """
            try:
                with registry_errors("setting the aliases"):
                    registry.set_aliases(current)
            except RegistryError as exc:
                raise cannot_set(current, exc) from None

        # Once per step: it runs git and reads the lock file.
        environment = environment_manifest()
        yield from each_day(
            context,
            day_of_registered_model,
            before_recording=move_aliases,
            carried=ALIASES,
            on_unchanged=kept,
            model=model,
            evaluation=evaluation,
            features=features,
        )

    return _registered_model


def aliases_left(
    met: dict[str, str | None], candidates: list[dict[str, Any]], recorded: DayRecord | None
) -> dict[str, str | None]:
    """The aliases a rerun of a past day leaves for its next day, though it moves none.

    What its candidates' decisions would have moved; a superseded candidate was not judged
    again, so the day keeps what its earlier record says (what the meeting days after it saw).
    """
    after = dict(met)
    for candidate in candidates:
        decision, version = candidate["decision"], candidate["version"]
        if decision == PROMOTE:
            after["champion"] = version
        elif decision == CHALLENGER and version != after["champion"]:
            after["challenger"] = version
        elif decision == SUPERSEDED and recorded is not None:
            after = aliases_of(recorded)
    return after


def not_registered(candidate: dict[str, Any]) -> str:
    """Why a candidate is not a version, in the registry's metadata."""
    if candidate["decision"] == SUPERSEDED and candidate.get("serving"):
        return f"not registered again, its model serves as {candidate['serving']}"
    if candidate["decision"] == SUPERSEDED:
        return "not promoted, a later day's model is champion"
    return "rejected, not registered"
