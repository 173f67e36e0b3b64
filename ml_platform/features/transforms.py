"""Row-wise feature transforms: each row's features depend on that row alone, nothing is fitted.

Fitting (scaling, encoding) happens inside the model pipeline, so the same preprocessing travels
with the model to wherever it scores.
"""

import numpy as np
import pandas as pd

from ml_platform.contracts import Contract, FeatureSpec
from ml_platform.contracts.model import EVENT_TIME, FEATURE_DEFINITIONS, definitions_text

DAY_NAMES = np.array(["mon", "tue", "wed", "thu", "fri", "sat", "sun"])


def _transform(values: pd.Series, transform: str) -> pd.Series:
    if transform == "identity":
        return values
    if transform == "log1p":
        return np.log1p(values.astype("float64"))
    if transform == "hhmm_to_minutes":
        hhmm = values.astype("float64")
        return hhmm // 100 * 60 + hhmm % 100
    when = values.dt
    if transform == "day_of_week":
        day_index = when.day_of_week.fillna(0).astype("int64").to_numpy()
        return pd.Series(DAY_NAMES[day_index], index=values.index).where(values.notna())
    if transform == "hour":
        part = when.hour
    elif transform == "minute_of_day":
        part = when.hour * 60 + when.minute
    elif transform == "month":
        part = when.month
    elif transform == "day_of_year":
        part = when.day_of_year
    else:
        raise ValueError(f"unknown transform '{transform}'")
    # pandas gives a time's parts as integers, or as floats on a day with a missing time: as
    # text (a categorical feature) 5 o'clock would be "5" one day and "5.0" the next, two
    # categories to the model and to drift. Nullable integers are the same on every day.
    return part.astype("Int64")


def feature_column(validated: pd.DataFrame, spec: FeatureSpec) -> pd.Series:
    """One feature of every row, typed float64 (numeric) or str (categorical)."""
    values = _transform(validated[spec.source], spec.transform)
    if spec.kind == "numeric":
        return values.astype("float64")
    return values.astype("str").where(values.notna()).astype("str")


def read_columns(contract: Contract) -> list[str]:
    """The columns of validated rows that `build_features` reads, each once."""
    sources = [EVENT_TIME, *(spec.source for spec in contract.features), contract.label_name]
    return list(dict.fromkeys(sources))


def build_features(validated: pd.DataFrame, contract: Contract) -> pd.DataFrame:
    """Model inputs of each validated row: event time, the contract's features, then the label.

    Leakage columns never reach this frame: only declared features (which the contract loader
    proves do not read a leakage column) and the label are kept. The frame says how each feature
    was computed (`attrs[FEATURE_DEFINITIONS]`, stored with it): a later contract that computes a
    feature of the same name otherwise is not compared or trained with these values.
    """
    columns = {EVENT_TIME: validated[EVENT_TIME]}
    columns.update({spec.name: feature_column(validated, spec) for spec in contract.features})
    columns[contract.label_name] = validated[contract.label_name]
    frame = pd.DataFrame(columns).reset_index(drop=True)
    frame.attrs[FEATURE_DEFINITIONS] = definitions_text(contract)
    return frame
