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
    assert len(daily) == 10
    # Up to the evaluation, runs of at most N days; the registry and the champion's monitoring
    # take the days a daemon loop can give them in one run.
    single = {"registered_model", "registered_full_model", "champion_performance"}
    for asset in daily:
        expected = (
            dg.BackfillPolicy.single_run()
            if asset.key.path[-1] in single
            else dg.BackfillPolicy.multi_run(3)
        )
        assert asset.backfill_policy == expected, asset.key
    # Each day's champion is the one the previous evaluation day left: those assets wait for
    # their own day before (a week before for the weekly full retrain), the others do not.
    chained = {
        asset.key.path[-1]: asset.get_partition_mapping(asset.key)
        for asset in daily
        if asset.key in asset.dependency_keys
    }
    assert {name: m.start_offset for name, m in chained.items()} == {
        "evaluation_report": -1,
        "registered_model": -1,
        "champion_performance": -1,
        "full_evaluation_report": -7,
        "registered_full_model": -7,
    }
    assert all(m.end_offset == m.start_offset for m in chained.values())
