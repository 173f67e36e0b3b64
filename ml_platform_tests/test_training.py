"""Training on a window of feature partitions: time hold-out, recorded facts, metrics, refusals."""

import datetime as dt
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.evaluation import metrics
from ml_platform.evaluation.metrics import holdout_of, score_model
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.flights import flights_for_day
from ml_platform.ingestion.synthetic import generate_day
from ml_platform.platform.formats import deserialise, serialise
from ml_platform.training.assets import every
from ml_platform.training.model import (
    Checkpoints,
    TrainingDataError,
    TrainingState,
    loss_rows,
    sparse_rows,
    split_holdout,
    train_model,
    window_frame,
)
from ml_platform.training.window import data_version

SYNTHETIC = load_contract("synthetic")
FLIGHTS = load_contract("flights")


def with_model(contract, **settings):
    """`contract` with its `model` section replaced (validated as a contract would be)."""
    return Contract.model_validate({**contract.model_dump(), "model": settings})


# SGD's epochs, batches and checkpoints, whatever the bundled contract's estimator.
FLIGHTS_SGD = with_model(FLIGHTS, estimator="sgd", max_epochs=30, patience=5)

SYNTHETIC_DAYS = ["2024-01-01", "2024-01-02", "2024-01-03"]
FLIGHTS_DAYS = ["2013-01-01", "2013-01-02"]


def features_of(frame: pd.DataFrame, contract, day: str) -> pd.DataFrame:
    file_name = contract.landing.file_name(day)
    raw = read_landed_file(frame.to_csv(index=False).encode(), file_name, day)
    return build_features(type_rows(raw, contract, file_name), contract)


@pytest.fixture(scope="module")
def synthetic_window() -> dict[str, pd.DataFrame]:
    return {
        day: features_of(generate_day(dt.date.fromisoformat(day), seed=7, rows=80), SYNTHETIC, day)
        for day in SYNTHETIC_DAYS
    }


@pytest.fixture(scope="module")
def flights_window() -> dict[str, pd.DataFrame]:
    return {
        day: features_of(flights_for_day(dt.date.fromisoformat(day)), FLIGHTS, day)
        for day in FLIGHTS_DAYS
    }


@pytest.fixture(scope="module")
def synthetic_model(synthetic_window):
    return train_model(synthetic_window, SYNTHETIC)


@pytest.fixture(scope="module")
def flights_model(flights_window):
    return train_model(flights_window, FLIGHTS)


@pytest.fixture(scope="module")
def flights_sgd_model(flights_window):
    return train_model(flights_window, FLIGHTS_SGD)


def share(rows: int, fraction: float) -> int:
    """`fraction` of `rows`, rounded up, computed exactly."""
    return math.ceil(Fraction(str(fraction)) * rows)


def timed_frame(n: int) -> pd.DataFrame:
    times = pd.date_range("2024-01-01", periods=n, freq="h")
    return pd.DataFrame({"event_time": times, "y": np.arange(n, dtype=float)})


def test_split_holdout_holds_out_the_latest_rows():
    train, holdout = split_holdout(timed_frame(10), 0.2)
    assert train["y"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert holdout["y"].tolist() == [8, 9]
    assert train["event_time"].max() < holdout["event_time"].min()


@pytest.mark.parametrize(
    ("rows", "fraction", "held_out"),
    [(10, 0.2, 2), (10, 0.25, 3), (3, 0.1, 1), (2, 0.5, 1), (100, 0.07, 7), (25, 0.28, 7)],
)
def test_split_holdout_size_is_the_fraction_rounded_up(rows, fraction, held_out):
    train, holdout = split_holdout(timed_frame(rows), fraction)
    assert len(holdout) == held_out
    assert len(train) == rows - held_out


@pytest.mark.parametrize("rows", [0, 1])
def test_split_holdout_refuses_too_few_rows(rows):
    with pytest.raises(TrainingDataError, match=f"{rows} labelled row"):
        split_holdout(timed_frame(rows), 0.2)


def test_synthetic_model_records_its_window_and_rows(synthetic_model, synthetic_window):
    total = sum(len(f) for f in synthetic_window.values())
    assert synthetic_model.task == "regression"
    assert synthetic_model.label == "target_value"
    assert synthetic_model.window == SYNTHETIC_DAYS
    assert synthetic_model.holdout_rows == share(total, SYNTHETIC.training.holdout_fraction)
    assert synthetic_model.train_rows == total - synthetic_model.holdout_rows
    latest = pd.concat(synthetic_window.values())["event_time"].sort_values()
    assert synthetic_model.holdout_start == str(latest.iloc[-synthetic_model.holdout_rows])


def test_window_is_recorded_oldest_first_whatever_the_input_order(synthetic_window):
    shuffled = {day: synthetic_window[day] for day in reversed(SYNTHETIC_DAYS)}
    assert train_model(shuffled, SYNTHETIC).window == SYNTHETIC_DAYS


def test_synthetic_model_predicts_values(synthetic_model, synthetic_window):
    frame = synthetic_window["2024-01-03"]
    predicted = synthetic_model.predict(frame)
    assert len(predicted) == len(frame)
    assert predicted.index.equals(frame.index)
    assert predicted.notna().all()
    # The target is a near-linear function of the features: predictions must follow it.
    assert np.corrcoef(predicted, frame["target_value"])[0, 1] > 0.9


def test_holdout_is_the_latest_labelled_rows_of_the_window(synthetic_model, synthetic_window):
    shuffled = {
        day: frame.sample(frac=1.0, random_state=1) for day, frame in synthetic_window.items()
    }
    holdout = holdout_of(synthetic_model, shuffled, SYNTHETIC)

    times = pd.concat(synthetic_window.values())["event_time"].sort_values().tolist()
    assert len(holdout) == synthetic_model.holdout_rows
    assert holdout["event_time"].tolist() == times[-synthetic_model.holdout_rows :]
    assert holdout["event_time"].iloc[0] == pd.Timestamp(synthetic_model.holdout_start)


def test_flights_model_trains_on_labelled_rows_only(flights_model, flights_window):
    labels = pd.concat(flights_window.values())["delayed"]
    labelled = int(labels.notna().sum())
    assert labelled < len(labels)
    assert flights_model.task == "classification"
    assert flights_model.window == FLIGHTS_DAYS
    assert flights_model.train_rows + flights_model.holdout_rows == labelled
    assert flights_model.holdout_rows == share(labelled, FLIGHTS.training.holdout_fraction)
    assert flights_model.holdout_start.startswith("2013-01-02")


def test_flights_model_predicts_classes_and_probabilities(flights_model, flights_window):
    frame = flights_window["2013-01-02"]
    assert set(flights_model.predict(frame)) <= {0, 1}
    assert len(set(flights_model.predict(frame))) == 2
    score = flights_model.score(frame)
    assert ((score >= 0) & (score <= 1)).all()
    assert len(score) == len(frame)


def test_the_batch_size_changes_the_calls_not_the_model(flights_window, flights_sgd_model):
    # SGD updates row by row in the generator's order; cutting an epoch into calls only
    # changes where scikit-learn rescales the weights, so results agree up to rounding.
    spec = FLIGHTS_SGD.model.model_copy(update={"batch_size": 100})
    small = train_model(flights_window, FLIGHTS_SGD.model_copy(update={"model": spec}))
    a = small.pipeline.named_steps["estimator"]
    b = flights_sgd_model.pipeline.named_steps["estimator"]
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(a.intercept_, b.intercept_, rtol=1e-9, atol=1e-12)
    assert small.best_epoch == flights_sgd_model.best_epoch
    assert len(small.history) == len(flights_sgd_model.history)


def with_training(contract, **settings):
    return contract.model_copy(update={"training": contract.training.model_copy(update=settings)})


class KeptCheckpoints(Checkpoints):
    """Every saved state, serialised as the lake's checkpoints store it; loads `resume_from`."""

    def __init__(self, resume_from: bytes | None = None):
        self.saved: list[bytes] = []
        self.resume_from = resume_from

    def save(self, state: TrainingState) -> None:
        self.saved.append(serialise(state, "joblib"))

    def load(self) -> TrainingState | None:
        return deserialise(self.resume_from, "joblib") if self.resume_from is not None else None


def assert_same_model(a, b) -> None:
    estimator_a = a.pipeline.named_steps["estimator"]
    estimator_b = b.pipeline.named_steps["estimator"]
    np.testing.assert_array_equal(estimator_a.coef_, estimator_b.coef_)
    np.testing.assert_array_equal(estimator_a.intercept_, estimator_b.intercept_)
    assert a.history == b.history and a.best_epoch == b.best_epoch


def test_checkpoint_cadence_decides_the_saves_not_the_model(flights_window, flights_sgd_model):
    every = KeptCheckpoints()
    model = train_model(flights_window, with_training(FLIGHTS_SGD, checkpoint_seconds=0), every)
    epochs = [deserialise(saved, "joblib").epoch for saved in every.saved]
    assert epochs == list(range(1, len(model.history) + 1))
    # An hour between checkpoints: a model trained in well under that stores none.
    none = KeptCheckpoints()
    hourly = train_model(flights_window, with_training(FLIGHTS_SGD, checkpoint_seconds=3600), none)
    assert none.saved == []
    assert_same_model(model, flights_sgd_model)
    assert_same_model(hourly, flights_sgd_model)


def test_a_run_resumed_from_a_checkpoint_ends_with_the_uninterrupted_model(
    flights_window, flights_sgd_model
):
    every = KeptCheckpoints()
    train_model(flights_window, with_training(FLIGHTS_SGD, checkpoint_seconds=0), every)
    assert len(every.saved) > 3
    # Resumed under the default cadence: how often checkpoints are written is not part of the
    # training job's identity, so the checkpoint of a run with another cadence is taken up.
    resumed = train_model(flights_window, FLIGHTS_SGD, KeptCheckpoints(resume_from=every.saved[2]))
    assert resumed.resumed_from_epoch == 3
    assert_same_model(resumed, flights_sgd_model)


def test_a_models_data_versions_are_each_partitions_own(flights_window, flights_sgd_model):
    one_by_one = {day: data_version(frame) for day, frame in flights_window.items()}
    assert flights_sgd_model.data_versions == one_by_one
    retyped = flights_window[FLIGHTS_DAYS[1]].astype({"log_distance": "float32"})
    assert data_version(retyped) != one_by_one[FLIGHTS_DAYS[1]]


def test_single_class_window_is_refused(flights_window):
    on_time = {
        day: frame[frame["delayed"].isna() | (frame["delayed"] == 0)]
        for day, frame in flights_window.items()
    }
    with pytest.raises(TrainingDataError, match=r"2013-01-01\.\.2013-01-02.*single class"):
        train_model(on_time, FLIGHTS)


def test_an_empty_window_is_refused():
    with pytest.raises(TrainingDataError):
        train_model({}, SYNTHETIC)


def test_classification_metrics_with_intervals(flights_model, flights_window):
    holdout = holdout_of(flights_model, flights_window, FLIGHTS)
    scores = score_model(flights_model, holdout, samples=100, seed=0)
    assert set(scores.values) == {"precision", "recall", "f1", "accuracy", "roc_auc"}
    for name, value in scores.values.items():
        low, high = scores.intervals[name]
        assert 0.0 <= low <= value <= high <= 1.0, name
    # Better than chance on the real flights it has not seen.
    assert scores.values["roc_auc"] > 0.55
    y = holdout[flights_model.label].to_numpy().astype("int64")
    for name, metric in scikit_learn_metrics("classification").items():
        expected = metric(y, scores.predicted, scores.score)
        assert scores.values[name] == pytest.approx(expected, rel=1e-12, abs=0), name


def test_bootstrap_in_blocks_gives_the_intervals_of_one_draw(
    flights_model, flights_window, monkeypatch
):
    holdout = holdout_of(flights_model, flights_window, FLIGHTS)
    whole = score_model(flights_model, holdout, samples=50, seed=3)
    # Three samples a block: the indices come from the same generator in the same order.
    monkeypatch.setattr(metrics, "BOOTSTRAP_BLOCK_ELEMENTS", 3 * len(holdout))
    blocked = score_model(flights_model, holdout, samples=50, seed=3)
    assert blocked.intervals == whole.intervals


def test_regression_metrics_with_intervals(synthetic_model, synthetic_window):
    holdout = holdout_of(synthetic_model, synthetic_window, SYNTHETIC)
    scores = score_model(synthetic_model, holdout, samples=100, seed=0)
    assert set(scores.values) == {"mae", "rmse", "r2"}
    assert 0.0 < scores.values["mae"] <= scores.values["rmse"]
    assert scores.values["r2"] > 0.8
    low, high = scores.intervals["rmse"]
    assert low < scores.values["rmse"] < high


def test_holdout_of_refuses_another_window(synthetic_model, synthetic_window):
    other = dict(synthetic_window)
    del other["2024-01-01"]
    with pytest.raises(ValueError, match="differs from the model's training window"):
        holdout_of(synthetic_model, other, SYNTHETIC)


def test_holdout_of_refuses_a_window_whose_rows_changed(synthetic_model, synthetic_window):
    changed = dict(synthetic_window)
    changed["2024-01-03"] = synthetic_window["2024-01-03"].iloc[:-10]
    with pytest.raises(ValueError, match="rematerialise the model"):
        holdout_of(synthetic_model, changed, SYNTHETIC)


def scikit_learn_metrics(task: str) -> dict:
    """The reference: scikit-learn's functions, one sample at a time (nan for one class)."""
    from sklearn import metrics as skm

    if task == "classification":
        return {
            "precision": lambda y, p, s: skm.precision_score(y, p, zero_division=0),
            "recall": lambda y, p, s: skm.recall_score(y, p, zero_division=0),
            "f1": lambda y, p, s: skm.f1_score(y, p, zero_division=0),
            "accuracy": lambda y, p, s: skm.accuracy_score(y, p),
            "roc_auc": lambda y, p, s: (
                skm.roc_auc_score(y, s) if len(np.unique(y)) == 2 else math.nan
            ),
        }
    return {
        "mae": lambda y, p, s: skm.mean_absolute_error(y, p),
        "rmse": lambda y, p, s: math.sqrt(skm.mean_squared_error(y, p)),
        "r2": lambda y, p, s: skm.r2_score(y, p),
    }


@pytest.mark.parametrize(
    ("task", "n", "positive_share"),
    [
        ("classification", 400, 0.5),
        # Few positives among few rows: many samples draw none, some predict none positive.
        ("classification", 8, 0.15),
        ("regression", 400, None),
    ],
)
def test_vectorised_bootstrap_metrics_equal_scikit_learn_on_every_sample(task, n, positive_share):
    from ml_platform.evaluation.metrics import _bootstrap

    rng = np.random.default_rng(3)
    if task == "classification":
        y = (rng.random(n) < positive_share).astype(int)
        score = np.round(rng.random(n), 1)  # rounded: ties in the ROC ranks
        predicted = (score > 0.5).astype(int)
    else:
        y = rng.normal(size=n)
        predicted = score = y + rng.normal(scale=0.3, size=n)
    rows = rng.integers(0, n, (200, n))
    vectorised = _bootstrap(task, y, predicted, score, rows)
    for name, metric in scikit_learn_metrics(task).items():
        expected = [metric(y[r], predicted[r], score[r]) for r in rows]
        np.testing.assert_allclose(vectorised[name], expected, rtol=1e-12, err_msg=name)
    if n == 8:
        one_class = np.array([len(np.unique(y[r])) == 1 for r in rows])
        assert one_class.any() and not one_class.all()
        assert np.isnan(vectorised["roc_auc"][one_class]).all()
        assert (vectorised["precision"][(predicted[rows] == 0).all(axis=1)] == 0).all()


@pytest.mark.parametrize("which", ["flights", "synthetic"])
def test_predictions_equal_predict_and_score(which, request):
    model = request.getfixturevalue(f"{which}_model")
    window = request.getfixturevalue(f"{which}_window")
    frame = window_frame(window)
    predicted, score = model.predictions(frame)
    np.testing.assert_array_equal(predicted, model.predict(frame).to_numpy())
    np.testing.assert_array_equal(score, model.score(frame).to_numpy())


@pytest.mark.parametrize("rows", [0, 1, 7, 1000])
def test_sparse_rows_equal_scipys_conversion(rows):
    from scipy.sparse import csr_array

    rng = np.random.default_rng(rows)
    x = rng.normal(size=(rows, 12)) * (rng.random((rows, 12)) < 0.3)
    x[:, 3] = 0.0  # a column never set, and (below) rows with nothing set
    x[::5] = 0.0
    ours, scipys = sparse_rows(x, block_rows=64), csr_array(x)
    assert ours.shape == scipys.shape
    np.testing.assert_array_equal(ours.indptr, scipys.indptr)
    np.testing.assert_array_equal(ours.indices, scipys.indices)
    np.testing.assert_array_equal(ours.data, scipys.data)


def test_losses_use_sparse_rows_only_where_most_entries_are_zero():
    from scipy.sparse import issparse

    one_hot = np.eye(10)[np.arange(100) % 10]  # a tenth of the entries set
    numeric = np.random.default_rng(0).normal(size=(100, 10))
    assert issparse(loss_rows(one_hot))
    np.testing.assert_array_equal(loss_rows(one_hot).toarray(), one_hot)
    assert loss_rows(numeric) is numeric


def test_boosting_resumed_from_a_mid_run_checkpoint_ends_with_the_uninterrupted_model(
    flights_window,
):
    # One boosting iteration a step, no early stop: a checkpoint after each of the 12.
    contract = with_training(
        with_model(FLIGHTS, estimator="hist_gradient_boosting", max_iter=12, step=1),
        checkpoint_seconds=0,
    )
    every = KeptCheckpoints()
    model = train_model(flights_window, contract, every)
    assert [deserialise(saved, "joblib").epoch for saved in every.saved] == list(range(1, 12))
    resumed = train_model(flights_window, contract, KeptCheckpoints(resume_from=every.saved[4]))
    assert resumed.resumed_from_epoch == 5 and model.resumed_from_epoch == 0
    frame = window_frame(flights_window)
    np.testing.assert_array_equal(resumed.score(frame), model.score(frame))
    assert resumed.history == model.history
    assert [h["iteration"] for h in model.history] == list(range(1, 13))
    # The loss per iteration is scikit-learn's own record of the fit, and it falls.
    estimator = model.pipeline.named_steps["estimator"]
    assert model.history[-1]["train_loss"] == -estimator.train_score_[-1]
    assert model.history[-1]["train_loss"] < model.initial_loss
    assert "12 boosting iteration(s)" in model.progress


def test_boosting_stops_early_on_its_validation_split(flights_window):
    contract = with_model(FLIGHTS, estimator="hist_gradient_boosting", patience=2, step=5)
    model = train_model(flights_window, contract)
    estimator = model.pipeline.named_steps["estimator"]
    # Stopped before the limit, within a step of the iteration it stopped at.
    assert len(model.history) == estimator.n_iter_ < 300
    assert model.best_epoch == min(model.history, key=lambda h: h["validation_loss"])["iteration"]


def test_a_linear_model_is_one_fit_without_checkpoints(flights_window, synthetic_window):
    every = KeptCheckpoints()
    logistic = train_model(
        flights_window,
        with_training(with_model(FLIGHTS, estimator="linear", C=0.5), checkpoint_seconds=0),
        every,
    )
    assert every.saved == []
    estimator = logistic.pipeline.named_steps["estimator"]
    assert type(estimator).__name__ == "LogisticRegression" and estimator.C == 0.5
    assert logistic.converged and len(logistic.history) == 1
    assert logistic.history[0]["iteration"] == estimator.n_iter_[0]
    ridge = train_model(synthetic_window, with_model(SYNTHETIC, estimator="linear"))
    assert type(ridge.pipeline.named_steps["estimator"]).__name__ == "Ridge"
    assert ridge.progress == "one fit of 1 solver iteration(s), converged"
    # Stopped at its iteration limit: recorded, for the loss_plateau check to warn.
    capped = train_model(flights_window, with_model(FLIGHTS, estimator="linear", max_iter=2))
    assert not capped.converged


def test_loss_plateau_and_finite_weights_judge_each_estimator(flights_window):
    from ml_platform.training.assets import finite_weights_result, loss_curve, loss_plateau_result

    boosting = train_model(
        flights_window, with_model(FLIGHTS, estimator="hist_gradient_boosting", step=5)
    )
    verdict = loss_plateau_result(boosting)
    assert verdict.passed and verdict.description.endswith(
        f"over {len(boosting.history)} iterations."
    )
    assert finite_weights_result(boosting).passed
    assert "losses per iteration are finite" in (finite_weights_result(boosting).description or "")
    assert "Loss per iteration" in loss_curve(boosting)
    capped = train_model(flights_window, with_model(FLIGHTS, estimator="linear", max_iter=2))
    verdict = loss_plateau_result(capped)
    assert not verdict.passed and verdict.severity.value == "WARN"
    assert "stopped at its limit of 2 iterations without converging: raise model.max_iter" in (
        verdict.description or ""
    )
    converged = train_model(flights_window, with_model(FLIGHTS, estimator="linear"))
    assert loss_plateau_result(converged).passed
    assert finite_weights_result(converged).passed


def test_a_training_logs_its_first_epoch_then_one_per_interval():
    logged: list[dict] = []
    now = [0.0]
    watch = every(5.0, logged.append, clock=lambda: now[0])
    for second in (0.0, 1.0, 4.9, 5.0, 7.0, 10.1):
        now[0] = second
        watch({"epoch": second})
    assert [record["epoch"] for record in logged] == [0.0, 5.0, 10.1]
