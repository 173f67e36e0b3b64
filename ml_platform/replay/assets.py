"""`<replay>/replay_comparison`: the live chain and the replay over the replayed days."""

import dataclasses

import dagster as dg

from ml_platform.evaluation.metrics import primary_metric
from ml_platform.platform.datasets import asset_key, dataset_name, writer_pool
from ml_platform.platform.formats import FORMAT_KEY
from ml_platform.platform.plots import Series, line_chart
from ml_platform.platform.retries import STORAGE_RETRY_POLICY
from ml_platform.replay.comparison import (
    COMPARED,
    ChainDay,
    ChainSummary,
    notes,
    paired_difference,
    read_chain,
    read_warm_up,
    render_days,
    render_summary,
    verdict,
)
from ml_platform.replay.replays import Replay

REPLAY_COMPARISON = "replay_comparison"
# The job that materialises it, which `ml-platform replay` launches once the backfill ended.
REPLAY_COMPARISON_JOB = f"{REPLAY_COMPARISON}_job"
REPLAY_GROUP = "replay"


def _chart(live: dict[str, ChainDay], replay: dict[str, ChainDay], metric: str) -> str:
    """Both serving champions' next-day metric, day by day (days as their index)."""

    def series(name: str, chain: dict[str, ChainDay]) -> Series:
        scored = [(i, row.metric) for i, row in enumerate(chain.values()) if row.metric is not None]
        return Series(name, [i for i, _ in scored], [m for _, m in scored])

    return line_chart(
        f"Serving champion's next-day {metric}",
        [series("live", live), series("replay", replay)],
        "day of the replay",
        metric,
    )


def build_replay_comparison(replay: Replay) -> dg.AssetsDefinition:
    """The replay's comparison asset, which reads the records of both chains' day assets."""
    dataset, live_dataset = replay.dataset, replay.live
    metric = primary_metric(replay.contract)
    samples = replay.contract.evaluation.bootstrap_samples
    # A changed label or task: both chains' figures stand, but side by side, not paired.
    changed_target = replay.changed_target

    @dg.asset(
        name=REPLAY_COMPARISON,
        key_prefix=dataset,
        # Both chains' records are what it reads: the lineage shows both.
        deps=[asset_key(d, name) for d in (live_dataset, dataset) for name in COMPARED],
        pool=writer_pool(dataset, REPLAY_COMPARISON),
        retry_policy=STORAGE_RETRY_POLICY,
        group_name=dataset_name(dataset, REPLAY_GROUP),
        kinds={"dagster", "json"},
        metadata={FORMAT_KEY: "json"},
        description=(
            f"Replay '{replay.name}' of {live_dataset} ({replay.start}, {replay.days} days) "
            "beside the live chain: accepted days, promotions, the serving champion's next-day "
            f"{metric}, drift alarm days and training cost."
        ),
    )
    def _replay_comparison(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        days = replay.day_keys
        live = read_chain(context.instance, live_dataset, days, metric)
        ran = read_chain(context.instance, dataset, days, metric)
        # The days before the first that the replay computed, as its backfill did.
        warm_up_days = replay.warm_up_days(replay.live_weekly_days(context.instance))
        warm_up = read_warm_up(context.instance, live_dataset, dataset, warm_up_days, days[0])
        difference = paired_difference(live, ran, samples)
        caveats = notes(live, ran, warm_up, replay.live_change)
        headline = render_summary(
            live_dataset, dataset, live, ran, metric, difference, changed_target, caveats
        )
        live_summary, replay_summary = ChainSummary.of(live), ChainSummary.of(ran)
        said = verdict(difference, metric, changed_target)
        context.log.info(f"{dataset} against {live_dataset}: {' '.join([said, *caveats])}")
        figures: dict[str, float | int] = {}
        for side, summary in (("live", live_summary), ("replay", replay_summary)):
            figures |= {
                f"{side}_promotions": summary.promotions,
                f"{side}_rejected_days": len(summary.rejected),
                f"{side}_drift_days": summary.drift_days,
                f"{side}_training_seconds": summary.train_seconds,
                f"{side}_unrecorded_days": len(summary.unrecorded),
                f"{side}_weekly_retrains": len(summary.weekly),
            }
            if summary.mean_metric is not None:
                figures[f"{side}_mean_{metric}"] = summary.mean_metric
        figures["warm_up_differing_days"] = len(warm_up.differing)
        if difference.mean is not None and not changed_target:
            figures[f"difference_{metric}"] = difference.mean
        return dg.MaterializeResult(
            value={
                "replay": replay.name,
                "live": live_dataset,
                "metric": metric,
                "verdict": said,
                "changed_target": changed_target,
                "notes": caveats,
                "warm_up": {
                    "days": warm_up.days,
                    "differing": list(warm_up.differing),
                    "judged": {
                        day: {"live": was, "replay": now}
                        for day, (was, now) in warm_up.differing.items()
                    },
                },
                # Replay minus live means nothing across two targets.
                "difference": None if changed_target else dataclasses.asdict(difference),
                "summary": {
                    "live": dataclasses.asdict(live_summary),
                    "replay": dataclasses.asdict(replay_summary),
                },
                "days": {
                    "live": [dataclasses.asdict(row) for row in live.values()],
                    "replay": [dataclasses.asdict(row) for row in ran.values()],
                },
            },
            metadata={
                **figures,
                "verdict": said,
                "notes": dg.MetadataValue.md("\n\n".join(caveats) or "none"),
                "summary": dg.MetadataValue.md(headline),
                "comparison": dg.MetadataValue.md(
                    f"{headline}\n{_chart(live, ran, metric)}\n\n{render_days(live, ran, metric)}"
                ),
            },
        )

    return _replay_comparison
