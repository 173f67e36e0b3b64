"""Known validation faults: duplicates under the quarantine, and patterns the gate cannot run."""

import pandas as pd
import pytest

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import ContractError, parse_contract
from ml_platform.validation.expectations import UNIQUENESS, quality_gate
from ml_platform_tests.conftest import Platform

# Runs a day of the real graph, and GE's validations.
pytestmark = pytest.mark.slow

DAY = "2024-01-01"


def checks_of(result) -> dict:
    return {c.check_name: c for c in result.get_asset_check_evaluations()}


def test_a_quarantined_duplicate_keeps_its_first_copy(tmp_path):
    # The synthetic contract quarantines up to 1 % of a day's rows; transaction_id is unique.
    platform = Platform(load_contract("synthetic"), tmp_path)
    platform.land(DAY, 1)
    landed = platform.landing_dir / f"synthetic_{DAY}.csv"
    frame = pd.read_csv(landed)
    # Three transactions delivered twice, the copies at the end of the file.
    landed.write_text(pd.concat([frame, frame.iloc[[10, 20, 30]]]).to_csv(index=False))

    result = platform.materialize(DAY, selection=["raw_data", "validated_data"])

    assert result.success
    uniqueness = checks_of(result)[UNIQUENESS]
    assert uniqueness.passed
    assert "These 3 row(s) were quarantined" in uniqueness.description
    assert "the first copy is kept" in uniqueness.description
    validated = pd.read_parquet(platform.stored("validated_data", DAY, "parquet"))
    # Nothing good is lost: every transaction is kept once, the first copy of each.
    assert len(validated) == 1000
    assert sorted(validated["transaction_id"]) == sorted(frame["transaction_id"])
    quarantined = pd.read_parquet(uniqueness.metadata["quarantine"].value)
    assert sorted(quarantined["transaction_id"]) == sorted(
        frame["transaction_id"].iloc[[10, 20, 30]]
    )
    [materialization] = [
        e.materialization
        for e in result.get_asset_materialization_events()
        if e.asset_key == platform.key("validated_data")
    ]
    assert materialization.metadata["quarantined_rows"].value == 3


PATTERN_CONTRACT = """
name: codes
owners: []
source: {kind: external}
partitions: {start_date: 2024-01-01}
landing: {file_pattern: "codes_{date}.csv", format: csv}
event_time: {column: ts, timezone: UTC}
columns:
  - {name: ts, dtype: datetime}
  - {name: y, dtype: int}
  - name: code
    dtype: str
    pattern: 'PATTERN'
label: {name: y_label, task: classification, source: y, rule: {op: "==", value: 1}}
leakage_columns: []
features:
  - {name: y_lag, kind: categorical, source: code}
"""


def codes_contract(pattern: str):
    return parse_contract(PATTERN_CONTRACT.replace("PATTERN", pattern), "codes.yaml")


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        # Python's re runs these; RE2, which pandas applies to Arrow strings, refuses them.
        ("[A-Z]++", "cannot run it"),
        ("(?>[A-Z]+)", "cannot run it"),
        ("(A)?(?(1)B|C)", "cannot run it"),
        ("[A-Z]{1,2000}", "cannot run it"),
        # Both run these, and read them differently: a day's values choose which one applies.
        ("[A-Z]{,3}", "write {0,3}"),
        ("[[:upper:]]+", "nested set"),
    ],
)
def test_a_pattern_the_gate_cannot_apply_is_refused_on_its_line(pattern, words):
    with pytest.raises(ContractError) as info:
        codes_contract(pattern)

    [problem] = info.value.problems
    line = PATTERN_CONTRACT.splitlines().index("    pattern: 'PATTERN'") + 1
    assert problem.startswith(f"line {line}: columns[2].pattern: ")
    assert words in problem


# GE's call warns that the backreference's group captures; only the match counts.
@pytest.mark.filterwarnings("ignore:This pattern is interpreted as a regular expression")
def test_lookarounds_and_backreferences_load_and_are_applied():
    # pandas runs these with Python's re, whatever the day's values: they are no problem.
    day = "2024-01-02"
    for pattern, good, bad in [("(?!X)[A-Z]{3}", "ABC", "XBC"), (r"([A-Z])\1[0-9]", "AA1", "AB1")]:
        contract = codes_contract(pattern)
        typed = pd.DataFrame(
            {
                "ts": pd.to_datetime([f"{day} 01:00", f"{day} 02:00"]),
                "y": pd.array([0, 1], dtype="Int64"),
                "code": pd.array([good, bad], dtype="str"),
            }
        )
        report, _ = quality_gate(contract).validate(typed, day)
        [failure] = [f for f in report.failures if f.column == "code"]
        assert failure.rows == [1], (pattern, failure.sentence)


@pytest.mark.parametrize(
    ("column", "words"),
    [
        # The typing reads empty text as missing: no value left could match.
        ("{name: code, dtype: str, pattern: ''}", "an empty pattern matches no value"),
        # Every row holding an allowed value would fail the pattern.
        (
            "{name: code, dtype: str, allowed_values: [EWR, JFK1], pattern: '[A-Z]{3}'}",
            "does not match the allowed value(s) 'JFK1'",
        ),
    ],
)
def test_a_pattern_no_allowed_value_could_pass_is_refused_on_its_line(column, words):
    text = PATTERN_CONTRACT.replace(
        "  - name: code\n    dtype: str\n    pattern: 'PATTERN'", f"  - {column}"
    )
    with pytest.raises(ContractError) as info:
        parse_contract(text, "codes.yaml")

    [problem] = info.value.problems
    line = text.splitlines().index(f"  - {column}") + 1
    assert problem.startswith(f"line {line}: columns[2].")
    assert words in problem
