"""features: model inputs of each day, computed row-wise from validated rows."""

import dagster as dg
import pandas as pd

from ml_platform.contracts import Contract
from ml_platform.features.transforms import build_features
from ml_platform.observability import table_schema
from ml_platform.storage import FORMAT_KEY


def build_features_asset(
    contract: Contract, partitions: dg.PartitionsDefinition
) -> dg.AssetsDefinition:
    """The features asset of a dataset."""

    @dg.asset(
        name="features",
        partitions_def=partitions,
        group_name="features",
        kinds={"pandas", "parquet"},
        metadata={FORMAT_KEY: "parquet"},
    )
    def features(validated_data: pd.DataFrame) -> dg.MaterializeResult[pd.DataFrame]:
        """Model inputs of day D: the contract's features, the event time and the label.

        Deterministic and row-wise: nothing is fitted here, so a day's features never depend
        on other days, and columns that leak the label never appear.
        """
        frame = build_features(validated_data, contract)
        return dg.MaterializeResult(
            value=frame,
            metadata={
                "dagster/row_count": len(frame),
                "dagster/column_schema": table_schema(frame),
                "labelled_rows": int(frame[contract.label_name].notna().sum()),
            },
        )

    return features
