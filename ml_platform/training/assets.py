"""model: a pipeline trained on the window of feature partitions ending each day."""

import time
import warnings

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.storage import FORMAT_KEY, WINDOW_KEY
from ml_platform.training.model import TrainedModel, train_model


def training_window(contract: Contract) -> dg.AssetIn:
    """The `features` input of a day: its W partitions ending that day (fewer at the start)."""
    # Without allow_nonexistent_upstream_partitions the first W-1 days, whose window reaches
    # before the first partition, could not run at all. The flag is marked beta; its behaviour
    # (drop partitions outside the definition) is what a window needs, so the warning is muted.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        mapping = dg.TimeWindowPartitionMapping(
            start_offset=-(contract.training.window_days - 1),
            end_offset=0,
            allow_nonexistent_upstream_partitions=True,
        )
    return dg.AssetIn(key="features", partition_mapping=mapping, metadata={WINDOW_KEY: True})


def build_model(contract: Contract, partitions: dg.PartitionsDefinition) -> dg.AssetsDefinition:
    """The model asset of a dataset."""
    window_days = contract.training.window_days

    @dg.asset(
        name="model",
        partitions_def=partitions,
        group_name="training",
        kinds={"scikitlearn"},
        metadata={FORMAT_KEY: "joblib", "window_days": window_days},
        ins={"features": training_window(contract)},
    )
    def model(features: dict[str, pd.DataFrame]) -> dg.MaterializeResult[TrainedModel]:
        """A scikit-learn pipeline trained on the feature partitions of the W days ending D.

        Imputation, scaling and one-hot encoding are fitted inside the pipeline, before the
        estimator, so scoring applies exactly what training did. The latest rows of the window
        (by event time, the contract's hold-out fraction) are held out for evaluation.
        """
        started = time.perf_counter()
        trained = train_model(features, contract)
        return dg.MaterializeResult(
            value=trained,
            metadata={
                "window_start": trained.window[0],
                "window_end": trained.window[-1],
                "window_partitions": trained.window,
                "window_days_read": len(trained.window),
                "train_rows": trained.train_rows,
                "holdout_rows": trained.holdout_rows,
                "holdout_start": trained.holdout_start,
                "fit_seconds": round(time.perf_counter() - started, 3),
            },
        )

    return model
