"""The reference an SGD model streamed from a window is held to: the same fit, rows in memory.

`same_order_fit` fits SGD on one matrix of every training row, in the order the streamed run
draws them. The streaming test and `benchmarks/memory_window.py --equivalence` compare the
streamed model with it.
"""

import copy
from typing import Any

import numpy as np

from ml_platform.contracts import Contract
from ml_platform.contracts.model import SgdSpec
from ml_platform.training.model import (
    _balanced_weights,
    _loss,
    labelled,
    make_estimator,
    window_frame,
)
from ml_platform.training.window import scan_window, split_window


def same_order_fit(partitions: Any, contract: Contract, preprocess: Any) -> tuple[Any, list[dict]]:
    """(best estimator, history) of SGD fitted on all training rows at once, in streamed order.

    The rows, encoding, weights, seeded orders, batches and early stopping are the streamed
    run's; only the reading differs: one matrix of every training row, each epoch's rows in the
    order the streamed run draws (days in a seeded order, then the rows of each day), cut into
    `batch_size` calls, as training cut the whole window's rows before it streamed.
    """
    spec, label = contract.model, contract.label_name
    if not isinstance(spec, SgdSpec):
        raise ValueError(f"same_order_fit is SGD's reference, not {spec.estimator}'s")
    split = split_window(scan_window(partitions, label), contract.training.holdout_fraction)
    rows = labelled(window_frame(partitions), contract)
    features = contract.numeric_features + contract.categorical_features
    classification = contract.task == "classification"
    dtype = "int64" if classification else "float64"
    fit = rows.iloc[: split.validation_start]
    val = rows.iloc[split.validation_start : split.train_rows]
    x_fit = np.ascontiguousarray(preprocess.transform(fit[features]), dtype=np.float64)
    x_val = np.ascontiguousarray(preprocess.transform(val[features]), dtype=np.float64)
    y_fit, y_val = fit[label].astype(dtype).to_numpy(), val[label].astype(dtype).to_numpy()
    w_fit = _balanced_weights(y_fit) if classification else None
    w_val = _balanced_weights(y_val) if classification else None
    sizes = [segment.rows for segment in split.fit]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rng = np.random.default_rng(contract.training.random_seed)
    estimator = make_estimator(contract)
    best, best_epoch, best_loss, history = None, 0, float("inf"), []
    epoch = 0
    while epoch < spec.max_epochs and epoch - best_epoch < spec.patience:
        order = np.concatenate(
            [starts[d] + rng.permutation(sizes[d]) for d in rng.permutation(len(sizes))]
        )
        for start in range(0, len(order), spec.batch_size):
            batch = order[start : start + spec.batch_size]
            if classification:
                weights = w_fit[batch] if w_fit is not None else None
                estimator.partial_fit(
                    x_fit[batch], y_fit[batch], classes=np.array([0, 1]), sample_weight=weights
                )
            else:
                estimator.partial_fit(x_fit[batch], y_fit[batch])
        epoch += 1
        record = {
            "epoch": epoch,
            "train_loss": _loss(estimator, x_fit, y_fit, w_fit, contract.task),
            "validation_loss": _loss(estimator, x_val, y_val, w_val, contract.task),
        }
        history.append(record)
        if record["validation_loss"] < best_loss - spec.min_delta:
            best, best_epoch, best_loss = copy.deepcopy(estimator), epoch, record["validation_loss"]
    return best, history
