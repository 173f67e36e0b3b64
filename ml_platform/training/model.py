"""The trained model: a scikit-learn pipeline with its preprocessing, and how it is fitted.

The window's rows are split in time: the latest `holdout_fraction` of rows (by event time) is
held out for evaluation and never trained on, so evaluation measures the model on days it has
not seen, as it will be used.
"""

import dataclasses
import math
from typing import TYPE_CHECKING

import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.contracts.model import EVENT_TIME

if TYPE_CHECKING:
    from sklearn.pipeline import Pipeline


class TrainingDataError(ValueError):
    """The training window cannot produce a model (no labelled rows, a single class...)."""


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    """A fitted pipeline and what it was trained on."""

    pipeline: "Pipeline"
    task: str
    features: list[str]
    label: str
    window: list[str]  # feature partitions read, oldest first
    train_rows: int
    holdout_rows: int
    holdout_start: str  # event time of the first held-out row

    def predict(self, frame: pd.DataFrame) -> pd.Series:
        """Predicted label (class or value) for each row of a features frame."""
        return pd.Series(self.pipeline.predict(frame[self.features]), index=frame.index)

    def score(self, frame: pd.DataFrame) -> pd.Series:
        """Probability of the positive class (classification) or the predicted value."""
        if self.task == "classification":
            proba = self.pipeline.predict_proba(frame[self.features])[:, 1]
            return pd.Series(proba, index=frame.index)
        return self.predict(frame)


def window_frame(partitions: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The window's feature partitions as one frame in time order, ties kept in partition order."""
    if not partitions:
        raise TrainingDataError("the training window holds no feature partitions")
    frames = [partitions[key] for key in sorted(partitions)]
    frame = pd.concat(frames, ignore_index=True)
    return frame.sort_values(EVENT_TIME, kind="stable").reset_index(drop=True)


def labelled(frame: pd.DataFrame, contract: Contract) -> pd.DataFrame:
    """Rows whose label is known."""
    return frame[frame[contract.label_name].notna()]


def split_holdout(frame: pd.DataFrame, fraction: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, holdout): the latest `fraction` of time-ordered rows is held out."""
    # Rounded first so that float error (100 * 0.07 = 7.000000000000001) does not add a row.
    n_holdout = max(1, math.ceil(round(len(frame) * fraction, 9)))
    if len(frame) - n_holdout < 1:
        raise TrainingDataError(f"{len(frame)} labelled row(s) are too few to train and evaluate")
    return frame.iloc[:-n_holdout], frame.iloc[-n_holdout:]


def make_pipeline(contract: Contract) -> "Pipeline":
    """Preprocessing and estimator for the contract's task, unfitted."""
    # scikit-learn is imported here, not at module level: loading the code location (webserver,
    # daemon, sensors) should not pay the seconds it takes to import.
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    preprocessing = ColumnTransformer(
        [
            (
                "numeric",
                Pipeline(
                    [("impute", SimpleImputer(strategy="median")), ("scale", StandardScaler())]
                ),
                contract.numeric_features,
            ),
            (
                "categorical",
                Pipeline(
                    [
                        ("impute", SimpleImputer(strategy="constant", fill_value="missing")),
                        ("encode", OneHotEncoder(handle_unknown="ignore", min_frequency=5)),
                    ]
                ),
                contract.categorical_features,
            ),
        ]
    )
    seed = contract.training.random_seed
    estimator = (
        LogisticRegression(max_iter=1000, class_weight="balanced", random_state=seed)
        if contract.task == "classification"
        else Ridge(alpha=1.0, random_state=seed)
    )
    return Pipeline([("preprocess", preprocessing), ("estimator", estimator)])


def train_model(partitions: dict[str, pd.DataFrame], contract: Contract) -> TrainedModel:
    """Fit the contract's pipeline on the training part of a window of feature partitions."""
    frame = labelled(window_frame(partitions), contract)
    train, holdout = split_holdout(frame, contract.training.holdout_fraction)
    label = contract.label_name
    y = train[label].astype("int64" if contract.task == "classification" else "float64")
    if contract.task == "classification" and y.nunique() < 2:
        raise TrainingDataError(
            f"the training rows of window {min(partitions)}..{max(partitions)} hold a single "
            f"class ({y.iloc[0]}); a classifier needs both"
        )
    features = contract.numeric_features + contract.categorical_features
    pipeline = make_pipeline(contract).fit(train[features], y)
    return TrainedModel(
        pipeline=pipeline,
        task=contract.task,
        features=features,
        label=label,
        window=sorted(partitions),
        train_rows=len(train),
        holdout_rows=len(holdout),
        holdout_start=str(holdout[EVENT_TIME].iloc[0]),
    )
