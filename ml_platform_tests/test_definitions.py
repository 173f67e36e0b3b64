"""The code location loads and holds one daily-partitioned graph of the five assets."""

import dagster as dg
import pytest

from ml_platform.contracts import load_contract
from ml_platform.definitions import DAILY_JOB, defs
from ml_platform.validation.expectations import CHECKS
from ml_platform_tests.conftest import ALL_ASSETS


@pytest.mark.parametrize("dataset", ["flights", "synthetic"])
def test_definitions_load_for_each_bundled_dataset(monkeypatch, dataset):
    monkeypatch.setenv("ML_PLATFORM_DATASET", dataset)
    loaded = defs()
    graph = loaded.resolve_asset_graph()
    contract = load_contract(dataset)

    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert set(ALL_ASSETS) <= keys
    assert keys - set(ALL_ASSETS) == {
        "registered_model",
        "champion_performance",
        "full_model",
        "full_evaluation_report",
        "registered_full_model",
    }
    for name in keys:
        node = graph.get(dg.AssetKey(name))
        assert isinstance(node.partitions_def, dg.DailyPartitionsDefinition)
        assert node.partitions_def.start.date() == contract.partitions.start_date
        assert node.description, f"{name} has no docstring for the UI"
    assert loaded.resolve_job_def(DAILY_JOB) is not None
    assert {k.to_user_string() for k in graph.get(dg.AssetKey("model")).parent_keys} == {"features"}
    assert {
        k.to_user_string() for k in graph.get(dg.AssetKey("evaluation_report")).parent_keys
    } == {"model", "features"}


def test_quality_gates_block_downstream_assets_and_schema_change_only_warns():
    graph = defs().resolve_asset_graph()
    checks = {key.name: graph.get_check_spec(key) for key in graph.asset_check_keys}
    gates = {"raw_schema", *CHECKS}
    assert gates <= set(checks)
    assert all(checks[name].blocking for name in gates)
    assert not checks["schema_change"].blocking


@pytest.mark.parametrize("dataset", ["flights", "synthetic"])
def test_every_check_of_a_daily_asset_has_a_result_per_day(monkeypatch, dataset):
    monkeypatch.setenv("ML_PLATFORM_DATASET", dataset)
    graph = defs().resolve_asset_graph()
    unpartitioned = [
        key.to_user_string()
        for key in graph.asset_check_keys
        if not isinstance(graph.get_check_spec(key).partitions_def, dg.DailyPartitionsDefinition)
    ]
    assert graph.asset_check_keys and unpartitioned == []


def test_an_unknown_dataset_fails_with_the_bundled_names(monkeypatch):
    monkeypatch.setenv("ML_PLATFORM_DATASET", "weather")
    with pytest.raises(ValueError, match="bundled contracts are: flights, synthetic"):
        defs()
