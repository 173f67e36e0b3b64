"""Each step on a worker of the pool its size asks for, on a real distributed engine.

A Redis server (Debian's package) is the broker; dagster-celery workers listen in two pools, a
queue each: `small` and `large` (ML_PLATFORM_WORKER_POOLS declares 1 GiB and 3 GiB workers),
each worker in a memory cgroup of its pool's size, as a container of that size would hold it.
The daily job of three real flights days runs with ML_PLATFORM_EXECUTOR=celery as `dg launch`
runs it, over a persistent instance: each step is a Celery task on a worker, which records in
the day's metadata where it ran (`step_worker`). Training asks for 2 GiB (the contract's
resources), so it goes to the large pool; the rest ask for 1 GiB and stay on the small one.
The same days through the default executor, in process, decide the same.

A worker whose container (a memory cgroup) holds less than a step needs is ended by the
kernel, as ECS or Kubernetes end one: the step is not retried, and the run is diagnosed as
resource exhaustion with the step's request and its last recorded peak.
"""

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from ml_platform.contracts import load_contract
from ml_platform.platform.records import day_records
from ml_platform.platform.settings import Settings
from ml_platform_tests.conftest import REPO, Platform, days_from
from ml_platform_tests.services import CeleryWorkers, memory_cgroup, redis_server
from ml_platform_tests.test_registry_chain_flights import registrations

pytestmark = pytest.mark.integration

FLIGHTS = load_contract("flights")
DAYS = days_from("2013-01-01", 3)
POOLS = "small=1024,large=3072"
BIN = Path(sys.executable).parent
SMALL_STAGES = ["raw_data", "validated_data", "features"]


class Engine:
    """The broker, the workers and the instance the distributed runs use."""

    def __init__(self, root: Path, broker: str):
        self.root = root
        self.platform = Platform(FLIGHTS, root)
        home = root / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
        self.platform.instance = dg.DagsterInstance.from_config(str(home))
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "ML_PLATFORM_LANDING_DIR": str(self.platform.landing_dir),
            "ML_PLATFORM_LAKE_DIR": str(self.platform.lake_dir),
            "ML_PLATFORM_DATASET": FLIGHTS.name,
            "ML_PLATFORM_EXECUTOR": "celery",
            "ML_PLATFORM_CELERY_BROKER": broker,
            "ML_PLATFORM_WORKER_POOLS": POOLS,
        }
        self.workers = CeleryWorkers(root, broker, self.env)

    def launch(self, *target: str, pools: str = POOLS) -> subprocess.CompletedProcess:
        """`dg launch TARGET` from the project, on the engine: the run executes as it returns."""
        return subprocess.run(
            [str(BIN / "dg"), "launch", *target],
            cwd=REPO,
            env={**self.env, "ML_PLATFORM_WORKER_POOLS": pools, "VIRTUAL_ENV": str(BIN.parent)},
            capture_output=True,
            text=True,
            timeout=600,
        )

    def recorded(self, stage: str, day: str, key: str) -> object:
        """A metadata value of the day's latest materialisation of `stage`."""
        records = self.platform.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=self.platform.key(stage), asset_partitions=[day]),
            limit=1,
        ).records
        assert records, f"{stage} {day} was not materialised"
        materialization = records[0].asset_materialization
        assert materialization is not None
        return materialization.metadata[key].value

    def worker_of(self, stage: str, day: str) -> str:
        """Where the step computed the day: `pool/host:pid`, as the step recorded it."""
        return str(self.recorded(stage, day, "step_worker"))


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[Engine]:
    """Redis, a worker of each pool in a container of its pool's memory, and the three days."""
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(redis_server())
        engine = Engine(tmp_path_factory.mktemp("celery"), broker)
        pools = Settings({"ML_PLATFORM_WORKER_POOLS": POOLS}).worker_pools
        cgroups = {
            pool: stack.enter_context(memory_cgroup(f"ml-platform-{pool}-{os.getpid()}", memory))
            for pool, memory in pools.items()
        }
        # Before the groups are removed, which waits for their processes to end.
        stack.callback(engine.workers.stop)
        for pool, cgroup in cgroups.items():
            engine.workers.start(pool, cgroup=cgroup)
        engine.platform.land(DAYS[0], len(DAYS) + 1)
        for day in DAYS:
            ran = engine.launch("--job", "flights_daily_pipeline_job", "--partition", day)
            assert ran.returncode == 0, f"{day}\n{ran.stderr[-6000:]}"
        yield engine


def test_each_step_runs_on_the_pool_its_size_asks_for_and_decides_as_in_process(engine, tmp_path):
    for day in DAYS:
        model = engine.worker_of("model", day)
        assert model.startswith("large/"), (day, model)
        for stage in SMALL_STAGES:
            worker = engine.worker_of(stage, day)
            assert worker.startswith("small/"), (stage, day, worker)
        # Not the process that launched the run: a worker's.
        assert model.split(":")[-1] != engine.worker_of("raw_data", day).split(":")[-1]

    default = Platform(FLIGHTS, tmp_path / "in_process")
    default.land(DAYS[0], len(DAYS))
    for day in DAYS:
        assert default.materialize(day).success, day

    def gate(platform: Platform) -> dict:
        records = day_records(platform.instance, platform.key("validated_data"), DAYS)
        return {
            day: (r.verdict, r.accepted, r.reason, r.accepted_rows) for day, r in records.items()
        }

    assert gate(engine.platform) == gate(default)
    distributed = registrations(engine.platform, DAYS)
    assert distributed == registrations(default, DAYS)
    assert all(distributed[day] for day in DAYS)


def test_a_worker_killed_for_memory_fails_its_step_once_and_diagnose_names_its_sizes(engine):
    """A pool declared 1 GiB whose worker's container holds 256 MiB: the kernel ends it."""
    day = days_from(DAYS[-1], 2)[-1]
    with memory_cgroup(f"ml-platform-test-{os.getpid()}", 256) as cgroup:
        engine.workers.start("tight", cgroup=cgroup)
        try:
            ran = engine.launch(
                "--assets", "flights/raw_data", "--partition", day, pools="tight=1024,large=3072"
            )
        finally:
            engine.workers.stop("tight")
    assert ran.returncode != 0
    instance = engine.platform.instance
    run = instance.get_runs(limit=1)[0]
    assert run.status == dg.DagsterRunStatus.FAILURE
    events = [r.event_log_entry for r in instance.get_records_for_run(run.run_id).records]
    sent = [e for e in events if "Submitting celery task" in (e.message or "")]
    assert [e.step_key for e in sent] == ["flights__raw_data"]  # sent once: not retried
    retried = dg.DagsterEventType.STEP_UP_FOR_RETRY
    assert not [e for e in events if e.dagster_event and e.dagster_event.event_type == retried]

    diagnosis = subprocess.run(
        [str(BIN / "ml-platform"), "diagnose", run.run_id],
        env=engine.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert diagnosis.returncode == 0, diagnosis.stderr
    said = diagnosis.stdout
    peak = engine.recorded("raw_data", DAYS[-1], "step_peak_rss_mb")
    assert "did not finish: flights__raw_data" in said, said
    assert "failure class: resource_exhaustion" in said, said
    assert "signal 9" in said, said
    assert "flights__raw_data: requests 1024 MiB" in said, said
    assert f"last recorded peak: {peak:.0f} MiB on {DAYS[-1]}" in said, said
    assert "ml-platform resources --dataset flights" in said, said
    assert "runbook: docs/runbook.md#resource-exhaustion" in said, said
