"""How a daily step reports its days: checks that target the day, and the backfill policy."""

import dagster as dg

from ml_platform.contracts import load_contract
from ml_platform.definitions import build_definitions
from ml_platform.platform.settings import BACKFILL_DAYS_PER_RUN_ENV
from ml_platform_tests.conftest import Platform, contract_with


def test_a_passing_days_checks_target_its_materialisation(tmp_path):
    # The UI counts a day's check as passed only when the evaluation targets the day's
    # materialisation; an evaluation reported before it counts the day as "Missing".
    contract = contract_with(tmp_path, "synthetic")
    platform = Platform(contract, tmp_path / "p")
    platform.land("2024-01-01", 1)
    assert platform.materialize("2024-01-01", selection=["raw_data", "validated_data"]).success
    for check in ("raw_schema", "gx_validity"):
        asset = "raw_data" if check == "raw_schema" else "validated_data"
        records = platform.instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(platform.key(asset), check), limit=5
        )
        assert records, check
        evaluation = records[0].event.dagster_event.event_specific_data
        assert evaluation.partition == "2024-01-01" and evaluation.passed
        assert evaluation.target_materialization_data is not None, check


def test_a_backfill_runs_at_most_the_configured_days_a_run_and_chains_the_registry(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(BACKFILL_DAYS_PER_RUN_ENV, "3")
    defs = build_definitions(
        load_contract("flights"), landing_dir=str(tmp_path), lake_dir=str(tmp_path)
    )
    daily = [a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition)]
    names = {asset.key.path[-1] for asset in daily}
    # The weekly retrain trains and evaluates; registered_model alone registers its candidate.
    assert "registered_full_model" not in names
    assert {"full_model", "full_evaluation_report", "registered_model"} <= names
    # Up to the evaluation, runs of at most N days; the registry and the champion's monitoring
    # take the days a daemon loop can give them in one run.
    single = {"registered_model", "champion_performance"}
    for asset in daily:
        expected = (
            dg.BackfillPolicy.single_run()
            if asset.key.path[-1] in single
            else dg.BackfillPolicy.multi_run(3)
        )
        if asset.partitions_def is None:  # rejected_days: one run at the end of a backfill
            expected = None
        assert asset.backfill_policy == expected, asset.key
    chained = {
        asset.key.path[-1]: asset.get_partition_mapping(asset.key)
        for asset in daily
        if asset.key in asset.dependency_keys
    }
    # The chain: registered_model walks the days in order, each after its day before, and
    # champion_performance's decay streak reads the records of its days before. The evaluations
    # judge their candidate alone, so their chunks run side by side.
    assert {name: chained[name].start_offset for name in single} == {
        "registered_model": -1,
        "champion_performance": -1,
    }
    assert all(chained[name].end_offset == -1 for name in single)
    assert not {"evaluation_report", "full_evaluation_report"} & set(chained)
    # The registry reads no evaluation but its day's and the weekly one of the day before;
    # champion_performance reads the champion the registrations before its day left.
    graph = defs.resolve_asset_graph()
    key = {name: asset.key for asset in daily for name in [asset.key.path[-1]]}
    assert graph.get(key["evaluation_report"]).parent_keys == {key["model"], key["features"]}
    assert graph.get(key["registered_model"]).parent_keys == {
        key["model"],
        key["evaluation_report"],
        key["features"],
        key["full_model"],
        key["full_evaluation_report"],
        key["registered_model"],
    }
    monitoring = next(a for a in daily if a.key == key["champion_performance"])
    registry = monitoring.get_partition_mapping(key["registered_model"])
    assert (registry.start_offset, registry.end_offset) == (-1, -1)
    # Nothing but the registry depends on the registry.
    for asset in daily:
        if asset.key not in (key["registered_model"], key["champion_performance"]):
            assert key["registered_model"] not in asset.dependency_keys, asset.key
