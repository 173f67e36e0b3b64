"""Write-audit-publish: a rejected re-delivery leaves every accepted partition of its day as it was.

A good file is materialised through the whole daily graph first; a bad file for the same day is
then landed and run. raw_data records each delivery as it was parsed; validated_data (the
accepted layer) and every asset after it keep their accepted version byte for byte and record
the day's verdict, and the rejected file's parse is kept in the day's quarantine, where the
record and the failed check say it is. The run succeeds: a rejected day is an outcome, not a
failure. A corrected re-delivery is accepted by a plain run.
"""

from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest

from ml_platform_tests.conftest import DAILY_ASSETS, Platform, contract_with

pytestmark = pytest.mark.slow

DAY = "2024-01-01"
FILE = f"synthetic_{DAY}.csv"
WHERE = f"{FILE} (partition {DAY})"
# The accepted layer and everything after it: kept byte for byte when a re-delivery is rejected.
ACCEPTED = {
    "validated_data": "parquet",
    "features": "parquet",
    "drift_report": "json",
    "model": "joblib",
    "evaluation_report": "json",
}
AFTER_VALIDATION = [a for a in DAILY_ASSETS if a not in ("raw_data", "validated_data")]


@pytest.fixture
def platform(tmp_path) -> Platform:
    """The synthetic graph with the good file of DAY materialised through every daily asset."""
    platform = Platform(contract_with(tmp_path, "synthetic"), tmp_path / "p")
    platform.land(DAY, 1)
    result = platform.materialize(DAY)
    assert result.success
    assert {a: record(result, platform, a)["verdict"] for a in DAILY_ASSETS} == dict.fromkeys(
        DAILY_ASSETS, "accepted"
    )
    return platform


def accepted(platform: Platform, day: str = DAY) -> dict[str, bytes]:
    return {asset: platform.stored(asset, day, ext).read_bytes() for asset, ext in ACCEPTED.items()}


def landed(platform: Platform) -> pd.DataFrame:
    return pd.read_csv(platform.landing_dir / FILE)


def check(result: dg.ExecuteInProcessResult, name: str) -> dg.AssetCheckEvaluation:
    return next(c for c in result.get_asset_check_evaluations() if c.check_name == name)


def record(
    result: dg.ExecuteInProcessResult, platform: Platform, asset: str, day: str = DAY
) -> dict[str, Any]:
    """The metadata the run recorded for `day` of `asset` (its verdict, reason, ...)."""
    [materialization] = [
        m
        for m in result.asset_materializations_for_node(platform.node(asset))
        if m.partition == day
    ]
    return {name: entry.value for name, entry in materialization.metadata.items()}


def retried(result: dg.ExecuteInProcessResult) -> bool:
    return any(e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY for e in result.all_events)


def assert_outcome_not_failure(result: dg.ExecuteInProcessResult) -> None:
    """The run succeeded, with no failed step and nothing retried."""
    assert result.success
    assert result.get_step_failure_events() == []
    assert not retried(result)


def test_a_day_failing_validation_keeps_its_accepted_version_and_quarantines_the_file(platform):
    good = landed(platform)
    before = accepted(platform)
    platform.land(DAY, 1, fault="out_of_range")
    bad = landed(platform)

    result = platform.materialize(DAY)

    assert_outcome_not_failure(result)
    assert accepted(platform) == before
    # raw_data records the delivery as it arrived; the gate after it rejected it.
    raw = record(result, platform, "raw_data")
    assert raw["verdict"] == "accepted"
    assert pd.read_parquet(platform.stored("raw_data", DAY, "parquet"))["amount"].tolist() == (
        bad["amount"].tolist()
    )
    # The bad file's parse is in the day's quarantine, linked from the failed check.
    validity = check(result, "gx_validity")
    assert not validity.passed and validity.partition == DAY
    assert validity.description.startswith(f"{WHERE}: ")
    kept = Path(validity.metadata["rejected_parse"].value)
    quarantine = (platform.lake_dir / "synthetic" / "quarantine" / DAY).resolve()
    assert kept == quarantine / f"{result.run_id}.raw_data.parquet"
    parse = pd.read_parquet(kept)
    assert parse["amount"].tolist() == bad["amount"].tolist() != good["amount"].tolist()
    # The day's record says what happened, and it is true: the verdict, the reason, the kept
    # version.
    validated = record(result, platform, "validated_data")
    assert validated["verdict"] == "failed quality gate"
    assert validated["accepted"] is True  # its accepted version stands
    assert validated["kept_previous_version"] == str(
        platform.stored("validated_data", DAY, "parquet")
    )
    assert f"{WHERE} failed the quality gate (gx_validity)" in validated["reason"]
    assert str(kept) in validated["reason"]
    assert validated["rejected_parse"] == str(kept)
    delivery = check(result, "delivery_accepted")
    assert not delivery.passed and delivery.severity == dg.AssetCheckSeverity.ERROR
    assert delivery.description.startswith(
        f"{DAY}: this delivery was rejected (failed quality gate)"
    )
    assert "keeps its earlier accepted version" in delivery.description
    # Everything after it records the day unchanged, without computing it again.
    for asset in AFTER_VALIDATION:
        assert record(result, platform, asset)["verdict"] == "unchanged", asset
    evaluated = {c.check_name for c in result.get_asset_check_evaluations()}
    assert not evaluated & {"finite_weights", "promotion_verdict"}  # no model trained nor judged


def test_a_corrected_re_delivery_is_accepted_by_a_plain_run(platform):
    good = landed(platform)
    platform.land(DAY, 1, fault="out_of_range")
    first = platform.materialize(DAY)
    assert record(first, platform, "validated_data")["verdict"] == "failed quality gate"

    # The upstream fixes its export: a corrected file differs from the first good one.
    corrected = good.copy()
    corrected.loc[0, "amount"] = good.loc[1, "amount"]
    (platform.landing_dir / FILE).write_text(corrected.to_csv(index=False))
    result = platform.materialize(DAY)

    assert_outcome_not_failure(result)
    for asset in DAILY_ASSETS:
        day = record(result, platform, asset)
        assert (day["verdict"], day["accepted"]) == ("accepted", True), asset
        assert "kept_previous_version" not in day, asset
    assert check(result, "delivery_accepted").passed
    assert check(result, "gx_validity").passed
    stored = pd.read_parquet(platform.stored("validated_data", DAY, "parquet"))
    assert stored["amount"].tolist() == corrected["amount"].tolist() != good["amount"].tolist()
    # Each delivery of the day is told apart by its content's digest.
    digests = [record(run, platform, "raw_data")["content_sha256"] for run in (first, result)]
    assert digests[0] != digests[1]


def test_a_value_too_big_for_its_int_column_fails_raw_schema_once_naming_it(platform):
    raw_before = platform.stored("raw_data", DAY, "parquet").read_bytes()
    before = accepted(platform)
    frame = landed(platform).astype({"transaction_id": "str"})
    frame.loc[5, "transaction_id"] = "1e308"
    (platform.landing_dir / FILE).write_text(frame.to_csv(index=False))

    result = platform.materialize(DAY)

    assert_outcome_not_failure(result)
    [schema] = [c for c in result.get_asset_check_evaluations() if c.check_name == "raw_schema"]
    assert not schema.passed and schema.severity == dg.AssetCheckSeverity.ERROR
    for words in (WHERE, "column transaction_id should be int", "1 of 1000", "'1e+308'"):
        assert words in schema.description
    # The delivery is rejected at raw_data: its accepted parse and everything after it stay.
    assert platform.stored("raw_data", DAY, "parquet").read_bytes() == raw_before
    assert accepted(platform) == before
    raw = record(result, platform, "raw_data")
    assert raw["verdict"] == "schema mismatch" and raw["accepted"] is True
    assert raw["kept_previous_version"] == str(platform.stored("raw_data", DAY, "parquet"))
    assert raw["reason"] == schema.description
    assert raw["rejected_parse"] == schema.metadata["rejected_parse"].value
    kept = pd.read_parquet(schema.metadata["rejected_parse"].value)
    assert kept["transaction_id"].iloc[5] == 1e308
    for asset in ["validated_data", *AFTER_VALIDATION]:
        assert record(result, platform, asset)["verdict"] == "unchanged", asset
    # The day's delivery check still says the re-delivery was rejected, and where.
    delivery = check(result, "delivery_accepted")
    assert not delivery.passed and delivery.severity == dg.AssetCheckSeverity.ERROR
    assert "raw_data" in delivery.description and "schema mismatch" in delivery.description
    assert "keeps its earlier accepted version" in delivery.description


def test_a_range_accepts_its_good_days_and_keeps_the_accepted_version_of_a_rejected_day(tmp_path):
    platform = Platform(contract_with(tmp_path, "synthetic"), tmp_path / "p")
    days = ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04"]
    good_days, redelivered, first_time = [days[0], days[2]], days[1], days[3]
    platform.land(days[0], len(days))
    gated = ["raw_data", "validated_data"]
    assert platform.materialize(redelivered, selection=gated).success
    kept = platform.stored("validated_data", redelivered, "parquet").read_bytes()
    platform.land(redelivered, 1, fault="out_of_range")
    platform.land(first_time, 1, fault="out_of_range")

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

    assert_outcome_not_failure(result)
    # Every delivery is recorded as parsed, the bad ones too.
    for day in days:
        raw = pd.read_parquet(platform.stored("raw_data", day, "parquet"))
        assert len(raw) == len(pd.read_csv(platform.landing_dir / f"synthetic_{day}.csv"))
        assert record(result, platform, "raw_data", day)["verdict"] == "accepted"
    for day in good_days:
        assert record(result, platform, "validated_data", day)["verdict"] == "accepted"
        assert platform.stored("validated_data", day, "parquet").is_file()
    # The re-delivered day keeps its accepted version; the day rejected on its first delivery
    # is a tombstone, with no file.
    again = record(result, platform, "validated_data", redelivered)
    assert (again["verdict"], again["accepted"]) == ("failed quality gate", True)
    assert platform.stored("validated_data", redelivered, "parquet").read_bytes() == kept
    tombstone = record(result, platform, "validated_data", first_time)
    assert (tombstone["verdict"], tombstone["accepted"], tombstone["accepted_rows"]) == (
        "failed quality gate",
        False,
        0,
    )
    assert (
        f"synthetic_{first_time}.csv (partition {first_time}) failed the quality gate"
        in (tombstone["reason"])
    )
    assert not platform.stored("validated_data", first_time, "parquet").exists()
    delivery = {
        c.partition: c.passed
        for c in result.get_asset_check_evaluations()
        if c.check_name == "delivery_accepted"
    }
    assert delivery == {d: d in good_days for d in days}
    for day in (redelivered, first_time):
        rejected = (
            platform.lake_dir / "synthetic/quarantine" / day / f"{result.run_id}.raw_data.parquet"
        )
        assert rejected.is_file(), day
