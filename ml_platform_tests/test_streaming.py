"""Training and evaluation read the window a day at a time, with the results of holding it whole."""

import datetime as dt
from typing import Any

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from ml_platform.evaluation.metrics import (
    HeldOutRows,
    baseline_predictions,
    score_model,
    score_predictions,
    split_of,
)
from ml_platform.ingestion.synthetic import generate_day
from ml_platform.platform.inputs import PartitionCache, WindowPartitions
from ml_platform.platform.io_manager import LakeIOManager
from ml_platform.platform.storage import LocalStorage
from ml_platform.training.equivalence import same_order_fit
from ml_platform.training.model import (
    fit_streamed_preprocessing,
    labelled,
    make_estimator,
    make_preprocessing,
    split_holdout,
    train_model,
    window_frame,
)
from ml_platform.training.window import (
    VALIDATION_FRACTION,
    LabelSummary,
    allocate,
    data_version,
    label_summary,
    scan_window,
    split_window,
    stream,
)
from ml_platform_tests.conftest import days_from
from ml_platform_tests.test_training import (
    FLIGHTS,
    FLIGHTS_SGD,
    SYNTHETIC,
    features_of,
    with_model,
    with_training,
)

SYNTHETIC_SGD = with_model(SYNTHETIC, estimator="sgd", max_epochs=8, patience=3)
DAYS = days_from("2024-01-01", 4)


def synthetic_days(rows: int = 60) -> dict[str, pd.DataFrame]:
    """Four synthetic days, with rare categories, missing values and unlabelled rows."""
    window = {
        day: features_of(
            generate_day(dt.date.fromisoformat(day), seed=3, rows=rows), SYNTHETIC, day
        )
        for day in DAYS
    }
    first, second, third, _ = (window[day] for day in DAYS)
    # "E" reaches the encoder's minimum of 5 rows only summed over two days; "D" never does.
    first.loc[:2, "segment"] = "E"
    second.loc[:2, "segment"] = "E"
    first.loc[3:5, "segment"] = "D"
    first.loc[6, "segment"] = np.nan
    second.loc[::7, "x4"] = np.nan
    third.loc[::5, "target_value"] = np.nan
    return window


@pytest.fixture(scope="module")
def window() -> dict[str, pd.DataFrame]:
    return synthetic_days()


def test_streamed_preprocessing_equals_a_fit_on_all_the_rows(window):
    frames = [labelled(window[day], SYNTHETIC_SGD) for day in DAYS]
    whole = pd.concat(frames, ignore_index=True)
    features = SYNTHETIC_SGD.numeric_features + SYNTHETIC_SGD.categorical_features

    streamed = fit_streamed_preprocessing(SYNTHETIC_SGD, lambda: iter(frames))
    batch = make_preprocessing(SYNTHETIC_SGD).fit(whole[features])

    encoder = streamed.named_transformers_["categorical"].named_steps["encode"]
    reference = batch.named_transformers_["categorical"].named_steps["encode"]
    assert [list(c) for c in encoder.categories_] == [list(c) for c in reference.categories_]
    assert [list(c) for c in encoder.infrequent_categories_] == [["D", "missing"]]
    assert [list(c) for c in reference.infrequent_categories_] == [["D", "missing"]]
    imputer = streamed.named_transformers_["numeric"].named_steps["impute"]
    reference_imputer = batch.named_transformers_["numeric"].named_steps["impute"]
    np.testing.assert_allclose(imputer.statistics_, reference_imputer.statistics_, rtol=1e-13)
    np.testing.assert_allclose(
        streamed.transform(whole[features]),
        batch.transform(whole[features]),
        rtol=1e-12,
        atol=1e-12,
    )


def test_streamed_preprocessing_of_real_flights_equals_a_fit_on_all_the_rows(flights_window):
    frames = [labelled(flights_window[day], FLIGHTS_SGD) for day in sorted(flights_window)]
    whole = pd.concat(frames, ignore_index=True)
    features = FLIGHTS_SGD.numeric_features + FLIGHTS_SGD.categorical_features

    streamed = fit_streamed_preprocessing(FLIGHTS_SGD, lambda: iter(frames))
    batch = make_preprocessing(FLIGHTS_SGD).fit(whole[features])

    ours, theirs = streamed.transform(whole[features]), batch.transform(whole[features])
    assert ours.shape == theirs.shape and ours.shape[1] > 50
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def flights_window():
    from ml_platform_tests.test_training import FLIGHTS_DAYS, flights_for_day

    return {
        day: features_of(flights_for_day(dt.date.fromisoformat(day)), FLIGHTS, day)
        for day in FLIGHTS_DAYS
    }


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.07])
def test_streamed_boundaries_split_the_rows_as_the_whole_window_does(window, fraction):
    # A day without labelled rows, and the days given newest first.
    holed = {day: window[day] for day in reversed(DAYS)}
    holed[DAYS[1]] = window[DAYS[1]].assign(target_value=np.nan)
    label = SYNTHETIC.label_name
    split = split_window(scan_window(holed, label), fraction)

    rows = labelled(window_frame(holed), SYNTHETIC)
    train, holdout = split_holdout(rows, fraction)
    fit, validation = split_holdout(train, VALIDATION_FRACTION)
    assert DAYS[1] not in {s.day for s in split.train + split.holdout}
    for segments, expected in [
        (split.train, train),
        (split.holdout, holdout),
        (split.fit, fit),
        (split.validation, validation),
    ]:
        got = pd.concat(list(stream(holed, segments, label)), ignore_index=True)
        pd.testing.assert_frame_equal(got, expected.reset_index(drop=True))
    summary = label_summary(holed, split.scan, split.train, label)
    assert summary.rows == len(train)
    assert summary.total == pytest.approx(train[label].sum(), rel=1e-12)


@pytest.mark.parametrize("which", ["flights", "synthetic"])
def test_streamed_sgd_equals_a_batch_fit_in_the_same_order(which, window, flights_window):
    contract, partitions = (
        (FLIGHTS_SGD, flights_window) if which == "flights" else (SYNTHETIC_SGD, window)
    )
    # Small batches: calls cut across days, as the whole window's rows were cut.
    contract = with_model(contract, **{**contract.model.model_dump(), "batch_size": 37})

    model = train_model(partitions, contract)
    preprocess = model.pipeline.named_steps["preprocess"]
    reference, history = same_order_fit(partitions, contract, preprocess)

    ours = model.pipeline.named_steps["estimator"]
    np.testing.assert_allclose(ours.coef_, reference.coef_, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ours.intercept_, reference.intercept_, rtol=1e-12, atol=1e-14)
    assert [h["epoch"] for h in model.history] == [h["epoch"] for h in history]
    np.testing.assert_allclose(
        [h["validation_loss"] for h in model.history],
        [h["validation_loss"] for h in history],
        rtol=1e-12,
    )


def test_streamed_sgd_keeps_few_encoded_days_and_learns_the_same(window, monkeypatch):
    from ml_platform.training import model as training

    kept = train_model(window, SYNTHETIC_SGD)
    # No room for encoded rows: every day is read and encoded again each epoch.
    monkeypatch.setattr(training, "ENCODED_CACHE_BYTES", 0)
    reread = train_model(window, SYNTHETIC_SGD)
    a = kept.pipeline.named_steps["estimator"]
    b = reread.pipeline.named_steps["estimator"]
    np.testing.assert_array_equal(a.coef_, b.coef_)
    assert kept.history == reread.history


def test_allocation_gives_each_stratum_its_share_and_exactly_the_total():
    counts = np.array([10, 0, 7, 3, 980])
    quotas = allocate(counts, 100)
    assert quotas.sum() == 100
    assert (quotas <= counts).all() and quotas[1] == 0
    np.testing.assert_allclose(quotas, counts * 100 / counts.sum(), atol=1)
    assert allocate(counts, int(counts.sum())).tolist() == counts.tolist()


def test_a_window_above_the_row_cap_trains_linear_on_a_stratified_sample(flights_window):
    contract = with_training(with_model(FLIGHTS, estimator="linear"), max_training_rows=600)
    model = train_model(flights_window, contract)
    again = train_model(flights_window, contract)

    assert model.sampled_rows == 600
    assert model.train_rows > 600
    np.testing.assert_array_equal(
        model.pipeline.named_steps["estimator"].coef_,
        again.pipeline.named_steps["estimator"].coef_,
    )
    from ml_platform.training.window import stratified_sample

    label = contract.label_name
    split = split_window(scan_window(flights_window, label), contract.training.holdout_fraction)
    sample = stratified_sample(flights_window, split.scan, split.train, label, 600, 13, True)
    train = pd.concat(list(stream(flights_window, split.train, label)), ignore_index=True)
    assert len(sample) == 600
    # Rows of the training rows, in their time order, each day and class at its share.
    assert sample["event_time"].is_monotonic_increasing
    assert set(sample["event_time"]) <= set(train["event_time"])
    share = 600 / len(train)
    for (day, delayed), group in train.groupby([train["event_time"].dt.date, label]):
        drawn = ((sample["event_time"].dt.date == day) & (sample[label] == delayed)).sum()
        assert abs(drawn - share * len(group)) <= 1, (day, delayed)


def test_below_the_row_cap_linear_learns_from_every_training_row_as_before(flights_window):
    contract = with_model(FLIGHTS, estimator="linear")
    model = train_model(flights_window, contract)

    rows = labelled(window_frame(flights_window), contract)
    train, _ = split_holdout(rows, contract.training.holdout_fraction)
    features = contract.numeric_features + contract.categorical_features
    preprocess = make_preprocessing(contract)
    x = preprocess.fit_transform(train[features])
    reference = make_estimator(contract).fit(x, train[contract.label_name].astype("int64"))
    assert model.sampled_rows is None
    np.testing.assert_allclose(
        model.pipeline.named_steps["estimator"].coef_, reference.coef_, rtol=1e-9, atol=1e-12
    )


@pytest.mark.parametrize("which", ["flights", "synthetic"])
def test_a_streamed_holdout_scores_as_the_holdout_held_at_once(which, window, flights_window):
    contract, partitions = (FLIGHTS, flights_window) if which == "flights" else (SYNTHETIC, window)
    model = train_model(partitions, contract)
    train_labels, holdout = split_of(model, partitions, contract)
    assert isinstance(holdout, HeldOutRows) and len(holdout) == model.holdout_rows

    streamed = score_model(model, holdout, samples=50, seed=4)
    whole = score_model(model, holdout.frame(), samples=50, seed=4)

    assert streamed.values == whole.values and streamed.intervals == whole.intervals
    assert streamed.pairing == whole.pairing
    np.testing.assert_array_equal(streamed.score, whole.score)
    rows = labelled(window_frame(partitions), contract)
    train, _ = split_holdout(rows, contract.training.holdout_fraction)
    labels = train[contract.label_name].astype("float64")
    assert train_labels.rows == len(train)
    assert train_labels.mean == pytest.approx(labels.mean(), rel=1e-12)


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_the_baseline_from_label_statistics_equals_one_fitted_on_the_labels(task):
    from sklearn.dummy import DummyClassifier, DummyRegressor

    rng = np.random.default_rng(2)
    train = (
        (rng.random(999) < 0.35).astype("int64")
        if task == "classification"
        else rng.normal(3, 1, 999)
    )
    y = (
        (rng.random(200) < 0.3).astype("int64")
        if task == "classification"
        else rng.normal(3, 1, 200)
    )
    zeros = np.zeros((len(train), 1))
    if task == "classification":
        fitted = DummyClassifier(strategy="prior").fit(zeros, train)
        expected = (
            fitted.predict(np.zeros((200, 1))),
            fitted.predict_proba(np.zeros((200, 1)))[:, 1],
        )
    else:
        fitted = DummyRegressor(strategy="mean").fit(zeros, train)
        expected = fitted.predict(np.zeros((200, 1))), fitted.predict(np.zeros((200, 1)))

    predicted, score = baseline_predictions(task, LabelSummary.of(train), len(y))

    np.testing.assert_array_equal(predicted, expected[0])
    np.testing.assert_allclose(score, expected[1], rtol=1e-12)
    ours = score_predictions(task, y, predicted, score, 20, 1)
    theirs = score_predictions(task, y, *expected, 20, 1)
    for metric, value in theirs.values.items():
        assert ours.values[metric] == pytest.approx(value, rel=1e-12)


def test_a_window_loads_a_day_when_read_and_keeps_what_fits():
    loads: list[str] = []

    def load(day: str) -> pd.DataFrame:
        loads.append(day)
        return pd.DataFrame({"x": np.zeros(1000)})

    one_day = pd.DataFrame({"x": np.zeros(1000)}).memory_usage(deep=True).sum()
    window = WindowPartitions(DAYS, PartitionCache(load, max_bytes=2 * one_day))
    assert DAYS[0] in window and "2023-12-31" not in window
    assert loads == [] and list(window) == DAYS and window.rows_read == 0
    for _ in range(2):
        for day in DAYS:
            assert len(window[day]) == 1000
    # Two days fit: a pass over four days reads each again, the latest kept.
    assert loads == DAYS + DAYS
    assert window.rows_read == 4000
    window[DAYS[-1]]
    assert len(loads) == 8
    with pytest.raises(KeyError):
        window["2023-12-31"]


def test_a_window_gives_each_days_size_as_measured_when_it_was_loaded(monkeypatch):
    from ml_platform.platform import inputs

    loads: list[str] = []
    measured: list[int] = []

    def load(day: str) -> pd.DataFrame:
        loads.append(day)
        return pd.DataFrame({"x": np.zeros(1000), "s": ["a" * 20] * 1000})

    def measure(value: Any) -> float:
        measured.append(len(value))
        return float(value.memory_usage(deep=True).sum())

    monkeypatch.setattr(inputs, "value_bytes", measure)
    window = WindowPartitions(DAYS, PartitionCache(load))
    expected = load(DAYS[0]).memory_usage(deep=True).sum()
    loads.clear()
    for _ in range(2):
        for day in DAYS:
            frame, size = window.value_and_size(day)
            assert len(frame) == 1000 and size == expected
    # Each day loaded and measured once, however often its size is asked for.
    assert loads == DAYS and len(measured) == len(DAYS)
    # A cache that keeps only the last day never needs a size: it measures nothing.
    last_only = WindowPartitions(DAYS, PartitionCache(load, max_bytes=0))
    assert all(last_only.value_and_size(day)[1] == float("inf") for day in DAYS)
    assert len(measured) == len(DAYS)
    with pytest.raises(KeyError):
        window.value_and_size("2023-12-31")


def test_a_days_hash_and_label_counts_are_computed_once_for_each_load():
    loads: list[str] = []
    computed: list[str] = []

    def load(day: str) -> pd.DataFrame:
        loads.append(day)
        return pd.DataFrame({"x": np.arange(10)})

    def count(day: str) -> Any:
        return lambda frame: computed.append(day) or len(frame)

    cache = PartitionCache(load)
    # Two days of a range: overlapping windows over the range's loaded partitions.
    for window in (WindowPartitions(DAYS[:3], cache), WindowPartitions(DAYS[1:], cache)):
        for day in window:
            assert window.derived(day, "rows", count(day)) == 10
    assert loads == computed == DAYS
    with pytest.raises(KeyError):
        WindowPartitions(DAYS[:3], cache).derived(DAYS[3], "rows", count(DAYS[3]))


def test_a_partition_rewritten_between_two_reads_gets_its_new_hash_and_label_counts(tmp_path):
    lake = LakeIOManager(storage=LocalStorage(base_dir=str(tmp_path)))
    key = dg.AssetKey(["synthetic", "features"])
    label = SYNTHETIC.label_name
    stored = synthetic_days()

    def load(day: str) -> pd.DataFrame:
        frame: pd.DataFrame = lake.load_key(lake.key(key, day, "parquet"), "parquet")
        return frame

    for day, frame in stored.items():
        lake.store_at(lake.key(key, day, "parquet"), "parquet", frame)

    def read() -> dict[str, pd.DataFrame]:
        return {day: load(day) for day in DAYS}

    # A cache of one day: a pass over the window loads each day again.
    one_day = max(frame.memory_usage(deep=True).sum() for frame in stored.values())
    window = WindowPartitions(
        DAYS,
        PartitionCache(lambda day: load(day), one_day),
    )
    before = scan_window(window, label)
    assert before == scan_window(read(), label)

    # Another run re-lands the first day: fewer labelled rows, other labels.
    rewritten = stored[DAYS[0]].copy()
    rewritten.loc[::2, label] = np.nan
    rewritten[label] = rewritten[label] * 2
    lake.store_at(lake.key(key, DAYS[0], "parquet"), "parquet", rewritten)

    after = scan_window(window, label)
    assert after == scan_window(read(), label)
    assert after.versions[DAYS[0]] == data_version(load(DAYS[0]))
    assert after.versions[DAYS[0]] != before.versions[DAYS[0]]
    assert after.rows[0] == before.rows[0] - stored[DAYS[0]][label].iloc[::2].notna().sum()
    assert after.labels[0] != before.labels[0]
    assert after.versions[DAYS[1]] == before.versions[DAYS[1]]

    # A window that keeps every day: its values are those of the rows it holds and trains on.
    whole = WindowPartitions(DAYS, PartitionCache(load))
    held = scan_window(whole, label)
    lake.store_at(lake.key(key, DAYS[0], "parquet"), "parquet", stored[DAYS[0]])
    assert scan_window(whole, label) == held == after
    assert scan_window(read(), label) == before


def test_the_daily_graph_trains_and_evaluates_on_a_window_read_day_by_day(tmp_path):
    import yaml

    from ml_platform.contracts import load_contract
    from ml_platform.contracts.model import bundled_contracts
    from ml_platform_tests.conftest import Platform

    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["training"]["window_days"] = 3
    document["model"] = {"estimator": "sgd", "max_epochs": 5}
    path = tmp_path / "synthetic.yaml"
    path.write_text(yaml.safe_dump(document))
    platform = Platform(load_contract(path), tmp_path / "root")
    days = days_from("2024-01-01", 3)
    platform.land(days[0], 3)
    for day in days:
        assert platform.materialize(day).success

    result = platform.materialize(days[-1], selection=["model", "evaluation_report"])
    model = result.asset_materializations_for_node(platform.node("model"))[0].metadata
    stored = sum(len(pd.read_parquet(platform.stored("features", d, "parquet"))) for d in days)
    assert model["window_partitions"].value == days
    # The rows of every window day, counted as each was read.
    assert model["rows_in"].value == stored
    assert model["rows_learnt_from"].value == model["train_rows"].value
    report = result.asset_materializations_for_node(platform.node("evaluation_report"))[0]
    assert report.metadata["holdout_rows"].value == model["holdout_rows"].value
    assert report.metadata["rows_in"].value == stored
