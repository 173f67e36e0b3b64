"""Metrics of a model on its held-out rows, and the markdown report shown in the UI."""

import math

import numpy as np
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.training.model import TrainedModel, labelled, split_holdout, window_frame


def holdout_of(model: TrainedModel, partitions: dict[str, pd.DataFrame], contract: Contract):
    """The rows `model` held out, recomputed from the same window of feature partitions."""
    if sorted(partitions) != model.window:
        raise ValueError(
            f"evaluation window {sorted(partitions)} differs from the model's training window "
            f"{model.window}; rematerialise the model for this partition"
        )
    _, holdout = split_holdout(
        labelled(window_frame(partitions), contract), contract.training.holdout_fraction
    )
    if len(holdout) != model.holdout_rows:
        raise ValueError(
            f"the window now holds {len(holdout)} hold-out rows but the model recorded "
            f"{model.holdout_rows}: its feature partitions changed after training; "
            "rematerialise the model"
        )
    return holdout


def classification_metrics(y_true: pd.Series, score: pd.Series, predicted: pd.Series) -> dict:
    """Precision, recall, F1, accuracy and ROC AUC (absent when the hold-out has one class)."""
    from sklearn import metrics as skm

    result = {
        "precision": skm.precision_score(y_true, predicted, zero_division=0),
        "recall": skm.recall_score(y_true, predicted, zero_division=0),
        "f1": skm.f1_score(y_true, predicted, zero_division=0),
        "accuracy": skm.accuracy_score(y_true, predicted),
        "positive_rate": float(np.mean(y_true)),
    }
    if y_true.nunique() == 2:
        result["roc_auc"] = skm.roc_auc_score(y_true, score)
    return {k: float(v) for k, v in result.items()}


def regression_metrics(y_true: pd.Series, predicted: pd.Series) -> dict:
    """MAE, RMSE and R²."""
    from sklearn import metrics as skm

    return {
        "mae": float(skm.mean_absolute_error(y_true, predicted)),
        "rmse": float(math.sqrt(skm.mean_squared_error(y_true, predicted))),
        "r2": float(skm.r2_score(y_true, predicted)),
    }


def evaluate(model: TrainedModel, holdout: pd.DataFrame) -> dict:
    """Metrics of `model` on `holdout`.

    Regression also reports the MAE of always predicting the mean, so a reader sees what the
    model adds.
    """
    if model.task == "classification":
        y = holdout[model.label].astype("int64")
        metrics = classification_metrics(y, model.score(holdout), model.predict(holdout))
        if y.nunique() < 2:
            metrics["note"] = "ROC AUC undefined: the hold-out rows hold a single class"
        return metrics
    y = holdout[model.label].astype("float64")
    metrics = regression_metrics(y, model.predict(holdout))
    metrics["baseline_mae"] = float(np.mean(np.abs(y - y.mean())))
    return metrics


def render_report(partition: str, model: TrainedModel, metrics: dict, holdout: pd.DataFrame):
    """Markdown report of one evaluation."""
    numeric = {k: v for k, v in metrics.items() if isinstance(v, float)}
    rows = "\n".join(f"| {name} | {value:.4f} |" for name, value in numeric.items())
    lines = [
        f"# Evaluation of the model of {partition}",
        "",
        f"Task: **{model.task}**; label `{model.label}`. Trained on {model.train_rows} rows of "
        f"{len(model.window)} day(s) ({model.window[0]} to {model.window[-1]}); evaluated on "
        f"the {model.holdout_rows} latest rows (from {model.holdout_start}), never trained on.",
        "",
        "| metric | value |",
        "|---|---|",
        rows,
    ]
    if model.task == "classification":
        from sklearn.metrics import confusion_matrix

        y = holdout[model.label].astype("int64")
        matrix = confusion_matrix(y, model.predict(holdout), labels=[0, 1])
        lines += [
            "",
            "Confusion matrix (rows: actual, columns: predicted)",
            "",
            "| | predicted 0 | predicted 1 |",
            "|---|---|---|",
            f"| actual 0 | {matrix[0, 0]} | {matrix[0, 1]} |",
            f"| actual 1 | {matrix[1, 0]} | {matrix[1, 1]} |",
        ]
    if "note" in metrics:
        lines += ["", f"Note: {metrics['note']}"]
    return "\n".join(lines) + "\n"
