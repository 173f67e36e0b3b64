"""evaluation_report: metrics of each day's model on rows it never trained on."""

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.evaluation.metrics import evaluate, holdout_of, render_report
from ml_platform.storage import FORMAT_KEY
from ml_platform.training.assets import training_window
from ml_platform.training.model import TrainedModel


def build_evaluation_report(
    contract: Contract, partitions: dg.PartitionsDefinition
) -> dg.AssetsDefinition:
    """The evaluation_report asset of a dataset."""

    @dg.asset(
        name="evaluation_report",
        partitions_def=partitions,
        group_name="evaluation",
        kinds={"scikitlearn", "json"},
        metadata={FORMAT_KEY: "json"},
        ins={"features": training_window(contract)},
    )
    def evaluation_report(
        context: dg.AssetExecutionContext, model: TrainedModel, features: dict[str, pd.DataFrame]
    ) -> dg.MaterializeResult[dict]:
        """Metrics of the model of day D on rows it never trained on.

        The rows are the latest of its window. Metrics are numbers the UI plots across days, and
        a markdown report. Classification: precision, recall, F1, accuracy, ROC AUC.
        Regression: MAE, RMSE, R².
        """
        holdout = holdout_of(model, features, contract)
        metrics = evaluate(model, holdout)
        report = render_report(context.partition_key, model, metrics, holdout)
        numbers = {k: v for k, v in metrics.items() if isinstance(v, float)}
        return dg.MaterializeResult(
            value={
                "partition": context.partition_key,
                "task": model.task,
                "metrics": metrics,
                "window": model.window,
                "holdout_rows": model.holdout_rows,
                "report_markdown": report,
            },
            metadata={
                **{name: dg.MetadataValue.float(value) for name, value in numbers.items()},
                "holdout_rows": model.holdout_rows,
                "report": dg.MetadataValue.md(report),
            },
        )

    return evaluation_report
