"""Write-audit-publish: a day that fails its gates leaves every published partition of it as it was.

A good file is materialised through the whole daily graph first; a bad file for the same day is
then landed and run: raw_data, validated_data, features and model of the day stay byte for byte,
and the rejected file's parse is kept in the day's quarantine, where the failure says it is.
"""

from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from ml_platform.ingestion.assets import staged_key
from ml_platform_tests.conftest import Platform, contract_with

pytestmark = pytest.mark.slow

DAY = "2024-01-01"
FILE = f"synthetic_{DAY}.csv"
WHERE = f"{FILE} (partition {DAY})"
PUBLISHED = {
    "raw_data": "parquet",
    "validated_data": "parquet",
    "features": "parquet",
    "model": "joblib",
}


@pytest.fixture
def platform(tmp_path) -> Platform:
    """The synthetic graph with the good file of DAY materialised through every daily asset."""
    platform = Platform(contract_with(tmp_path, "synthetic"), tmp_path / "p")
    platform.land(DAY, 1)
    assert platform.materialize(DAY).success
    return platform


def published(platform: Platform) -> dict[str, bytes]:
    return {
        asset: platform.stored(asset, DAY, ext).read_bytes() for asset, ext in PUBLISHED.items()
    }


def landed(platform: Platform) -> pd.DataFrame:
    return pd.read_csv(platform.landing_dir / FILE)


def check(result: dg.ExecuteInProcessResult, name: str) -> dg.AssetCheckEvaluation:
    return next(c for c in result.get_asset_check_evaluations() if c.check_name == name)


def error_text(result: dg.ExecuteInProcessResult) -> str:
    return "\n".join(
        e.event_specific_data.error.to_string() for e in result.get_step_failure_events()
    )


def retried(result: dg.ExecuteInProcessResult) -> bool:
    return any(e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY for e in result.all_events)


def test_a_day_failing_validation_keeps_what_was_published_and_quarantines_the_file(platform):
    good = landed(platform)
    published_raw = pd.read_parquet(platform.stored("raw_data", DAY, "parquet"))
    assert published_raw["amount"].tolist() == good["amount"].tolist()
    before = published(platform)
    platform.land(DAY, 1, fault="out_of_range")
    bad = landed(platform)

    result = platform.materialize(DAY)

    assert not result.success
    assert [e.step_key for e in result.get_step_failure_events()] == [
        platform.node("validated_data")
    ]
    assert not retried(result)
    assert published(platform) == before
    # The bad file's parse is in the day's quarantine, linked from the failed check.
    validity = check(result, "gx_validity")
    assert not validity.passed
    kept = Path(validity.metadata["rejected_parse"].value)
    quarantine = (platform.lake_dir / "synthetic" / "quarantine" / DAY).resolve()
    assert kept == quarantine / f"{result.run_id}.raw_data.parquet"
    parse = pd.read_parquet(kept)
    assert parse["amount"].tolist() == bad["amount"].tolist() != good["amount"].tolist()
    # The failure says what happened, and it is true.
    message = error_text(result)
    assert f"{WHERE} failed the quality gate (gx_validity)" in message
    assert "published raw_data, validated_data and everything after them keep their" in message
    assert str(kept) in message


def test_a_rejected_file_stays_staged_and_a_passing_file_replaces_it_when_published(platform):
    before = published(platform)
    platform.land(DAY, 1, fault="out_of_range")
    assert not platform.materialize(DAY).success
    staging = platform.lake_dir / staged_key(platform.contract, DAY)
    assert staging.is_file()  # the file raw_data last read, for a rerun after a contract change

    # A corrected file passes: it is published as the day's raw_data, and the staging is gone.
    platform.land(DAY, 1)
    result = platform.materialize(DAY, selection=["raw_data", "validated_data"])

    assert result.success
    assert not staging.exists()
    assert published(platform)["raw_data"] == before["raw_data"]
    raw = result.asset_materializations_for_node(platform.node("raw_data"))[0].metadata
    assert raw["staged"].value == str(staging.resolve())


def test_a_value_too_big_for_its_int_column_fails_raw_schema_once_naming_it(platform):
    before = published(platform)
    frame = landed(platform).astype({"transaction_id": "str"})
    frame.loc[5, "transaction_id"] = "1e308"
    (platform.landing_dir / FILE).write_text(frame.to_csv(index=False))

    result = platform.materialize(DAY)

    assert not result.success
    assert [e.step_key for e in result.get_step_failure_events()] == [platform.node("raw_data")]
    assert not retried(result)
    schema = check(result, "raw_schema")
    assert not schema.passed
    for words in (WHERE, "column transaction_id should be int", "1 of 1000", "'1e+308'"):
        assert words in schema.description
    assert published(platform) == before
    kept = pd.read_parquet(schema.metadata["rejected_parse"].value)
    assert kept["transaction_id"].iloc[5] == 1e308


def test_a_range_publishes_its_good_days_and_keeps_the_bad_days_published_version(tmp_path):
    platform = Platform(contract_with(tmp_path, "synthetic"), tmp_path / "p")
    days = ["2024-01-01", "2024-01-02", "2024-01-03"]
    platform.land(days[0], 3)
    gated = ["raw_data", "validated_data"]
    assert platform.materialize(days[1], selection=gated).success
    kept = {asset: platform.stored(asset, days[1], "parquet").read_bytes() for asset in gated}
    platform.land(days[1], 1, fault="out_of_range")

    result = dg.materialize(
        list(platform.defs.assets or []),
        resources=platform.defs.resources,
        instance=platform.instance,
        selection=[platform.key(asset) for asset in gated],
        tags={
            "dagster/asset_partition_range_start": days[0],
            "dagster/asset_partition_range_end": days[-1],
        },
        raise_on_error=False,
    )

    assert not result.success
    for asset, stored in kept.items():
        assert platform.stored(asset, days[1], "parquet").read_bytes() == stored, asset
    for day in (days[0], days[2]):
        raw = pd.read_parquet(platform.stored("raw_data", day, "parquet"))
        assert len(raw) == len(pd.read_csv(platform.landing_dir / f"synthetic_{day}.csv"))
        assert not (platform.lake_dir / staged_key(platform.contract, day)).exists()
    rejected = (
        platform.lake_dir / "synthetic/quarantine" / days[1] / f"{result.run_id}.raw_data.parquet"
    )
    assert rejected.is_file()
