"""The history gate: bounds from a day's reference days, and broken real days it stops."""

import math
from pathlib import Path
from urllib.parse import urlparse

import dagster as dg
import pandas as pd
import pytest
import yaml

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.contracts.schema import type_rows
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.platform.records import day_records
from ml_platform.registry.store import MODEL_FILE
from ml_platform.validation.expectations import HISTORY, quality_gate
from ml_platform.validation.history import (
    PROFILE_KEY,
    Bound,
    bounds_of,
    count_bound,
    day_profile,
    gated_statistics,
    history_parameters,
    judge,
    robust_sd,
    share_bound,
    window_from_profiles,
)
from ml_platform_tests.conftest import DAILY_ASSETS, Platform, days_from, lake_registry

pytestmark = pytest.mark.slow

GOOD_DAYS = days_from("2013-01-01", 4)
EMPTIED_LABEL_DAY = "2013-01-05"
HALF_EMPTY_DAY = "2013-01-06"


def test_robust_sd_is_the_scaled_median_absolute_deviation_and_ignores_one_outlier():
    assert robust_sd([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(1.4826)
    assert robust_sd([1.0, 2.0, 3.0, 4.0, 500.0]) == pytest.approx(1.4826)
    assert robust_sd([0.2, 0.2, 0.2]) == 0.0


def test_a_stable_share_is_widened_by_the_floor_and_clipped_to_zero_and_one():
    assert share_bound([0.01, 0.01, 0.01], spread=4.0, floor=0.05) == Bound(
        0.01, 0.01, 0.0, pytest.approx(0.06)
    )
    high = share_bound([0.98, 0.99, 0.99], spread=4.0, floor=0.05)
    assert high.high == 1.0 and high.low == pytest.approx(0.93)


def test_a_noisy_share_is_widened_by_spread_robust_sds():
    history = [0.1, 0.2, 0.3, 0.4, 0.5]
    bound = share_bound(history, spread=2.0, floor=0.01)
    margin = 2.0 * robust_sd(history)
    assert margin == pytest.approx(0.29652)
    assert (bound.low, bound.high) == (0.0, pytest.approx(0.5 + margin))
    assert bound.holds(0.79) and not bound.holds(0.8)


def test_a_count_floor_is_relative_to_the_median_and_counts_stay_non_negative():
    bound = count_bound([1000.0, 1000.0, 1000.0], spread=4.0, floor=0.25)
    assert (bound.low, bound.high) == (750.0, 1250.0)
    assert bound.holds(750) and not bound.holds(749) and not bound.holds(1251)
    assert count_bound([1.0, 2.0, 40.0], spread=4.0, floor=0.25).low == 0.0
    # A count that never moved in a small history still allows one more or one less: the
    # first row of a column never filled, or one new category, is no broken delivery.
    assert count_bound([0.0, 0.0, 0.0], spread=4.0, floor=0.25).high == 1.0
    one_value = count_bound([1.0, 1.0, 1.0], spread=4.0, floor=0.25)
    assert (one_value.low, one_value.high) == (0.0, 2.0)


def test_a_counts_bounds_are_the_whole_counts_inside_as_ge_holds_them():
    # 4 robust sds of [100, 101, 103] are 5.93: 94.07 to 108.93, so 95 to 108 rows.
    bound = count_bound([100.0, 101.0, 103.0], spread=4.0, floor=0.0)
    assert (bound.low, bound.high) == (95.0, 108.0)
    assert not bound.holds(94) and bound.holds(95) and bound.holds(108) and not bound.holds(109)


def test_an_undefined_value_is_never_within_bounds():
    bound = Bound(0.1, 0.2, 0.0, 0.5)
    assert not bound.holds(None) and not bound.holds(math.nan)


def flights_with_history(tmp_path, **history) -> Contract:
    """The bundled flights contract with `quality.history` settings, written to tmp_path."""
    document = yaml.safe_load(bundled_contracts()["flights"].read_text())
    document["quality"]["history"] = history
    path = tmp_path / "flights.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_contract(path)


def test_statistics_with_too_few_days_get_no_bounds(tmp_path):
    contract = flights_with_history(tmp_path, min_days=3)
    keys = [s.key for s in gated_statistics(contract)]
    # Null shares only of columns that may hold nulls: the others are gx_completeness's.
    assert "null_share(tailnum)" in keys and "null_share(carrier)" not in keys
    assert {"labelled_share(delayed)", "positive_rate(delayed)", "row_count"} <= set(keys)
    profiles = [{"row_count": 900.0, "positive_rate(delayed)": None} for _ in range(3)]
    profiles[0]["positive_rate(delayed)"] = 0.2
    bounds = bounds_of(gated_statistics(contract), profiles, contract)
    assert set(bounds) == {"row_count"}


def test_a_short_history_is_unbounded_in_the_suite_parameters(tmp_path):
    contract = flights_with_history(
        tmp_path, reference={"mode": "previous_days", "days": 7}, min_days=3
    )
    stats = gated_statistics(contract)
    profile = {"null_share(tailnum)": 0.01, "row_count": 1000.0}
    short = window_from_profiles(contract, "2013-01-05", {"2013-01-03": profile})
    assert short.too_short and short.bounds == {}
    assert "the history is too short yet: 1 of the 3 reference days" in short.note()
    assert set(history_parameters(stats, short).values()) == {None}

    window = window_from_profiles(contract, "2013-01-05", {d: profile for d in GOOD_DAYS})
    assert window.stored == GOOD_DAYS and not window.too_short
    parameters = history_parameters(stats, window)
    # GE checks the present share: a null share of 0 to 0.26 is a present share of 0.74 to 1.
    tailnum = next(s for s in stats if s.key == "null_share(tailnum)")
    assert parameters[tailnum.parameter("min")] == pytest.approx(0.74)
    assert parameters[tailnum.parameter("max")] == pytest.approx(1.0)
    assert judge({"null_share(tailnum)": 0.5, "row_count": 1000.0}, window.bounds) == [
        "null_share(tailnum)"
    ]


ACCENTED = """
name: shop
description: a shop's sales, priced per unit
owners: ["team:x"]
source: {kind: external}
partitions: {start_date: 2024-01-01}
landing: {file_pattern: "shop_{date}.csv", format: csv}
event_time: {column: ts, timezone: UTC}
columns:
  - {name: ts, dtype: datetime}
  - {name: "prix_unité", dtype: float, nullable: true}
  - {name: y, dtype: int}
label: {name: y_label, task: classification, source: y, rule: {op: "==", value: 1}}
leakage_columns: []
features:
  - {name: prix, kind: numeric, source: "prix_unité"}
quality:
  row_count: {min: 1}
  history: {reference: {mode: previous_days, days: 7}, min_days: 3}
"""


def test_a_column_named_beyond_ascii_is_gated_on_its_own_day(tmp_path):
    path = tmp_path / "shop.yaml"
    path.write_text(ACCENTED)
    contract = load_contract(path)
    day = "2024-01-04"
    landed = pd.DataFrame(
        {
            "ts": [f"{day}T{h:02d}:00:00" for h in range(20)],
            "prix_unité": [1.0 + h for h in range(20)],
            "y": [h % 2 for h in range(20)],
        }
    ).to_csv(index=False)
    name = f"shop_{day}.csv"
    rows = type_rows(read_landed_file(landed.encode(), name, day, []), contract, where=name)
    profile = day_profile(rows, contract)
    history = {d: profile for d in ["2024-01-01", "2024-01-02", "2024-01-03"]}

    report, _ = quality_gate(contract).validate(
        rows, day, window_from_profiles(contract, day, history)
    )

    # Judged against its history like any column: bounds given to GE, the day within them.
    assert report.of(HISTORY) == [] and report.failures == []
    assert report.evaluated > 0


def shop_day(contract: Contract, day: str, rows: int) -> pd.DataFrame:
    """`rows` typed rows of the ACCENTED contract's day, as landed."""
    landed = pd.DataFrame(
        {
            "ts": [f"{day}T{h % 24:02d}:00:00" for h in range(rows)],
            "prix_unité": [1.0 + h for h in range(rows)],
            "y": [h % 2 for h in range(rows)],
        }
    ).to_csv(index=False)
    name = f"shop_{day}.csv"
    return type_rows(read_landed_file(landed.encode(), name, day, []), contract, where=name)


def test_ge_fails_a_row_count_just_below_a_fractional_low_bound(tmp_path):
    # GE truncates a count expectation's bounds: given 94.07, it would pass 94 rows.
    path = tmp_path / "shop.yaml"
    settings = "min_days: 3, spread: 4.0, count_floor: 0.001}"
    path.write_text(ACCENTED.replace("min_days: 3}", settings))
    contract = load_contract(path)
    day = "2024-01-04"
    history = {
        d: day_profile(shop_day(contract, d, rows), contract)
        for d, rows in [("2024-01-01", 100), ("2024-01-02", 101), ("2024-01-03", 103)]
    }
    window = window_from_profiles(contract, day, history)
    assert (window.bounds["row_count"].low, window.bounds["row_count"].high) == (95.0, 108.0)

    gate = quality_gate(contract)
    short, _ = gate.validate(shop_day(contract, day, 94), day, window)
    enough, _ = gate.validate(shop_day(contract, day, 95), day, window)

    [finding] = [f.finding for f in short.of(HISTORY)]
    assert finding is not None and finding.statistic.key == "row_count" and finding.today == 94
    assert "row_count" not in [f.finding.statistic.key for f in enough.of(HISTORY) if f.finding]


@pytest.fixture(scope="module")
def platform(tmp_path_factory) -> Platform:
    """Four real flights days, judged against the previous 7 days; the last through the daily
    graph, whose model serves: the gates read the days' data, and one champion is enough."""
    root = tmp_path_factory.mktemp("history")
    contract = flights_with_history(
        root, reference={"mode": "previous_days", "days": 7}, min_days=3
    )
    platform = Platform(contract, root / "platform")
    platform.land(GOOD_DAYS[0], len(GOOD_DAYS))
    data = ["raw_data", "validated_data", "features"]
    platform.results = {day: platform.materialize(day, selection=data) for day in GOOD_DAYS[:-1]}
    platform.results[GOOD_DAYS[-1]] = platform.materialize(GOOD_DAYS[-1])
    # A small day's model may be rejected (and fail its run) by the value thresholds; every day
    # passes its data gates either way.
    assert platform.materialized("validated_data") == set(GOOD_DAYS)
    return platform


def history_check(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    return next(c for c in result.get_asset_check_evaluations() if c.check_name == HISTORY)


def land_edited(platform: Platform, day: str, edit) -> None:
    """Land `day` as the source delivers it, then rewrite its file with `edit(frame)` applied."""
    platform.land(day, 1)
    path = platform.landing_dir / platform.contract.landing.file_name(day)
    # As text, so every other value is written back exactly as it was landed.
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    edit(frame)
    path.write_text(frame.to_csv(index=False))


def materialize_range(platform: Platform, days: list[str]) -> dg.ExecuteInProcessResult:
    """raw_data and validated_data of `days` in one run, as a backfill runs a range."""
    return dg.materialize(
        list(platform.defs.assets or []),
        resources=platform.defs.resources,
        instance=platform.instance,
        selection=[platform.key("raw_data"), platform.key("validated_data")],
        tags={
            "dagster/asset_partition_range_start": days[0],
            "dagster/asset_partition_range_end": days[-1],
        },
        raise_on_error=False,
    )


def test_a_first_day_passes_with_a_note_that_the_history_is_too_short(platform):
    first = history_check(platform.results[GOOD_DAYS[0]])
    assert first.passed
    assert "the history is too short yet: 0 of the 3 reference days needed are stored" in (
        first.description
    )
    fourth = history_check(platform.results[GOOD_DAYS[3]])
    assert fourth.passed and "within their bounds from 3 reference days" in fourth.description
    assert fourth.metadata["history_reference_days"].value == GOOD_DAYS[:3]
    # What the day was compared with: the version Dagster recorded of each reference day.
    recorded = {
        day: platform.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=platform.key("validated_data"), asset_partitions=[day]),
            limit=1,
        ).records[0]
        for day in GOOD_DAYS[:3]
    }
    assert fourth.metadata["history_reference_data_versions"].value == {
        day: record.asset_materialization.tags["dagster/data_version"]
        for day, record in recorded.items()
    }
    assert fourth.metadata["history_reference_runs"].value == {
        day: record.run_id for day, record in recorded.items()
    }
    assert platform.stored("validated_data", GOOD_DAYS[3], "parquet").exists()


def test_an_emptied_label_source_fails_and_leaves_the_champion_byte_identical(platform):
    registry = lake_registry(platform.lake_dir, "flights")
    champion = registry.alias("champion")
    assert champion is not None, "the good days produced a champion"
    # The champion's MLflow files (its model and manifest), its versions and the aliases.
    folder = Path(urlparse(registry.model_version(champion).source).path)
    champion_files = sorted(folder.rglob("*"))
    assert folder / MODEL_FILE in champion_files
    before = {p: p.read_bytes() for p in champion_files if p.is_file()}
    state = (registry.aliases(), registry.versions(), registry.model_version(champion).version)
    # Each accepted day records the profile its later days' gates compare with.
    good = day_records(platform.instance, platform.key("validated_data"), GOOD_DAYS)
    assert all(PROFILE_KEY in good[day].metadata for day in GOOD_DAYS)

    def empty_arr_delay(frame: pd.DataFrame) -> None:
        frame["arr_delay"] = ""

    land_edited(platform, EMPTIED_LABEL_DAY, empty_arr_delay)
    result = platform.materialize(EMPTIED_LABEL_DAY)

    # A rejected day is a verdict on the day, not a failure of the run (docs/verdicts.md).
    assert result.success
    check = history_check(result)
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert "the share of rows with a label (delayed) is 0.0% today" in check.description
    assert "the share of missing values of column arr_delay is 100.0% today" in check.description
    assert "fix it upstream and re-land it" in check.description
    assert "tune quality.history in the contract" in check.description
    failures = check.metadata["history_failures"].value
    assert failures["labelled_share(delayed)"]["today"] == 0.0
    assert failures["labelled_share(delayed)"]["history_min"] > 0.95
    # The reference days are named once, and every statistic judged is in the table.
    assert check.metadata["history_reference_days"].value == GOOD_DAYS
    assert check.description.count(GOOD_DAYS[0]) == 1
    table = {r.data["statistic"]: r.data for r in check.metadata["history_table"].value.records}
    assert table["labelled_share(delayed)"]["verdict"] == "outside"
    assert table["row_count"]["verdict"] == "within"
    # The day stops at its gate: it is recorded rejected, no asset after it accepts the day
    # (features has no accepted input, the model's window lacks its own day), nothing is
    # stored for it, no model, and the champion is unchanged.
    records = {
        e.asset_key: e.materialization.metadata for e in result.get_asset_materialization_events()
    }
    assert records[platform.key("validated_data")]["verdict"].value == "failed quality gate"
    assert records[platform.key("features")]["verdict"].value == "no accepted input"
    after = DAILY_ASSETS[DAILY_ASSETS.index("validated_data") + 1 :]
    assert {platform.key(a) for a in after} <= set(records)
    assert not any(records[platform.key(a)]["accepted"].value for a in after)
    assert not platform.stored("validated_data", EMPTIED_LABEL_DAY, "parquet").exists()
    assert not platform.stored("model", EMPTIED_LABEL_DAY, "joblib").exists()
    assert PROFILE_KEY not in records[platform.key("validated_data")]
    assert sorted(folder.rglob("*")) == champion_files
    assert {p: p.read_bytes() for p in before} == before
    assert (registry.aliases(), registry.versions(), registry.model_version(champion).version) == (
        state
    )


def test_a_nullable_column_empty_on_half_the_rows_fails_naming_it(platform):
    def empty_half_the_tailnums(frame: pd.DataFrame) -> None:
        frame.loc[frame.index % 2 == 0, "tailnum"] = ""

    land_edited(platform, HALF_EMPTY_DAY, empty_half_the_tailnums)
    result = platform.materialize(HALF_EMPTY_DAY, selection=["raw_data", "validated_data"])

    assert result.success  # a rejected day is a verdict, not a failure of the run
    check = history_check(result)
    assert not check.passed
    assert "the share of missing values of column tailnum is 50." in check.description
    failures = check.metadata["history_failures"].value
    assert failures["null_share(tailnum)"]["column"] == "tailnum"
    assert failures["null_share(tailnum)"]["today"] >= 0.5 > failures["null_share(tailnum)"]["high"]
    # The other checks of the day pass: only its history says it is broken (and the day's
    # delivery check, which says it was rejected for it).
    checks = result.get_asset_check_evaluations()
    others = [c for c in checks if c.check_name not in (HISTORY, "delivery_accepted")]
    assert others and all(c.passed for c in others)
    [delivery] = [c for c in checks if c.check_name == "delivery_accepted"]
    assert not delivery.passed and "(gx_history)" in (delivery.description or "")


def test_a_range_judges_each_day_against_the_days_before_it_that_passed(tmp_path):
    contract = flights_with_history(
        tmp_path, reference={"mode": "previous_days", "days": 7}, min_days=3
    )
    platform = Platform(contract, tmp_path / "platform")
    days = days_from("2013-01-01", 6)
    platform.land(days[0], len(days))

    def empty_half_the_tailnums(frame: pd.DataFrame) -> None:
        frame.loc[frame.index % 2 == 0, "tailnum"] = ""

    land_edited(platform, days[4], empty_half_the_tailnums)
    # One run over the six days, as a backfill runs them.
    result = materialize_range(platform, days)

    assert result.success  # the rejected day is a verdict, not a failure of the run
    checks = {
        c.partition: c for c in result.get_asset_check_evaluations() if c.check_name == HISTORY
    }
    assert [day for day, check in sorted(checks.items()) if not check.passed] == [days[4]]
    # The broken day never became history: the day after it is judged against the four before.
    assert checks[days[5]].metadata["history_reference_days"].value == days[:4]
    assert checks[days[3]].metadata["history_reference_days"].value == days[:3]
    # The reference days this run judged first are named as this run's: Dagster records their
    # data versions only when the step ends.
    assert checks[days[5]].metadata["history_reference_data_versions"].value == dict.fromkeys(
        days[:4], "recorded by this run"
    )
    assert checks[days[5]].metadata["history_reference_runs"].value == dict.fromkeys(
        days[:4], result.run_id
    )
    assert not platform.stored("validated_data", days[4], "parquet").exists()
