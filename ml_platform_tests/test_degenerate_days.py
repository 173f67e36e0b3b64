"""Degenerate days from each bundled contract through the real gates: a pass or a named verdict.

Every day is generated from a real landed day of the contract (0 rows, 1 row, a column emptied
or made constant, a label of one class or none, extreme floats, one category), written as CSV
text and read as raw_data reads it, then judged by raw_data's schema check, the typing, the
Great Expectations gate with the history gate against a real week of profiles, and the drift
check's describers. No outcome may be an exception: each check passes, or says which check,
which column, what value and what range.
"""

import dataclasses
import datetime as dt
import hashlib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.reference import describe_reference, reference_days
from ml_platform.contracts.schema import ContractViolationError, type_rows
from ml_platform.drift.checks import describe
from ml_platform.drift.detect import Calibration, calibrate, detect_drift
from ml_platform.drift.report import DriftReport, verdict_table
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.assets import read_landed_file, schema_check_result
from ml_platform.ingestion.landing import LandingZone, land_days
from ml_platform.validation.assets import check_results
from ml_platform.validation.expectations import HISTORY, quality_gate
from ml_platform.validation.history import HistoryWindow, day_profile, window_from_profiles

# GE's fixed cost per validation (about 0.25 s a flights day on an idle core) is most of it.
pytestmark = pytest.mark.slow

# The judged day of each contract: its reference days (the four same weekdays before, for
# flights; the baseline days before it, for synthetic) are landed, typed and profiled.
DAYS = {"flights": "2013-01-22", "synthetic": "2024-01-08"}
EXTREME = ["1e308", "-1e308", "5e-324", "-5e-324", "inf", "-inf", "0", "1.7976931348623157e308"]
KINDS = [
    "no_rows",
    "one_row",
    "null_column",
    "constant_column",
    "single_class",
    "no_label",
    "label_all_equal",
    "extreme_floats",
    "one_category",
]


@dataclasses.dataclass(repr=False)
class Judged:
    """A contract, its real day as landed, and the history and drift reference it is judged by."""

    contract: Contract
    day: str
    landed: pd.DataFrame  # the real day's CSV cells, as text
    history: HistoryWindow
    short_history: HistoryWindow  # one reference day: too short to bound anything
    reference: list[pd.DataFrame]  # features of the drift reference days
    reference_days: list[str]
    calibration: Calibration
    # GE's report of each distinct typed day already judged: generated days often coincide
    # (every emptied file is the same file), and GE's fixed cost is most of an example's.
    reports: dict[tuple[str, bool], Any] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Judged({self.contract.name}, {self.day})"


def read_text(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def as_landed(contract: Contract, day: str, text: pd.DataFrame) -> pd.DataFrame:
    """The frame raw_data stores for CSV cells `text`."""
    data = text.to_csv(index=False).encode()
    columns = [c.name for c in contract.columns if c.dtype == "str"]
    return read_landed_file(data, contract.landing.file_name(day), day, columns)


def judged(name: str, root: Path) -> Judged:
    contract = load_contract(name)
    day = DAYS[name]
    date = dt.date.fromisoformat(day)
    references = reference_days(contract.history_reference, date, contract.partitions.start_date)
    zone = LandingZone(base_dir=str(root))
    list(land_days(contract, zone, [*references, date]))
    profiles, reference = {}, []
    for ref in references:
        key = ref.isoformat()
        where = f"{contract.landing.file_name(key)} (partition {key})"
        landed = as_landed(contract, key, read_text(root / contract.landing.file_name(key)))
        typed = type_rows(landed, contract, where)
        profiles[key] = day_profile(typed, contract)
        reference.append(build_features(typed, contract))
    first = references[0].isoformat()
    return Judged(
        contract=contract,
        day=day,
        landed=read_text(root / contract.landing.file_name(day)),
        history=window_from_profiles(contract, day, profiles),
        short_history=window_from_profiles(contract, day, {first: profiles[first]}),
        reference=reference,
        reference_days=[d.isoformat() for d in references],
        calibration=calibrate(reference, contract),
    )


@pytest.fixture(scope="module")
def contracts(tmp_path_factory) -> dict[str, Judged]:
    """The real week of history of each bundled contract, built once for every example."""
    return {name: judged(name, tmp_path_factory.mktemp(name)) for name in DAYS}


def degenerate(data: st.DataObject, case: Judged) -> tuple[str, pd.DataFrame]:
    """A degenerate version of the real day's CSV cells, and what was done to it."""
    contract = case.contract
    text = case.landed.copy()
    kinds = data.draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=3, unique=True))
    column = data.draw(st.sampled_from(contract.column_names))
    source = contract.label.source
    done = []
    for kind in kinds:
        if kind == "no_rows":
            text = text.iloc[0:0]
        elif kind == "one_row":
            text = text.iloc[: data.draw(st.integers(1, 3))]
        elif kind == "null_column":
            text[column] = ""
        elif kind == "constant_column":
            present = text.loc[text[column] != "", column]
            text[column] = present.iloc[0] if len(present) else "0"
        elif kind == "single_class":
            text[source] = data.draw(st.sampled_from(["-5", "0", "60", "0.5"]))
        elif kind == "no_label":
            text[source] = ""
        elif kind == "label_all_equal":
            present = text.loc[text[source] != "", source]
            text[source] = present.iloc[0] if len(present) else "1"
        elif kind == "extreme_floats" and len(text):
            rows = data.draw(st.lists(st.integers(0, len(text) - 1), min_size=1, max_size=5))
            value = data.draw(st.sampled_from(EXTREME))
            text.iloc[rows, text.columns.get_loc(column)] = value
        elif kind == "one_category":
            categorical = [c.name for c in contract.columns if c.dtype == "str"]
            chosen = data.draw(st.sampled_from(categorical))
            text[chosen] = text[chosen].iloc[0] if len(text) else "A"
        done.append(f"{kind}({column})")
    return ", ".join(done), text.reset_index(drop=True)


def assert_named(description: str, where: str, what: str) -> None:
    assert description.startswith(where), (what, description)


def judge_day(case: Judged, text: pd.DataFrame, short: bool, what: str) -> None:
    """Every gate and describer on the day; fails the test on an exception or a vague verdict."""
    contract, day = case.contract, case.day
    file_name = contract.landing.file_name(day)
    where = f"{file_name} (partition {day})"
    landed = as_landed(contract, day, text)
    schema = schema_check_result(landed, contract, file_name, day)
    if not schema.passed:
        # raw_data's verdict: the column and what its values should be.
        assert any(c in (schema.description or "") for c in contract.column_names), what
        assert "does not match contract" in (schema.description or ""), what
        return
    try:
        typed = type_rows(landed, contract, where)
    except ContractViolationError as exc:
        assert str(exc).startswith(where) and "column" in str(exc), (what, str(exc))
        return
    history = case.short_history if short else case.history
    digest = hashlib.sha256(pd.util.hash_pandas_object(typed).to_numpy().tobytes())
    digest.update(str(list(typed.dtypes)).encode())
    key = (digest.hexdigest(), short)
    if key not in case.reports:
        case.reports[key] = quality_gate(contract).validate(typed, day, history)[0]
    report = case.reports[key]
    profile = day_profile(typed, contract)
    for check in check_results(contract, report, typed, where, {}, history, profile):
        description = check.description or ""
        assert_named(description, where, what)
        failures = report.of(str(check.check_name))
        if not failures:
            continue
        assert not check.passed or str(check.check_name) != HISTORY, what
        for failure in failures:
            if failure.finding is not None:
                # The statistic, its value today and the range allowed.
                finding = failure.finding
                stat = finding.statistic
                assert stat.describe() in description, (what, description)
                assert f"{stat.show(finding.today)} today" in description, (what, description)
                assert finding.allowed() in description, (what, description)
                table = check.metadata["history_table"].value.records
                assert failure.finding.statistic.key in {r.data["statistic"] for r in table}
            else:
                assert failure.sentence in description, (what, description)
                if failure.column:
                    assert failure.column.split(", ")[0] in failure.sentence, what
                assert check.metadata["findings"].value.records, what
    features = build_features(typed, contract)
    verdicts = detect_drift(case.reference, features, contract, case.calibration)
    drift = DriftReport(
        dataset=contract.name,
        partition=day,
        reference=describe_reference(contract.drift.reference, dt.date.fromisoformat(day)),
        reference_days=case.reference_days,
        missing_reference_days=[],
        reference_rows=sum(map(len, case.reference)),
        current_rows=len(features),
        correction=contract.drift.correction,
        alpha=contract.drift.alpha,
        verdicts=verdicts,
    )
    summary = describe(drift, contract)
    assert day in summary, what
    for verdict in drift.drifting:
        assert verdict.feature in summary, what
    assert len(verdict_table(drift)) == len(verdicts)


@pytest.mark.parametrize("name", sorted(DAYS))
# 40 examples a contract reach every kind several times over (about 2 s each for flights): the
# suite's budget, not the kinds, bounds them.
@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data(), short=st.booleans())
def test_every_degenerate_day_passes_or_gets_a_named_verdict(contracts, name, data, short):
    case = contracts[name]
    what, text = degenerate(data, case)
    judge_day(case, text, short, what)
