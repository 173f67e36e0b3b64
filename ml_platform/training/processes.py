"""A range's models trained side by side in worker processes, as many as memory and cores allow.

A range step (a backfill's chunk of days) trains one model a day, each on the window ending that
day: the days do not depend on each other, so they can train at once. Threads do not help:
scikit-learn's SGD passes and the preprocessing hold the GIL (two threads trained 24 flights days
0.95 times as fast as one); processes do (1.74 times on two cores once started).

How many: the step trains its first day in its own process, as a one-day run does, and sizes the
rest from what that day used (its peak memory and its seconds, recorded in its metadata):
`worker_count` takes the cores this process may use, bounded by memory, MEMORY_SHARE of what
the machine (or the container's cgroup) has available over that day's peak, so the number of
trainings at once follows memory, not a fixed count. A day trains in a worker when:

- its window's frames fit WORKER_WINDOW_BYTES: they are sent to the worker whole (a window of
  big days is streamed a day at a time in the step's process instead, as before);
- its training would be shorter than the contract's `training.checkpoint_seconds`, judged
  from the step's first training's seconds per window row times this window's rows (a range
  from a dataset's start grows from a one-day window to a whole one): a worker writes no
  checkpoint, and such a training would have written none either, so a kill loses at most
  what it would have lost in the step's process;
- no checkpoint of it is stored (a killed run's training resumes in the step's process).

Every other day trains in the step's process, as before. Each model is the same whichever
process trained it (the training is seeded; `test_training_processes.py` compares them).
"""

import concurrent.futures
import dataclasses
import functools
import math
import multiprocessing
import multiprocessing.connection
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.platform.inputs import WINDOW_CACHE_BYTES
from ml_platform.platform.observability import StepTelemetry
from ml_platform.training.model import TrainedModel, train_model

# Share of the available memory the trainings at once may take, each counted at the peak of the
# step's first training (its whole process: an overestimate of a worker, which imports less).
MEMORY_SHARE = 0.5
# A window sent to a worker is held whole: the budget a step keeps loaded windows within.
WORKER_WINDOW_BYTES = WINDOW_CACHE_BYTES
# A worker is a new interpreter that imports pandas and scikit-learn (about 2 s): trainings that
# would take fewer seconds than this in all gain nothing from it.
MIN_PARALLEL_SECONDS = 10.0

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit number; anything this large is.
V1_UNLIMITED = 2**62


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_levels(controller: str) -> list[Path]:
    """This process's cgroup directories for `controller`, from its own group up to the root.

    cgroup v2 has one tree (`0::/path` in /proc/self/cgroup), v1 a tree per controller
    (`4:memory:/path`). A container without a cgroup namespace sees its host's path, which its
    own /sys/fs/cgroup does not have: its mount's root is then the container's group.
    """
    levels: list[Path] = []
    for line in (_read(PROC_CGROUP) or "").splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and not controllers:
            root = CGROUP
        elif controller in controllers.split(","):
            root = CGROUP / controller
        else:
            continue
        group = root / path.lstrip("/")
        while group != root and group.is_relative_to(root):
            if group.is_dir():
                levels.append(group)
            group = group.parent
        levels.append(root)
    return levels


def cgroup_available_mb() -> float:
    """Memory the cgroups of this process still allow (MiB): the tightest level, inf if none."""
    available = math.inf
    for group in cgroup_levels("memory"):
        for limit_file, used_file in (
            ("memory.max", "memory.current"),  # v2
            ("memory.limit_in_bytes", "memory.usage_in_bytes"),  # v1
        ):
            limit, used = _read(group / limit_file), _read(group / used_file)
            if limit is None or used is None or limit == "max":
                continue
            try:
                if int(limit) < V1_UNLIMITED:
                    available = min(available, (int(limit) - int(used)) / 1024**2)
            except ValueError:
                continue
    return available


def cgroup_cpus() -> float:
    """CPUs the cgroups' CFS quotas allow this process (inf if none): quota over period."""
    cpus = math.inf
    for group in cgroup_levels("cpu"):
        v2 = _read(group / "cpu.max")  # "max 100000", or "150000 100000" for 1.5 CPUs
        if v2 is not None:
            quota, _, period = v2.partition(" ")
        else:
            quota = _read(group / "cpu.cfs_quota_us") or "-1"  # v1; -1: no quota
            period = _read(group / "cpu.cfs_period_us") or ""
        if quota in ("max", "-1"):
            continue
        try:
            cpus = min(cpus, int(quota) / int(period))
        except (ValueError, ZeroDivisionError):
            continue
    return cpus


def available_memory_mb() -> float:
    """Memory this process can still take (MiB): the OS's MemAvailable within its cgroups'."""
    available = math.inf
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) / 1024
    except OSError:
        pass  # not Linux: the free physical pages below
    available = min(available, cgroup_available_mb())
    if math.isinf(available):
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1024**2
    return available


def usable_cores() -> int:
    """The cores this process may run on, within its cgroups' CPU quota.

    A container given 1 vCPU on a host of 16 sees the 16 in its affinity: 16 trainings at once
    would each take 16 times as long, holding 16 windows' memory.
    """
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    quota = cgroup_cpus()
    if math.isfinite(quota):
        cores = min(cores, int(quota))
    return max(1, cores)


def worker_count(days_left: int, peak_mb: float, available_mb: float, cores: int) -> int:
    """Trainings at once: the cores, at most one a day left, within MEMORY_SHARE of memory."""
    by_memory = int(MEMORY_SHARE * available_mb // max(peak_mb, 1.0))
    return max(1, min(cores, days_left, by_memory))


def _die_with_parent() -> None:
    """In a worker: end the process when the step's process is gone.

    A step's process killed (the OOM killer takes the largest process, the step's own) would
    leave its workers waiting for work for ever, each holding its memory.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


@dataclasses.dataclass(frozen=True)
class WorkerTraining:
    """A model trained in a worker, and what its training used there."""

    model: TrainedModel
    telemetry: StepTelemetry


@functools.cache
def _contract(contract_json: str) -> Contract:
    return Contract.model_validate_json(contract_json)


def train_in_worker(frames: dict[str, pd.DataFrame], contract_json: str) -> WorkerTraining:
    """Train the contract's model on a window's frames: what a worker process runs."""
    with StepTelemetry(reset_peak=True) as telemetry:
        model = train_model(frames, _contract(contract_json))
    return WorkerTraining(model, telemetry)


@dataclasses.dataclass(frozen=True)
class Trained:
    """A day's model, what its training used, and whether a worker trained it."""

    model: TrainedModel
    telemetry: StepTelemetry
    in_worker: bool


class RangeTrainer:
    """Trains a step's days in order: in its own process, or ahead of it in worker processes.

    `worker_window(day)` gives a later day's window frames when that day may train in a worker
    (see the module's docstring), else None. Used as a context manager: leaving it stops the
    workers and drops the trainings of days the step did not ask for.
    """

    def __init__(
        self,
        contract: Contract,
        days: list[str],
        worker_window: Callable[[str], Mapping[str, pd.DataFrame] | None],
        log: Callable[[str], None],
    ):
        self.contract_json = contract.model_dump_json()
        self.checkpoint_seconds = contract.training.checkpoint_seconds
        self.days = days
        self.worker_window = worker_window
        self.log = log
        self.decided = False
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.workers = 0
        self.next_index = 0  # the next day `_fill` considers
        self.seconds_per_row = 0.0  # of the step's first training
        self.pending: dict[str, concurrent.futures.Future[WorkerTraining]] = {}

    def __enter__(self) -> "RangeTrainer":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # Leaving on an error or an interrupt (the run terminated) does not wait for trainings
        # nobody will read: a worker stuck in one would hold the step; it ends with its training
        # or, the step's process gone, by itself (`_die_with_parent`).
        self._stop(wait=exc_type is None)

    def train(
        self, day: str, in_process: Callable[[], tuple[TrainedModel, StepTelemetry]]
    ) -> Trained:
        """The day's model: a worker's when one trained it, else `in_process()`'s.

        The step asks for its days in order; a day it did not ask for (recorded unchanged, or
        a verdict before training) drops the training a worker started for it.
        """
        for skipped in [d for d in self.pending if d < day]:
            self.pending.pop(skipped).cancel()
        self.next_index = max(self.next_index, self.days.index(day) + 1)
        future = self.pending.pop(day, None)
        if future is not None:
            try:
                self._fill()
                done = future.result()
                return Trained(done.model, done.telemetry, in_worker=True)
            except BrokenProcessPool:
                self._worker_died(f"{day} and the step's days after it")
        model, telemetry = in_process()
        if not self.decided:
            rows = model.train_rows + model.holdout_rows
            self.seconds_per_row = telemetry.wall_seconds / max(rows, 1)
            self._decide(day, telemetry)
        try:
            self._fill()
        except BrokenProcessPool:
            self._worker_died(f"the step's days after {day}")
        return Trained(model, telemetry, in_worker=False)

    def _worker_died(self, days: str) -> None:
        """A worker died, breaking the pool: the step goes on in its own process.

        The OS kills the largest process when memory runs out; the step loses nothing but time.
        """
        self.log(f"a training worker process died; {days} train in the step's own process")
        self._stop()

    def _decide(self, day: str, telemetry: StepTelemetry) -> None:
        """After the step's first training: whether, and in how many workers, the rest train."""
        self.decided = True
        left = len(self.days) - self.next_index
        seconds = telemetry.wall_seconds
        if left < 2 or seconds >= self.checkpoint_seconds or seconds * left < MIN_PARALLEL_SECONDS:
            return
        available = available_memory_mb()
        workers = worker_count(left, telemetry.peak_rss_mb, available, usable_cores())
        if workers < 2:
            return
        # A new interpreter each: a fork of a run's process would inherit its threads' locks.
        context = multiprocessing.get_context("spawn")
        self.pool = concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=context, initializer=_die_with_parent
        )
        self.workers = workers
        self.log(
            f"the {left} days after {day} train in up to {workers} worker processes: {day}'s "
            f"training took {seconds:.2f} s and a peak of {telemetry.peak_rss_mb:.0f} MB, and "
            f"{available:.0f} MB are available"
        )

    def _fill(self) -> None:
        """Submit the next days a worker may train, until every worker has one."""
        while self.pool is not None and len(self.pending) < self.workers:
            if self.next_index >= len(self.days):
                return
            day = self.days[self.next_index]
            self.next_index += 1
            try:
                frames = self.worker_window(day)
            except Exception as exc:
                # Read ahead for a worker, while an earlier day trains: not that day's failure.
                # The day meets its own error when the step reaches it, in its own process.
                self.log(
                    f"{day} trains in the step's own process: its window was not read "
                    f"ahead ({type(exc).__name__}: {exc})"
                )
                continue
            if frames is None:
                continue
            rows = sum(len(frame) for frame in frames.values())
            seconds = self.seconds_per_row * rows
            if seconds >= self.checkpoint_seconds:
                self.log(
                    f"{day} trains in the step's own process, with checkpoints: its window's "
                    f"{rows} rows would train for about {seconds:.0f} s, at least the contract's "
                    f"training.checkpoint_seconds ({self.checkpoint_seconds:g} s)"
                )
                continue
            self.pending[day] = self.pool.submit(train_in_worker, dict(frames), self.contract_json)

    def _stop(self, wait: bool = True) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=True)
        self.pool = None
        self.pending.clear()
