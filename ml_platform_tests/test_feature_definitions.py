"""A feature the contract computes otherwise under the same name: its stored values are not
compared, trained or scored as if they were the new definition's.

The team changes `log_amount` from `log1p(amount)` to `amount` itself: every stored day and the
serving champion hold logarithms where the new days hold amounts (drift's side of it is in
test_drift_contract_change.py).
"""

import dataclasses
import json

import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer
from sklearn.pipeline import Pipeline

from ml_platform.contracts.model import FEATURE_DEFINITIONS
from ml_platform.platform.failures import CONFIGURATION, error_chain
from ml_platform.platform.run_events import classify_outcome, run_outcome
from ml_platform.registry.chain import unfed
from ml_platform.registry.monitoring import SCORED
from ml_platform.training.model import TrainedModel, train_model
from ml_platform.training.window import TrainingDataError
from ml_platform_tests.test_champion_known import FIRST, MONITORED, SECOND, champion_then
from ml_platform_tests.test_drift_contract_change import (
    amount_itself,
    hour_categorical,
)
from ml_platform_tests.test_streaming import DAYS, synthetic_days
from ml_platform_tests.test_training import SYNTHETIC

LOGARITHM = "numeric log1p(amount)"
AMOUNT = "numeric identity(amount)"


def test_a_champion_whose_feature_is_computed_otherwise_stops_with_the_named_error(tmp_path):
    # Before, the champion was scored on amounts it learnt as logarithms: an R² of -22, a decay
    # nobody caused, and every candidate promoted against it.
    platform = champion_then(tmp_path, amount_itself)

    result = platform.materialize(SECOND, MONITORED)

    assert not result.success
    data = platform.step_failure(result, "champion_performance")
    description = data.user_failure_data.description
    assert (
        f"champion_performance {SECOND}: the champion daily-{FIRST} cannot be scored under the "
        f"contract of 'synthetic': it learnt the feature log_amount as {LOGARITHM}, which the "
        f"contract now computes as {AMOUNT}"
    ) in description
    assert "ChampionFeaturesError" in error_chain(data.error)[-1]
    outcome = run_outcome(platform.instance, result.run_id, succeeded=False)
    assert outcome is not None and classify_outcome(outcome).failure_class == CONFIGURATION
    assert SECOND not in platform.materialized("champion_performance")

    # The registry meets the same champion: the same stop, no decision recorded.
    result = platform.materialize(SECOND, ["model", "evaluation_report", "registered_model"])
    assert not result.success
    data = platform.step_failure(result, "registered_model")
    assert f"registered_model {SECOND}: the champion daily-{FIRST} cannot be scored" in (
        data.user_failure_data.description
    )
    assert platform.registry().alias("champion") == f"daily-{FIRST}"


def test_a_numeric_feature_made_categorical_still_feeds_the_champion(tmp_path):
    # `hour` as text holds the same numbers: the champion reads them as it learnt them.
    platform = champion_then(tmp_path, hour_categorical)

    assert platform.materialize(SECOND, MONITORED).success

    performance = json.loads(platform.stored("champion_performance", SECOND, "json").read_text())
    assert performance["status"] == SCORED and performance["metrics"]["r2"] > 0.9


def recorded(definitions: dict, task: str = "regression") -> TrainedModel:
    """A model as unfed reads it: its task, features and recorded definitions; no pipeline."""
    return TrainedModel(
        pipeline=None,  # type: ignore[arg-type]
        task=task,
        features=list(definitions),
        label="target_value",
        window=[FIRST],
        train_rows=1,
        holdout_rows=1,
        holdout_start=FIRST,
        feature_definitions=definitions,
    )


def test_a_categorical_feature_made_numeric_or_another_task_does_not_feed_the_champion():
    learnt = SYNTHETIC.feature_definitions
    as_category = recorded({**learnt, "x1": {**learnt["x1"], "kind": "categorical"}})
    assert unfed(as_category, SYNTHETIC) == [
        "it learnt the feature x1 as categorical identity(x1), which the contract now computes "
        "as numeric identity(x1)"
    ]
    # The encoder would read every number as a category it never saw; a classifier is judged
    # by the metrics of a regression.
    assert unfed(recorded(learnt, task="classification"), SYNTHETIC) == [
        "it is a classification model, and the contract's label is for regression"
    ]
    assert unfed(recorded(learnt), SYNTHETIC) == []


def test_a_champion_trained_before_definitions_were_recorded_is_judged_by_its_kinds():
    # Its preprocessing says which features it treats as categories: x1 was one.
    preprocess = ColumnTransformer(
        [
            ("numeric", "passthrough", ["x2"]),
            ("categorical", "passthrough", ["x1", "segment"]),
        ]
    )
    older = dataclasses.replace(
        recorded({}),
        pipeline=Pipeline([("preprocess", preprocess)]),
        features=["x1", "x2", "segment"],
        feature_definitions=None,
    )

    assert unfed(older, SYNTHETIC) == [
        "it learnt the feature x1 as categorical, which the contract now computes as "
        "numeric identity(x1)"
    ]


def test_window_days_stored_under_the_old_definition_are_refused_naming_them():
    window = synthetic_days()
    for day in DAYS[:2]:
        old = json.loads(window[day].attrs[FEATURE_DEFINITIONS])
        old["log_amount"] = {**old["log_amount"], "transform": "identity"}
        window[day].attrs[FEATURE_DEFINITIONS] = json.dumps(old)

    with pytest.raises(TrainingDataError) as refused:
        train_model(window, SYNTHETIC)

    message = str(refused.value)
    assert (
        f"{DAYS[0]} holds log_amount as {AMOUNT}, now {LOGARITHM}; {DAYS[1]} holds log_amount "
        f"as {AMOUNT}, now {LOGARITHM}"
    ) in message
    assert f"--start {DAYS[0]} --days 4 --force" in message


def test_days_stored_before_definitions_were_recorded_train_as_before():
    window = {day: pd.DataFrame(frame) for day, frame in synthetic_days().items()}
    for frame in window.values():
        frame.attrs.clear()

    assert train_model(window, SYNTHETIC).train_rows > 0
