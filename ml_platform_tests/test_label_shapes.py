"""Training and evaluation on label shapes nobody designed for.

A regression label known on a couple of rows only, a window of one class, a rare class whose
held-out rows hold a handful of positives or none, a label constant on the held-out day: each
gets a model, or a verdict that names the reason (never a bare scikit-learn error retried as a
code bug, nor advice to look for a broken feature where only the rows cannot measure a metric).
"""

import dagster as dg
import numpy as np
import pandas as pd
import pytest
import yaml

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.evaluation.assets import verdict_check
from ml_platform.evaluation.metrics import (
    baseline_predictions,
    importance_shares,
    judge_candidate,
    score_predictions,
)
from ml_platform.platform.records import day_records
from ml_platform.platform.steps import Verdict
from ml_platform.training.model import TrainingDataError, train_model
from ml_platform.training.window import LabelSummary
from ml_platform_tests.conftest import Platform
from ml_platform_tests.test_baseline import FLIGHTS, SAMPLES, SEED, SYNTHETIC, with_evaluation
from ml_platform_tests.test_streaming import DAYS, SYNTHETIC_SGD, synthetic_days
from ml_platform_tests.test_training import flights_window as flights_window  # shared fixture
from ml_platform_tests.test_training import with_model

FLIGHTS_LINEAR = with_model(FLIGHTS, estimator="linear")


@pytest.fixture(scope="module")
def window() -> dict[str, pd.DataFrame]:
    return synthetic_days()


def labelled_on(window: dict[str, pd.DataFrame], rows: int) -> dict[str, pd.DataFrame]:
    """`window` with the label known on its first day's first `rows` rows only (labels late)."""
    late = {day: frame.assign(target_value=np.nan) for day, frame in window.items()}
    first = late[DAYS[0]]
    first.loc[first.index[:rows], "target_value"] = window[DAYS[0]]["target_value"].iloc[:rows]
    return late


def test_boosting_on_one_regression_training_row_is_a_training_data_error(window):
    # Two labelled rows: one to train on, one held out. Boosting's early stopping cannot split
    # a validation row off one row; scikit-learn's ValueError would be retried as a code bug.
    two = labelled_on(window, 2)
    boosting = with_model(SYNTHETIC_SGD, estimator="hist_gradient_boosting")
    with pytest.raises(TrainingDataError, match="the 1 training row gradient boosting learns"):
        train_model(two, boosting)
    # Three rows (two to train on) are enough for it, as one row is for the other estimators.
    assert train_model(labelled_on(window, 3), boosting).train_rows == 2
    for estimator in ("linear", "sgd"):
        assert train_model(two, with_model(SYNTHETIC_SGD, estimator=estimator)).train_rows == 1


def judged(contract, y: np.ndarray, predicted: np.ndarray, score: np.ndarray, train: np.ndarray):
    """The verdict on a candidate's held-out predictions, with the baseline of `train` labels."""
    task = contract.task
    candidate = score_predictions(task, y, predicted, score, SAMPLES, SEED)
    base_predicted, base_score = baseline_predictions(task, LabelSummary.of(train), len(y))
    baseline = score_predictions(task, y, base_predicted, base_score, SAMPLES, SEED)
    verdict = judge_candidate(contract, candidate, baseline)
    return verdict, verdict_check(verdict, "daily-2024-03-04").description or ""


def test_a_rare_labels_hold_out_too_thin_to_resample_is_told_so_not_blamed_on_the_features():
    # A fraud-like label: 2 positives in 200 held-out rows, both ranked first. One bootstrap
    # sample in seven draws neither, so ROC AUC's interval cannot be measured.
    y = np.zeros(200, dtype="int64")
    y[[40, 150]] = 1
    score = np.where(y == 1, 0.9, np.linspace(0.1, 0.6, len(y)))
    train = (np.random.default_rng(3).random(2000) < 0.01).astype("int64")
    contract = with_evaluation(FLIGHTS, value_thresholds={})

    verdict, description = judged(contract, y, (score > 0.5).astype("int64"), score, train)

    assert verdict.decision == "reject" and not verdict.beats_baseline
    assert "roc_auc 1.0000 vs 0.5000: lift +0.5000, whose 95 % interval cannot be measured" in (
        verdict.cause
    )
    assert "(2 positive of 200 held-out rows)" in verdict.cause
    assert "cannot measure the metric" in description
    assert "carry the label's signal" not in description


@pytest.mark.parametrize("metric", ["recall", "f1"])
def test_recall_or_f1_on_a_hold_out_with_no_positive_is_undefined_not_a_lost_lift(metric):
    # A quiet day of a rare label: no held-out row is positive, so recall and F1 are 0 for the
    # candidate and the baseline alike by convention, and their "lift" is no evidence of anything.
    y = np.zeros(200, dtype="int64")
    score = np.linspace(0.0, 0.7, len(y))
    train = (np.random.default_rng(3).random(2000) < 0.2).astype("int64")
    contract = with_evaluation(FLIGHTS, value_thresholds={}, change_thresholds={metric: 0.0})

    verdict, description = judged(contract, y, (score > 0.5).astype("int64"), score, train)

    assert verdict.decision == "reject"
    assert verdict.cause.startswith(
        f"{metric} is undefined on the held-out rows (all 200 held-out rows are negative"
    )
    assert "cannot measure the metric" in description
    assert "carry the label's signal" not in description


def test_r2_on_a_hold_out_of_a_constant_label_is_undefined_not_a_convention():
    # Every held-out row's label is 0 (nothing sold on a holiday): R² has no value there;
    # scikit-learn's 0 (or 1 for an exact prediction) is a convention, not the model's.
    y = np.zeros(200)
    train = np.random.default_rng(5).normal(10.0, 2.0, 1000)
    primary = with_evaluation(SYNTHETIC, value_thresholds={}, change_thresholds={"r2": 0.0})
    near = np.random.default_rng(6).normal(0.0, 0.1, len(y))

    verdict, description = judged(primary, y, near, near, train)

    assert verdict.decision == "reject"
    assert verdict.cause.startswith(
        "r2 is undefined on the held-out rows (the label is the same on all 200 held-out row(s)"
    )
    assert "cannot measure the metric" in description
    assert "carry the label's signal" not in description

    # An exact prediction's R² of 1 meets no bound either: it is the same convention.
    bound = with_evaluation(SYNTHETIC, value_thresholds={"r2": 0.8}, change_thresholds={})
    verdict, _ = judged(bound, y, y.copy(), y.copy(), train)
    assert not verdict.passes_values
    assert "r2 is undefined on the held-out rows" in verdict.cause
    assert "nothing shows it meets the bound (at least 0.8)" in verdict.cause


def test_a_window_of_one_class_names_the_label_and_its_rule(flights_window):
    # Every flight of the window on time (a rule whose threshold no row reaches reads the same):
    # the user is told which label, from which rule, and what to check.
    on_time = {
        day: frame[frame["delayed"].isna() | (frame["delayed"] == 0)]
        for day, frame in flights_window.items()
    }
    with pytest.raises(
        TrainingDataError,
        match=r"training rows of window 2013-01-01\.\.2013-01-02 hold a single class \(0\): "
        r"delayed is 0 on every one \(arr_delay > 15 holds on none of them\).*label\.rule",
    ):
        train_model(on_time, FLIGHTS_LINEAR)


def test_a_quiet_days_permutation_importance_is_unmeasured_not_all_zero(flights_window, window):
    # A drift episode opens on a quiet day of a rare label: no labelled flight was delayed, so
    # recall and F1 are 0 whatever is shuffled. Shares of 0 would say the champion leans on no
    # feature, and the episode would not page.
    flights = train_model(flights_window, FLIGHTS_LINEAR)
    day = flights_window["2013-01-02"]
    quiet = day[(day["delayed"] == 0).fillna(False).to_numpy()]
    for metric in ("recall", "f1"):
        assert importance_shares(flights, quiet, metric, 0) is None
    both = day[day["delayed"].notna().to_numpy()]
    assert importance_shares(flights, both, "recall", 0) is not None
    # A regression label the same on every row of the day: R² is no figure of the model.
    synthetic = train_model(window, with_model(SYNTHETIC_SGD, estimator="linear"))
    rows = window[DAYS[3]].dropna(subset=["target_value"]).assign(target_value=0.0)
    assert importance_shares(synthetic, rows, "r2", 0) is None
    assert importance_shares(synthetic, rows, "rmse", 0) is not None


@pytest.mark.slow
def test_a_first_day_with_two_labels_is_boostings_training_data_verdict_not_a_retry(tmp_path):
    # Labels come late: the dataset's first day lands with 2 of its rows labelled.
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["model"] = {"estimator": "hist_gradient_boosting"}
    # The label's source may be missing: a row's label is known later.
    for column in document["columns"]:
        if column["name"] == "target":
            column["nullable"] = True
    path = tmp_path / "synthetic.yaml"
    path.write_text(yaml.safe_dump(document))
    platform = Platform(load_contract(path), tmp_path / "p")
    day = "2024-01-01"
    platform.land(day, 1)
    landed = platform.landing_dir / platform.contract.landing.file_name(day)
    frame = pd.read_csv(landed)
    frame.loc[frame.index[2:], "target"] = np.nan
    frame.to_csv(landed, index=False)

    result = platform.materialize(day, ["raw_data", "validated_data", "features", "model"])

    assert result.success
    retried = [
        e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY
    ]
    assert retried == []
    record = day_records(platform.instance, platform.key("model"), [day])[day]
    assert record.verdict == Verdict.TRAINING_DATA.value
    assert "the 1 training row gradient boosting learns from is too few" in record.reason
