"""Metadata helpers shared by the assets, so every stage reports the same way."""

import dagster as dg
import pandas as pd


def table_schema(frame: pd.DataFrame) -> dg.TableSchema:
    """Column names and dtypes of a frame, for the `dagster/column_schema` metadata."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(name=str(name), type=str(dtype)) for name, dtype in frame.dtypes.items()
        ]
    )
