"""Shared fixtures: temporary landing zone and lake, contracts, and running days of the graph."""

import contextlib
import datetime as dt
import errno
import functools
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.definitions import build_definitions
from ml_platform.ingestion.landing import LandingZone, land_days
from ml_platform.platform.datasets import asset_key, op_name
from ml_platform.platform.formats import from_json_text
from ml_platform.platform.records import day_records
from ml_platform.platform.storage import LocalStorage
from ml_platform.platform.tracking import MLFLOW_PREFIX, MlflowStores
from ml_platform.registry.store import ModelRegistry

REPO = Path(__file__).resolve().parent.parent
ALL_ASSETS = [
    "raw_data",
    "validated_data",
    "features",
    "drift_report",
    "model",
    "evaluation_report",
]
# What the daily job materialises: the assets of a day's data and candidate, the registry entry
# and the serving champion's performance.
DAILY_ASSETS = [*ALL_ASSETS, "registered_model", "champion_performance"]


def days_from(start: str, count: int) -> list[str]:
    first = dt.date.fromisoformat(start)
    return [(first + dt.timedelta(days=i)).isoformat() for i in range(count)]


def rejected_days(contract: Contract, lake_dir: Path, days: list[str]) -> list[str]:
    """The days whose stored evaluation report rejected the model, each decision checked first.

    A small day's model can land either side of a value threshold (the first flights day, 167
    held-out rows, does), so tests that run whole days check what a verdict must follow from
    instead of which verdict it is: a report rejects exactly when a recorded metric misses its
    contract bound (mae and rmse are maximums, the others minimums) or the lower bound of the
    recorded lift over the trivial baseline on its primary metric is not above 0.
    """
    rejected = []
    for day in days:
        # The day's latest version (a test without the instance at hand: the CLI's).
        path = max(
            day_files(lake_dir, contract.name, "evaluation_report", day),
            key=lambda p: p.stat().st_mtime_ns,
        )
        # As the platform reads it: a metric the day could not define is NaN again.
        report = from_json_text(path.read_text())
        metrics = report["metrics"]
        misses = [
            metric
            for metric, bound in contract.evaluation.value_thresholds.items()
            if not (
                metrics[metric] <= bound if metric in {"mae", "rmse"} else metrics[metric] >= bound
            )
        ]
        baseline = report["baseline"]
        if not baseline["lifts"][baseline["primary_metric"]]["low"] > 0:
            misses.append("trivial baseline")
        assert (report["decision"] == "reject") == bool(misses), (day, report["decision"], misses)
        if misses:
            rejected.append(day)
    return rejected


def contract_with(tmp_path: Path, name: str, **training) -> Contract:
    """A bundled contract with training settings overridden, written to tmp_path."""
    document = yaml.safe_load(bundled_contracts()[name].read_text())
    document["training"].update(training)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_contract(path)


def day_files(lake_dir: Path, dataset: str, asset: str, day: str) -> list[Path]:
    """The stored versions of an asset's day in a local lake, `<asset>/<day>/<version>.<ext>`."""
    folder = lake_dir / dataset / asset / day
    return sorted(p for p in folder.glob("*") if p.is_file() and not p.name.startswith("."))


def lake_registry(lake_dir: Path | str, dataset: str) -> ModelRegistry:
    """A dataset's registry in the embedded MLflow of the lake in `lake_dir`."""
    return ModelRegistry(MlflowStores(lake=LocalStorage(base_dir=str(lake_dir))), dataset)


@functools.cache
def empty_mlflow_store() -> Path:
    """An empty embedded MLflow store, made by MLflow once per test process.

    Creating one runs MLflow's database migrations (about a second of CPU); a test's new lake
    starts with a copy of this one instead, as a lake whose store already exists does. The
    store's creation itself is what this does, once per process.
    """
    lake = Path(tempfile.mkdtemp(prefix="mlflow-store-"))
    MlflowStores(lake=LocalStorage(base_dir=str(lake))).client().search_experiments()
    return lake / MLFLOW_PREFIX / "mlflow.db"


class Platform:
    """One dataset's graph over temporary storage, with an ephemeral Dagster instance.

    Its lake starts with an empty MLflow store (`empty_mlflow_store`).
    """

    def __init__(self, contract: Contract, root: Path):
        self.contract = contract
        self.landing_dir = root / "landing"
        self.lake_dir = root / "lake"
        store = self.lake_dir / MLFLOW_PREFIX / "mlflow.db"
        if not store.exists():
            store.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(empty_mlflow_store(), store)
        self.defs = build_definitions(
            contract, landing_dir=str(self.landing_dir), lake_dir=str(self.lake_dir)
        )
        self.instance = dg.DagsterInstance.ephemeral()

    def registry(self) -> ModelRegistry:
        """The dataset's registry in the platform's MLflow (the lake's embedded store)."""
        return lake_registry(self.lake_dir, self.contract.name)

    def land(self, start: str, days: int, **switches) -> None:
        zone = LandingZone(base_dir=str(self.landing_dir))
        dates = [dt.date.fromisoformat(d) for d in days_from(start, days)]
        list(land_days(self.contract, zone, dates, **switches))

    def key(self, asset: str) -> dg.AssetKey:
        """The key of the dataset's asset `asset` (keys are prefixed by the dataset)."""
        return asset_key(self.contract.name, asset)

    def node(self, asset: str) -> str:
        """The op of the dataset's asset `asset`, as `asset_materializations_for_node` wants."""
        return op_name(self.contract.name, asset)

    def materialize(
        self, day: str, selection=None, checks: bool = False
    ) -> dg.ExecuteInProcessResult:
        """Materialise `day` of the assets named in `selection` (default: the daily job's).

        `checks`: with the code location's asset checks defined apart from the assets.
        """
        assets = [*(self.defs.assets or []), *((checks and self.defs.asset_checks) or [])]
        return dg.materialize(
            assets,
            partition_key=day,
            resources=self.defs.resources,
            instance=self.instance,
            selection=[self.key(name) for name in selection or DAILY_ASSETS],
            raise_on_error=False,
        )

    def stored(self, asset: str, day: str, ext: str) -> Path:
        """The file of the day's version Dagster records; a path that does not exist if none."""
        records = day_records(self.instance, self.key(asset), [day])
        record = records.get(day)
        if record is None or not record.accepted:
            return self.lake_dir / self.contract.name / asset / day / "no-accepted-version"
        key = record.lake_key or f"{self.contract.name}/{asset}/{day}.{ext}"
        return self.lake_dir / key

    def put(self, asset: str, day: str, value: Any, fmt: str) -> None:
        """Store and record a day of an asset, as if a run had materialised it."""
        io_manager = self.defs.resources["io_manager"]
        key = io_manager.version_key(self.key(asset), day, fmt, "put-0")
        metadata = io_manager.store_at(key, fmt, value)
        event = dg.AssetMaterialization(self.key(asset), partition=day, metadata=metadata)
        self.instance.report_runless_asset_event(event)

    def materialized(self, asset: str) -> set[str]:
        return set(self.instance.get_materialized_partitions(self.key(asset)))

    def step_failure(self, result: dg.ExecuteInProcessResult, asset: str) -> Any:
        """The one failure of `asset`'s step in `result`, as Dagster recorded it."""
        [failure] = [
            e
            for e in result.all_events
            if e.event_type == dg.DagsterEventType.STEP_FAILURE and e.step_key == self.node(asset)
        ]
        return failure.step_failure_data


@pytest.fixture(autouse=True)
def sigterm_not_ignored() -> None:
    """SIGTERM ends what a test starts, as it does outside the test runner.

    A pytest-xdist worker ignores SIGINT, and each main-thread run of Dagster's (capture
    interrupts) leaves SIGTERM as SIGINT is: ignored from then on in that worker, and in every
    process it starts. Dagster stops the `tail` processes that copy a step's stdout and stderr
    to its compute logs with SIGTERM, then waits up to 30 s for each: a test whose steps log
    under `capsys` waited a minute after any earlier main-thread run in its worker.
    """
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture
def platform_for(tmp_path):
    """Factory: a Platform for a bundled contract name or a Contract."""

    def make(contract: str | Contract) -> Platform:
        loaded = load_contract(contract) if isinstance(contract, str) else contract
        return Platform(loaded, tmp_path / loaded.name)

    return make


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL server for the session; tests take a database each (`.database(name)`)."""
    from ml_platform_tests.services import postgres_server

    with postgres_server() as server:
        yield server


@pytest.fixture
def s3_server():
    """A real S3 API server on 127.0.0.1; yields its endpoint URL."""
    from ml_platform_tests.services import moto_s3

    with moto_s3() as endpoint:
        yield endpoint


PAGE = 4096


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *options: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` for the block."""
    path.mkdir(parents=True, exist_ok=True)
    flags = ",".join([f"size={size}", *options])
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", flags, "tmpfs", str(path)], check=True, timeout=30
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True, timeout=30)


def fill(folder: Path, leave_pages: int) -> Path:
    """Fill the file system of `folder` until the kernel says ENOSPC, then free a few pages."""
    filler = folder / "filler"
    with filler.open("wb") as handle:
        with pytest.raises(OSError) as full:
            while True:
                handle.write(b"\0" * (64 * PAGE))
                handle.flush()
        assert full.value.errno == errno.ENOSPC
        handle.truncate(filler.stat().st_size - leave_pages * PAGE)
    return filler


# The modules that took longest in a fresh clone's `make test` (the integration layer's, then
# the others', longest first). The workers take modules whole, so the order they are handed out
# in decides when a layer ends: a long module handed out last runs on while the other workers
# have nothing left. pytest-xdist's own order (most tests first; the Makefile turns it off)
# hands out the long modules of one or two tests last.
LONGEST_FIRST = (
    "test_command_runs.py",
    "test_replay_daemon.py",
    "test_integration.py",
    "test_production.py",
    "test_backfill_daemon.py",
    "test_distributed.py",
    "test_automation_integration.py",
    "test_quality_gate.py",
    "test_promotion.py",
    "test_degenerate_materialize.py",
    "test_model_lifecycle.py",
    "test_registry_chain_flights.py",
    "test_troubleshooting.py",
    "test_benchmarks_smoke.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest modules first, then the other modules that run days (`slow`), then the rest."""

    def rank(item: pytest.Item) -> int:
        module = item.path.name
        if module in LONGEST_FIRST:
            return LONGEST_FIRST.index(module)
        return len(LONGEST_FIRST) + (item.get_closest_marker("slow") is None)

    items.sort(key=rank)  # stable: a module's tests keep their order
