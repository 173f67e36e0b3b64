"""The quality gate: a catalogue of bad files, each landed among good days, and what it does."""

import dagster as dg
import pandas as pd
import pytest
import yaml

from ml_platform.cli import main
from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts, parse_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.landing import LandingZone, land_days, scan_landing, source_day
from ml_platform.validation.expectations import (
    COMPLETENESS,
    PARTITION_DAY,
    UNIQUENESS,
    VALIDITY,
    quality_gate,
)
from ml_platform.validation.history import day_profile, window_from_profiles
from ml_platform.validation.range_gate import screen_range
from ml_platform.validation.rejected_days import REJECTED_DAYS
from ml_platform_tests.conftest import ALL_ASSETS, DAILY_ASSETS, Platform, day_files, days_from
from ml_platform_tests.test_backfill_range import materialize_range

pytestmark = pytest.mark.slow

GOOD_DAYS = ["2024-01-01", "2024-01-02"]
BAD_DAY = "2024-01-03"
BAD_FILE = f"synthetic_{BAD_DAY}.csv"
WHERE = f"{BAD_FILE} (partition {BAD_DAY})"

# fault -> (failing step, failing check or None for a raised error, words the message must hold)
CATALOGUE = {
    "empty_file": ("raw_data", None, ["is not a readable CSV file"]),
    "header_only": ("validated_data", "gx_volume", ["the file holds 0 rows, expected between 900"]),
    "wrong_delimiter": (
        "raw_data",
        "raw_schema",
        ["missing column(s) event_time, x1", "unexpected column(s) event_time;x1;x2"],
    ),
    "retyped_column": ("raw_data", "raw_schema", ["column x1 should be float", "'n/a'"]),
    "missing_column": ("raw_data", "raw_schema", ["missing column(s) x3"]),
    "extra_column": ("raw_data", "raw_schema", ["unexpected column(s) promo_code"]),
    "null_burst": (
        "validated_data",
        "gx_completeness",
        ["expect_column_values_to_not_be_null failed on column x2", "are missing"],
    ),
    "out_of_range": (
        "validated_data",
        "gx_validity",
        ["expect_column_values_to_be_between failed on column amount", "e.g. -1.0"],
    ),
    "unknown_category": (
        "validated_data",
        "gx_validity",
        ["failed on column segment", "not among the contract's allowed values, e.g. 'Z'"],
    ),
    "duplicate_rows": (
        "validated_data",
        "gx_uniqueness",
        ["expect_column_values_to_be_unique failed on column transaction_id"],
    ),
    "wrong_day": (
        "validated_data",
        "gx_partition_day",
        ["failed on column event_time: 1000 of 1000 rows (100.0%) are outside"],
    ),
    "non_utf8": ("raw_data", None, ["is not a readable CSV file", "utf-8"]),
    # Cut mid-row: the last row's half-written timestamp gives it away.
    "truncated": ("raw_data", None, ["is not a readable CSV file", "the file looks truncated"]),
    "binary_garbage": ("raw_data", None, ["is not a readable CSV file"]),
}


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    """Two good days materialised once; each case then lands one bad file for the third."""
    platform = Platform(load_contract("synthetic"), tmp_path_factory.mktemp("gate"))
    platform.land(GOOD_DAYS[0], 2)
    for day in GOOD_DAYS:
        assert platform.materialize(day).success
    return platform


def good_outputs(platform: Platform) -> dict:
    """Every stored version of the good days' assets (`<asset>/<day>/<version>.<ext>`)."""
    outputs = {
        path: path.read_bytes()
        for asset in ALL_ASSETS
        for day in GOOD_DAYS
        for path in day_files(platform.lake_dir, "synthetic", asset, day)
    }
    assert outputs, "the good days stored nothing"
    return outputs


def day_records(result) -> dict:
    """Asset key -> what the run recorded of its day: verdict, accepted, reason..."""
    return {
        e.asset_key: {name: entry.value for name, entry in e.materialization.metadata.items()}
        for e in result.get_asset_materialization_events()
    }


def read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.parametrize("fault", sorted(CATALOGUE))
def test_a_bad_file_fails_its_day_and_names_file_partition_and_reason(platform, fault):
    step, check_name, words = CATALOGUE[fault]
    before = good_outputs(platform)
    platform.land(BAD_DAY, 1, fault=fault)

    result = platform.materialize(BAD_DAY)

    # A rejected file is a verdict on its day, not a failure of the run (docs/verdicts.md).
    assert result.success
    assert not result.get_step_failure_events()
    records = day_records(result)
    rejected = records[platform.key(step)]
    assert rejected["verdict"] != "accepted"
    if check_name is None:
        message = rejected["reason"]
    else:
        checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
        assert not checks[check_name].passed
        message = checks[check_name].description
        assert check_name in rejected["reason"] or step == "raw_data"
    assert WHERE in message
    for word in words:
        assert word in message
    # The landed file is kept, the good days and their model are untouched; the assets before
    # the rejecting step accepted the day, and none after it does. (The cases share the bad
    # day: an earlier case's version of it may be kept, which the next asset then judges.)
    assert (platform.landing_dir / BAD_FILE).exists()
    assert good_outputs(platform) == before
    position = DAILY_ASSETS.index(step)
    verdicts = {asset: records[platform.key(asset)]["verdict"] for asset in DAILY_ASSETS}
    assert all(verdicts[asset] == "accepted" for asset in DAILY_ASSETS[:position]), verdicts
    assert all(verdicts[asset] != "accepted" for asset in DAILY_ASSETS[position:]), verdicts
    if not rejected["accepted"]:
        assert verdicts[DAILY_ASSETS[position + 1]] == "no accepted input"


def test_an_offending_value_holding_a_bar_keeps_the_rows_table_whole(platform):
    # A '|' in a value would start a column of its own in the markdown table of the rows.
    platform.land(BAD_DAY, 1, fault="unknown_category")
    path = platform.landing_dir / BAD_FILE
    landed = pd.read_csv(path, dtype=str, keep_default_na=False)
    landed.loc[landed["segment"] == "Z", "segment"] = "Z|Y"
    landed.to_csv(path, index=False)

    result = platform.materialize(BAD_DAY)

    check = next(c for c in result.get_asset_check_evaluations() if c.check_name == "gx_validity")
    table = str(check.metadata["offending_rows"].value).splitlines()
    columns = {line.replace("\\|", "").count("|") for line in table}
    assert len(columns) == 1, table
    assert "Z\\|Y" in table[2], table


def test_gate_failures_carry_samples_values_and_links(platform):
    platform.land(BAD_DAY, 1, fault="unknown_category")
    result = platform.materialize(BAD_DAY)
    check = next(c for c in result.get_asset_check_evaluations() if c.check_name == "gx_validity")
    meta = check.metadata
    assert meta["unexpected_values"].value == {"segment": ["Z"]}
    landed = pd.read_csv(platform.landing_dir / BAD_FILE)
    assert meta["unexpected_rows"].value == (landed["segment"] == "Z").sum() > 0
    assert "| Z " in meta["offending_rows"].value
    assert BAD_DAY in meta["validation_result"].value and BAD_DAY in meta["data_docs"].value
    assert "<html" in read(meta["data_docs"].value).lower()
    # The JSON is GE's own validation result.
    assert '"expect_column_values_to_be_in_set"' in read(meta["validation_result"].value)


def test_a_bad_relanding_of_a_good_day_keeps_its_good_version(tmp_path):
    platform = Platform(load_contract("synthetic"), tmp_path)
    platform.land("2024-01-01", 1)
    assert platform.materialize("2024-01-01").success
    kept = platform.stored("validated_data", "2024-01-01", "parquet")
    stored = kept.read_bytes()

    platform.land("2024-01-01", 1, fault="null_burst")
    result = platform.materialize("2024-01-01")
    assert result.success  # the rejected re-delivery is the day's verdict

    assert platform.stored("validated_data", "2024-01-01", "parquet").read_bytes() == stored
    record = day_records(result)[platform.key("validated_data")]
    assert record["verdict"] == "failed quality gate" and record["accepted"] is True
    assert record["kept_previous_version"] == str(kept.resolve())


def test_a_few_bad_rows_are_quarantined_with_reasons_and_the_day_passes(tmp_path):
    platform = Platform(load_contract("synthetic"), tmp_path)
    platform.land("2024-01-01", 1)
    landed = platform.landing_dir / "synthetic_2024-01-01.csv"
    frame = pd.read_csv(landed)
    frame.loc[[10, 20, 30], "amount"] = -5.0
    landed.write_text(frame.to_csv(index=False))

    result = platform.materialize("2024-01-01")

    assert result.success
    validity = next(
        c for c in result.get_asset_check_evaluations() if c.check_name == "gx_validity"
    )
    assert validity.passed and "These 3 row(s) were quarantined" in validity.description
    validated = pd.read_parquet(platform.stored("validated_data", "2024-01-01", "parquet"))
    assert len(validated) == 997 and (validated["amount"] >= 0).all()
    quarantined = pd.read_parquet(validity.metadata["quarantine"].value)
    assert quarantined["amount"].tolist() == [-5.0, -5.0, -5.0]
    assert set(quarantined["quarantine_reasons"]) == {"expect_column_values_to_be_between(amount)"}


def test_misnamed_and_out_of_range_files_are_reported_by_name(tmp_path, capsys):
    contract = load_contract("synthetic")
    zone = LandingZone(base_dir=str(tmp_path))
    list(land_days(contract, zone, [pd.Timestamp("2024-01-05").date()]))
    (tmp_path / "synthetic_latest.csv").write_text("x")
    (tmp_path / "synthetic_2024-02-30.csv").write_text("x")
    (tmp_path / "synthetic_2023-12-31.csv").write_text("x")

    scan = scan_landing(contract, [e.name for e in zone.entries() if e.refused is None])

    assert scan.days == {"2024-01-05": "synthetic_2024-01-05.csv"}
    assert "carries no parsable date" in scan.problems["synthetic_latest.csv"]
    assert "carries no parsable date" in scan.problems["synthetic_2024-02-30.csv"]
    assert "before the first partition 2024-01-01" in scan.problems["synthetic_2023-12-31.csv"]
    code = main(["landing-status", "--dataset", "synthetic", "--landing-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert f"{tmp_path / 'synthetic_latest.csv'} belongs to no partition" in err


def test_a_clean_real_month_of_flights_passes_every_gate():
    contract = load_contract("flights")
    gate = quality_gate(contract)
    text = [c.name for c in contract.columns if c.dtype == "str"]
    days = days_from("2013-01-01", 31)
    typed = {}
    for day in days:
        csv = source_day(contract, pd.Timestamp(day).date()).to_csv(index=False).encode()
        typed[day] = type_rows(read_landed_file(csv, "f", day, text), contract, day)
    # Every day of the month through the range's screen, in a few GE validations instead of one
    # per day: the screen is sound, never lenient (a day it passes passes its own validation,
    # test_range_gate.py), so no day of the month fails the gate.
    screened = screen_range(
        lambda day: None,
        contract,
        days,
        rows_of=lambda day: len(typed[day]),
        typed_of=lambda day: typed[day],
        history_on=True,
    )
    assert sorted(screened) == days
    # Each day against the days before it, with the contract's history settings; the days the
    # history judges, and the first (judged without one), also validated one by one.
    profiles: dict = {}
    judged = []
    for day in days:
        history = window_from_profiles(contract, day, profiles)
        if not history.too_short:
            judged.append(day)
        if day == days[0] or not history.too_short:
            report, _ = gate.validate(typed[day], day, history)
            assert report.failures == [], f"{day}: {[f.sentence for f in report.failures]}"
        assert screened[day].history == history, day
        profiles[day] = day_profile(typed[day], contract)
    assert gate.expectation_count >= 50
    # Same-weekday history: from the fourth week on, every day is judged.
    assert judged == days_from("2013-01-22", 10)


def typed_flights_day(contract, day: str, edit=None) -> pd.DataFrame:
    """A real flights day as landed (CSV written as an exporter writes it), then typed."""
    frame = source_day(contract, pd.Timestamp(day).date())
    if edit is not None:
        edit(frame)
    csv = frame.to_csv(index=False).encode()
    text = [c.name for c in contract.columns if c.dtype == "str"]
    return type_rows(read_landed_file(csv, f"flights_{day}.csv", day, text), contract, day)


@pytest.mark.parametrize("tailnum", ["N5,64UW", "N5\n64UW"])
def test_quoted_text_inside_a_code_column_fails_its_pattern(tailnum):
    contract = load_contract("flights")

    def mangle(frame: pd.DataFrame) -> None:
        frame.loc[3, "tailnum"] = tailnum

    typed = typed_flights_day(contract, "2013-01-01", mangle)
    report, _ = quality_gate(contract).validate(typed, "2013-01-01")

    assert [f.check for f in report.failures] == [VALIDITY]
    [failure] = report.failures
    assert (failure.expectation, failure.column) == (
        "expect_column_values_to_match_regex",
        "tailnum",
    )
    assert failure.rows == [3] and failure.unexpected_values == [tailnum]
    assert "do not match the contract's pattern ^(?:[A-Z0-9]{2,6})$" in failure.sentence


def test_a_one_column_row_key_is_checked_by_column_uniqueness(tmp_path):
    document = yaml.safe_load(bundled_contracts()["flights"].read_text())
    document["quality"]["row_key"] = ["flight"]
    path = tmp_path / "flights.yaml"
    path.write_text(yaml.safe_dump(document))
    contract = load_contract(path)
    typed = typed_flights_day(contract, "2013-01-01")

    report, _ = quality_gate(contract).validate(typed, "2013-01-01")

    # Flight numbers repeat across carriers and airports on a day: the key is not unique.
    [failure] = report.failures
    assert failure.check == UNIQUENESS
    assert (failure.expectation, failure.column) == ("expect_column_values_to_be_unique", "flight")
    duplicated = typed["flight"].duplicated(keep=False)
    assert failure.unexpected_count == duplicated.sum() > 0
    assert "are duplicates" in failure.sentence


def test_a_row_with_a_missing_or_impossible_date_fails_partition_day_naming_it():
    contract = load_contract("flights")

    def damage(frame: pd.DataFrame) -> None:
        frame["day"] = frame["day"].astype("str")
        frame.loc[4, "day"] = ""
        frame.loc[9, ["month", "day"]] = [2, "30"]

    typed = typed_flights_day(contract, "2013-01-01", damage)
    report, _ = quality_gate(contract).validate(typed, "2013-01-01")

    partition_day = report.of(PARTITION_DAY)
    assert [(f.expectation, f.column) for f in partition_day] == [
        ("expect_column_values_to_not_be_null", "event_time")
    ]
    assert partition_day[0].rows == [4, 9]
    assert "2 of" in partition_day[0].sentence and "have no event time" in partition_day[0].sentence
    # The empty day is also a missing value of a column that must be filled.
    assert [f.column for f in report.of(COMPLETENESS)] == ["day"]


def test_rejected_days_lists_each_rejected_delivery_where_and_why_until_it_is_accepted(tmp_path):
    platform = Platform(load_contract("synthetic"), tmp_path)
    good, gate, file = days_from("2024-01-01", 3)
    platform.land(good, 1)
    platform.land(gate, 1, fault="out_of_range")
    platform.land(file, 1, fault="non_utf8")
    delivery = ["raw_data", "validated_data"]
    for day in (good, gate, file):
        assert platform.materialize(day, selection=delivery).success
    # A rejected re-delivery of the good day keeps its accepted version.
    platform.land(good, 1, fault="null_burst")
    assert platform.materialize(good, selection=delivery).success

    def listed() -> dict:
        result = dg.materialize(
            list(platform.defs.assets or []),
            resources=platform.defs.resources,
            instance=platform.instance,
            selection=[platform.key(REJECTED_DAYS)],
        )
        assert result.success
        [event] = result.asset_materializations_for_node(platform.node(REJECTED_DAYS))
        return {key: value.value for key, value in event.metadata.items()}

    shown = listed()
    assert shown["rejected_day_count"] == 3
    assert shown["rejected_day_list"] == f"{good}, {gate}, {file}"
    table = shown["rejected_day_reasons"]
    assert f"| {good} | validated_data | failed quality gate (earlier version kept) |" in table
    assert f"| {gate} | validated_data | failed quality gate | " in table
    [gate_row] = [line for line in table.splitlines() if line.startswith(f"| {gate} |")]
    assert f"synthetic_{gate}.csv (partition {gate})" in gate_row
    assert f"| {file} | raw_data | " in table and "is not a readable CSV file" in table

    # The gate's day delivered again, correct: it leaves the list.
    platform.land(gate, 1)
    assert platform.materialize(gate, selection=delivery).success
    assert listed()["rejected_day_list"] == f"{good}, {file}"


@pytest.mark.parametrize("in_range", [False, True], ids=["one by one", "in one range"])
def test_the_day_after_a_header_only_file_warns_of_no_schema_change(platform_for, in_range):
    # A header alone has no values to read types from: the next day's columns are the same.
    platform = platform_for("synthetic")
    platform.land("2024-01-01", 2)
    platform.land("2024-01-01", 1, fault="header_only")
    if in_range:
        results = [materialize_range(platform, "2024-01-01", "2024-01-02", ["raw_data"])]
    else:
        results = [platform.materialize(day, ["raw_data"]) for day in ("2024-01-01", "2024-01-02")]
    [change] = [
        e
        for result in results
        for e in result.get_asset_check_evaluations()
        if e.check_name == "schema_change" and e.partition == "2024-01-02"
    ]
    assert change.passed, change.description
    assert change.description == (
        "synthetic_2024-01-02.csv (partition 2024-01-02): 2024-01-01's file held no rows, so its "
        "columns have no types to compare; same column names."
    )


TINY_CONTRACT = """
name: tiny
source: {kind: external}
partitions: {start_date: 2024-01-01}
landing: {file_pattern: "tiny_{date}.csv"}
event_time: {column: ts, timezone: UTC}
allow_extra_columns: true
columns:
  - {name: ts, dtype: datetime}
  - {name: id, dtype: int, nullable: true}
  - {name: ok, dtype: bool, nullable: true}
  - {name: x, dtype: float, nullable: true}
  - {name: y, dtype: float}
label: {name: target, task: regression, source: y}
features:
  - {name: x, kind: numeric, source: x}
quality: {row_count: {min: 1}, history: {enabled: false}}
"""


def tiny_platform(platform_for) -> Platform:
    """A small contract whose int and bool columns may be blank and which allows extra columns."""
    return platform_for(parse_contract(TINY_CONTRACT, "tiny.yaml"))


def land_text(platform: Platform, day: str, text: str) -> None:
    """Land `text` as the day's file."""
    platform.landing_dir.mkdir(parents=True, exist_ok=True)
    (platform.landing_dir / platform.contract.landing.file_name(day)).write_text(text)


def raw_data_run(platform: Platform, day: str) -> tuple[dict, dict]:
    """Materialise the day's raw_data: what it recorded, and its checks by name."""
    result = platform.materialize(day, ["raw_data"])
    assert result.success
    [record] = day_records(result).values()
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    return record, checks


def test_a_number_beyond_64_bits_is_stored_as_its_float_or_in_an_extra_column_as_text(
    platform_for,
):
    platform = tiny_platform(platform_for)
    land_text(
        platform,
        "2024-01-01",
        "ts,id,ok,x,y,ref\n"
        "2024-01-01T10:00:00,1,true,100000000000000000000000,2.0,100000000000000000000001\n"
        "2024-01-01T11:00:00,2,false,3,3.0,7\n",
    )
    record, _ = raw_data_run(platform, "2024-01-01")
    assert record["verdict"] == "accepted"
    stored = pd.read_parquet(platform.stored("raw_data", "2024-01-01", "parquet"))
    assert stored["x"].tolist() == [1e23, 3.0]
    assert stored["ref"].tolist() == ["100000000000000000000001", "7"]


def test_blanks_in_typed_columns_are_no_schema_change_but_an_extra_columns_type_is(platform_for):
    # An int column with a blank reads as float, a bool one as text: the contract types them.
    platform = tiny_platform(platform_for)
    header = "ts,id,ok,x,y,promo\n"
    land_text(platform, "2024-01-01", header + "2024-01-01T10:00:00,1,true,1.5,2.0,1\n")
    land_text(platform, "2024-01-02", header + "2024-01-02T10:00:00,,,1.5,2.0,SPRING\n")
    raw_data_run(platform, "2024-01-01")
    _, checks = raw_data_run(platform, "2024-01-02")
    change = checks["schema_change"]
    assert not change.passed
    assert change.metadata["retyped_columns"].value == {"promo": "int64 -> str"}


def test_the_day_after_a_rejected_redelivery_is_compared_with_the_kept_version(platform_for):
    platform = tiny_platform(platform_for)
    header = "ts,id,ok,x,y"
    land_text(platform, "2024-01-01", header + "\n2024-01-01T10:00:00,1,true,1.5,2.0\n")
    assert raw_data_run(platform, "2024-01-01")[0]["verdict"] == "accepted"
    land_text(platform, "2024-01-01", header.replace(",", ";") + "\n")
    kept, _ = raw_data_run(platform, "2024-01-01")
    assert (kept["accepted"], "kept_previous_version" in kept) == (True, True)
    land_text(platform, "2024-01-02", header + ",promo\n2024-01-02T10:00:00,1,true,1.5,2.0,A\n")
    _, checks = raw_data_run(platform, "2024-01-02")
    assert not checks["schema_change"].passed
    assert checks["schema_change"].metadata["new_columns"].value == ["promo"]
