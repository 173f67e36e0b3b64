"""`ml-platform replay` through a real webserver and daemon, beside 30 live days of real flights.

The live chain's 30 days are materialised first (one run of the range, as a backfill runs it) on
the instance the webserver and daemon then serve, with a week's training window. The replay
runs the bundled contract's four weeks over the same days: the command keeps it, has the
webserver load it, runs its days as one backfill through the daemon and materialises its
comparison. Afterwards the live lake, MLflow registry (versions and aliases) and every record and
check evaluation of the live assets are what they were, the comparison holds both chains'
decisions and next-day ROC AUC for every day, the longer window served better on average, and
`ml-platform replay promote` changes the contract file and nothing else.
"""

import contextlib
import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.definitions import build_definitions
from ml_platform.ingestion.landing import LandingZone, land_days
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.rejected import DAY_ASSETS
from ml_platform.replay.assets import REPLAY_COMPARISON
from ml_platform_tests.conftest import REPO, days_from, free_port, lake_registry
from ml_platform_tests.services import DagsterProcesses

pytestmark = pytest.mark.integration
DAYS = days_from("2013-01-01", 30)
REPLAY = "month"
# The live chain trains on a week; the replay on the bundled contract's four weeks.
BUNDLED_WINDOW, LIVE_WINDOW = "  window_days: 28\n", "  window_days: 7\n"
ENV_KEPT_OUT = (
    "ML_PLATFORM_LANDING_URL",
    "ML_PLATFORM_LAKE_URL",
    "ML_PLATFORM_DATASET",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_REGISTRY_URI",
)


class ReplayStack(DagsterProcesses):
    """Webserver and daemon over a fresh instance of the repository's dagster.yaml."""

    def __init__(self, root: Path):
        home = root / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
        self.home, self.landing, self.lake = home, root / "landing", root / "lake"
        self.contracts, self.replays = root / "contracts", root / "replays"
        self.contracts.mkdir()
        self.port = free_port()
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ENV_KEPT_OUT},
            "DAGSTER_HOME": str(home),
            "ML_PLATFORM_CONTRACTS": str(self.contracts),
            "ML_PLATFORM_REPLAYS_DIR": str(self.replays),
            "ML_PLATFORM_LANDING_DIR": str(self.landing),
            "ML_PLATFORM_LAKE_DIR": str(self.lake),
            "ML_PLATFORM_DAGSTER_URL": f"http://127.0.0.1:{self.port}",
        }
        self.cwd, self.logs, self.procs = REPO, root, []

    def command(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "ml_platform.cli", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=1500,
        )


@contextlib.contextmanager
def instance_of(stack: ReplayStack) -> Iterator[dg.DagsterInstance]:
    """The stack's instance in this process (its dagster.yaml logs under DAGSTER_HOME)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DAGSTER_HOME", str(stack.home))
        with dg.DagsterInstance.get() as instance:
            yield instance


def files(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def live_state(stack: ReplayStack) -> dict:
    """What the live dataset owns: its lake files, registry, records and check evaluations."""
    registry = lake_registry(stack.lake, "flights")
    defs = build_definitions(
        load_contract(stack.contracts / "flights.yaml"),
        landing_dir=str(stack.landing),
        lake_dir=str(stack.lake),
    )
    graph = defs.resolve_asset_graph()
    with instance_of(stack) as instance:
        materializations = {
            key.to_user_string(): [
                r.storage_id for r in instance.fetch_materializations(key, limit=10_000).records
            ]
            for key in graph.get_all_asset_keys()
        }
        checks = {
            key.to_user_string(): [
                r.id
                for r in instance.event_log_storage.get_asset_check_execution_history(
                    key, limit=10_000
                )
            ]
            for key in graph.asset_check_keys
        }
    return {
        "lake": files(stack.lake / "flights"),
        "versions": registry.versions(),
        "aliases": registry.aliases(),
        "materializations": materializations,
        "checks": checks,
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay_daemon")
    stack = ReplayStack(root)
    text = bundled_contracts()["flights"].read_text()
    assert BUNDLED_WINDOW in text
    (stack.contracts / "flights.yaml").write_text(text.replace(BUNDLED_WINDOW, LIVE_WINDOW))
    (root / "flights_month.yaml").write_text(text)
    live = load_contract(stack.contracts / "flights.yaml")
    zone = LandingZone(base_dir=str(stack.landing))
    list(land_days(live, zone, [dt.date.fromisoformat(d) for d in DAYS]))
    # The live chain's days, one run of the range, on the instance the services will serve.
    defs = build_definitions(live, landing_dir=str(stack.landing), lake_dir=str(stack.lake))
    with instance_of(stack) as instance:
        result = dg.materialize(
            [*(defs.assets or []), *(defs.asset_checks or [])],
            resources=defs.resources,
            instance=instance,
            selection=[asset_key("flights", name) for name in DAY_ASSETS],
            tags={
                "dagster/asset_partition_range_start": DAYS[0],
                "dagster/asset_partition_range_end": DAYS[-1],
            },
            raise_on_error=False,
        )
    assert result.success
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def test_a_replay_through_the_daemon_leaves_the_live_chain_as_it_was(stack):
    before = live_state(stack)
    assert before["aliases"]["champion"], "the live chain serves a champion"
    assert all(before["materializations"][f"flights/{name}"] for name in DAY_ASSETS)
    assert sum(map(len, before["checks"].values())) >= len(DAYS) * len(DAY_ASSETS)
    done = stack.command(
        "replay",
        str(stack.logs / "flights_month.yaml"),
        *("--start", DAYS[0], "--days", str(len(DAYS)), "--name", REPLAY, "--wait", "180"),
    )
    assert done.returncode == 0, done.stdout + done.stderr + stack.output()
    # The command prints the summary and where the whole comparison is.
    assert "flights__replay_month against flights" in done.stdout
    assert "| promotions |" in done.stdout and "mean next-day roc_auc" in done.stdout
    assert "the whole comparison: " in done.stdout
    # It went through the daemon: a backfill whose runs the instance recorded.
    with instance_of(stack) as instance:
        backfills = instance.get_backfills()
        assert len(backfills) == 1 and backfills[0].status.value.startswith("COMPLETED")
        runs = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfills[0].backfill_id}))
        assert runs and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        event = instance.get_latest_materialization_event(
            asset_key("flights__replay_month", REPLAY_COMPARISON)
        )
    assert event is not None and event.asset_materialization is not None
    stored = json.loads(Path(str(event.asset_materialization.metadata["path"].value)).read_text())

    assert live_state(stack) == before
    live_days, replay_days = stored["days"]["live"], stored["days"]["replay"]
    assert [d["day"] for d in live_days] == DAYS == [d["day"] for d in replay_days]
    for chain in (live_days, replay_days):
        # Every day judged; each day a champion served, it was scored on the day's rows.
        assert all(d["decision"] for d in chain), chain
        served = [
            today
            for yesterday, today in zip(chain, chain[1:], strict=False)
            if yesterday["champion"]
        ]
        assert len(served) >= 20 and all(d["metric"] is not None for d in served), chain
    summary = stored["summary"]
    assert summary["live"]["promotions"] >= 1 and summary["replay"]["promotions"] >= 1
    # Four weeks of data served better than one.
    assert summary["replay"]["mean_metric"] > summary["live"]["mean_metric"]
    assert lake_registry(stack.lake, "flights__replay_month").aliases()["champion"]

    # Promoting it changes the contract file, and nothing the live chain holds.
    promoted = stack.command("replay", "promote", REPLAY)
    assert promoted.returncode == 0, promoted.stderr
    assert (stack.contracts / "flights.yaml").read_bytes() == (
        stack.logs / "flights_month.yaml"
    ).read_bytes()
    assert live_state(stack) == before
