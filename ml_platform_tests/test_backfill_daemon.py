"""Backfills through a real webserver and daemon: chunks of N days, the registry in one run or two.

A range of two chunks runs raw_data to evaluation_report in runs of at most N days, the
evaluation chunk after chunk, then registered_model over the range: in one run, or in two when
the second evaluation outlasts a daemon loop (the first chunk is then registered beside it). It
ends with the verdicts (decision and champion per day, the registry's alias moves) that
materialising the same days one by one reaches. In a second backfill, running beside the first
on the same daemon, a malformed file in the second chunk fails that chunk only: the first
chunk's days are stored and recorded, the failed chunk's days are neither published nor
recorded.
"""

import datetime as dt
import json
import os
import subprocess
from pathlib import Path

import dagster as dg
import pytest

from ml_platform.contracts import load_contract
from ml_platform.ingestion.landing import LandingZone, land_days
from ml_platform.platform.settings import BACKFILL_DAYS_PER_RUN_ENV
from ml_platform_tests.conftest import ALL_ASSETS, REPO, Platform, days_from, free_port
from ml_platform_tests.services import BACKFILL_QUERY, LAUNCH_BACKFILL, DagsterProcesses

pytestmark = pytest.mark.integration
SYNTHETIC = load_contract("synthetic")
DAYS_PER_RUN = 3
DAYS = days_from("2024-01-01", 6)
# The second backfill's days: their model windows do not reach the first backfill's days.
FAILING = days_from("2024-03-01", 6)
BAD_DAY = FAILING[4]
# The daily graph up to the registry (champion_performance would add a daemon loop).
TARGET = [*ALL_ASSETS, "registered_model"]
# The second backfill stops before the registry, which the first one's verdicts depend on.
INGESTION = TARGET[:3]
RUNS = """
query Runs($filter: RunsFilter) {
  runsOrError(filter: $filter) {
    ... on Runs { results { runId status startTime assetSelection { path } tags { key value } } }
  }
}
"""
FINISHED = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


class BackfillStack(DagsterProcesses):
    """Webserver and daemon over a fresh instance (the repository's dagster.yaml), local files."""

    def __init__(self, tmp_path: Path):
        home = tmp_path / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
        self.landing = tmp_path / "landing"
        self.lake = tmp_path / "lake"
        self.port = free_port()
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "ML_PLATFORM_DATASET": "synthetic",
            "ML_PLATFORM_LANDING_DIR": str(self.landing),
            "ML_PLATFORM_LAKE_DIR": str(self.lake),
            BACKFILL_DAYS_PER_RUN_ENV: str(DAYS_PER_RUN),
        }
        for variable in (
            "ML_PLATFORM_LANDING_URL",
            "ML_PLATFORM_LAKE_URL",
            "ML_PLATFORM_CONTRACTS",
        ):
            self.env.pop(variable, None)
        self.cwd = REPO
        self.logs = tmp_path
        self.procs: list[subprocess.Popen] = []

    def backfill(self, days: list[str], assets: list[str]) -> str:
        """Launch a backfill of `assets` over days, as the UI's "Materialize" of a range does."""
        launched = self.graphql(
            LAUNCH_BACKFILL,
            {
                "params": {
                    "partitionsByAssets": [
                        {
                            "assetKey": {"path": ["synthetic", name]},
                            "partitions": {"range": {"start": days[0], "end": days[-1]}},
                        }
                        for name in assets
                    ]
                }
            },
        )["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        return str(launched["backfillId"])

    def status(self, backfill_id: str) -> str | None:
        status = self.graphql(BACKFILL_QUERY, {"id": backfill_id})["partitionBackfillOrError"][
            "status"
        ]
        return status if status in FINISHED else None

    def runs(self, backfill_id: str) -> list[dict]:
        tag = {"key": "dagster/backfill", "value": backfill_id}
        results = self.graphql(RUNS, {"filter": {"tags": [tag]}})["runsOrError"]["results"]
        return [
            {
                **r,
                "tags": {t["key"]: t["value"] for t in r["tags"]},
                "assets": tuple(sorted(a["path"][-1] for a in r["assetSelection"])),
            }
            for r in results
        ]


def run_days(run: dict) -> list[str]:
    """The days a run of a backfill holds, from its partition tags."""
    tags = run["tags"]
    if "dagster/partition" in tags:
        return [tags["dagster/partition"]]
    first = tags["dagster/asset_partition_range_start"]
    last = tags["dagster/asset_partition_range_end"]
    return [d for d in days_from(first, 366) if d <= last]


def verdicts(lake: Path, days: list[str]) -> dict[str, tuple]:
    """Each day's decision and the champion it competed with and left, from its report."""
    found = {}
    for day in days:
        report = json.loads((lake / "synthetic" / "evaluation_report" / f"{day}.json").read_text())
        found[day] = (report["decision"], report["champion_version"], report["champion_after"])
    return found


def alias_moves(lake: Path) -> list[tuple]:
    history = json.loads((lake / "synthetic" / "registry" / "alias_history.json").read_text())
    return [(move["alias"], move["version"], move["previous"]) for move in history]


def recorded(instance: dg.DagsterInstance, asset: str) -> set[str]:
    return set(instance.get_materialized_partitions(dg.AssetKey(["synthetic", asset])))


@pytest.fixture
def stack(tmp_path):
    stack = BackfillStack(tmp_path)
    zone = LandingZone(base_dir=str(stack.landing))
    list(land_days(SYNTHETIC, zone, [dt.date.fromisoformat(d) for d in [*DAYS, *FAILING]]))
    list(land_days(SYNTHETIC, zone, [dt.date.fromisoformat(BAD_DAY)], fault="wrong_delimiter"))
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def test_runs_of_n_days_reach_the_one_by_one_verdicts_and_a_failed_chunk_spoils_only_itself(
    stack, tmp_path, monkeypatch
):
    stack.wait_for(lambda: stack.graphql("{ version }"), 180, "the webserver")
    good = stack.backfill(DAYS, TARGET)
    failing = stack.backfill(FAILING, INGESTION)

    # Meanwhile, the same days one by one in this process, on a lake and instance of their own.
    by_day = Platform(SYNTHETIC, tmp_path / "by_day")
    by_day.land(DAYS[0], len(DAYS))
    for day in DAYS:
        assert by_day.materialize(day, selection=TARGET).success, day

    statuses = {
        name: stack.wait_for(lambda i=backfill_id: stack.status(i), 600, f"the {name} backfill")
        for name, backfill_id in {"good": good, "failing": failing}.items()
    }
    assert statuses == {"good": "COMPLETED_SUCCESS", "failing": "COMPLETED_FAILED"}

    # raw_data to evaluation_report ran in runs of at most N days, each chunk on its own and
    # raw_data to features together; the registry took the range in one run, or in two in day
    # order when it registered the first chunk while the second was being evaluated.
    runs = {name: stack.runs(i) for name, i in {"good": good, "failing": failing}.items()}
    registry = sorted(
        (r for r in runs["good"] if r["assets"] == ("registered_model",)),
        key=lambda r: r["startTime"],
    )
    for run in [*runs["good"], *runs["failing"]]:
        if run not in registry:
            assert len(run_days(run)) <= DAYS_PER_RUN, run["tags"]
    upstream = tuple(sorted(TARGET[:3]))
    chunks = [tuple(DAYS[:3]), tuple(DAYS[3:])]
    chunked = sorted((r["assets"], tuple(run_days(r))) for r in runs["good"] if r not in registry)
    assert chunked == sorted(
        (assets, chunk)
        for assets in (upstream, ("model",), ("evaluation_report",))
        for chunk in chunks
    )
    assert len(registry) in (1, 2), [run_days(r) for r in registry]
    assert [day for run in registry for day in run_days(run)] == DAYS
    assert all(r["status"] == "SUCCESS" for r in runs["good"])

    # The verdicts of the one-by-one run: decisions, champions, and the registry's history.
    assert verdicts(stack.lake, DAYS) == verdicts(by_day.lake_dir, DAYS)
    assert alias_moves(stack.lake) == alias_moves(by_day.lake_dir)

    # The failed chunk spoiled only itself: the first chunk's days are stored and recorded.
    monkeypatch.setenv("DAGSTER_HOME", stack.env["DAGSTER_HOME"])
    with dg.DagsterInstance.get() as instance:
        for asset in INGESTION:
            assert recorded(instance, asset) >= set(FAILING[:3]), asset
            assert recorded(instance, asset).isdisjoint(FAILING[3:]), asset
    lake = stack.lake / "synthetic"
    for day in FAILING[:3]:
        for asset in INGESTION:
            assert (lake / asset / f"{day}.parquet").is_file(), (asset, day)
    # None of the failed chunk's days was published, its good days included.
    for day in FAILING[3:]:
        for asset in ("raw_data", "validated_data", "features"):
            assert not (lake / asset / f"{day}.parquet").exists(), (asset, day)
    [failed_run] = [r for r in runs["failing"] if r["status"] == "FAILURE"]
    assert run_days(failed_run) == FAILING[3:]
