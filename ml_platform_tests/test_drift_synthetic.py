"""Drift alarms on 60 days of synthetic data: rare when nothing changes, every day on a lasting
0.2 sd shift of one feature and on no other, with the synthetic contract's own settings."""

import datetime as dt

import pandas as pd
import pytest

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import DriftReferenceSpec
from ml_platform.drift.detect import detect_drift
from ml_platform.drift.reference import reference_days
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.synthetic import Drift, file_bytes, generate_day
from ml_platform.validation.schema import type_rows

CONTRACT = load_contract("synthetic")
START = CONTRACT.partitions.start_date
DAYS = [START + dt.timedelta(days=i) for i in range(60)]
SHIFTED_FROM = DAYS[40]
SHIFT = Drift("x1", 0.2, SHIFTED_FROM)


def features_of(day: dt.date, drift: Drift | None = None) -> pd.DataFrame:
    """A day's features the way the graph makes them: file bytes, landed, typed, featurised."""
    source = CONTRACT.source
    frame = generate_day(day, seed=source.seed, rows=source.rows_per_day, drift=drift)
    name = CONTRACT.landing.file_name(day.isoformat())
    text_columns = [c.name for c in CONTRACT.columns if c.dtype == "str"]
    raw = read_landed_file(file_bytes(frame), name, day.isoformat(), text_columns)
    return build_features(type_rows(raw, CONTRACT, where=name), CONTRACT)


@pytest.fixture(scope="module")
def quiet() -> dict[dt.date, pd.DataFrame]:
    return {day: features_of(day) for day in DAYS}


@pytest.fixture(scope="module")
def shifted(quiet) -> dict[dt.date, pd.DataFrame]:
    return {**quiet, **{day: features_of(day, SHIFT) for day in DAYS if day >= SHIFTED_FROM}}


def alarms(frames: dict[dt.date, pd.DataFrame], contract: Contract) -> tuple[set, int]:
    """(day, feature) pairs that drifted, and the number of feature-days tested."""
    fired, tested = set(), 0
    references: dict[tuple, pd.DataFrame] = {}
    for day in DAYS:
        ref_days = tuple(reference_days(contract.drift.reference, day, START))
        if not ref_days:
            continue
        if ref_days not in references:
            references[ref_days] = pd.concat([frames[d] for d in ref_days], ignore_index=True)
        for verdict in detect_drift(references[ref_days], frames[day], contract):
            tested += verdict.status != "skipped"
            if verdict.status == "drift":
                fired.add((day, verdict.feature))
    return fired, tested


def test_without_drift_at_most_one_percent_of_feature_days_fire(quiet):
    fired, tested = alarms(quiet, CONTRACT)
    assert tested == 59 * 7  # every day but the first, which has no reference yet
    assert len(fired) <= 0.01 * tested, sorted(fired)


def test_a_lasting_shift_fires_on_that_feature_every_day_and_on_no_other(shifted):
    fired, _ = alarms(shifted, CONTRACT)
    assert fired == {(day, "x1") for day in DAYS if day >= SHIFTED_FROM}


def test_a_sliding_reference_stops_seeing_a_lasting_shift(shifted):
    """Why the synthetic contract uses a baseline: 7 previous days absorb the shift in a week."""
    sliding = CONTRACT.model_copy(
        update={
            "drift": CONTRACT.drift.model_copy(
                update={"reference": DriftReferenceSpec(mode="previous_days", days=7)}
            )
        }
    )
    fired, _ = alarms(shifted, sliding)
    x1_days = {day for day, feature in fired if feature == "x1"}
    assert SHIFTED_FROM in x1_days
    assert not {day for day in x1_days if day >= SHIFTED_FROM + dt.timedelta(days=7)}
