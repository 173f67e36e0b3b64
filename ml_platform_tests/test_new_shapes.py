"""Data shapes the platform was not built on, from sample files through `init-contract` to days.

Flights (a numeric rule on arrival delay) and the synthetic regression are what the platform was
designed around. These hold what already works for other shapes a team brings: a label spelled
as words, files written by spreadsheets and exports (a byte-order mark, CRLF, quoted fields that
hold commas and line breaks, a column never filled), a day of no rows, a text label of several
classes, very wide days.
"""

import datetime as dt
import json
import shutil
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from ml_platform import cli
from ml_platform.contracts import load_contract
from ml_platform.contracts.model import parse_contract
from ml_platform.contracts.schema import raw_schema, type_rows
from ml_platform.ingestion.assets import LandingFileError, read_landed_file
from ml_platform.platform.records import day_records
from ml_platform.validation.expectations import quality_gate
from ml_platform.validation.infer import draft_contract
from ml_platform_tests.conftest import DAILY_ASSETS, Platform, rejected_days

# Each test that runs days runs a few of the real graph.
pytestmark = pytest.mark.slow

START = dt.date(2024, 3, 4)
NOTES = ["ok", "late, again", 'said "hi"\nthen left', "two\r\nlines, one comma"]


def days(count: int) -> list[str]:
    return [(START + dt.timedelta(days=i)).isoformat() for i in range(count)]


def churn_day(day: str, seed: int, rows: int = 240) -> pd.DataFrame:
    """A day of a churn export: distinct event times, a key, two signals and a yes/no label."""
    rng = np.random.default_rng(seed)
    seconds = np.sort(rng.choice(86_400, rows, replace=False))
    x = rng.normal(0, 1, (rows, 2))
    churned = rng.random(rows) < 1 / (1 + np.exp(-(2 * x[:, 0] - x[:, 1])))
    return pd.DataFrame(
        {
            "ts": [(pd.Timestamp(day) + pd.Timedelta(seconds=int(s))).isoformat() for s in seconds],
            "account": rng.choice(["basic", "pro", "team"], rows),
            "x0": x[:, 0].round(4),
            "x1": x[:, 1].round(4),
            "note": rng.choice(NOTES, rows),
            "unused": "",
            "churned": np.where(churned, "yes", "no"),
        }
    )


def export_bytes(frame: pd.DataFrame) -> bytes:
    """A file as a spreadsheet's 'CSV UTF-8' writes it: a byte-order mark and CRLF lines."""
    return b"\xef\xbb\xbf" + frame.to_csv(index=False, lineterminator="\r\n").encode()


def choose_label(path: Path, label: str) -> None:
    """The draft with `label` chosen and every other label candidate's feature taken in."""
    lines = [line for line in path.read_text().splitlines() if not line.startswith("# label:")]
    source = label.split("source: ")[1].split(",")[0].rstrip("}")
    lines = [
        line.replace("# - {", "- {", 1)
        if line.strip().startswith("# - {name:") and f"source: {source}}}" not in line
        else line
        for line in lines
    ]
    path.write_text("\n".join([*lines, label, ""]))


def materialize_range(platform: Platform, first: str, last: str) -> dg.ExecuteInProcessResult:
    """One run of the daily assets and their checks over first..last, as a backfill runs it."""
    return dg.materialize(
        [*(platform.defs.assets or []), *(platform.defs.asset_checks or [])],
        resources=platform.defs.resources,
        instance=platform.instance,
        selection=[platform.key(name) for name in DAILY_ASSETS],
        tags={
            "dagster/asset_partition_range_start": first,
            "dagster/asset_partition_range_end": last,
        },
        raise_on_error=False,
    )


def test_a_bom_crlf_quoted_export_with_a_yes_no_label_runs_by_day_as_a_range_and_again(
    tmp_path, capsys
):
    """init-contract on the export's samples, its days one by one, as a range, one day again."""
    all_days = days(6)
    frames = {day: churn_day(day, seed=i + 1) for i, day in enumerate(all_days)}
    # The fifth day's export came out empty: its header alone.
    frames[all_days[4]] = frames[all_days[4]].iloc[:0]
    landing = tmp_path / "exports"
    landing.mkdir()
    for day, frame in frames.items():
        (landing / f"churn_{day}.csv").write_bytes(export_bytes(frame))

    draft = tmp_path / "churn.yaml"
    samples = [str(landing / f"churn_{day}.csv") for day in all_days[:3]]
    assert cli.main(["init-contract", *samples, "--name", "churn", "-o", str(draft)]) == 0
    text = draft.read_text()
    # The label spelled yes/no is a bool column, offered as a classification label.
    assert "# label: {name: churned_label, task: classification, source: churned}" in text
    choose_label(draft, "label: {name: churn_label, task: classification, source: churned}")
    # The notes are a closed set: its line's comment lists the values seen, which the team
    # copies in as the allowed values, as the comment says.
    line = next(line for line in draft.read_text().splitlines() if "{name: note," in line)
    mapping, seen = line.split("  # ")[0], line.split("add allowed_values: ")[1]
    closed = mapping.replace("}", f", allowed_values: {seen}}}")
    draft.write_text(draft.read_text().replace(line, closed))
    assert cli.main(["check-contract", str(draft)]) == 0
    capsys.readouterr()
    contract = load_contract(draft)
    columns = {c.name: c for c in contract.columns}
    assert columns["churned"].dtype == "bool"
    # Values holding a comma, a quote, LF or CRLF are allowed values as written, byte for byte
    # (listed on one comment line, line breaks escaped).
    assert sorted(columns["note"].allowed_values or []) == sorted(NOTES)
    # A column every sample left empty is text that may be missing, never a number.
    assert columns["unused"].dtype == "str" and columns["unused"].nullable

    platform = Platform(contract, tmp_path / "platform")
    shutil.copytree(landing, platform.landing_dir)
    one_by_one, as_range = all_days[:3], all_days[3:]
    for day in one_by_one:
        assert platform.materialize(day).success, day
    assert materialize_range(platform, as_range[0], as_range[-1]).success

    validated = {
        day: pd.read_parquet(platform.stored("validated_data", day, "parquet"))
        for day in all_days
        if day != all_days[4]
    }
    for day, rows in validated.items():
        landed = frames[day]
        assert len(rows) == len(landed), day
        # Every line break and comma inside a quoted field is kept, on the row it belongs to.
        assert rows["note"].tolist() == landed["note"].tolist(), day
        assert rows["unused"].isna().all(), day
        assert rows["churn_label"].tolist() == (landed["churned"] == "yes").astype(int).tolist()

    # The day of no rows is rejected with its file, its day and why; the days around it are not.
    records = day_records(platform.instance, platform.key("validated_data"), all_days)
    empty = records[all_days[4]]
    assert not empty.accepted
    assert f"churn_{all_days[4]}.csv (partition {all_days[4]})" in empty.reason
    assert "holds 0 rows" in empty.reason
    assert all(records[day].accepted for day in all_days if day != all_days[4])

    # Each evaluated day's decision follows from its recorded metrics.
    evaluated = [d for d in all_days if platform.stored("evaluation_report", d, "json").exists()]
    assert evaluated == [d for d in all_days if d != all_days[4]]
    rejected_days(contract, platform.lake_dir, evaluated)
    report = json.loads(platform.stored("evaluation_report", all_days[3], "json").read_text())
    assert report["metrics"]["roc_auc"] > 0.7

    # A day run again keeps its rows: the same accepted data, version after version.
    again = all_days[1]
    before = validated[again]
    assert platform.materialize(again).success
    after = pd.read_parquet(platform.stored("validated_data", again, "parquet"))
    pd.testing.assert_frame_equal(before, after)


CHURN = """
name: churn
owners: []
source: {kind: external}
partitions: {start_date: 2024-03-04}
landing: {file_pattern: "churn_{date}.csv", format: csv}
event_time: {column: ts, timezone: UTC}
columns:
  - {name: ts, dtype: datetime}
  - {name: x0, dtype: float}
  - {name: churned, dtype: bool, nullable: true}
label: {name: churn_label, task: classification, source: churned}
leakage_columns: []
features:
  - {name: x0, kind: numeric, source: x0}
quality:
  row_count: {min: 1, max: 1000}
"""


@pytest.mark.parametrize(
    ("spelled", "label"),
    [
        (["yes", "No", "YES", "no"], [1, 0, 1, 0]),
        (["True", "false", "TRUE", "False"], [1, 0, 1, 0]),
        (["y", "N", " yes", "no "], [1, 0, 1, 0]),
        (["1", "0", "", "0"], [1, 0, None, 0]),
    ],
)
def test_a_label_written_as_words_in_any_case_types_to_one_label(spelled, label):
    contract = parse_contract(CHURN, "churn.yaml")
    day = "2024-03-05"
    text = "ts,x0,churned\n" + "".join(
        f"{day}T0{i}:00:00,0.{i},{word}\n" for i, word in enumerate(spelled)
    )
    name = contract.landing.file_name(day)
    raw = read_landed_file(text.encode(), name, day, ["ts", "churned"])
    typed = type_rows(raw, contract, f"{name} (partition {day})")
    assert (
        typed["churn_label"].astype("object").where(typed["churn_label"].notna(), None).tolist()
        == label
    )


def test_a_label_word_that_is_no_yes_or_no_is_named_with_its_file_and_day():
    contract = parse_contract(CHURN, "churn.yaml")
    day = "2024-03-05"
    text = f"ts,x0,churned\n{day}T01:00:00,0.1,oui\n{day}T02:00:00,0.2,no\n"
    name = contract.landing.file_name(day)
    raw = read_landed_file(text.encode(), name, day, ["ts", "churned"])
    with pytest.raises(ValueError, match=rf"churn_{day}\.csv \(partition {day}\).*churned.*'oui'"):
        type_rows(raw, contract, f"{name} (partition {day})")


def test_a_text_label_of_several_classes_is_refused_by_check_contract_naming_its_line(
    tmp_path, capsys
):
    """A multiclass label is no shape the platform trains: check-contract says so, by line."""
    folder = tmp_path / "samples"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for day in days(3):
        pd.DataFrame(
            {
                "ts": [f"{day}T{h:02d}:00:00" for h in range(24)],
                "x0": rng.normal(0, 1, 24).round(3),
                "species": rng.choice(["setosa", "versicolor", "virginica"], 24),
            }
        ).to_csv(folder / f"iris_{day}.csv", index=False)
    draft = tmp_path / "iris.yaml"
    paths = sorted(map(str, folder.glob("*.csv")))
    assert cli.main(["init-contract", *paths, "--name", "iris", "-o", str(draft)]) == 0
    # Text is never offered as a label: only numeric and bool columns are.
    assert "source: species}" not in "".join(
        line for line in draft.read_text().splitlines() if line.startswith("# label:")
    )
    choose_label(draft, "label: {name: species_label, task: classification, source: species}")
    capsys.readouterr()
    assert cli.main(["check-contract", str(draft)]) == 2
    err = capsys.readouterr().err
    assert "label source 'species' must be numeric or bool" in err
    assert "'species' leaks the label and cannot feed a feature" in err


def test_a_semicolon_separated_day_is_told_as_such_naming_file_and_day():
    """A European spreadsheet's export: refused with what to do, whether or not it parses."""
    contract = parse_contract(CHURN, "churn.yaml")
    day = "2024-03-05"
    name = contract.landing.file_name(day)
    # Decimal commas make the rows longer than the header: not a readable CSV file.
    with pytest.raises(LandingFileError, match=rf"{name} \(partition {day}\).*separated by ';'"):
        read_landed_file(f"ts;x0;churned\n{day}T01:00:00;0,5;yes\n".encode(), name, day)
    # Decimal points make one column of the whole line: the schema check says why.
    text = f"ts;x0;churned\n{day}T01:00:00;0.5;yes\n"
    raw = read_landed_file(text.encode(), name, day, ["ts", "churned"])
    report = raw_schema(raw, contract)
    assert not report.ok
    assert "missing column(s) ts, x0, churned" in report.describe()
    assert "separated by ';', not ','" in report.describe()


def test_a_day_of_150_features_is_drafted_typed_and_gated_column_by_column(tmp_path):
    """Very wide days: every column drafted with its range, and a bad value named by column."""
    rng = np.random.default_rng(11)
    width, rows = 150, 60
    paths = []
    for day in days(3):
        frame = pd.DataFrame(
            rng.uniform(-1, 1, (rows, width)).round(3), columns=[f"f{j:03d}" for j in range(width)]
        )
        frame.insert(0, "ts", [f"{day}T{m // 60:02d}:{m % 60:02d}:00" for m in range(rows)])
        frame["y"] = rng.normal(0, 1, rows).round(3)
        path = tmp_path / f"wide_{day}.csv"
        frame.to_csv(path, index=False)
        paths.append(path)
    text = draft_contract(paths, "wide").replace(
        "# label: {name: y_label", "label: {name: y_label", 1
    )
    contract = parse_contract(text, "wide.yaml")
    assert len(contract.columns) == width + 2
    bounds = {c.name: (c.min, c.max) for c in contract.columns if c.name.startswith("f")}
    assert len(bounds) == width
    # Each column's own range, twice its span beyond each end (it takes both signs): none
    # lost, none shared by mistake.
    seen = pd.concat(pd.read_csv(path) for path in paths)
    for column, (low, high) in bounds.items():
        least, most = seen[column].min(), seen[column].max()
        span = most - least
        assert (low, high) == pytest.approx((least - 2 * span, most + 2 * span), abs=1e-6)

    # A later day of the same shape passes; one value far out is named with its column.
    day = days(4)[3]
    later = pd.read_csv(paths[0]).assign(ts=lambda f: f["ts"].str.replace(days(1)[0], day))
    later.loc[7, "f123"] = 50.0
    name = contract.landing.file_name(day)
    raw = read_landed_file(later.to_csv(index=False).encode(), name, day, ["ts"])
    typed = type_rows(raw, contract, f"{name} (partition {day})")
    report, _ = quality_gate(contract).validate(typed, day)
    assert [(f.column, f.rows) for f in report.failures] == [("f123", [7])]
    assert "1 of 60 rows" in report.failures[0].sentence
