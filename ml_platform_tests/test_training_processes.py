"""A range's models trained side by side in worker processes, sized by memory and cores."""

import concurrent.futures
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import pytest

from ml_platform.contracts import load_contract
from ml_platform.platform.observability import StepTelemetry
from ml_platform.training import processes
from ml_platform.training.processes import RangeTrainer, available_memory_mb, worker_count
from ml_platform_tests.conftest import Platform, contract_with, days_from
from ml_platform_tests.test_backfill_range import materialize_range

DAYS = days_from("2024-01-01", 7)
REJECTED = DAYS[4]
UPSTREAM = ["raw_data", "validated_data", "features"]


def test_trainings_at_once_follow_memory_then_cores_then_days():
    # 4,000 MB available, half of it for trainings of 400 MB: five fit, the cores allow two.
    assert worker_count(days_left=30, peak_mb=400, available_mb=4000, cores=2) == 2
    # Big trainings: memory allows two where eight cores would allow eight.
    assert worker_count(days_left=30, peak_mb=900, available_mb=4000, cores=8) == 2
    # Memory for none at once still trains, one at a time.
    assert worker_count(days_left=30, peak_mb=3000, available_mb=4000, cores=8) == 1
    # Never more workers than days left.
    assert worker_count(days_left=3, peak_mb=10, available_mb=4000, cores=8) == 3


def test_available_memory_is_a_positive_finite_figure():
    assert 0 < available_memory_mb() < float("inf")


MIB = 1024**2
UNLIMITED_V1 = "9223372036854771712"


@pytest.mark.parametrize(
    ("proc_cgroup", "files", "memory_mb", "cpus"),
    [
        (
            "0::/\n",
            {"memory.max": 1024 * MIB, "memory.current": 256 * MIB, "cpu.max": "150000 100000"},
            768,
            1.5,
        ),
        (
            "0::/\n",
            {"memory.max": "max", "memory.current": 256 * MIB, "cpu.max": "max 100000"},
            None,
            None,
        ),
        (
            # A v1 container without a cgroup namespace: its host's path, its own group mounted.
            "4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n",
            {
                "memory/memory.limit_in_bytes": 2048 * MIB,
                "memory/memory.usage_in_bytes": 512 * MIB,
                "cpu/cpu.cfs_quota_us": 200000,
                "cpu/cpu.cfs_period_us": 100000,
            },
            1536,
            2.0,
        ),
        (
            # v1, the limit on a parent group: the tightest level counts.
            "4:memory:/jobs/step\n1:cpu,cpuacct:/jobs/step\n",
            {
                "memory/jobs/step/memory.limit_in_bytes": UNLIMITED_V1,
                "memory/jobs/step/memory.usage_in_bytes": 100 * MIB,
                "memory/jobs/memory.limit_in_bytes": 1024 * MIB,
                "memory/jobs/memory.usage_in_bytes": 900 * MIB,
                "memory/memory.limit_in_bytes": UNLIMITED_V1,
                "memory/memory.usage_in_bytes": 4096 * MIB,
                "cpu/jobs/step/cpu.cfs_quota_us": -1,
                "cpu/jobs/step/cpu.cfs_period_us": 100000,
                "cpu/cpu.cfs_quota_us": -1,
                "cpu/cpu.cfs_period_us": 100000,
            },
            124,
            None,
        ),
    ],
    ids=["v2 limits", "v2 no limit", "v1 container", "v1 parent's limit"],
)
def test_a_cgroups_memory_limit_and_cpu_quota_size_the_trainings(
    tmp_path, monkeypatch, proc_cgroup, files, memory_mb, cpus
):
    root = tmp_path / "cgroup"
    for name, value in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"{value}\n")
    (tmp_path / "proc_cgroup").write_text(proc_cgroup)
    monkeypatch.setattr(processes, "CGROUP", root)
    monkeypatch.setattr(processes, "PROC_CGROUP", tmp_path / "proc_cgroup")

    assert processes.cgroup_available_mb() == (memory_mb or float("inf"))
    assert processes.cgroup_cpus() == (cpus or float("inf"))
    if memory_mb is not None:
        assert available_memory_mb() <= memory_mb
    cores = len(os.sched_getaffinity(0))
    assert processes.usable_cores() == (min(cores, int(cpus)) if cpus else cores)


@dataclasses.dataclass(frozen=True)
class OwnModel:
    """What the trainer reads of a model trained in the step's own process: its window's rows."""

    train_rows: int = 8
    holdout_rows: int = 2


def own_training() -> tuple[OwnModel, StepTelemetry]:
    """A day trained in the step's own process, instantly: what the trainer sizes workers from."""
    with StepTelemetry() as telemetry:
        pass
    return OwnModel(), telemetry


class EndsItsProcess:
    """A window that ends the worker process unpickling it at once, as the OOM killer does."""

    def __reduce__(self):
        return (os._exit, (137,))

    def __len__(self) -> int:
        return 1  # a row, for the trainer's estimate of its training's seconds


@pytest.mark.parametrize("asked", ["every day", "after two verdicts"])
def test_a_killed_training_worker_leaves_the_days_to_the_steps_process(monkeypatch, asked):
    monkeypatch.setattr(processes, "MIN_PARALLEL_SECONDS", 0.0)
    monkeypatch.setattr(processes, "usable_cores", lambda: 2)
    days = days_from("2024-01-01", 5)
    logs: list[str] = []

    windows = {day: {"x1": EndsItsProcess()} for day in days}
    with RangeTrainer(load_contract("synthetic"), days, windows.get, logs.append) as trainer:
        # The first day sizes the workers; they are handed the next two days and die on them.
        assert not trainer.train(days[0], own_training).in_worker
        assert trainer.workers == 2
        concurrent.futures.wait(trainer.pending.values(), timeout=120)
        # Either the step asks for a day a worker had, or, the next two days being verdicts
        # (never trained), for a later one it trains itself while the pool is broken.
        wanted = days[1:] if asked == "every day" else days[3:]
        trained = [trainer.train(day, own_training) for day in wanted]

    assert [t.in_worker for t in trained] == [False] * len(wanted)
    assert {t.model for t in trained} == {OwnModel()}
    [said] = [line for line in logs if "worker process died" in line]
    assert "train in the step's own process" in said


def test_a_later_days_unreadable_window_is_not_an_earlier_days_failure(monkeypatch):
    monkeypatch.setattr(processes, "MIN_PARALLEL_SECONDS", 0.0)
    monkeypatch.setattr(processes, "usable_cores", lambda: 2)
    days = days_from("2024-01-01", 4)
    logs: list[str] = []

    def window(day: str):
        # Read ahead for a worker while the first day trains: a damaged file of the third day.
        if day == days[2]:
            raise OSError(f"features partition {day} cannot be read")
        return None

    with RangeTrainer(load_contract("synthetic"), days, window, logs.append) as trainer:
        # The first day's training sizes the workers and reads the next days ahead.
        assert trainer.train(days[0], own_training).model == OwnModel()
        assert trainer.workers == 2
        assert trainer.train(days[1], own_training).model == OwnModel()

    [said] = [line for line in logs if "was not read ahead" in line]
    assert said.startswith(f"{days[2]} trains in the step's own process")
    assert f"features partition {days[2]} cannot be read" in said


def test_a_window_whose_training_would_outlast_the_checkpoint_interval_trains_in_the_step(
    monkeypatch,
):
    # A range from the dataset's start: its first day trains on a one-day window, later days
    # on ten times the rows. 10 rows took 1 s: 100 rows would take 10, past checkpoint_seconds
    # (5 s by default), so that day keeps its checkpoints in the step's own process.
    monkeypatch.setattr(processes, "MIN_PARALLEL_SECONDS", 0.0)
    monkeypatch.setattr(processes, "usable_cores", lambda: 2)
    days = days_from("2024-01-01", 4)
    rows = {days[1]: 100, days[2]: 30, days[3]: 100}
    logs: list[str] = []

    def first_day() -> tuple[OwnModel, StepTelemetry]:
        model, telemetry = own_training()
        telemetry.wall_seconds = 1.0
        return model, telemetry

    def window(day: str):
        return {day: pd.DataFrame({"x1": np.zeros(rows[day])})}

    with RangeTrainer(load_contract("synthetic"), days, window, logs.append) as trainer:
        trainer.train(days[0], first_day)
        assert trainer.workers == 2
        assert list(trainer.pending) == [days[2]]

    said = [line for line in logs if "with checkpoints" in line]
    assert [line.split()[0] for line in said] == [days[1], days[3]]
    assert "its window's 100 rows would train for about 10 s" in said[0]
    assert "training.checkpoint_seconds (5 s)" in said[0]


class HoldsItsWorker:
    """A window whose unpickling keeps the worker busy for half a minute: a stuck training."""

    def __reduce__(self):
        return (time.sleep, (30,))

    def __len__(self) -> int:
        return 1


def test_a_step_leaving_on_an_error_does_not_wait_for_a_stuck_worker(monkeypatch):
    monkeypatch.setattr(processes, "MIN_PARALLEL_SECONDS", 0.0)
    monkeypatch.setattr(processes, "usable_cores", lambda: 2)
    days = days_from("2024-01-01", 4)

    windows = {day: {"x1": HoldsItsWorker()} for day in days}
    started = time.monotonic()
    # The run terminated (an interrupt) or a later day failed: the step leaves.
    trainer = RangeTrainer(load_contract("synthetic"), days, windows.get, print)
    with pytest.raises(KeyboardInterrupt), trainer:
        trainer.train(days[0], own_training)
        assert trainer.workers == 2
        raise KeyboardInterrupt
    # Not after the workers' trainings, which nobody will read (they end by themselves).
    assert time.monotonic() - started < 20


def test_a_training_worker_ends_when_the_steps_process_is_gone(tmp_path):
    # A step's process that spawned a worker pool is killed (the OOM killer's largest process).
    script = tmp_path / "step.py"
    script.write_text(
        "import concurrent.futures, multiprocessing, os, sys, time\n"
        "from ml_platform.training.processes import _die_with_parent\n"
        "if __name__ == '__main__':\n"
        "    pool = concurrent.futures.ProcessPoolExecutor(\n"
        "        1, mp_context=multiprocessing.get_context('spawn'), initializer=_die_with_parent\n"
        "    )\n"
        "    print(pool.submit(os.getpid).result(), flush=True)\n"
        "    os.kill(os.getpid(), 9)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == -9, done.stderr
    worker = int(done.stdout.split()[0])

    deadline = time.monotonic() + 30
    while pid_alive(worker):
        assert time.monotonic() < deadline, f"worker {worker} outlived its step's process"
        time.sleep(0.1)


def pid_alive(pid: int) -> bool:
    """Whether a process runs under this pid (not a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_models_trained_in_workers_are_those_of_the_steps_process(tmp_path, monkeypatch):
    contract = contract_with(tmp_path, "synthetic")
    runs = {name: Platform(contract, tmp_path / name) for name in ("alone", "workers")}
    for platform in runs.values():
        platform.land(DAYS[0], len(DAYS))
        platform.land(REJECTED, 1, fault="null_burst")
        assert materialize_range(platform, DAYS[0], DAYS[-1], UPSTREAM).success
    assert materialize_range(runs["alone"], DAYS[0], DAYS[-1], ["model"]).success
    # Whatever this machine: its cores and a training's seconds would decide otherwise.
    monkeypatch.setattr(processes, "MIN_PARALLEL_SECONDS", 0.0)
    monkeypatch.setattr(processes, "usable_cores", lambda: 2)
    result = materialize_range(runs["workers"], DAYS[0], DAYS[-1], ["model"])

    assert result.success
    where = {
        m.partition: m.metadata["trained_in"].text
        for m in result.asset_materializations_for_node(runs["workers"].node("model"))
        if "trained_in" in m.metadata
    }
    # The first day sizes the workers; the rejected day is a verdict, trained nowhere.
    assert where == {
        day: "the step's process" if day == DAYS[0] else "a worker process"
        for day in DAYS
        if day != REJECTED
    }
    logs = [r.user_message for r in runs["workers"].instance.all_logs(result.run_id)]
    assert any(f"the 6 days after {DAYS[0]} train in up to 2 worker" in m for m in logs), logs
    for day in DAYS:
        if day == REJECTED:
            assert not runs["workers"].stored("model", day, "joblib").exists()
            continue
        models = [joblib.load(p.stored("model", day, "joblib")) for p in runs.values()]
        for model in models:
            assert model.window == [d for d in DAYS if d <= day and d != REJECTED]
        np.testing.assert_array_equal(
            models[0].pipeline.named_steps["estimator"].coef_,
            models[1].pipeline.named_steps["estimator"].coef_,
        )
        assert models[0].history == models[1].history
