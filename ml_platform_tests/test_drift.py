"""Drift building blocks: contract section, reference days, corrections, categorical test,
verdict rule, calibration by each feature's day-to-day movement, feature profile and the stored
report."""

import base64
import datetime as dt
import json
import re
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from scipy.spatial.distance import jensenshannon

from ml_platform.contracts import ContractError, load_contract
from ml_platform.contracts.model import BUNDLED_DIR, DriftReferenceSpec, parse_contract
from ml_platform.contracts.reference import describe_reference, reference_days
from ml_platform.drift.categorical import (
    category_counts,
    compare_categorical,
    summed_counts,
)
from ml_platform.drift.correction import benjamini_hochberg, holm
from ml_platform.drift.detect import (
    calibrate,
    calibration_bound,
    detect_drift,
    leave_one_out_distances,
)
from ml_platform.drift.report import DriftReport, render_markdown
from ml_platform.features.profile import feature_profile

SYNTHETIC_TEXT = (BUNDLED_DIR / "synthetic.yaml").read_text()
BEFORE_DRIFT = SYNTHETIC_TEXT[: SYNTHETIC_TEXT.index("\ndrift:")] + "\n"
RNG = np.random.default_rng(4)


def with_drift(block: str):
    """The synthetic contract with its drift section replaced by `block`."""
    return parse_contract(BEFORE_DRIFT + block, "synthetic.yaml")


def test_bundled_drift_settings():
    flights, synthetic = load_contract("flights"), load_contract("synthetic")
    assert flights.drift.reference == DriftReferenceSpec(days=28, same_weekday=True)
    assert synthetic.drift.reference.mode == "baseline"
    assert synthetic.drift.reference.start == dt.date(2024, 1, 1)
    for contract in (flights, synthetic):
        assert (contract.drift.alpha, contract.drift.correction) == (0.02, "holm")
        assert (contract.drift.numeric_threshold, contract.drift.categorical_threshold) == (
            0.05,
            0.1,
        )


def test_a_contract_without_drift_section_gets_the_defaults():
    contract = parse_contract(BEFORE_DRIFT, "synthetic.yaml")
    assert contract.drift.reference == DriftReferenceSpec(mode="previous_days", days=7)
    assert contract.drift.features == {}


def test_drift_section_mistakes_are_reported_with_their_lines():
    block = (
        "drift:\n"
        "  reference: {mode: baseline, days: 28}\n"
        "  alpha: 0\n"
        "  features:\n"
        "    x9: {blocking: true}\n"
        "    x1: {exclude: true, threshold: 0.1}\n"
    )
    first = len(BEFORE_DRIFT.splitlines())
    with pytest.raises(ContractError) as pydantic_error:
        with_drift(block)
    # A field error does not hide the cross-field mistakes of the same section.
    assert pydantic_error.value.problems == [
        f"line {first + 2}: drift.reference.mode: a baseline reference needs a 'start' day",
        f"line {first + 3}: drift.alpha: Input should be greater than 0 (got 0)",
        f"line {first + 5}: drift.features.x9: 'x9' is not a declared feature",
        f"line {first + 6}: drift.features.x1: an excluded feature takes no other setting",
    ]
    with pytest.raises(ContractError) as semantic:
        with_drift(block.replace("  alpha: 0\n", ""))
    assert semantic.value.problems == [
        f"line {first + 2}: drift.reference.mode: a baseline reference needs a 'start' day",
        f"line {first + 4}: drift.features.x9: 'x9' is not a declared feature",
        f"line {first + 5}: drift.features.x1: an excluded feature takes no other setting",
    ]


@pytest.mark.parametrize(
    ("reference", "problem"),
    [
        ("{mode: baseline, start: 2023-12-01}", "the baseline starts before the partitions"),
        ("{mode: previous_days, start: 2024-01-01}", "'start' belongs to a baseline reference"),
        ("{days: 3, same_weekday: true}", "same_weekday needs a window of at least 7 days"),
    ],
)
def test_reference_mistakes(reference, problem):
    with pytest.raises(ContractError, match=problem):
        with_drift(f"drift:\n  reference: {reference}\n")


def days(*isodays: str) -> list[dt.date]:
    return [dt.date.fromisoformat(d) for d in isodays]


FIRST = dt.date(2024, 1, 1)


def test_previous_days_slide_with_the_day_and_start_at_the_first_partition():
    spec = DriftReferenceSpec(mode="previous_days", days=3)
    assert reference_days(spec, dt.date(2024, 1, 10), FIRST) == days(
        "2024-01-07", "2024-01-08", "2024-01-09"
    )
    assert reference_days(spec, dt.date(2024, 1, 2), FIRST) == days("2024-01-01")
    assert reference_days(spec, FIRST, FIRST) == []


def test_a_baseline_is_fixed_and_never_holds_the_day_or_later_days():
    spec = DriftReferenceSpec(mode="baseline", start=dt.date(2024, 1, 2), days=4)
    assert reference_days(spec, dt.date(2024, 3, 1), FIRST) == days(
        "2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05"
    )
    assert reference_days(spec, dt.date(2024, 1, 4), FIRST) == days("2024-01-02", "2024-01-03")
    assert "baseline 2024-01-02 to 2024-01-05" in describe_reference(spec, dt.date(2024, 3, 1))


def test_same_weekday_keeps_the_days_of_the_window_on_the_days_weekday():
    spec = DriftReferenceSpec(mode="previous_days", days=28, same_weekday=True)
    saturday = dt.date(2013, 3, 30)
    assert reference_days(spec, saturday, dt.date(2013, 1, 1)) == days(
        "2013-03-02", "2013-03-09", "2013-03-16", "2013-03-23"
    )
    assert describe_reference(spec, saturday) == "the Saturdays of the 28 days before"


def brute_force_holm(p: np.ndarray) -> np.ndarray:
    m = len(p)
    order = np.argsort(p)
    adjusted = np.empty(m)
    for rank, i in enumerate(order):
        adjusted[i] = min(1.0, max((m - r) * p[order[r]] for r in range(rank + 1)))
    return adjusted


def test_corrections_match_their_definitions():
    for _ in range(20):
        p = RNG.random(RNG.integers(1, 12)) ** 3
        np.testing.assert_allclose(holm(p), brute_force_holm(p))
        np.testing.assert_allclose(benjamini_hochberg(p), stats.false_discovery_control(p))
    assert holm(np.array([])).size == 0


def test_categorical_shares_distance_and_chi_square():
    ref = pd.Series(["A"] * 500 + ["B"] * 300 + ["C"] * 200)
    same = compare_categorical(ref, ref.sample(frac=1.0, random_state=1))
    assert same.js_distance == 0.0 and same.pvalue == pytest.approx(1.0)

    cur = pd.Series(["A"] * 300 + ["B"] * 500 + ["C"] * 200 + [None] * 50)
    moved = compare_categorical(ref, cur)
    assert moved.n_current == 1000
    table = [[500, 300, 200], [300, 500, 200]]
    assert moved.pvalue == pytest.approx(stats.chi2_contingency(table, correction=False).pvalue)
    assert moved.js_distance == pytest.approx(
        jensenshannon([0.5, 0.3, 0.2], [0.3, 0.5, 0.2], base=2)
    )
    assert moved.largest_change() in {("A", 0.5, 0.3), ("B", 0.3, 0.5)}


def test_rare_and_new_categories_are_tested_together():
    ref = pd.Series(["A"] * 600 + ["B"] * 395 + ["r1"] * 3 + ["r2"] * 2)
    cur = pd.Series(["A"] * 590 + ["B"] * 400 + ["NEW"] * 4 + ["r1"] * 1)
    result = compare_categorical(ref, cur)
    assert set(result.pooled) == {"NEW", "r1", "r2"}
    assert result.dof == 2  # A, B and one pooled cell
    assert result.new_categories == ["NEW"]


SYNTHETIC = load_contract("synthetic")


def synthetic_features(rows: int, x1_shift: float = 0.0, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "x1": rng.normal(x1_shift, 1.0, rows),
            "x2": rng.normal(5.0, 2.0, rows),
            "x3": rng.uniform(-1.0, 1.0, rows),
            "x4": rng.normal(0.0, 1.0, rows),
            "log_amount": rng.normal(3.0, 1.0, rows),
            "segment": pd.Series(rng.choice(["A", "B", "C"], rows), dtype="str"),
            "hour": rng.integers(0, 24, rows).astype("float64"),
            "temperature": rng.normal(12.0, 2.0, rows),
        }
    )


def verdicts_by_name(reference, current, contract=SYNTHETIC):
    return {v.feature: v for v in detect_drift(reference, current, contract)}


def test_a_large_shift_drifts_and_the_rest_is_stable():
    verdicts = verdicts_by_name(synthetic_features(5000), synthetic_features(1000, 0.5, seed=1))
    assert verdicts["x1"].status == "drift"
    assert verdicts["x1"].effect > 0.15 and verdicts["x1"].p_adjusted < 1e-10
    assert "+0.5" in verdicts["x1"].change  # median moved by about half a reference sd
    assert {n for n, v in verdicts.items() if v.status == "drift"} == {"x1"}


def test_a_significant_but_small_effect_does_not_drift():
    """At 200k rows a 0.05 sd shift is highly significant, but below the effect threshold."""
    verdicts = verdicts_by_name(
        synthetic_features(200_000), synthetic_features(200_000, 0.05, seed=1)
    )
    assert verdicts["x1"].p_adjusted < 1e-20
    assert verdicts["x1"].effect < SYNTHETIC.drift.numeric_threshold
    assert verdicts["x1"].status == "stable"


def test_a_large_but_insignificant_effect_does_not_drift():
    """At 20 rows a day, a KS D above the threshold is mostly noise: the p-value gate holds."""
    verdicts = verdicts_by_name(synthetic_features(20), synthetic_features(20, 0.3, seed=1))
    assert verdicts["x1"].effect >= SYNTHETIC.drift.numeric_threshold
    assert verdicts["x1"].status == "stable"


def test_per_feature_thresholds_exclusion_and_blocking(tmp_path):
    contract = with_drift(
        "drift:\n"
        "  features:\n"
        "    x1: {threshold: 0.5, blocking: true}\n"
        "    x2: {exclude: true}\n"
        "    x3: {blocking: true}\n"
    )
    ref = synthetic_features(5000)
    cur = synthetic_features(1000, 0.5, seed=1).assign(x2=lambda f: f["x2"] + 10, x3=np.nan)
    verdicts = verdicts_by_name(ref, cur, contract)
    assert verdicts["x1"].threshold == 0.5 and verdicts["x1"].status == "stable"
    assert verdicts["x1"].blocking
    assert verdicts["x2"].status == "skipped" and "excluded" in verdicts["x2"].change
    # Blocking without values on the day: it cannot be checked, so it is held as drifted.
    assert verdicts["x3"].status == "drift" and verdicts["x3"].effect is None
    assert verdicts["x3"].change.startswith("no values in the day")
    assert verdicts["x3"].nulls_current == 1000
    assert verdicts["segment"].threshold == contract.drift.categorical_threshold


def test_calendar_features_are_never_tested():
    flights = load_contract("flights")
    mondays = pd.DataFrame(
        {
            "dep_minute_of_day": RNG.normal(700, 200, 3000),
            "arr_minute_of_day": RNG.normal(800, 200, 3000),
            "day_of_week": pd.Series(["mon"] * 3000, dtype="str"),
            "log_distance": RNG.normal(7, 0.5, 3000),
            "carrier": pd.Series(RNG.choice(["AA", "UA"], 3000), dtype="str"),
            "origin": pd.Series(RNG.choice(["EWR", "JFK"], 3000), dtype="str"),
            "dest": pd.Series(RNG.choice(["LAX", "ORD"], 3000), dtype="str"),
        }
    )
    tuesday = mondays.iloc[:1000].assign(day_of_week="tue")
    verdicts = verdicts_by_name(mondays, tuesday, flights)
    assert verdicts["day_of_week"].status == "skipped"
    assert "calendar feature" in verdicts["day_of_week"].change
    assert all(v.status == "stable" for n, v in verdicts.items() if n != "day_of_week")


def test_profile_of_numeric_and_categorical_features():
    frame = synthetic_features(1000).assign(x4=lambda f: f["x4"].mask(f.index < 100), x3=np.nan)
    profile = feature_profile(frame, SYNTHETIC)
    assert profile["x1/count"] == 1000 and profile["x1/nulls"] == 0
    assert profile["x4/count"] == 900 and profile["x4/nulls"] == 100
    assert profile["x1/min"] <= profile["x1/p05"] <= profile["x1/p50"] <= profile["x1/max"]
    assert profile["x2/mean"] == pytest.approx(frame["x2"].mean())
    assert profile["segment/distinct"] == 3
    assert 0.3 < profile["segment/top_share"] < 0.4
    assert profile["x3/count"] == 0 and "x3/mean" not in profile  # no NaN metadata
    assert all(isinstance(v, (int, float)) and np.isfinite(v) for v in profile.values())


def test_report_json_and_markdown_name_what_drifted():
    ref, cur = synthetic_features(3000), synthetic_features(1000, 0.5, seed=1)
    report = DriftReport(
        dataset="synthetic",
        partition="2024-02-10",
        reference="the 3 days before",
        reference_days=["2024-02-07", "2024-02-08", "2024-02-09"],
        missing_reference_days=[],
        reference_rows=len(ref),
        current_rows=len(cur),
        correction="holm",
        alpha=0.02,
        verdicts=detect_drift(ref, cur, SYNTHETIC),
    )
    document = json.loads(json.dumps(report.to_json()))
    assert document["drifting_features"] == ["x1"]
    assert document["drift_share"] == pytest.approx(1 / 8)
    row = next(f for f in document["features"] if f["feature"] == "x1")
    assert {"n_reference", "n_current", "effect", "threshold", "p_value", "status"} <= set(row)
    markdown = render_markdown(report, "summary line", ref, cur)
    assert "| x1 " in markdown and "drift" in markdown
    # The drifted feature's histogram and ECDF, drawn by the report charts as an embedded SVG.
    image = re.search(r"!\[drift plots\]\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", markdown)
    assert image, markdown[-200:]
    svg = ET.fromstring(base64.b64decode(image.group(1)))
    drawn = [t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert {"ref", "day"} <= set(drawn), drawn
    assert any(t.startswith("x1: drift, effect ") for t in drawn), drawn
    assert any(t.startswith("ECDF: KS D = ") for t in drawn), drawn


def moving_days(n: int, seed: int, rows: int = 1000) -> list[pd.DataFrame]:
    """Days of synthetic features whose temperature mean moves by 3 from day to day."""
    rng = np.random.default_rng(seed)
    return [
        synthetic_features(rows, seed=seed * 1000 + i).assign(
            temperature=lambda f: f["temperature"] + rng.normal(0.0, 3.0)
        )
        for i in range(n)
    ]


def test_the_bound_is_the_quantile_at_plotting_position_q_times_n_plus_one():
    distances = np.arange(1.0, 40.0)  # 39 distances: q * (n + 1) = 38 at q = 0.95
    assert calibration_bound(distances, 0.95) == 38.0
    assert calibration_bound(np.arange(1.0, 5.0), 0.6) == 3.0  # the second largest of four
    assert calibration_bound(np.arange(1.0, 5.0), 0.95) == 4.0  # too few days: the largest


def test_day_to_day_distances_are_each_day_against_the_others_with_the_day_statistic():
    days = moving_days(5, seed=1)
    days[2] = days[2].assign(segment=pd.Series(["A"] * 999 + [None], dtype="str"))
    distances = leave_one_out_distances(days, SYNTHETIC)
    assert set(distances) == {f.name for f in SYNTHETIC.features}
    for i, day in enumerate(days):
        rest = pd.concat([d for j, d in enumerate(days) if j != i], ignore_index=True)
        for name in ("x1", "hour", "temperature"):  # hour: many ties
            expected = stats.ks_2samp(rest[name], day[name]).statistic
            assert distances[name][i] == pytest.approx(expected, abs=1e-12)
        js = compare_categorical(rest["segment"], day["segment"]).js_distance
        assert distances["segment"][i] == pytest.approx(js, abs=1e-12)
    # A feature that moves every day is far from the other days; a stable one is not.
    assert distances["temperature"].min() > 3 * distances["x1"].max()


def test_verdicts_from_each_days_counted_categories_are_those_from_the_rows():
    # A range counts each reference day's categories once and sums them for each day judged;
    # a category only some days have (and a day with a missing value) must count as in the rows.
    days = moving_days(4, seed=5)
    days[1] = days[1].assign(segment=pd.Series(["A"] * 990 + ["D"] * 9 + [None], dtype="str"))
    today = moving_days(1, seed=6)[0]
    counts = [{"segment": category_counts(day["segment"])} for day in days]
    summed = summed_counts([c["segment"] for c in counts])
    pooled = pd.concat(days, ignore_index=True)["segment"]
    assert summed.sort_index().to_dict() == category_counts(pooled).sort_index().to_dict()

    plain = detect_drift(days, today, SYNTHETIC, calibrate(days, SYNTHETIC))
    counted = detect_drift(
        days, today, SYNTHETIC, calibrate(days, SYNTHETIC, counts), {"segment": summed}
    )
    assert counted == plain
    assert calibrate(days, SYNTHETIC, counts).distances["segment"].tolist() == (
        calibrate(days, SYNTHETIC).distances["segment"].tolist()
    )


def test_a_feature_that_moves_every_day_drifts_only_beyond_its_usual_movement():
    reference, today = moving_days(28, seed=2), moving_days(1, seed=3)[0]
    today = today.assign(temperature=today["temperature"] - today["temperature"].mean() + 12.5)
    ordinary = verdicts_by_name(reference, today)["temperature"]
    # The fixed gate alone fires (the day's mean is not the month's), calibration holds it.
    assert ordinary.fixed_gate and ordinary.status == "stable"
    assert ordinary.effect <= ordinary.calibration_bound
    assert ordinary.day_to_day_low < ordinary.calibration_bound <= ordinary.day_to_day_high
    assert "within its usual day-to-day movement" in ordinary.change
    assert ordinary.calibration.startswith("quantile 0.975 of each feature's 28 day-to-day")

    shifted = verdicts_by_name(reference, today.assign(temperature=today["temperature"] + 15))
    assert shifted["temperature"].status == "drift"
    assert shifted["temperature"].effect > shifted["temperature"].calibration_bound
    assert "within its usual" not in shifted["temperature"].change
    # Stable features keep their verdict: calibration only ever removes alarms.
    assert {n for n, v in shifted.items() if v.status == "drift"} == {"temperature"}


def test_a_shift_of_a_stable_feature_still_drifts_when_calibrated():
    reference = moving_days(28, seed=4)
    today = synthetic_features(1000, x1_shift=0.3, seed=99)
    x1 = verdicts_by_name(reference, today)["x1"]
    assert x1.status == "drift" and x1.effect > 2 * x1.calibration_bound


def test_without_enough_reference_days_or_when_disabled_the_fixed_gate_decides_alone():
    today = moving_days(1, seed=5)[0].assign(temperature=lambda f: f["temperature"] + 6)
    few = verdicts_by_name(moving_days(3, seed=6), today)["temperature"]
    assert few.status == "drift" and few.calibration_bound is None
    assert few.calibration == (
        "not calibrated: 3 reference day(s), fewer than drift.calibration.min_days 4; "
        "the fixed gate decides alone"
    )
    disabled = with_drift("drift:\n  calibration: {enabled: false}\n")
    off = verdicts_by_name(moving_days(10, seed=6), today, disabled)["temperature"]
    assert off.status == "drift" and off.calibration_bound is None
    assert "calibration disabled in the contract" in off.calibration
    assert calibrate(moving_days(10, seed=6), disabled).distances == {}
    pooled = verdicts_by_name(pd.concat(moving_days(10, seed=6)), today)["temperature"]
    assert pooled.status == "drift" and "not given day by day" in pooled.calibration


def test_constant_within_day_features_and_columns_are_never_tested():
    text = BEFORE_DRIFT.replace(
        "{name: x3, dtype: float}", "{name: x3, dtype: float, constant_within_day: true}"
    ).replace(
        "{name: x2, kind: numeric, source: x2}",
        "{name: x2, kind: numeric, source: x2, constant_within_day: true}",
    )
    contract = parse_contract(text, "synthetic.yaml")
    reference = moving_days(5, seed=7)
    today = synthetic_features(1000, seed=8).assign(x2=100.0, x3=5.0)
    verdicts = verdicts_by_name(reference, today, contract)
    assert verdicts["x2"].status == verdicts["x3"].status == "skipped"
    assert verdicts["x2"].change.startswith("constant within a day (constant_within_day")
    assert "its column 'x3' is marked constant_within_day" in verdicts["x3"].change
    assert set(leave_one_out_distances(reference, contract)) == {
        "x1",
        "x4",
        "log_amount",
        "segment",
        "hour",
        "temperature",
    }


def test_report_shows_each_features_bound_and_the_calibration():
    reference = moving_days(28, seed=9)
    today = moving_days(1, seed=10)[0].assign(temperature=lambda f: f["temperature"] + 20)
    verdicts = detect_drift(reference, today, SYNTHETIC)
    report = DriftReport(
        dataset="synthetic",
        partition="2024-03-01",
        reference="the baseline",
        reference_days=[f"2024-01-{d:02d}" for d in range(1, 29)],
        missing_reference_days=[],
        reference_rows=28_000,
        current_rows=1000,
        correction="holm",
        alpha=0.02,
        verdicts=verdicts,
        calibration=calibrate(reference, SYNTHETIC).note,
    )
    document = json.loads(json.dumps(report.to_json()))
    assert document["drifting_features"] == ["temperature"]
    assert document["calibration"].startswith("quantile 0.975 of each feature's 28")
    row = next(f for f in document["features"] if f["feature"] == "temperature")
    assert row["calibration_bound"] < row["effect"] and row["fixed_gate"]
    markdown = render_markdown(report, "summary", pd.concat(reference), today)
    assert " day-to-day " in markdown and " bound |" in markdown
    assert "its effect exceeds its bound (calibration: quantile 0.975" in markdown
