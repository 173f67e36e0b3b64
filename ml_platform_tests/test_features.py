"""Row-wise features: which columns reach the model, determinism, and each transform's values."""

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from ml_platform.contracts import FeatureSpec, load_contract
from ml_platform.contracts.model import NUMERIC_TRANSFORMS, TIME_TRANSFORMS
from ml_platform.contracts.schema import type_rows
from ml_platform.features.transforms import build_features, feature_column
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.flights import flights_for_day
from ml_platform.ingestion.synthetic import generate_day

FLIGHTS = load_contract("flights")
SYNTHETIC = load_contract("synthetic")


def typed(frame: pd.DataFrame, contract) -> pd.DataFrame:
    raw = read_landed_file(frame.to_csv(index=False).encode(), "day.csv", "p")
    return type_rows(raw, contract, "day.csv")


@pytest.fixture(scope="module")
def flights_validated() -> pd.DataFrame:
    return typed(flights_for_day(dt.date(2013, 1, 1)), FLIGHTS)


@pytest.fixture(scope="module")
def synthetic_validated() -> pd.DataFrame:
    return typed(generate_day(dt.date(2024, 1, 3), seed=7, rows=300), SYNTHETIC)


def test_flights_features_are_event_time_features_and_label_only(flights_validated):
    features = build_features(flights_validated, FLIGHTS)

    assert list(features.columns) == [
        "event_time",
        *(f.name for f in FLIGHTS.features),
        "delayed",
    ]
    assert not set(FLIGHTS.leakage_columns) & set(features.columns)
    assert "time_hour" not in features.columns
    assert len(features) == len(flights_validated)
    pd.testing.assert_series_equal(
        features["delayed"], flights_validated["delayed"].reset_index(drop=True)
    )


def test_synthetic_features_are_event_time_features_and_label_only(synthetic_validated):
    features = build_features(synthetic_validated, SYNTHETIC)
    assert list(features.columns) == [
        "event_time",
        "x1",
        "x2",
        "x3",
        "x4",
        "log_amount",
        "segment",
        "hour",
        "temperature",
        "target_value",
    ]
    assert "target" not in features.columns
    assert "amount" not in features.columns


def test_feature_dtypes_are_float_for_numeric_and_text_for_categorical(flights_validated):
    features = build_features(flights_validated, FLIGHTS)
    for name in FLIGHTS.numeric_features:
        assert features[name].dtype == "float64", name
    for name in FLIGHTS.categorical_features:
        assert pd.api.types.is_string_dtype(features[name]), name


@pytest.mark.parametrize("contract_name", ["flights", "synthetic"])
def test_features_are_row_wise(contract_name, flights_validated, synthetic_validated):
    contract = FLIGHTS if contract_name == "flights" else SYNTHETIC
    validated = flights_validated if contract_name == "flights" else synthetic_validated
    rows = np.random.default_rng(0).permutation(len(validated))[: len(validated) // 3]

    of_subset = build_features(validated.iloc[rows], contract)
    subset_of = build_features(validated, contract).iloc[rows].reset_index(drop=True)

    pd.testing.assert_frame_equal(of_subset, subset_of)


def test_features_are_deterministic(flights_validated):
    first = build_features(flights_validated, FLIGHTS)
    again = build_features(typed(flights_for_day(dt.date(2013, 1, 1)), FLIGHTS), FLIGHTS)
    pd.testing.assert_frame_equal(first, again)


WHEN = pd.Series(
    pd.to_datetime(["2024-01-01 00:00:00", "2024-03-02 13:45:10", "2023-12-31 23:59:59"]),
    index=[10, 11, 12],
)
TIME_EXPECTED = {
    "hour": [0.0, 13.0, 23.0],
    "minute_of_day": [0.0, 825.0, 1439.0],
    "month": [1.0, 3.0, 12.0],
    "day_of_year": [1.0, 62.0, 365.0],
}


def feature(values: pd.Series, kind: str, transform: str) -> pd.Series:
    frame = pd.DataFrame({"source": values})
    spec = FeatureSpec(name="f", kind=kind, source="source", transform=transform)
    return feature_column(frame, spec)


def test_every_transform_has_a_value_test():
    tested = {"identity", "log1p", "hhmm_to_minutes", "day_of_week", *TIME_EXPECTED}
    assert tested == NUMERIC_TRANSFORMS | TIME_TRANSFORMS


@pytest.mark.parametrize("transform", sorted(TIME_EXPECTED))
def test_numeric_time_transforms(transform):
    result = feature(WHEN, "numeric", transform)
    assert result.dtype == "float64"
    assert result.index.tolist() == [10, 11, 12]
    assert result.tolist() == TIME_EXPECTED[transform]


def test_day_of_week():
    result = feature(WHEN, "categorical", "day_of_week")
    assert result.tolist() == ["mon", "sat", "sun"]
    assert result.index.tolist() == [10, 11, 12]


def test_time_transforms_leave_missing_times_missing():
    when = pd.Series(pd.to_datetime(["2024-01-01 06:30:00", None]))
    for transform in TIME_EXPECTED:
        result = feature(when, "numeric", transform)
        assert pd.isna(result.iloc[1]), transform
    day = feature(when, "categorical", "day_of_week")
    assert day.iloc[0] == "mon"
    assert pd.isna(day.iloc[1])


def test_hhmm_to_minutes():
    hhmm = pd.Series(pd.array([0, 5, 100, 1345, 2359, None], dtype="Int64"))
    result = feature(hhmm, "numeric", "hhmm_to_minutes")
    assert result.dtype == "float64"
    assert result.tolist()[:5] == [0.0, 5.0, 60.0, 825.0, 1439.0]
    assert np.isnan(result.iloc[5])


def test_log1p():
    values = pd.Series([0.0, np.e - 1.0, np.e**2 - 1.0, np.nan])
    result = feature(values, "numeric", "log1p")
    assert result.tolist()[:3] == pytest.approx([0.0, 1.0, 2.0])
    assert np.isnan(result.iloc[3])


def test_identity_numeric_is_float():
    values = pd.Series(pd.array([3, None, -1], dtype="Int64"))
    result = feature(values, "numeric", "identity")
    assert result.dtype == "float64"
    assert result.tolist()[0] == 3.0
    assert np.isnan(result.iloc[1])
    assert result.tolist()[2] == -1.0


def test_identity_categorical_is_text_and_keeps_missing_missing():
    values = pd.Series(["EWR", None, "JFK"], dtype="str")
    result = feature(values, "categorical", "identity")
    assert pd.api.types.is_string_dtype(result)
    assert result.tolist()[0] == "EWR"
    assert pd.isna(result.iloc[1])
    assert result.tolist()[2] == "JFK"


def test_categorical_of_integers_is_their_text():
    values = pd.Series(pd.array([1, None, 3], dtype="Int64"))
    result = feature(values, "categorical", "identity")
    assert result.tolist()[0] == "1"
    assert pd.isna(result.iloc[1])
    assert result.tolist()[2] == "3"
