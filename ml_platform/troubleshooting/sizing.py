"""Sizes learned from use: what each stage's steps used, and the request that fits it.

Every day a step computes records its resource use in the day's materialisation
(`steps.day_metrics`): `step_peak_rss_mb`, and `step_cpu_seconds` over `step_wall_seconds`.
`ml-platform resources` reads them from the instance for each stage of a dataset over its
recent materialisations, and sets beside the contract's request the median and p95 of both and
the request they advise (`platform.sizes.recommend`); a day run more than once gives the
figures of its newest run. A stage with fewer than `ADVICE_MIN_DAYS` recorded days keeps its
request, and `--write` is refused when no stage has that many. Where the contract's bounds cap
the advice below the memory the recorded days need, the table says so, and a request already
above the capped advice is kept. With `--write` the advice goes into the contract's
`resources:` section, where a person reviews it like any other change.
"""

import dataclasses
import time

import dagster as dg

from ml_platform.contracts import Contract
from ml_platform.contracts.model import STAGES, ContractError, ResourcesSpec, StageSize
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.observability import STEP_PREFIX
from ml_platform.platform.settings import Settings
from ml_platform.platform.sizes import MEMORY_HEADROOM, memory_request_mb, recommend
from ml_platform.troubleshooting.health import percentile

PEAK_KEY = f"{STEP_PREFIX}peak_rss_mb"
CPU_KEY = f"{STEP_PREFIX}cpu_seconds"
WALL_KEY = f"{STEP_PREFIX}wall_seconds"
# Days of a stage read at most: a year of one asset's days, newest first.
MAX_DAYS_READ = 366
# Recorded days a stage's advice needs: one day's peak is that day's data (a small delivery, a
# re-delivery of part of a day), and a p95 of one or two days is their largest.
ADVICE_MIN_DAYS = 3


class TooFewDaysError(ContractError):
    """`--write` refused: no stage has `ADVICE_MIN_DAYS` recorded days to advise from.

    A `ContractError`, as the commands report one: the contract is left as it is.
    """

    def __init__(self, source: str, message: str):
        ValueError.__init__(self, message)
        self.source = source
        self.problems = [message]


@dataclasses.dataclass
class StageUse:
    """One stage's request and the resource use its recorded days show."""

    stage: str
    request: StageSize
    peaks_mb: list[float]
    # CPU seconds per wall second of each day (1.0: one core busy throughout).
    cpus: list[float]
    # The days (partitions) those were recorded on: a day run again is one day still.
    days: set[str] = dataclasses.field(default_factory=set)

    @property
    def advised(self) -> bool:
        """Whether enough days are recorded to advise from (`ADVICE_MIN_DAYS`)."""
        return bool(self.peaks_mb) and len(self.days) >= ADVICE_MIN_DAYS

    @property
    def needed_peak_mb(self) -> float:
        """The p95 of the recorded peaks (MiB); 0 with none."""
        return percentile(self.peaks_mb, 95) or 0.0

    @property
    def needed_memory_mb(self) -> int:
        """The memory the recorded p95 peak asks for, with its headroom (`memory_request_mb`)."""
        return memory_request_mb(self.needed_peak_mb)

    def advice(self, contract: Contract) -> StageSize:
        """The request the recorded days advise; the current one when too few are recorded.

        The current one too when the contract's bounds cap the advice below what the recorded
        days need and the request already asks for more (`capped`).
        """
        if not self.advised:
            return self.request
        # No day with CPU figures says nothing of the CPU: the request's, not the least size.
        p95_cpu = percentile(self.cpus, 95) if self.cpus else self.request.cpu
        advised = recommend(self.needed_peak_mb, p95_cpu or 0.0, contract).size
        if advised.memory < self.needed_memory_mb and self.request.memory > advised.memory:
            # A request raised past the bound by hand, which holds the days the capped advice
            # would not: written, the advice would end the step on every such day.
            return self.request
        return advised

    def capped(self, contract: Contract) -> str:
        """Why the advice holds less memory than the recorded days need; "" when it holds it."""
        if not self.advised or self.advice(contract).memory >= self.needed_memory_mb:
            return ""
        bounds = contract.resources
        kept = "its request kept, as " if self.advice(contract) == self.request else ""
        return (
            f"{kept}max_memory_mb {bounds.max_memory_mb} and max_cpu {bounds.max_cpu:g} (in "
            f"Fargate's sizes) cap the advice below the {self.needed_memory_mb} MiB the recorded "
            "p95 needs: raise them"
        )


def stage_uses(
    instance: dg.DagsterInstance, contract: Contract, days: float, now: float | None = None
) -> list[StageUse]:
    """Each stage's use over the materialisations of the last `days` days, in graph order."""
    since = (now or time.time()) - days * 86400
    uses = []
    for stage in STAGES:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key(contract.name, stage), after_timestamp=since),
            limit=MAX_DAYS_READ,
        ).records
        peaks, cpus, recorded = [], [], set()
        for record in records:
            materialization = record.asset_materialization
            metadata = dict(materialization.metadata) if materialization else {}
            peak = _number(metadata, PEAK_KEY)
            if peak is None:
                continue  # a day recorded unchanged computed nothing
            # An unpartitioned materialisation is a day of its own.
            day = record.partition_key or f"record {record.storage_id}"
            if day in recorded:
                # Newest first: a day's figures are its newest computation's (its data as now
                # delivered). Each run of a day retried or re-run counted would weigh that day
                # in the percentiles as many times, and outvote the days run once.
                continue
            recorded.add(day)
            peaks.append(peak)
            cpu, wall = _number(metadata, CPU_KEY), _number(metadata, WALL_KEY)
            if cpu is not None and wall:
                cpus.append(cpu / wall)
        uses.append(StageUse(stage, contract.resources.size(stage), peaks, cpus, recorded))
    return uses


def _number(metadata: dict[str, dg.MetadataValue], key: str) -> float | None:
    value = metadata[key].value if key in metadata else None
    return float(value) if isinstance(value, int | float) else None


def last_peak(instance: dg.DagsterInstance, contract: Contract, stage: str) -> tuple[float, str]:
    """The newest recorded peak memory (MiB) of the stage's days, and its day; (0, "") if none."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key(contract.name, stage)), limit=MAX_DAYS_READ
    ).records
    for record in records:
        materialization = record.asset_materialization
        peak = _number(dict(materialization.metadata), PEAK_KEY) if materialization else None
        if peak is not None:
            return peak, record.partition_key or ""
    return 0.0, ""


def memory_advice(
    instance: dg.DagsterInstance, contracts: list[Contract], steps: tuple[str, ...]
) -> list[str]:
    """For each step that ran out of memory: its request, its last peak and what to run.

    Steps of no served contract's stage (a check's step, another code location's) are left out.
    """
    lines = []
    for step in steps:
        for contract in contracts:
            stage = step.removeprefix(f"{contract.name}__")
            if stage == step or stage not in STAGES:
                continue
            request = contract.resources.size(stage)
            peak, day = last_peak(instance, contract, stage)
            seen = f"{peak:.0f} MiB on {day}" if peak else "none recorded yet"
            lines += [
                f"{step}: requests {request.memory} MiB, {request.cpu:g} vCPU (the contract's "
                f"resources: {stage}); its last recorded peak: {seen}",
                f"  `ml-platform resources --dataset {contract.name}` advises a request from the "
                "recorded peaks (`--write` puts it in the contract); the worker that runs it "
                "must have at least that memory (ML_PLATFORM_WORKER_POOLS)",
            ]
    return lines


def advised_resources(
    contract: Contract, uses: list[StageUse], pools: dict[str, int] | None = None
) -> ResourcesSpec:
    """The contract's `resources:` with each recorded stage's advice; its bounds unchanged.

    `TooFewDaysError` if no stage has `ADVICE_MIN_DAYS` recorded days: the section would be
    rewritten as advice that one or two days dictate, or that advises nothing. `ContractError`
    if a stage's advice is more than the workers of every pool hold (`pools`, by default the
    settings' worker pools, as `sizes.step_tags`): the code location would not load it.
    """
    if not any(use.advised for use in uses):
        most = max((len(use.days) for use in uses), default=0)
        raise TooFewDaysError(
            contract.name,
            f"{contract.name}: advice to write needs at least {ADVICE_MIN_DAYS} recorded days "
            f"of a stage, and no stage has them (the most: {most}); the contract is left as it "
            "is. Materialise more days (or read more of them with --days), then write again",
        )
    current = contract.resources
    stages = {use.stage: use.advice(contract) for use in uses}
    pools = Settings().worker_pools if pools is None else pools
    # Fargate's sizes can raise the memory with the CPU (2 vCPU: 4 GiB at least), past the
    # largest pool; written, the contract would take every dataset's code location down.
    too_large = [
        f"resources: stages: {stage}: the advice {size.cpu:g} vCPU {size.memory} MiB is more "
        f"than a worker of any pool has ({', '.join(f'{n}={mb}' for n, mb in pools.items())}): "
        "add a larger pool to ML_PLATFORM_WORKER_POOLS, or lower max_cpu or max_memory_mb; "
        "the contract is left as it is"
        for stage, size in stages.items()
        if pools and size.memory > max(pools.values())
    ]
    if too_large:
        raise ContractError(contract.name, too_large)
    bounds = {name: getattr(current, name) for name in current.model_fields_set - {"stages"}}
    return ResourcesSpec(stages=stages, **bounds)


def render(contract: Contract, uses: list[StageUse], days: float) -> str:
    """The table `ml-platform resources` prints."""

    def size(s: StageSize) -> str:
        return f"{s.cpu:g} vCPU {s.memory} MiB"

    def pair(values: list[float], unit: str, digits: int) -> str:
        if not values:
            return "-"
        median, p95 = percentile(values, 50), percentile(values, 95)
        return f"{median:.{digits}f} / {p95:.{digits}f}{unit}"

    header = ("stage", "request", "days", "memory median / p95", "CPU median / p95", "recommended")
    rows = [header]
    for use in uses:
        if use.advised:
            advice = size(use.advice(contract))
            if use.capped(contract):
                advice += f", {use.capped(contract)}"
        elif use.peaks_mb:
            advice = (
                f"{len(use.days)} recorded day(s), fewer than the {ADVICE_MIN_DAYS} advice "
                "needs: keeps its request"
            )
        else:
            advice = "no recorded run: keeps its request"
        rows.append(
            (
                use.stage,
                size(use.request),
                str(len(use.days)),
                pair(use.peaks_mb, " MiB", 0),
                pair(use.cpus, " vCPU", 2),
                advice,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        f"{contract.name}: resource use per stage over the materialisations of the last "
        f"{days:g} day(s)",
        f"recommended: p95 peak memory x {MEMORY_HEADROOM} and the CPU size nearest the p95 CPU, "
        "within the contract's bounds, rounded up to a Fargate task size, from a stage's "
        f"recorded days (at least {ADVICE_MIN_DAYS}, shown under days)",
    ]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
