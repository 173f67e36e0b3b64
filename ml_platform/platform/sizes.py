"""Each step's size: the contract's request as the step executors' own op tags, and its advice.

A stage's request (`resources:` in the contract: vCPUs and MiB) is data on its step, read by the
executor that places steps, never by the run launcher:

- dagster-aws's `ecs_executor` starts each step as its own ECS task and reads the op tags
  `ecs/cpu` (CPU units, 1024 a vCPU) and `ecs/memory` (MiB), both strings, which it puts in
  the task's overrides. Fargate accepts only some pairs of the two (`FARGATE_MEMORY`), so the
  request is rounded up to the smallest pair that holds it.
- dagster-k8s's `k8s_job_executor` starts each step as its own pod and reads the op tag
  `dagster-k8s/config`, whose `container_config.resources` is the container's Kubernetes
  requests and limits. The pod gets the contract's request as it is (Kubernetes takes any
  size); its memory limit is its request, so a step that outgrows it is ended by the kernel and
  says so, instead of taking a neighbour's memory; CPU has no limit (a limit only throttles).
- dagster-celery's `celery_executor` sends each step as a Celery task to the queue in the op
  tag `dagster-celery/queue`. Workers are started in pools, a queue each (`dagster-celery
  worker start -q POOL`), declared in ML_PLATFORM_WORKER_POOLS with the memory each of their
  workers has; a step goes to the smallest pool whose workers hold its request, so training
  goes to the large workers and the rest stay on the small ones.

The embedded default (the in-process executor) reads none of these tags.

`ml-platform resources` turns the peaks the steps recorded into a request (`recommend`): the
p95 peak memory with `MEMORY_HEADROOM`, rounded up to `MEMORY_STEP_MB`, and the Fargate CPU size
nearest the p95 of the CPU seconds per wall second, each within the contract's bounds, then
rounded up to a Fargate pair.
"""

import dataclasses
import math
from typing import Any

from ml_platform.contracts import Contract, ContractError
from ml_platform.contracts.model import StageSize
from ml_platform.platform.settings import Settings

# Peak memory varies with the day's size; a request at the peak observed would OOM on the next
# bigger day.
MEMORY_HEADROOM = 1.25
MEMORY_STEP_MB = 64
CPU_UNITS_PER_VCPU = 1024
# Fargate's task sizes: the memory (MiB) each CPU size (CPU units) accepts. From the Amazon ECS
# developer guide, "Troubleshoot Amazon ECS task definition invalid CPU or memory errors"
# (docs.aws.amazon.com/AmazonECS/latest/developerguide/task-cpu-memory-error.html): 0.25 vCPU
# takes 0.5, 1 or 2 GB; 0.5 vCPU 1 to 4 GB; 1 vCPU 2 to 8 GB; 2 vCPU 4 to 16 GB and 4 vCPU 8 to
# 30 GB, by 1 GB; 8 vCPU 16 to 60 GB by 4 GB; 16 vCPU 32 to 120 GB by 8 GB (the last two on
# Linux platform 1.4.0 or later).
FARGATE_MEMORY: dict[int, tuple[int, ...]] = {
    256: (512, 1024, 2048),
    512: tuple(range(1024, 4096 + 1, 1024)),
    1024: tuple(range(2048, 8192 + 1, 1024)),
    2048: tuple(range(4096, 16384 + 1, 1024)),
    4096: tuple(range(8192, 30720 + 1, 1024)),
    8192: tuple(range(16384, 61440 + 1, 4096)),
    16384: tuple(range(32768, 122880 + 1, 8192)),
}
ECS_CPU_TAG = "ecs/cpu"
ECS_MEMORY_TAG = "ecs/memory"
K8S_CONFIG_TAG = "dagster-k8s/config"
CELERY_QUEUE_TAG = "dagster-celery/queue"
# The asset's definition metadata that shows its request in the UI.
REQUEST_CPU_KEY = "resources/request_cpu"
REQUEST_MEMORY_KEY = "resources/request_memory_mb"


def fargate_pair(cpu: float, memory_mb: int) -> tuple[int, int]:
    """The smallest Fargate task (CPU units, MiB) with at least `cpu` vCPUs and `memory_mb`.

    The smallest CPU size that can hold the memory first (a vCPU costs about nine GB of
    memory), then the least memory that size accepts. Raises ValueError past the largest task.
    """
    units = cpu * CPU_UNITS_PER_VCPU
    for size, memories in FARGATE_MEMORY.items():
        if size < units:
            continue
        fitting = [m for m in memories if m >= memory_mb]
        if fitting:
            return size, fitting[0]
    raise ValueError(
        f"no Fargate task has {cpu:g} vCPU and {memory_mb} MiB: the largest is 16 vCPU, 120 GiB"
    )


def worker_pool(memory_mb: int, pools: dict[str, int], stage: str) -> str:
    """The smallest of `pools` (name -> MiB a worker) whose workers hold `memory_mb`."""
    for name, capacity in sorted(pools.items(), key=lambda pool: pool[1]):
        if capacity >= memory_mb:
            return name
    largest = ", ".join(f"{name}={mb}" for name, mb in pools.items())
    raise ValueError(
        f"stage {stage} asks for {memory_mb} MiB, more than a worker of any pool has ({largest}): "
        "add a larger pool to ML_PLATFORM_WORKER_POOLS or lower the contract's request"
    )


def step_tags(
    contract: Contract, stage: str, pools: dict[str, int] | None = None
) -> dict[str, Any]:
    """The op tags of `stage`: its request for the ECS, Kubernetes and Celery executors.

    `pools` defaults to the settings' worker pools; with none, the Celery tag is left out and
    the step goes to Celery's default queue. `ContractError` if no pool's workers hold the
    stage's request.
    """
    size = contract.resources.size(stage)
    cpu_units, memory = fargate_pair(size.cpu, size.memory)
    pools = Settings().worker_pools if pools is None else pools
    try:
        queue = {CELERY_QUEUE_TAG: worker_pool(size.memory, pools, stage)} if pools else {}
    except ValueError as exc:
        # With several datasets served, the stage alone does not say whose contract to change.
        raise ContractError(contract.name, [f"resources: stages: {stage}: {exc}"]) from exc
    return {
        **queue,
        ECS_CPU_TAG: str(cpu_units),
        ECS_MEMORY_TAG: str(memory),
        K8S_CONFIG_TAG: {
            "container_config": {
                "resources": {
                    "requests": {
                        "cpu": f"{round(size.cpu * 1000)}m",
                        "memory": f"{size.memory}Mi",
                    },
                    "limits": {"memory": f"{size.memory}Mi"},
                }
            }
        },
    }


def request_metadata(contract: Contract, stage: str) -> dict[str, float | int]:
    """The stage's request as asset metadata, which the UI shows beside its recorded peaks."""
    size = contract.resources.size(stage)
    return {REQUEST_CPU_KEY: size.cpu, REQUEST_MEMORY_KEY: size.memory}


def memory_request_mb(peak_mb: float) -> int:
    """A peak memory plus headroom, rounded up to a multiple of MEMORY_STEP_MB."""
    return int(math.ceil(peak_mb * MEMORY_HEADROOM / MEMORY_STEP_MB) * MEMORY_STEP_MB)


def cpu_request(cpu_per_second: float) -> float:
    """The vCPUs for a step that used `cpu_per_second` CPU seconds per wall second.

    The Fargate CPU size nearest it, on a ratio scale (0.7 of a core: 0.5 vCPU; 0.75: 1), with
    no headroom: too little CPU only slows a step (by less than 1.42 x at the nearest size),
    where too little memory ends it, and a short step's CPU share is noisy.
    """
    sizes = [units / CPU_UNITS_PER_VCPU for units in FARGATE_MEMORY]
    if cpu_per_second <= sizes[0]:
        return sizes[0]
    return min(sizes, key=lambda size: abs(math.log(size / cpu_per_second)))


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """The size `recommend` advises, and whether the contract's bounds or Fargate moved it."""

    size: StageSize
    clamped: bool


def recommend(p95_peak_mb: float, p95_cpu: float, contract: Contract) -> Recommendation:
    """A stage's request from its p95 peak memory and p95 CPU seconds per wall second.

    Memory: `memory_request_mb`; CPU: `cpu_request`; each kept within the contract's bounds,
    then rounded up to the Fargate pair that holds both (which can raise the memory to the
    least its CPU size accepts). `ContractError` if the bounds admit no Fargate task.
    """
    bounds = contract.resources
    memory = memory_request_mb(p95_peak_mb)
    cpu = cpu_request(p95_cpu)
    bounded_memory = min(max(memory, bounds.min_memory_mb), bounds.max_memory_mb)
    bounded_cpu = min(max(cpu, bounds.min_cpu), bounds.max_cpu)
    units, fitted = fargate_pair(bounded_cpu, bounded_memory)
    if units / CPU_UNITS_PER_VCPU > bounds.max_cpu or fitted > bounds.max_memory_mb:
        # Rounding up to a Fargate pair went past a bound: the pair within them nearest.
        try:
            units, fitted = pair_within(
                bounded_cpu, bounded_memory, bounds.max_cpu, bounds.max_memory_mb
            )
        except ValueError as exc:
            # Bounds the contract accepts, below Fargate's smallest task: the contract's mistake,
            # which the commands report as one, not a traceback.
            raise ContractError(contract.name, [f"resources: {exc}"]) from exc
    clamped = (bounded_memory, bounded_cpu) != (memory, cpu) or (units, fitted) != fargate_pair(
        cpu, memory
    )
    return Recommendation(StageSize(cpu=units / CPU_UNITS_PER_VCPU, memory=fitted), clamped)


def pair_within(cpu: float, memory_mb: int, max_cpu: float, max_memory_mb: int) -> tuple[int, int]:
    """The Fargate task within the bounds nearest (`cpu`, `memory_mb`): (CPU units, MiB).

    Memory first (too little ends a step, too little CPU only slows it): of the tasks with at
    least `memory_mb`, the CPU size nearest `cpu`, then the least memory; if none has that
    much memory, of those with the most, the CPU size nearest `cpu`. ValueError if the bounds
    admit no Fargate task.
    """
    within = [
        (size, memory)
        for size, memories in FARGATE_MEMORY.items()
        for memory in memories
        if size <= max_cpu * CPU_UNITS_PER_VCPU and memory <= max_memory_mb
    ]
    if not within:
        raise ValueError(
            f"max_cpu {max_cpu:g} and max_memory_mb {max_memory_mb} admit no Fargate task: "
            "the smallest is 0.25 vCPU with 512 MiB"
        )
    units = cpu * CPU_UNITS_PER_VCPU
    holding = [pair for pair in within if pair[1] >= memory_mb]
    if not holding:
        # Several CPU sizes take the most memory (9 GiB: 2 and 4 vCPU): the one nearest the
        # use, not the largest, which would cost more and run no faster.
        most = max(memory for _, memory in within)
        holding = [pair for pair in within if pair[1] == most]
    return min(holding, key=lambda pair: (abs(math.log(pair[0] / units)), pair[1]))
