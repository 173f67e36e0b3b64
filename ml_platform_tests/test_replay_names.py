"""A replay's name: what an earlier replay of it left, and the command's arguments.

A replay's folder deleted by hand (or kept by an older version) leaves the records, lake files
and MLflow entries it made under its dataset's name: a new replay of that name is refused, and
`ml-platform replay remove NAME` removes them from the name alone. The replay runs through the
code location's own graph into a real instance (`DAGSTER_HOME`), as the command reads it.
"""

import datetime as dt
import shutil
from pathlib import Path

import dagster as dg
import pytest

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.definitions import build_definitions
from ml_platform.ingestion.landing import LandingZone, land_days
from ml_platform.platform.datasets import asset_key
from ml_platform.platform.rejected import DAY_ASSETS
from ml_platform.platform.storage import LocalStorage
from ml_platform.platform.tracking import MLFLOW_PREFIX, MlflowStores
from ml_platform.replay.lifecycle import left_behind, remove_replay
from ml_platform.replay.replays import BrokenReplay, ReplayError, create_replay, find_replay
from ml_platform_tests.conftest import days_from, empty_mlflow_store

DAYS = days_from("2024-01-01", 2)
START = dt.date.fromisoformat(DAYS[0])


def lake_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def served(tmp_path, monkeypatch):
    """Settings the command reads: synthetic (and flights) served, a real instance and lake."""
    contracts, lake = tmp_path / "contracts", tmp_path / "lake"
    contracts.mkdir()
    for name in ("synthetic", "flights"):
        shutil.copyfile(bundled_contracts()[name], contracts / f"{name}.yaml")
    (lake / MLFLOW_PREFIX).mkdir(parents=True)
    shutil.copyfile(empty_mlflow_store(), lake / MLFLOW_PREFIX / "mlflow.db")
    for variable in ("ML_PLATFORM_DATASET", "ML_PLATFORM_LAKE_URL", "ML_PLATFORM_LANDING_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("ML_PLATFORM_CONTRACTS", str(contracts))
    monkeypatch.setenv("ML_PLATFORM_REPLAYS_DIR", str(tmp_path / "replays"))
    monkeypatch.setenv("ML_PLATFORM_LAKE_DIR", str(lake))
    monkeypatch.setenv("ML_PLATFORM_LANDING_DIR", str(tmp_path / "landing"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text("")
    # Nothing listens there.
    monkeypatch.setenv("ML_PLATFORM_DAGSTER_URL", "http://127.0.0.1:9")
    changed = tmp_path / "synthetic_sgd.yaml"
    changed.write_text(
        bundled_contracts()["synthetic"]
        .read_text()
        .replace("  estimator: linear\n", "  estimator: sgd\n  max_epochs: 3\n")
    )
    return tmp_path


def stores(lake: Path) -> tuple[LocalStorage, MlflowStores]:
    storage = LocalStorage(base_dir=str(lake))
    return storage, MlflowStores(lake=storage)


@pytest.mark.slow
def test_what_a_replay_deleted_by_hand_left_refuses_its_name_until_removed(served, capsys):
    from ml_platform.cli import main

    root, lake, replays = served, served / "lake", served / "replays"
    live = load_contract(root / "contracts" / "synthetic.yaml")
    zone = LandingZone(base_dir=str(root / "landing"))
    list(land_days(live, zone, [dt.date.fromisoformat(d) for d in DAYS]))
    made = create_replay(replays, root / "synthetic_sgd.yaml", live, "sgd", START, len(DAYS))
    defs = build_definitions(
        live, landing_dir=str(root / "landing"), lake_dir=str(lake), replays=[made]
    )
    with dg.DagsterInstance.get() as instance:
        result = dg.materialize(
            [*(defs.assets or []), *(defs.asset_checks or [])],
            resources=defs.resources,
            instance=instance,
            selection=[asset_key(made.dataset, name) for name in DAY_ASSETS],
            tags={
                "dagster/asset_partition_range_start": DAYS[0],
                "dagster/asset_partition_range_end": DAYS[-1],
            },
        )
        assert result.success
    # Its folder deleted by hand: its records, lake files and MLflow entries stay.
    shutil.rmtree(made.folder)
    storage, mlflow = stores(lake)
    assert lake_files(lake / made.dataset)
    with dg.DagsterInstance.get() as instance:

        def left(dataset: str) -> list[str]:
            return left_behind(dataset, instance, storage, mlflow)

        with pytest.raises(ReplayError) as refused:
            create_replay(
                replays, root / "synthetic_sgd.yaml", live, "sgd", START, 1, left_behind=left
            )
        said = str(refused.value)
        assert said.startswith(
            f"an earlier replay named 'sgd' of synthetic left records of {len(DAY_ASSETS)} "
            "asset(s) in the Dagster instance; "
        )
        assert "lake object(s) under synthetic__replay_sgd/ and mlflow/artifacts/" in said
        assert "MLflow's registered model 'synthetic__replay_sgd'" in said
        assert "MLflow's experiment 'synthetic__replay_sgd'" in said
        assert "Remove them first (`ml-platform replay remove sgd`) or choose another" in said
        assert not (replays / "sgd").exists()
        # Another name is free.
        assert create_replay(
            replays, root / "synthetic_sgd.yaml", live, "other", START, 1, left_behind=left
        ).folder.is_dir()

    capsys.readouterr()
    assert main(["replay", "remove", "sgd"]) == 0
    out = capsys.readouterr().out
    assert f"removed replay 'sgd': records of {len(DAY_ASSETS)} asset(s)" in out
    assert lake_files(lake / made.dataset) == []
    with dg.DagsterInstance.get() as instance:
        assert left_behind(made.dataset, instance, storage, mlflow) == []
        for name in DAY_ASSETS:
            records = instance.fetch_materializations(asset_key(made.dataset, name), limit=1)
            assert records.records == [], name
        # The name is free again; nothing is left to remove.
        again = create_replay(
            replays, root / "synthetic_sgd.yaml", live, "sgd", START, 1, left_behind=left
        )
    assert again.folder.is_dir()
    # The other replay is untouched.
    assert (replays / "other").is_dir()
    shutil.rmtree(again.folder)
    assert main(["replay", "remove", "sgd"]) == 2
    assert "no replay named 'sgd'" in capsys.readouterr().err


def record(dataset: str, name: str = "model") -> None:
    """A record of `dataset`'s asset `name` in the instance, as a run of it would leave."""
    with dg.DagsterInstance.get() as instance:
        event = dg.AssetMaterialization(asset_key(dataset, name), partition=DAYS[0])
        instance.report_runless_asset_event(event)


def test_what_replays_of_two_served_datasets_left_under_one_name_is_not_guessed(served, capsys):
    from ml_platform.cli import main

    replays = served / "replays"
    record("synthetic__replay_week")
    record("flights__replay_week")
    assert main(["replay", "remove", "week"]) == 2
    assert (
        "replays named 'week' of flights and synthetic left what they made, their folders gone: "
        "set ML_PLATFORM_DATASET to the dataset whose replay to remove"
    ) in capsys.readouterr().err
    # A folder of that name that is no replay's is not deleted with what the replay left.
    (replays / "week").mkdir(parents=True)
    (replays / "week" / "notes.txt").write_text("mine")
    contracts = [load_contract(served / "contracts" / "synthetic.yaml")]
    with dg.DagsterInstance.get() as instance:
        storage, mlflow = stores(served / "lake")

        def left(dataset: str) -> list[str]:
            return left_behind(dataset, instance, storage, mlflow)

        with pytest.raises(ReplayError, match="is no replay's folder .* move it away"):
            find_replay(replays, "week", contracts, left_behind=left)
        (replays / "week" / "notes.txt").unlink()
        (replays / "week").rmdir()
        found = find_replay(replays, "week", contracts, left_behind=left)
        assert isinstance(found, BrokenReplay) and found.dataset == "synthetic__replay_week"
        assert found.reason == (
            f"its folder {replays / 'week'} is gone, it left records of 1 asset(s) in the "
            "Dagster instance"
        )
        # Without what it left to go by, the name is not there.
        with pytest.raises(ReplayError, match="no replay named 'week'"):
            find_replay(replays, "week", contracts)
        remove_replay(found, instance, [], storage, mlflow)
        assert left("synthetic__replay_week") == []
        assert left("flights__replay_week") == ["records of 1 asset(s) in the Dagster instance"]


def test_a_replay_whose_experiment_was_deleted_in_mlflow_is_removed(served):
    live = load_contract(served / "contracts" / "synthetic.yaml")
    made = create_replay(
        served / "replays", served / "synthetic_sgd.yaml", live, "sgd", START, len(DAYS)
    )
    storage, mlflow = stores(served / "lake")
    client = mlflow.client()
    # Deleted in MLflow's UI: its name stays taken, and no new replay can record under it.
    client.delete_experiment(client.create_experiment(made.dataset))
    with dg.DagsterInstance.get() as instance:
        assert left_behind(made.dataset, instance, storage, mlflow) == [
            "MLflow's experiment 'synthetic__replay_sgd' (deleted, its name still taken)"
        ]
        removed = remove_replay(made, instance, [], storage, mlflow)
        assert removed.experiment
        assert left_behind(made.dataset, instance, storage, mlflow) == []
    assert client.get_experiment_by_name(made.dataset) is None
    assert not made.folder.exists()


def test_a_name_after_the_contract_is_refused_not_dropped(served, capsys):
    from ml_platform.cli import main

    changed = str(served / "synthetic_sgd.yaml")
    assert main(["replay", changed, "week", "--start", DAYS[0], "--days", "2"]) == 2
    assert capsys.readouterr().err == (
        f"error: `ml-platform replay {changed} week`: '{changed}' is taken as the changed "
        "contract (not one of promote, remove, list); name the replay with --name week\n"
    )
    # A misspelt action reads the same.
    assert main(["replay", "remvoe", "week"]) == 2
    assert "'remvoe' is taken as the changed contract" in capsys.readouterr().err
    assert main(["replay", "list", "week"]) == 2
    assert "`ml-platform replay list` lists every replay, not 'week'" in capsys.readouterr().err
    assert not (served / "replays").exists()


def test_promote_refuses_a_live_contract_changed_since_the_replay_was_made(served, capsys):
    from ml_platform.cli import main

    live_file = served / "contracts" / "synthetic.yaml"
    replays, changed = served / "replays", served / "synthetic_sgd.yaml"
    live = load_contract(live_file)
    first = create_replay(replays, changed, live, "sgd", START, 2, live_file=live_file)
    second = create_replay(replays, changed, live, "again", START, 2, live_file=live_file)
    # Made as an older version made it: no digest of the live contract.
    older = create_replay(replays, changed, live, "older", START, 2)
    assert main(["replay", "promote", "sgd"]) == 0
    assert live_file.read_bytes() == first.contract_file.read_bytes()
    # Promoted already: nothing to undo.
    assert main(["replay", "promote", "sgd"]) == 0
    # The live contract changed since `again` was made (by the promotion, here).
    capsys.readouterr()
    live_file.write_text(live_file.read_text() + "# the gate's bounds, reviewed\n")
    before = live_file.read_bytes()
    assert main(["replay", "promote", "again"]) == 2
    said = capsys.readouterr().err
    assert said.startswith(
        f"error: {live_file} changed since replay 'again' was made: its contract changes the "
        "live contract as it was, and copying it would undo what changed since."
    )
    assert "`ml-platform replay remove again`, then `ml-platform replay CONTRACT`" in said
    assert main(["replay", "promote", "older"]) == 2
    assert (
        f"replay 'older' records no digest of the live contract it was made against (made by "
        f"an older version), so whether {live_file} changed since cannot be told: compare them, "
        f"and copy {older.contract_file} over it by hand if it did not"
    ) in capsys.readouterr().err
    assert live_file.read_bytes() == before
    assert second.folder.is_dir()


def test_promote_writes_the_contract_file_the_settings_serve(served, monkeypatch):
    from ml_platform.cli import main

    # The live contract served from a file of its own; the contracts directory has another.
    own = served / "own" / "synthetic.yaml"
    own.parent.mkdir()
    own.write_text(bundled_contracts()["synthetic"].read_text() + "# ours\n")
    monkeypatch.setenv("ML_PLATFORM_DATASET", str(own))
    in_directory = (served / "contracts" / "synthetic.yaml").read_bytes()
    made = create_replay(
        served / "replays",
        served / "synthetic_sgd.yaml",
        load_contract(own),
        "sgd",
        START,
        2,
        live_file=own,
    )
    assert main(["replay", "promote", "sgd"]) == 0
    assert own.read_bytes() == made.contract_file.read_bytes()
    assert (served / "contracts" / "synthetic.yaml").read_bytes() == in_directory
