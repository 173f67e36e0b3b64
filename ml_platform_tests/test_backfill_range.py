"""A range of days in one run (what a backfill from the UI launches) against one run per day."""

import json

import dagster as dg
import joblib
import numpy as np
import pandas as pd
import pytest
import yaml

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform_tests.conftest import ALL_ASSETS, DAILY_ASSETS, Platform, contract_with, days_from

pytestmark = pytest.mark.slow

DAYS = days_from("2024-01-01", 3)


def materialize_range(
    platform: Platform, first: str, last: str, selection: list[str] = DAILY_ASSETS
) -> dg.ExecuteInProcessResult:
    """One run of the daily assets and their checks over first..last, as a backfill runs it."""
    return dg.materialize(
        [*(platform.defs.assets or []), *(platform.defs.asset_checks or [])],
        resources=platform.defs.resources,
        instance=platform.instance,
        selection=[platform.key(name) for name in selection],
        tags={
            "dagster/asset_partition_range_start": first,
            "dagster/asset_partition_range_end": last,
        },
        raise_on_error=False,
    )


def evaluations(platform: Platform, asset: str, check: str) -> dict[str, bool]:
    """Latest evaluation of a check per partition, from the instance."""
    records = platform.instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(platform.key(asset), check), limit=100
    )
    latest: dict[str, bool] = {}
    for record in reversed(records):  # oldest first, so the latest wins
        evaluation = record.event.dagster_event.event_specific_data if record.event else None
        if isinstance(evaluation, dg.AssetCheckEvaluation) and evaluation.partition:
            latest[evaluation.partition] = evaluation.passed
    return latest


def test_a_range_in_one_run_reaches_what_one_run_per_day_reaches(tmp_path):
    contract = contract_with(tmp_path, "synthetic")
    by_day = Platform(contract, tmp_path / "by_day")
    in_range = Platform(contract, tmp_path / "in_range")
    for platform in (by_day, in_range):
        platform.land(DAYS[0], len(DAYS))
    for day in DAYS:
        assert by_day.materialize(day).success, day
        # The daily assets alone leave out the drift check: features again, with it.
        drift_alone = dg.materialize(
            [*(by_day.defs.assets or []), *(by_day.defs.asset_checks or [])],
            partition_key=day,
            resources=by_day.defs.resources,
            instance=by_day.instance,
            selection=[by_day.key("features")],
        )
        assert drift_alone.success, day

    result = materialize_range(in_range, DAYS[0], DAYS[-1])

    assert result.success
    for asset in DAILY_ASSETS:
        assert in_range.materialized(asset) == set(DAYS), asset
    for day in DAYS:
        for asset in ("raw_data", "validated_data", "features"):
            pd.testing.assert_frame_equal(
                pd.read_parquet(in_range.stored(asset, day, "parquet")),
                pd.read_parquet(by_day.stored(asset, day, "parquet")),
            )
        models = [
            joblib.load(p.stored("model", day, "joblib")).pipeline.named_steps["estimator"]
            for p in (in_range, by_day)
        ]
        np.testing.assert_array_equal(models[0].coef_, models[1].coef_)
        reports = [
            json.loads(p.stored("evaluation_report", day, "json").read_text())
            for p in (in_range, by_day)
        ]
        for key in ("decision", "champion_version", "metrics", "window"):
            assert reports[0][key] == reports[1][key], (day, key)
        # The range reads its earlier days once as references of its later ones and counts
        # their categories once: each day's drift report is still that of its own run.
        drift = [
            json.loads((p.lake_dir / f"synthetic/drift/features/{day}.json").read_text())
            for p in (in_range, by_day)
        ]
        assert drift[0] == drift[1], day
    history = [
        json.loads((p.lake_dir / "synthetic/registry/alias_history.json").read_text())
        for p in (in_range, by_day)
    ]
    assert [(h["alias"], h["version"]) for h in history[0]] == [
        (h["alias"], h["version"]) for h in history[1]
    ]

    # Each day is its own partition: its own metadata and its own check evaluations.
    rows = {
        m.partition: m.metadata["dagster/row_count"].value
        for m in result.asset_materializations_for_node(in_range.node("raw_data"))
    }
    assert rows == {day: 1000 for day in DAYS}
    for asset in DAILY_ASSETS:
        for event in result.asset_materializations_for_node(in_range.node(asset)):
            assert event.metadata["step_wall_seconds"].value > 0, asset
    assert evaluations(in_range, "validated_data", "gx_validity") == {day: True for day in DAYS}
    assert set(evaluations(in_range, "features", "features_drift")) == set(DAYS)


def test_a_bad_day_fails_the_range_naming_it_and_keeps_its_good_version(tmp_path):
    contract = contract_with(tmp_path, "synthetic")
    platform = Platform(contract, tmp_path / "platform")
    platform.land(DAYS[0], len(DAYS))
    assert platform.materialize(DAYS[1], selection=["raw_data", "validated_data"]).success
    good = platform.stored("validated_data", DAYS[1], "parquet").read_bytes()
    platform.land(DAYS[1], 1, fault="out_of_range")

    result = materialize_range(platform, DAYS[0], DAYS[-1])

    assert not result.success
    message = result.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert "validated_data: 1 of 3 days failed" in message
    assert f"synthetic_{DAYS[1]}.csv (partition {DAYS[1]}) failed the quality gate" in message
    # The bad day keeps its good version; the other days were computed and stored.
    assert platform.stored("validated_data", DAYS[1], "parquet").read_bytes() == good
    for day in (DAYS[0], *DAYS[2:]):
        assert platform.stored("validated_data", day, "parquet").is_file()
    assert evaluations(platform, "validated_data", "gx_validity") == {
        DAYS[0]: True,
        DAYS[1]: False,
        DAYS[2]: True,
    }
    # Nothing downstream ran on a range that holds a bad day.
    assert platform.materialized("features") == set()


def test_rejected_days_of_a_range_are_not_registered_and_do_not_stop_the_others(tmp_path):
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    # No model can reach these: every day is rejected.
    document["evaluation"]["value_thresholds"] = {"r2": 0.9999}
    path = tmp_path / "synthetic.yaml"
    path.write_text(yaml.safe_dump(document))
    platform = Platform(load_contract(path), tmp_path / "platform")
    platform.land(DAYS[0], 2)

    result = materialize_range(platform, DAYS[0], DAYS[1])

    assert result.success
    assert evaluations(platform, "evaluation_report", "promotion_verdict") == {
        DAYS[0]: False,
        DAYS[1]: False,
    }
    assert not (platform.lake_dir / "synthetic/registry/aliases.json").exists()
    for day in DAYS[:2]:
        registered = json.loads(platform.stored("registered_model", day, "json").read_text())
        assert registered["version"] is None and registered["registered"] is False
        assert registered["decision"] == "reject"
        assert registered["outcome"] == f"rejected: {registered['reason']}"
        assert "misses the bound (at least 0.9999)" in registered["reason"]


def test_a_day_whose_input_was_never_materialised_fails_alone_named(tmp_path):
    contract = contract_with(tmp_path, "synthetic")
    platform = Platform(contract, tmp_path / "platform")
    platform.land(DAYS[0], 2)
    ingestion = ["raw_data", "validated_data", "features"]
    assert materialize_range(platform, DAYS[0], DAYS[1], ingestion).success

    # The models of the three days: the third day's features do not exist.
    result = materialize_range(platform, DAYS[0], DAYS[2], ["model"])

    assert not result.success
    message = result.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert "model: 1 of 3 days failed" in message
    assert f"features partition {DAYS[2]} is not in storage" in message
    for day in DAYS[:2]:
        assert platform.stored("model", day, "joblib").is_file()


def test_a_day_evaluated_before_the_day_before_is_registered_meets_the_champion_it_left(tmp_path):
    # A backfill's runs: the evaluation runs chunk after chunk, then the registry and the
    # champion's monitoring take the evaluated range, here in one run of both
    # (ml_platform/platform/steps.py lists the waves).
    contract = contract_with(tmp_path, "synthetic")
    by_day = Platform(contract, tmp_path / "by_day")
    chunked = Platform(contract, tmp_path / "chunked")
    for platform in (by_day, chunked):
        platform.land(DAYS[0], len(DAYS))
    for day in DAYS:
        assert by_day.materialize(day, selection=DAILY_ASSETS).success
    upstream = ALL_ASSETS

    assert materialize_range(chunked, DAYS[0], DAYS[1], upstream).success
    assert materialize_range(chunked, DAYS[2], DAYS[2], upstream).success
    assert not (chunked.lake_dir / "synthetic/registry").exists()
    chain = ["registered_model", "champion_performance"]
    assert materialize_range(chunked, DAYS[0], DAYS[2], chain).success

    reports = {
        p: [json.loads(p.stored("evaluation_report", day, "json").read_text()) for day in DAYS]
        for p in (by_day, chunked)
    }
    fields = ("decision", "champion_version", "champion_after", "champion_metrics")
    assert [[r[f] for f in fields] for r in reports[chunked]] == [
        [r[f] for f in fields] for r in reports[by_day]
    ]
    # The third day met a champion promoted by the second day, before it was registered.
    assert reports[chunked][2]["champion_version"] == reports[chunked][1]["champion_after"]
    assert reports[chunked][1]["decision"] == "promote"
    history = [
        json.loads((p.lake_dir / "synthetic/registry/alias_history.json").read_text())
        for p in (chunked, by_day)
    ]
    assert [(h["alias"], h["version"]) for h in history[0]] == [
        (h["alias"], h["version"]) for h in history[1]
    ]
    # The monitoring of each day scored the same serving champion as one by one.
    monitoring = [
        [json.loads(p.stored("champion_performance", day, "json").read_text()) for day in DAYS]
        for p in (chunked, by_day)
    ]
    assert monitoring[0] == monitoring[1]
