"""A replay: a changed contract over past days beside the live chain, compared, promoted, removed.

The live days and the replay's run as a backfill runs them (one run of a range) through the
code location's own graph, the replay served as `defs()` serves it. The integration test of
`ml-platform replay` through the webserver and daemon is in test_replay_daemon.py.
"""

import datetime as dt
import hashlib
import json
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ml_platform.automation.alerts import Alert
from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.definitions import build_definitions
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.rejected import DAY_ASSETS
from ml_platform.registry.assets import PROMOTE
from ml_platform.replay.assets import REPLAY_COMPARISON
from ml_platform.replay.lifecycle import promote_replay, remove_replay
from ml_platform.replay.replays import ReplayError, create_replay, load_replays
from ml_platform_tests.conftest import Platform, days_from, lake_registry

pytestmark = pytest.mark.slow

DAYS = days_from("2024-01-01", 4)


def lake_files(folder: Path) -> dict[str, str]:
    """Every file under `folder` with its sha256."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def records(instance: dg.DagsterInstance, dataset: str) -> list[tuple]:
    """Every materialisation and check evaluation of the dataset's day assets, by storage id."""
    found = []
    for name in DAY_ASSETS:
        key = asset_key(dataset, name)
        result = instance.fetch_materializations(key, limit=1000)
        found += [(name, r.storage_id, r.partition_key) for r in result.records]
    return found


def run_range(platform: Platform, defs: dg.Definitions, dataset: str) -> None:
    result = dg.materialize(
        [*(defs.assets or []), *(defs.asset_checks or [])],
        resources=defs.resources,
        instance=platform.instance,
        selection=[asset_key(dataset, name) for name in DAY_ASSETS],
        tags={
            "dagster/asset_partition_range_start": DAYS[0],
            "dagster/asset_partition_range_end": DAYS[-1],
        },
        raise_on_error=False,
    )
    assert result.success, dataset


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """Live synthetic days, then a replay of them with another estimator; tests only read."""
    root = tmp_path_factory.mktemp("replay")
    text = bundled_contracts()["synthetic"].read_text()
    live_file = root / "contracts" / "synthetic.yaml"
    live_file.parent.mkdir()
    live_file.write_text(text)
    changed = root / "synthetic_sgd.yaml"
    changed.write_text(text.replace("  estimator: linear\n", "  estimator: sgd\n  max_epochs: 3\n"))
    live = load_contract(live_file)
    platform = Platform(live, root / "platform")
    platform.land(DAYS[0], len(DAYS))
    run_range(platform, platform.defs, "synthetic")
    before = {
        "lake": lake_files(platform.lake_dir / "synthetic"),
        "records": records(platform.instance, "synthetic"),
        "aliases": platform.registry().aliases(),
        "versions": platform.registry().versions(),
        "landing": lake_files(platform.landing_dir),
    }
    replays = root / "replays"
    made = create_replay(replays, changed, live, "sgd", dt.date.fromisoformat(DAYS[0]), len(DAYS))
    [replay] = load_replays(replays, [live])
    defs = build_definitions(
        live,
        landing_dir=str(platform.landing_dir),
        lake_dir=str(platform.lake_dir),
        replays=[replay],
    )
    run_range(platform, defs, replay.dataset)
    comparison = dg.materialize(
        [*(defs.assets or [])],
        resources=defs.resources,
        instance=platform.instance,
        selection=[asset_key(replay.dataset, REPLAY_COMPARISON)],
    )
    return {
        "root": root,
        "live_file": live_file,
        "platform": platform,
        "defs": defs,
        "replay": made,
        "before": before,
        "comparison": comparison,
    }


def test_a_replay_is_a_dataset_of_its_own_without_automation(replayed):
    defs = replayed["defs"]
    replay = replayed["replay"]
    assert replay.dataset == "synthetic__replay_sgd"
    assert replay.contract.model.estimator == "sgd"
    jobs = {j.name for j in defs.resolve_all_job_defs()}
    assert f"{replay.dataset}_daily_pipeline_job" in jobs
    # Only the live dataset's sensors and schedules: a replay runs when launched.
    assert not [s for s in defs.schedules or [] if replay.dataset in s.name]
    assert not [s for s in defs.sensors or [] if replay.dataset in s.name]
    notifier = defs.resources["notifier"]
    assert notifier.silent == [replay.dataset]
    # A replay's rejected day pages no one; the live dataset's still does.
    for dataset, pages in ((replay.dataset, False), ("synthetic", True)):
        alert = Alert(
            severity="ERROR",
            rule="day_rejected",
            title="2024-01-02 rejected",
            cause="failed quality gate",
            subject=f"{dataset}/validated_data",
            failure_class=None,
            run_id=None,
            partition="2024-01-02",
            run_url=None,
            runbook="docs/runbook.md",
            page=True,
            occurred_at=0.0,
            dataset=dataset,
        )
        assert notifier.routed(alert).page is pages


def test_the_replay_leaves_the_live_chain_as_it_was(replayed):
    platform, before = replayed["platform"], replayed["before"]
    assert lake_files(platform.lake_dir / "synthetic") == before["lake"]
    assert records(platform.instance, "synthetic") == before["records"]
    assert platform.registry().aliases() == before["aliases"]
    assert platform.registry().versions() == before["versions"]
    # The landed files are read, never moved or rewritten.
    assert lake_files(platform.landing_dir) == before["landing"]
    # The replay wrote its own folder, registered model and records.
    replay = replayed["replay"]
    assert (platform.lake_dir / replay.dataset / "model").is_dir()
    assert lake_registry(platform.lake_dir, replay.dataset).versions()
    assert len(records(platform.instance, replay.dataset)) == len(before["records"])


def test_the_comparison_shows_both_chains_day_by_day(replayed):
    result = replayed["comparison"]
    assert result.success
    [event] = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    stored = json.loads(Path(str(metadata["path"].value)).read_text())
    assert stored["metric"] == "rmse"
    live_days, replay_days = stored["days"]["live"], stored["days"]["replay"]
    assert [d["day"] for d in live_days] == DAYS == [d["day"] for d in replay_days]
    # The first day of each chain is promoted: there was no champion to beat.
    assert live_days[0]["decision"] == replay_days[0]["decision"] == PROMOTE
    # From the second day on, each serving champion is scored on the day it served.
    for days in (live_days, replay_days):
        assert all(d["metric"] is not None for d in days[1:]), days
    # Two estimators, two sets of scores.
    assert [d["metric"] for d in live_days] != [d["metric"] for d in replay_days]
    difference = stored["difference"]
    assert difference["days"] == len(DAYS) - 1
    assert difference["low"] <= difference["mean"] <= difference["high"]
    assert metadata["live_promotions"].value == stored["summary"]["live"]["promotions"] >= 1
    markdown = str(metadata["comparison"].value)
    assert "synthetic__replay_sgd against synthetic" in markdown
    assert all(f"| {day} |" in markdown for day in DAYS)


def test_promote_rewrites_the_live_contract_file_and_nothing_else(replayed, tmp_path):
    replay, platform = replayed["replay"], replayed["platform"]
    live_copy = tmp_path / "synthetic.yaml"
    live_copy.write_text(replayed["live_file"].read_text())
    lake_before = lake_files(platform.lake_dir)
    promote_replay(replay, live_copy)
    assert live_copy.read_bytes() == replay.contract_file.read_bytes()
    assert load_contract(live_copy).name == "synthetic"
    assert load_contract(live_copy).model.estimator == "sgd"
    assert lake_files(platform.lake_dir) == lake_before


def test_a_replay_must_keep_the_live_landing_and_name(replayed, tmp_path):
    live = load_contract(replayed["live_file"])
    document = yaml.safe_load(replayed["live_file"].read_text())
    document["landing"]["file_pattern"] = "other_{date}.csv"
    moved = tmp_path / "moved.yaml"
    moved.write_text(yaml.safe_dump(document))
    with pytest.raises(ReplayError, match="landing"):
        create_replay(tmp_path / "replays", moved, live, "moved", dt.date(2024, 1, 1), 2)
    with pytest.raises(ReplayError, match="exists"):
        create_replay(
            replayed["replay"].folder.parent,
            replayed["live_file"],
            live,
            "sgd",
            dt.date(2024, 1, 1),
            2,
        )


def test_remove_takes_away_the_replay_and_only_it(replayed):
    platform, defs, replay = replayed["platform"], replayed["defs"], replayed["replay"]
    live_lake = lake_files(platform.lake_dir / "synthetic")
    live_records = records(platform.instance, "synthetic")
    keys = [
        k for k in defs.resolve_asset_graph().get_all_asset_keys() if k.path[0] == replay.dataset
    ]
    resources = defs.resources or {}
    removed = remove_replay(replay, platform.instance, keys, resources["lake"], resources["mlflow"])
    assert removed.registered_model and removed.experiment and removed.lake_objects > 0
    assert records(platform.instance, replay.dataset) == []
    assert lake_files(platform.lake_dir / replay.dataset) == {}
    client = resources["mlflow"].client()
    assert client.search_registered_models(f"name = '{replay.dataset}'") == []
    assert client.get_experiment_by_name(replay.dataset) is None
    assert not replay.folder.exists()
    assert lake_files(platform.lake_dir / "synthetic") == live_lake
    assert records(platform.instance, "synthetic") == live_records


def test_the_command_says_what_is_missing_and_keeps_nothing_without_a_webserver(
    tmp_path, monkeypatch, capsys
):
    from ml_platform.cli import main

    replays = tmp_path / "replays"
    monkeypatch.setenv("ML_PLATFORM_REPLAYS_DIR", str(replays))
    monkeypatch.setenv("ML_PLATFORM_DATASET", "synthetic")
    # Nothing listens there.
    monkeypatch.setenv("ML_PLATFORM_DAGSTER_URL", "http://127.0.0.1:9")
    changed = tmp_path / "synthetic_sgd.yaml"
    changed.write_text(
        bundled_contracts()["synthetic"]
        .read_text()
        .replace("  estimator: linear\n", "  estimator: sgd\n")
    )
    assert main(["replay", str(changed), "--days", "3"]) == 2
    assert "give the first day" in capsys.readouterr().err
    assert main(["replay", "promote"]) == 2
    assert "name the replay" in capsys.readouterr().err
    assert main(["replay", "remove", "nothing"]) == 2
    assert "no replay named 'nothing'" in capsys.readouterr().err
    assert main(["replay", str(changed), "--start", "2024-01-01", "--days", "3"]) == 1
    assert "no Dagster webserver answers" in capsys.readouterr().err
    assert not replays.exists()
    assert main(["replay", "list"]) == 0
    assert "no replays" in capsys.readouterr().out


def test_a_replay_computes_the_days_its_first_days_look_back_on(tmp_path):
    flights = load_contract("flights")
    changed = tmp_path / "flights_week.yaml"
    changed.write_text(
        bundled_contracts()["flights"]
        .read_text()
        .replace("  window_days: 28\n", "  window_days: 7\n")
    )
    later = create_replay(tmp_path / "r", changed, flights, "later", dt.date(2013, 3, 1), 10)
    # The flights contract's gate and drift references are both the previous days.
    look_back = max(6, flights.history_reference.days, flights.drift.reference.days)
    assert later.warm_up_keys[0] == (dt.date(2013, 3, 1) - dt.timedelta(days=look_back)).isoformat()
    assert later.warm_up_keys[-1] == "2013-02-28"
    ranges = later.backfill_ranges()
    assert ranges["features"] == (later.warm_up_keys[0], "2013-03-10")
    assert ranges["model"] == ranges["registered_model"] == ("2013-03-01", "2013-03-10")
    # From the dataset's first day there is nothing before to compute.
    first = create_replay(tmp_path / "r", changed, flights, "first", dt.date(2013, 1, 1), 3)
    assert first.warm_up_keys == []
    assert set(first.backfill_ranges().values()) == {("2013-01-01", "2013-01-03")}
