"""Names across datasets: writer pools, the contracts a code location loads, shared patterns;
and the live contract file a replay's promotion writes."""

import datetime as dt
import errno
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ml_platform.contracts import ContractError, load_contract, load_contracts
from ml_platform.contracts.catalog import contract_file
from ml_platform.contracts.model import bundled_contracts
from ml_platform.definitions import build_definitions, defs
from ml_platform.platform.pools import pools_of
from ml_platform.platform.rejected import rerun_command
from ml_platform.replay.lifecycle import promote_replay
from ml_platform.replay.replays import ReplayError, create_replay
from ml_platform_tests.conftest import PAGE, tmpfs


def write_contract(folder: Path, name: str, pattern: str, file: str | None = None) -> Path:
    """The synthetic contract as dataset `name`, its files named by `pattern`, in `folder`."""
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["name"] = name
    document["landing"]["file_pattern"] = pattern
    path = folder / (file or f"{name}.yaml")
    path.write_text(yaml.safe_dump(document))
    return path


def test_datasets_whose_names_meet_at_an_underscore_have_writer_pools_of_their_own(tmp_path):
    # `x` + `registered_model` and `x_registered` + `model` (or `x_full` + `model` and `x` +
    # `full_model`): each dataset's runs wait only for its own writers.
    names = ("x", "x_registered", "x_full")
    contracts = [load_contract(write_contract(tmp_path, n, f"{n}_{{date}}.csv")) for n in names]
    loaded = build_definitions(
        contracts, landing_dir=str(tmp_path / "landing"), lake_dir=str(tmp_path / "lake")
    )
    pools = {
        key: asset.node_def.pool
        for asset in loaded.assets or []
        if isinstance(asset, dg.AssetsDefinition) and isinstance(asset.node_def, dg.OpDefinition)
        for key in asset.keys
    }
    by_pool: dict[str | None, list[str]] = {}
    for key, pool in pools.items():
        by_pool.setdefault(pool, []).append(key.to_user_string())
    shared = {pool: keys for pool, keys in by_pool.items() if len(keys) > 1}
    assert shared == {}
    assert len(pools_of(loaded)) == len(pools)


@pytest.fixture
def folder_with_a_broken_contract(tmp_path, monkeypatch):
    """A contracts folder: `sales` and `stock` load, `broken.yaml` does not."""
    folder = tmp_path / "contracts"
    folder.mkdir()
    write_contract(folder, "sales", "sales_{date}.csv")
    write_contract(folder, "stock", "stock_{date}.csv")
    broken = write_contract(folder, "returns", "returns_{date}.csv", file="broken.yaml")
    broken.write_text(broken.read_text().replace("window_days:", "window_dayz:"))
    for variable in ("ML_PLATFORM_LAKE_URL", "ML_PLATFORM_LANDING_URL", "ML_PLATFORM_REPLAYS_DIR"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("ML_PLATFORM_CONTRACTS", str(folder))
    monkeypatch.setenv("ML_PLATFORM_LAKE_DIR", str(tmp_path / "lake"))
    monkeypatch.setenv("ML_PLATFORM_LANDING_DIR", str(tmp_path / "landing"))
    return folder


def test_a_broken_contract_stops_not_the_dataset_ml_platform_dataset_names(
    folder_with_a_broken_contract, monkeypatch
):
    folder = folder_with_a_broken_contract
    monkeypatch.setenv("ML_PLATFORM_DATASET", "sales")
    served = defs()
    datasets = {key.path[0] for key in served.resolve_asset_graph().get_all_asset_keys()}
    assert datasets == {"sales"}
    assert contract_file(folder, "stock") == folder / "stock.yaml"
    # Not even a YAML document beside it: the name it would declare cannot be read.
    (folder / "notes.yaml").write_text("sales: [unclosed\n")
    assert [c.name for c in load_contracts(folder, "sales")] == ["sales"]


def test_without_a_chosen_dataset_the_broken_contract_is_named(folder_with_a_broken_contract):
    folder = folder_with_a_broken_contract
    with pytest.raises(ContractError, match=r"(?s)broken\.yaml: 1 problem.*window_dayz"):
        load_contracts(folder)


def test_the_chosen_datasets_own_mistakes_are_still_raised(folder_with_a_broken_contract):
    folder = folder_with_a_broken_contract
    with pytest.raises(ContractError, match=r"(?s)broken\.yaml: .*window_dayz"):
        load_contracts(folder, "returns")
    # A file that cannot be read may be the one meant: said, rather than "no such dataset".
    (folder / "broken.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ContractError, match=r"(?s)broken\.yaml: .*not valid YAML"):
        load_contracts(folder, "returns")
    write_contract(folder, "sales", "sales2_{date}.csv", file="sales_copy.yaml")
    with pytest.raises(ContractError, match="dataset name 'sales' is also the name in"):
        load_contracts(folder, "sales")


def test_two_contracts_ingesting_the_same_files_are_refused_naming_both(tmp_path):
    write_contract(tmp_path, "sales", "daily_{date}.csv")
    write_contract(tmp_path, "stock", "daily_{date}.csv")
    with pytest.raises(ContractError) as raised:
        load_contracts(tmp_path)
    message = str(raised.value)
    assert "stock.yaml" in message and "sales.yaml" in message, message
    assert "landing.file_pattern 'daily_{date}.csv'" in message, message
    # Either served alone takes its files, as its own code location.
    assert [c.name for c in load_contracts(tmp_path, "stock")] == ["stock"]


def test_the_bundled_contracts_still_load_together():
    assert [c.name for c in load_contracts()] == sorted(bundled_contracts())


def filled(filler: Path) -> None:
    """Fill the file system of `filler` until ENOSPC, then free a page; unbuffered, so closing
    the file has nothing left to write."""
    with filler.open("wb", buffering=0) as handle:
        with pytest.raises(OSError) as full:
            while True:
                handle.write(b"\0" * PAGE)
        assert full.value.errno == errno.ENOSPC
        handle.truncate(filler.stat().st_size - PAGE)


def test_a_promotion_cut_short_by_a_full_disk_leaves_the_live_contract_as_it_was(tmp_path):
    # The live contract is what the code location loads: a copy cut short would take the
    # dataset down (and every dataset served beside it) until someone restores the file.
    text = bundled_contracts()["synthetic"].read_text()
    changed = tmp_path / "synthetic_sgd.yaml"
    # A change with its reasons written beside it: longer than the live file by many pages.
    notes = "".join(
        f"# why the SGD estimator, reason {i}: measured on the replay\n" for i in range(400)
    )
    changed.write_text(text.replace("  estimator: linear\n", "  estimator: sgd\n") + notes)
    with tmpfs(tmp_path / "contracts", "1m") as contracts:
        live_file = contracts / "synthetic.yaml"
        live_file.write_text(text)
        live = load_contract(live_file)
        start = dt.date.fromisoformat("2024-01-01")
        made = create_replay(
            tmp_path / "replays", changed, live, "sgd", start, 1, live_file=live_file
        )
        filled(contracts / "filler")
        with pytest.raises(ReplayError, match=r"synthetic\.yaml could not be written .*as it was"):
            promote_replay(made, live_file)
        assert live_file.read_text() == text
        assert sorted(p.name for p in contracts.iterdir()) == ["filler", "synthetic.yaml"]
        # Room again: the promotion writes the whole of the replay's contract.
        (contracts / "filler").unlink()
        assert promote_replay(made, live_file) == live_file
        assert live_file.read_bytes() == changed.read_bytes()


def test_a_replays_rejected_days_are_told_a_rerun_that_serves_them():
    # `materialize` serves the live datasets only: a replay's days are rerun from the UI, then
    # compared again; a live dataset's keep the command.
    replay = "flights__replay_hgb"
    told = rerun_command(replay, ["2013-02-09", "2013-02-08"])
    assert "ml-platform materialize" not in told
    assert f"materialise {replay}'s assets for 2013-02-08 to 2013-02-09 again" in told
    assert f"{replay}_replay_comparison_job" in told
    assert rerun_command("flights", ["2013-02-09", "2013-02-08"]) == (
        "ml-platform materialize --dataset flights --start 2013-02-08 --days 2"
    )
