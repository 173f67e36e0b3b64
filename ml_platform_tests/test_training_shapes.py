"""Training on windows it was not shaped for: changed contracts, cut checkpoints, rare classes."""

import numpy as np
import pandas as pd
import pytest

from ml_platform.contracts.model import FeatureSpec
from ml_platform.platform.storage import LocalStorage
from ml_platform.training.assets import LakeCheckpoints
from ml_platform.training.model import TrainingDataError, fingerprint_of, train_model
from ml_platform.training.window import (
    allocate,
    day_rows,
    keep_each_class,
    scan_window,
    split_window,
)
from ml_platform_tests.test_streaming import DAYS, SYNTHETIC_SGD, synthetic_days
from ml_platform_tests.test_training import (
    FLIGHTS,
    KeptCheckpoints,
    assert_same_model,
    with_model,
    with_training,
)
from ml_platform_tests.test_training import (
    flights_window as flights_window,  # the module's fixture, shared
)


@pytest.fixture(scope="module")
def window() -> dict[str, pd.DataFrame]:
    return synthetic_days()


def with_features(contract, features: list[FeatureSpec]):
    return contract.model_copy(update={"features": features})


def test_a_checkpoint_of_other_features_or_another_task_is_not_resumed(window):
    versions = {"2024-01-01": "v"}
    base = fingerprint_of(SYNTHETIC_SGD, versions)
    dropped = [f for f in SYNTHETIC_SGD.features if f.name != "x4"]
    recast = [
        f.model_copy(update={"kind": "categorical"}) if f.name == "hour" else f
        for f in SYNTHETIC_SGD.features
    ]
    label = SYNTHETIC_SGD.label.model_copy(update={"task": "classification"})
    others = [
        with_features(SYNTHETIC_SGD, dropped),
        with_features(SYNTHETIC_SGD, recast),
        SYNTHETIC_SGD.model_copy(update={"label": label}),
    ]
    assert all(fingerprint_of(other, versions) != base for other in others)

    # The stored days are the same; the checkpoint's preprocessing was fitted with x4.
    every = KeptCheckpoints()
    train_model(window, with_training(SYNTHETIC_SGD, checkpoint_seconds=0), every)
    without_x4 = with_features(SYNTHETIC_SGD, dropped)
    resumed = train_model(window, without_x4, KeptCheckpoints(resume_from=every.saved[1]))
    assert resumed.resumed_from_epoch == 0
    assert_same_model(resumed, train_model(window, without_x4))


def test_a_checkpoint_cut_short_is_discarded_and_training_starts_afresh(window, tmp_path):
    lake = LocalStorage(base_dir=str(tmp_path))
    key = "synthetic/checkpoints/model/2024-01-04.joblib"
    warned: list[str] = []
    contract = with_training(SYNTHETIC_SGD, checkpoint_seconds=0)
    uninterrupted = train_model(window, contract, LakeCheckpoints(lake, key, warned.append))
    whole = lake.read_bytes(key)
    lake.write_bytes(key, whole[: len(whole) // 2])  # a copy or a disk that stopped half-way

    again = train_model(window, contract, LakeCheckpoints(lake, key, warned.append))
    assert again.resumed_from_epoch == 0
    assert_same_model(again, uninterrupted)
    assert len(warned) == 1 and key in warned[0] and "starts afresh" in warned[0]


def test_days_stored_before_a_feature_was_added_are_refused_naming_them(window):
    old = dict(window)
    for day in DAYS[:2]:
        old[day] = window[day].drop(columns=["x4"])
    for contract in (SYNTHETIC_SGD, with_model(SYNTHETIC_SGD, estimator="linear")):
        with pytest.raises(
            TrainingDataError,
            match=r"2024-01-01 lacks x4; 2024-01-02 lacks x4.*--start 2024-01-01 --days 4",
        ):
            train_model(old, contract)


def test_a_quota_keeps_two_rows_of_a_rare_class_and_the_total():
    counts = np.array([[500, 1], [400, 0], [300, 2]])
    quotas = allocate(counts.ravel(), 12).reshape(counts.shape)
    assert quotas[:, 1].sum() == 0  # proportional shares round the 3 positives away
    kept = keep_each_class(quotas, counts, 12)
    assert kept.sum() == 12 and kept[:, 1].sum() == 2
    assert (kept <= counts).all() and (kept >= 0).all()
    # A class with a single row keeps it; a sample of 2 or 3 rows keeps one of each class.
    assert keep_each_class(quotas, np.array([[500, 1], [400, 0], [300, 0]]), 12)[:, 1].sum() == 1
    small = allocate(counts.ravel(), 3).reshape(counts.shape)
    assert keep_each_class(small, counts, 3)[:, 1].sum() == 1


def rare_positives(window: dict[str, pd.DataFrame], per_day: list[int]) -> dict:
    """`window` with only the first `per_day[i]` delayed flights of day i left delayed."""
    rare = {}
    for day, keep in zip(sorted(window), per_day, strict=True):
        frame = window[day].copy()
        frame.loc[frame.index[frame["delayed"] == 1][keep:], "delayed"] = 0
        rare[day] = frame
    return rare


@pytest.mark.parametrize("estimator", ["linear", "hist_gradient_boosting"])
def test_a_sample_of_a_window_with_few_positives_keeps_both_classes(flights_window, estimator):
    rare = rare_positives(flights_window, [3, 3])
    contract = with_training(with_model(FLIGHTS, estimator=estimator), max_training_rows=100)
    model = train_model(rare, contract)
    assert model.sampled_rows == 100
    assert list(model.pipeline.named_steps["estimator"].classes_) == [0, 1]


def test_boosting_on_a_single_row_of_a_class_is_a_training_data_error(flights_window):
    one = rare_positives(flights_window, [1, 0])
    with pytest.raises(TrainingDataError, match=r"\(1406 of class 0, 1 of class 1\) are too few"):
        train_model(one, with_model(FLIGHTS, estimator="hist_gradient_boosting"))


def test_boosting_on_ten_training_rows_is_a_training_data_error(flights_window):
    day = flights_window["2013-01-01"].dropna(subset=["delayed"])
    rows = pd.concat([day[day["delayed"] == 1].iloc[:6], day[day["delayed"] == 0].iloc[:7]])
    tiny = {"2013-01-01": rows}  # 13 labelled rows: 10 to train on, 3 held out
    contract = with_model(FLIGHTS, estimator="hist_gradient_boosting")
    with pytest.raises(TrainingDataError, match="the 10 training rows .* needs 2 rows of each "):
        train_model(tiny, contract)
    # The other estimators have no validation split to draw: they train.
    assert train_model(tiny, with_model(FLIGHTS, estimator="linear")).train_rows == 10


@pytest.mark.parametrize("estimator", ["sgd", "linear"])
def test_infinite_or_overflowing_feature_values_are_a_training_data_error(window, estimator):
    contract = with_model(SYNTHETIC_SGD, estimator=estimator)
    bad = dict(window)
    bad[DAYS[1]] = window[DAYS[1]].copy()
    bad[DAYS[1]].loc[3, "x1"] = np.inf
    bad[DAYS[2]] = window[DAYS[2]].copy()
    bad[DAYS[2]].loc[1, "temperature"] = 1e300  # finite, but its square is not
    with pytest.raises(
        TrainingDataError,
        match=r"x1 \(from x1\) on 2024-01-02; temperature \(from temperature\) on 2024-01-03",
    ):
        train_model(bad, contract)


def test_boosting_learns_from_infinite_feature_values(window):
    bad = dict(window)
    bad[DAYS[1]] = window[DAYS[1]].copy()
    bad[DAYS[1]].loc[3, "x1"] = np.inf
    model = train_model(bad, with_model(SYNTHETIC_SGD, estimator="hist_gradient_boosting"))
    assert model.train_rows > 0


def test_sgd_whose_rows_to_learn_from_hold_one_class_is_a_training_data_error(flights_window):
    # Every delay of the window falls in SGD's validation slice, none in the rows it learns from.
    ordered = {day: day_rows(frame, "delayed") for day, frame in flights_window.items()}
    split = split_window(scan_window(ordered, "delayed"), FLIGHTS.training.holdout_fraction)
    late = {day: ordered[day].copy() for day in ordered}
    for frame in late.values():
        frame["delayed"] = frame["delayed"] * 0
    for segment in split.validation:
        rows = late[segment.day].index[segment.start : segment.stop]
        late[segment.day].loc[rows, "delayed"] = ordered[segment.day].loc[rows, "delayed"]
    with pytest.raises(TrainingDataError, match=r"SGD learns from .* hold a single class \(0\)"):
        train_model(late, with_model(FLIGHTS, estimator="sgd"))
    # Learning from every training row, the linear model has both classes.
    assert train_model(late, with_model(FLIGHTS, estimator="linear")).train_rows == split.train_rows


def test_a_window_whose_label_is_all_missing_names_the_window_and_its_days(window):
    unlabelled = {day: frame.assign(target_value=np.nan) for day, frame in window.items()}
    unlabelled[DAYS[3]].loc[0, "target_value"] = 1.0
    with pytest.raises(
        TrainingDataError,
        match=r"window 2024-01-01..2024-01-04 \(4 feature partition\(s\)\): 1 labelled row\(s\) "
        r"are too few .* target_value value per day: \{'2024-01-01': 0, .*'2024-01-04': 1\}",
    ):
        train_model(unlabelled, SYNTHETIC_SGD)


def test_boosting_learns_from_a_categorical_feature_of_more_categories_than_its_bins():
    many = {
        day: frame.assign(segment=[f"s{i % 300}" for i in range(len(frame))])
        for day, frame in synthetic_days(rows=400).items()
    }
    model = train_model(many, with_model(SYNTHETIC_SGD, estimator="hist_gradient_boosting"))
    encoder = model.pipeline.named_steps["preprocess"].named_transformers_["categorical"]
    assert len(encoder.categories_[0]) == 300
    # 254 categories keep their own code; the 46 rarest share the 255th.
    assert len(encoder.infrequent_categories_[0]) == 46
    assert np.isfinite(model.predict(many[DAYS[3]])).all()
