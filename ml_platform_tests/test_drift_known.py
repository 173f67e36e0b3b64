"""Drift on the days found wrong by review: a day of a few rows, a blocking feature without
values on the day, a reference window longer than 64 days read over a range, a tiny day in the
reference window, and the drift plot of a small day."""

import collections
import datetime as dt
import json
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from ml_platform.contracts.model import BUNDLED_DIR, parse_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.drift.checks import FEATURES_DRIFT_CHECK, drift_check_result
from ml_platform.drift.ks import ks_2samp_columns
from ml_platform.drift.report import _histogram
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.synthetic import file_bytes, generate_day
from ml_platform.platform import plots
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.records import DayRecord
from ml_platform_tests.conftest import Platform, days_from
from ml_platform_tests.test_drift_shapes import features

SYNTHETIC_TEXT = (BUNDLED_DIR / "synthetic.yaml").read_text()
BEFORE_DRIFT = SYNTHETIC_TEXT[: SYNTHETIC_TEXT.index("\ndrift:")] + "\n"
DAY = "2024-02-10"


def with_drift(block: str):
    """The synthetic contract with its drift section replaced by `block`."""
    return parse_contract(BEFORE_DRIFT + block, "synthetic.yaml")


def reference(count: int, rows: int) -> tuple[list[pd.DataFrame], list[str]]:
    frames = [features(rows, seed) for seed in range(count)]
    days = [(dt.date(2024, 1, 1) + dt.timedelta(days=i)).isoformat() for i in range(count)]
    return frames, days


# 1. A day of a few rows: its p-value is the exact one, not the asymptotic 0.


def test_one_value_beyond_a_small_reference_gets_the_exact_p_value_not_zero():
    # 28 reference values, one value of the day above all of them: D = 1. Under "no change"
    # that value is the largest of 29 (or the smallest) with probability 2/29; the asymptotic
    # formula, at an effective size of one value, says 0.
    x = np.arange(28, dtype="float64")[:, None]
    y = np.array([[100.0]])

    result = ks_2samp_columns(x, y)

    assert result.statistic[0] == 1.0
    assert result.pvalue[0] == pytest.approx(2 / 29, rel=1e-9)
    assert result.pvalue[0] == pytest.approx(
        stats.ks_2samp(x[:, 0], y[:, 0], method="exact").pvalue, rel=1e-12
    )


def test_days_of_one_value_like_the_reference_fire_at_most_at_the_tests_level():
    # 4000 days of one value drawn as the reference's 28 were: nothing changed, so at most
    # about alpha (0.02) of them may reach p <= 0.02. The asymptotic p-value gave 2/29 of
    # them (the days beyond the reference's range) p = 0.
    rng = np.random.default_rng(11)
    x, y = rng.normal(size=(28, 4000)), rng.normal(size=(1, 4000))

    result = ks_2samp_columns(x, y)

    assert np.mean(result.pvalue <= 0.02) <= 0.02
    assert not np.any(result.pvalue == 0.0)


def test_a_day_of_one_row_beyond_a_small_reference_is_not_drift():
    # Four reference days of 7 rows (28 values); the day holds one row, its x1 above all of
    # them. Calibrated (four days), the fixed gate would pass on p = 0 and the distance of 1
    # exceeds any day-to-day distance: the day was called drifted.
    frames, days = reference(4, rows=7)
    today = features(1, 99, x1=[50.0])

    outcome = drift_check_result(with_drift("drift: {}\n"), DAY, today, frames, days, [])

    [x1] = [v for v in outcome.document["features"] if v["feature"] == "x1"]
    assert x1["effect"] == 1.0
    assert x1["p_value"] == pytest.approx(2 / 29, rel=1e-9)
    assert x1["status"] == "stable"
    assert outcome.check.passed, outcome.check.description


def test_normal_days_keep_the_asymptotic_p_value_their_thresholds_were_set_with():
    # Hundreds of rows against thousands, as the flights days are: scipy's asymptotic p-value.
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(3600, 3)), rng.normal(0.05, 1.0, size=(900, 3))

    result = ks_2samp_columns(x, y)

    for j in range(3):
        expected = stats.ks_2samp(x[:, j], y[:, j], method="asymp").pvalue
        assert result.pvalue[j] == pytest.approx(expected, rel=1e-12)


# 2. A blocking feature without values on the day is not "no drift".

BLOCKING_X2 = "drift:\n  features:\n    x2: {blocking: true}\n"


def test_a_blocking_feature_without_values_on_the_day_blocks_the_day():
    frames, days = reference(5, rows=500)
    today = features(500, 99, x2=np.nan)

    outcome = drift_check_result(with_drift(BLOCKING_X2), DAY, today, frames, days, [])

    document = outcome.document
    # The model reads exactly this: a blocking feature among the drifting ones.
    assert document["drifting_features"] == ["x2"]
    [x2] = [v for v in document["features"] if v["feature"] == "x2"]
    assert x2["blocking"] and x2["status"] == "drift" and x2["effect"] is None
    assert "no values in the day" in x2["change"]
    assert not outcome.check.passed
    description = outcome.check.description
    assert "x2" in description and "no values" in description and "blocking" in description
    assert "blocking drift" in description
    assert "x2/ks_d" not in outcome.check.metadata  # no statistic was computed
    # The features with values keep their verdicts.
    assert all(v["status"] == "stable" for v in document["features"] if v["feature"] != "x2")


def test_a_feature_not_blocking_without_values_on_the_day_is_still_only_named():
    frames, days = reference(5, rows=500)
    today = features(500, 99, x1=np.nan)

    outcome = drift_check_result(with_drift(BLOCKING_X2), DAY, today, frames, days, [])

    assert outcome.document["drifting_features"] == []
    assert outcome.check.passed
    assert "Not tested, without values to compare: x1 (no values in the day)." in (
        outcome.check.description
    )


def test_a_day_without_rows_blocks_a_blocking_feature_and_names_the_others():
    frames, days = reference(5, rows=500)

    outcome = drift_check_result(with_drift(BLOCKING_X2), DAY, features(0, 99), frames, days, [])

    assert outcome.document["drifting_features"] == ["x2"]
    description = outcome.check.description
    assert "x2" in description and "blocking drift" in description
    assert "x1 (no values in the day)" in description
    assert "No drift" not in description


def blocking_x2_contract(tmp_path: Path):
    # x2 may be missing (nullable), so a day can hold no value of it and still be accepted.
    text = BEFORE_DRIFT.replace(
        "{name: x2, dtype: float}", "{name: x2, dtype: float, nullable: true}"
    )
    text += "drift:\n  reference: {mode: previous_days, days: 7}\n  features:\n"
    text += "    x2: {blocking: true}\n    temperature: {exclude: true}\n"
    return parse_contract(text, str(tmp_path / "synthetic.yaml"))


def store_validated(platform: Platform, day: str, **columns) -> None:
    """A day's typed rows as validated_data, as if the quality gate had accepted them."""
    contract = platform.contract
    frame = generate_day(dt.date.fromisoformat(day), seed=contract.source.seed, rows=300)
    raw = read_landed_file(file_bytes(frame), "day.csv", day, ["segment"])
    platform.put("validated_data", day, type_rows(raw, contract, day).assign(**columns), "parquet")


def run(platform: Platform, selection: list[str], **partitions) -> dg.ExecuteInProcessResult:
    defs = platform.defs
    return dg.materialize(
        [*(defs.assets or []), *(defs.asset_checks or [])],
        resources=defs.resources,
        instance=platform.instance,
        selection=[platform.key(name) for name in selection],
        raise_on_error=False,
        **partitions,
    )


def test_the_model_of_a_day_whose_blocking_feature_has_no_values_is_not_trained(tmp_path):
    platform = Platform(blocking_x2_contract(tmp_path), tmp_path)
    days = days_from("2024-01-01", 4)
    for day in days[:3]:
        store_validated(platform, day)
    store_validated(platform, days[3], x2=np.nan)
    for day in days[:3]:
        assert run(platform, ["features"], partition_key=day).success

    result = run(platform, ["features", "drift_report", "model"], partition_key=days[3])

    assert result.success
    [check] = [
        e for e in result.get_asset_check_evaluations() if e.check_name == FEATURES_DRIFT_CHECK
    ]
    assert not check.passed and "x2" in check.description
    [model] = result.asset_materializations_for_node(platform.node("model"))
    record = {name: entry.value for name, entry in model.metadata.items()}
    assert record["verdict"] == "blocking drift"
    assert record["blocking_drift"] == ["x2"]
    report = json.loads(platform.stored("drift_report", days[3], "json").read_text())
    assert report["drifting_features"] == ["x2"]


# 3. A reference window longer than 64 days: each reference day read once over a range.

LOADS: collections.Counter[str] = collections.Counter()


class CountingIOManager(LakeIOManager):
    """The lake's IO manager, counting the reference days the drift step loads (`load_of`)."""

    def load_of(
        self, record: DayRecord | None, asset_key: dg.AssetKey, day: str, fmt: str
    ) -> pd.DataFrame | None:
        LOADS[day] += 1
        frame: pd.DataFrame | None = super().load_of(record, asset_key, day, fmt)
        return frame


def test_a_range_reads_each_day_of_a_long_reference_window_once(tmp_path):
    window = 66  # longer than the 64 days the step kept before
    text = BEFORE_DRIFT + f"drift:\n  reference: {{mode: previous_days, days: {window}}}\n"
    platform = Platform(parse_contract(text, str(tmp_path / "synthetic.yaml")), tmp_path)
    days = days_from("2024-01-01", window + 3)
    for seed, day in enumerate(days):
        platform.put("features", day, features(20, seed), "parquet")
    io_manager = platform.defs.resources["io_manager"]
    counting = CountingIOManager(storage=io_manager.storage)
    LOADS.clear()

    result = dg.materialize(
        [*(platform.defs.assets or []), *(platform.defs.asset_checks or [])],
        resources={**platform.defs.resources, "io_manager": counting},
        instance=platform.instance,
        selection=[platform.key("drift_report")],
        tags={
            "dagster/asset_partition_range_start": days[window],
            "dagster/asset_partition_range_end": days[-1],
        },
        raise_on_error=False,
    )

    assert result.success
    assert len(result.asset_materializations_for_node(platform.node("drift_report"))) == 3
    # The three days' windows together hold days 1 to window + 2: each read once.
    assert set(LOADS) == set(days[: window + 2])
    assert max(LOADS.values()) == 1, LOADS.most_common(3)


# 4. A partial day in the reference window does not set the bound of every day after it.


def test_a_tiny_reference_day_does_not_hide_a_shift_for_the_whole_window():
    contract = with_drift("drift:\n  reference: {mode: previous_days, days: 28}\n")
    frames, days = reference(28, rows=1000)
    today = features(1000, 99, x1=np.random.default_rng(3).normal(0.4, 1.0, 1000))
    whole = drift_check_result(contract, "2024-01-29", today, frames, days, [])
    # Day 11 was delivered with 3 rows: its distance from the others is mostly noise.
    frames[10] = features(3, 500)

    outcome = drift_check_result(contract, "2024-01-29", today, frames, days, [])

    [x1] = [v for v in outcome.document["features"] if v["feature"] == "x1"]
    [x1_whole] = [v for v in whole.document["features"] if v["feature"] == "x1"]
    assert x1_whole["status"] == "drift"
    assert x1["status"] == "drift", outcome.check.description
    assert x1["calibration_bound"] == pytest.approx(x1_whole["calibration_bound"], abs=0.01)


# 5. The drift plot of a small day shows the day.


def test_the_histogram_of_a_small_shifted_day_shows_the_day():
    rng = np.random.default_rng(8)
    ref, cur = rng.normal(0.0, 1.0, 28_000), rng.normal(4.0, 1.0, 100)

    with plots.new_figure(4.0, 3.0) as figure:
        axes = figure.add_subplot()
        _histogram(axes, ref, cur, "x1", True)
        low, high = axes.get_xlim()

    # Nearly all the day's values are inside the view, not only its lower tail.
    assert low <= np.quantile(cur, 0.01) and np.quantile(cur, 0.99) <= high
    assert low <= np.quantile(ref, 0.01) and np.quantile(ref, 0.99) <= high
