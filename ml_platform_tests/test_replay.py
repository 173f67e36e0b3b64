"""A replay: a changed contract over past days beside the live chain, compared, promoted, removed.

The live days and the replay's run as a backfill runs them (one run of a range) through the
code location's own graph, the replay served as `defs()` serves it. The integration test of
`ml-platform replay` through the webserver and daemon is in test_replay_daemon.py.
"""

import datetime as dt
import hashlib
import json
import logging
import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ml_platform.automation.alerts import Alert
from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.contracts.reference import reference_days
from ml_platform.definitions import build_definitions
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.rejected import DAY_ASSETS
from ml_platform.platform.tracking import MLFLOW_PREFIX
from ml_platform.registry.assets import PROMOTE
from ml_platform.replay.assets import REPLAY_COMPARISON
from ml_platform.replay.comparison import (
    MIN_PAIRED_DAYS,
    ChainDay,
    paired_difference,
    render_summary,
    verdict,
)
from ml_platform.replay.lifecycle import promote_replay, remove_replay
from ml_platform.replay.replays import ReplayError, create_replay, load_replays
from ml_platform_tests.conftest import Platform, days_from, empty_mlflow_store, lake_registry

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
    start = dt.date.fromisoformat(DAYS[0])
    made = create_replay(replays, changed, live, "sgd", start, len(DAYS), live_file=live_file)
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
    # Three paired days are too few for the interval to say which did better.
    assert stored["verdict"].startswith("too few days scored to tell: 3 day(s)")
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
    # `replay remove NAME` looks for what a replay of that name left where its folder is gone.
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text("")
    monkeypatch.setenv("ML_PLATFORM_LAKE_DIR", str(tmp_path / "lake"))
    monkeypatch.delenv("ML_PLATFORM_LAKE_URL", raising=False)
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
    first_warm_up = dt.date(2013, 3, 1) - dt.timedelta(days=look_back)
    assert later.warm_up_days()[0] == first_warm_up.isoformat()
    assert later.warm_up_days()[-1] == "2013-02-28"
    ranges = later.backfill_ranges()
    assert ranges["features"] == [(later.warm_up_days()[0], "2013-03-10")]
    assert ranges["model"] == ranges["registered_model"] == [("2013-03-01", "2013-03-10")]
    # From the dataset's first day there is nothing before to compute.
    first = create_replay(tmp_path / "r", changed, flights, "first", dt.date(2013, 1, 1), 3)
    assert first.warm_up_days() == []
    assert all(r == [("2013-01-01", "2013-01-03")] for r in first.backfill_ranges().values())


def test_a_replay_warms_up_the_baseline_days_its_days_are_compared_with(tmp_path):
    synthetic = load_contract("synthetic")
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    # Both references fixed, apart from each other and long before the replayed days.
    document["drift"]["reference"] = {"mode": "baseline", "start": "2024-01-01", "days": 14}
    document["quality"]["history"] = {
        "reference": {"mode": "baseline", "start": "2024-01-20", "days": 5}
    }
    changed = tmp_path / "synthetic_baselines.yaml"
    changed.write_text(yaml.safe_dump(document))
    replay = create_replay(tmp_path / "r", changed, synthetic, "base", dt.date(2024, 3, 1), 5)
    computed = {*replay.warm_up_days(), *replay.day_keys}
    c = replay.contract
    for day in replay.day_keys:
        for reference in (c.drift.reference, c.history_reference):
            wanted = reference_days(reference, dt.date.fromisoformat(day), c.partitions.start_date)
            assert wanted and {d.isoformat() for d in wanted} <= computed, (day, reference)
    # Each baseline is a range of its own, the days between them not computed; the training
    # window's days lead up to the first day.
    ranges = replay.backfill_ranges()
    assert (
        ranges["features"]
        == ranges["validated_data"]
        == [
            ("2024-01-01", "2024-01-14"),
            ("2024-01-20", "2024-01-24"),
            ("2024-02-03", "2024-03-05"),
        ]
    )
    assert ranges["model"] == [("2024-03-01", "2024-03-05")]


def test_a_replay_of_days_outside_either_contracts_partitions_is_not_kept(tmp_path):
    flights = load_contract("flights")
    text = bundled_contracts()["flights"].read_text()
    changed = tmp_path / "flights_week.yaml"
    changed.write_text(text.replace("  window_days: 28\n", "  window_days: 7\n"))
    replays = tmp_path / "replays"
    # Past the dataset's last day (2013-12-31).
    with pytest.raises(ReplayError) as past:
        create_replay(replays, changed, flights, "week", dt.date(2013, 12, 30), 5)
    said = str(past.value)
    assert "3 of the 5 day(s) are outside the partitions" in said
    assert "the first 2014-01-01 and the last 2014-01-03" in said
    assert "live contract's partitions are 2013-01-01 to 2013-12-31" in said
    # Before the first day of the changed contract, which moved it.
    moved = tmp_path / "flights_march.yaml"
    moved.write_text(
        changed.read_text().replace("start_date: 2013-01-01", "start_date: 2013-03-01")
    )
    with pytest.raises(ReplayError) as before:
        create_replay(replays, moved, flights, "week", dt.date(2013, 2, 27), 4)
    said = str(before.value)
    assert "the first 2013-02-27 and the last 2013-02-28" in said
    assert "the changed contract's 2013-03-01 to 2013-12-31" in said
    # Nothing was kept: the same name takes days that fit.
    assert not replays.exists()
    kept = create_replay(replays, changed, flights, "week", dt.date(2013, 12, 27), 5)
    assert kept.day_keys[-1] == "2013-12-31"


def _day(day: str, metric: float | None) -> ChainDay:
    return ChainDay(day, None, PROMOTE, "v1", metric, False, 1.0, 100.0)


def test_the_comparison_needs_a_week_of_paired_days_for_a_verdict():
    days = days_from("2024-03-01", MIN_PAIRED_DAYS + 1)
    live = {d: _day(d, 0.90) for d in days}
    # The replay's first day has no champion yet; each later day a hair better (lower rmse).
    replay = {d: _day(d, None if i == 0 else 0.8999 - i / 1e5) for i, d in enumerate(days)}
    for scored in (2, 3):
        few = dict(list(replay.items())[:scored])
        difference = paired_difference(live, few, 200)
        assert difference.days == scored - 1
        said = verdict(difference, "rmse")
        assert said == (
            f"too few days scored to tell: {scored - 1} day(s) have both champions' rmse, a "
            f"verdict needs {MIN_PAIRED_DAYS}"
        )
        summary = render_summary("synthetic", "synthetic__replay_x", live, few, "rmse", difference)
        assert said in summary and "better" not in summary
    difference = paired_difference(live, replay, 200)
    assert difference.days == MIN_PAIRED_DAYS
    assert verdict(difference, "rmse").startswith("the replay's serving champion did better")


def test_a_replay_that_changes_the_label_gives_no_verdict(tmp_path):
    flights = load_contract("flights")
    changed = tmp_path / "flights_late30.yaml"
    changed.write_text(
        bundled_contracts()["flights"]
        .read_text()
        .replace('rule: {op: ">", value: 15}', 'rule: {op: ">", value: 30}')
    )
    days = days_from("2013-03-01", 10)
    replay = create_replay(tmp_path / "r", changed, flights, "late30", dt.date(2013, 3, 1), 10)
    defs = build_definitions(
        flights,
        landing_dir=str(tmp_path / "landing"),
        lake_dir=str(tmp_path / "lake"),
        replays=[replay],
    )
    instance = dg.DagsterInstance.ephemeral()
    # Every day, the replay's champion scores far higher on its own (rarer) positives.
    for dataset, score in (("flights", 0.60), (replay.dataset, 0.80)):
        for day in days:
            event = dg.AssetMaterialization(
                asset_key(dataset, "champion_performance"),
                partition=day,
                metadata={"champion_roc_auc": score},
            )
            instance.report_runless_asset_event(event)
    result = dg.materialize(
        [*(defs.assets or [])],
        resources=defs.resources,
        instance=instance,
        selection=[asset_key(replay.dataset, REPLAY_COMPARISON)],
    )
    [event] = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    said = str(metadata["verdict"].value)
    assert said == (
        "the two chains are measured on different targets (label rule > 15 -> > 30): their "
        "roc_auc cannot be compared, no verdict"
    )
    summary = str(metadata["summary"].value)
    assert said in summary and "better" not in summary and "interval" not in summary
    assert "difference_roc_auc" not in metadata
    stored = json.loads(Path(str(metadata["path"].value)).read_text())
    assert stored["difference"] is None
    # Each chain's own figures are still there.
    assert stored["summary"]["replay"]["mean_metric"] == pytest.approx(0.80)


def test_a_replay_that_cannot_be_read_is_not_served_says_so_and_can_be_removed(
    tmp_path, monkeypatch, caplog, capsys
):
    from ml_platform.cli import main
    from ml_platform.definitions import defs

    text = bundled_contracts()["synthetic"].read_text()
    synthetic = load_contract("synthetic")
    replays, contracts, lake = tmp_path / "replays", tmp_path / "contracts", tmp_path / "lake"
    changed = tmp_path / "synthetic_sgd.yaml"
    changed.write_text(text.replace("  estimator: linear\n", "  estimator: sgd\n"))
    start = dt.date(2024, 1, 5)
    # Made against the live contract as it was; its landing changes afterwards.
    create_replay(replays, changed, synthetic, "stale", start, 3)
    # Its replay.yaml written only in part; a copy under a name no replay may have.
    half = create_replay(replays, changed, synthetic, "half", start, 3)
    (half.folder / "replay.yaml").write_text("of: synthetic\nstart: 2024-01-05\n")
    shutil.copytree(half.folder, replays / "Bad-Name")
    new_landing = text.replace('"synthetic_{date}.csv"', '"synthetic-v2_{date}.csv"')
    contracts.mkdir()
    (contracts / "synthetic.yaml").write_text(new_landing)
    live = load_contract(contracts / "synthetic.yaml")
    changed.write_text(new_landing.replace("  estimator: linear\n", "  estimator: sgd\n"))
    create_replay(replays, changed, live, "sgd", start, 3)

    with caplog.at_level(logging.ERROR, logger="ml_platform.replay.replays"):
        served = load_replays(replays, [live])
    assert [r.name for r in served] == ["sgd"]
    said = {r.getMessage().split("'")[1]: r.getMessage() for r in caplog.records}
    assert set(said) == {"Bad-Name", "half", "stale"}
    for name, message in said.items():
        assert f"in {replays / name} is not served" in message
        # Their dataset is known: `remove` takes what they made, a folder deleted by hand not.
        assert f"run `ml-platform replay remove {name}`, which removes what it made" in message
        assert "deleting the folder by hand leaves that behind" in message
    assert "lower-case letters, digits and _" in said["Bad-Name"]
    assert "replay.yaml lacks days" in said["half"]
    assert "changes `landing`" in said["stale"]

    # The code location serves the live dataset and the readable replay.
    for variable in ("ML_PLATFORM_DATASET", "ML_PLATFORM_LAKE_URL", "ML_PLATFORM_LANDING_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("ML_PLATFORM_CONTRACTS", str(contracts))
    monkeypatch.setenv("ML_PLATFORM_REPLAYS_DIR", str(replays))
    monkeypatch.setenv("ML_PLATFORM_LAKE_DIR", str(lake))
    monkeypatch.setenv("ML_PLATFORM_LANDING_DIR", str(tmp_path / "landing"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text("")
    monkeypatch.setenv("ML_PLATFORM_DAGSTER_URL", "http://127.0.0.1:9")
    datasets = {k.path[0] for k in defs().resolve_asset_graph().get_all_asset_keys()}
    assert datasets == {"synthetic", "synthetic__replay_sgd"}

    # What the stale replay recorded and stored while it was served goes with its folder.
    (lake / MLFLOW_PREFIX).mkdir(parents=True)
    shutil.copyfile(empty_mlflow_store(), lake / MLFLOW_PREFIX / "mlflow.db")
    (lake / "synthetic__replay_stale" / "model" / start.isoformat()).mkdir(parents=True)
    (lake / "synthetic__replay_stale" / "model" / start.isoformat() / "v.joblib").write_text("")
    stale_model = asset_key("synthetic__replay_stale", "model")
    with dg.DagsterInstance.get() as instance:
        event = dg.AssetMaterialization(stale_model, partition=start.isoformat())
        instance.report_runless_asset_event(event)
    capsys.readouterr()
    assert main(["replay", "promote", "stale"]) == 2
    assert "replay 'stale' cannot be read" in capsys.readouterr().err
    assert main(["replay", "remove", "stale"]) == 0
    assert "removed replay 'stale': records of 1 asset(s), 1 lake object(s)" in (
        capsys.readouterr().out
    )
    assert main(["replay", "remove", "Bad-Name"]) == 0
    assert sorted(p.name for p in replays.iterdir()) == ["half", "sgd"]
    assert not [p for p in (lake / "synthetic__replay_stale").rglob("*") if p.is_file()]
    with dg.DagsterInstance.get() as instance:
        assert instance.fetch_materializations(stale_model, limit=1).records == []
