"""The draft of `init-contract` on sample shapes a team brings: ids that count on, down or at
random, heavy tails, many columns, small whole-number spans, files separated otherwise than by
commas, a category too rare for the samples, quieter weekends after weekday samples.

A team that follows docs/contracts.md (draft, choose the label, check-contract, materialise)
must not get ordinary days rejected by what the draft guessed; the drafted ranges still catch
gross errors (a unit changed, a sign flipped, a sentinel value).
"""

import datetime as dt
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from ml_platform import cli
from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import parse_contract
from ml_platform.contracts.schema import type_rows
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.platform.records import day_records
from ml_platform.validation.expectations import Failure, quality_gate
from ml_platform.validation.infer import InferenceError, draft_contract
from ml_platform_tests.conftest import Platform

START = dt.date(2024, 3, 1)


def orders_day(i: int, rows: int = 300, late: int = 0) -> tuple[str, pd.DataFrame]:
    """Day i of an order export: distinct event times, an order id counting on across days.

    With `late`, a day's first ids are the `late` last of the day before (orders placed before
    midnight, exported when paid after it).
    """
    day = (START + dt.timedelta(days=i)).isoformat()
    rng = np.random.default_rng(i)
    seconds = np.sort(rng.choice(86_400, rows, replace=False))
    return day, pd.DataFrame(
        {
            "ts": [(pd.Timestamp(day) + pd.Timedelta(seconds=int(s))).isoformat() for s in seconds],
            "order_id": 1_000 + i * rows + np.arange(rows) - (late if i else 0),
            "basket": rng.choice(["small", "large"], rows),
            # Spend per order: lognormal, as money is.
            "spend": np.exp(rng.normal(1.0, 1.2, rows)).round(2),
            # Items per order: a count.
            "items": rng.poisson(1.2, rows),
        }
    )


def orders_draft(folder: Path, count: int = 5, late: int = 0) -> str:
    """The draft of the first `count` order days, as `init-contract` writes it."""
    folder.mkdir(exist_ok=True)
    paths = []
    for i in range(count):
        day, frame = orders_day(i, late=late)
        paths.append(folder / f"orders_{day}.csv")
        frame.to_csv(paths[-1], index=False)
    return draft_contract(paths, "orders")


def with_label(text: str, label: str) -> Contract:
    """The draft with `label`'s line uncommented, as docs/contracts.md tells a team to."""
    chosen = text.replace(f"# label: {{name: {label}", f"label: {{name: {label}", 1)
    assert chosen != text, label
    return parse_contract(chosen, "draft.yaml")


def gate_failures(contract: Contract, day: str, frame: pd.DataFrame) -> list[Failure]:
    """The quality gate's failures on `frame` landed as `day`'s file."""
    name = contract.landing.file_name(day)
    text_columns = [c.name for c in contract.columns if c.dtype == "str"]
    raw = read_landed_file(frame.to_csv(index=False).encode(), name, day, text_columns)
    typed = type_rows(raw, contract, f"{name} (partition {day})")
    report, _ = quality_gate(contract).validate(typed, day)
    return report.failures


def column_line(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"  - {{name: {name},"))


def drafted_exports(
    tmp_path: Path, name: str, day_of: Callable[[int], tuple[str, pd.DataFrame]]
) -> tuple[Path, list[str], Path]:
    """Ten days exported as `<name>_<day>.csv` and the contract init-contract drafts from the
    first three, as docs/contracts.md has a team do: (exports folder, days, draft)."""
    landing = tmp_path / "exports"
    landing.mkdir()
    days = []
    for i in range(10):
        day, frame = day_of(i)
        frame.to_csv(landing / f"{name}_{day}.csv", index=False)
        days.append(day)
    draft = tmp_path / f"{name}.yaml"
    samples = [str(landing / f"{name}_{day}.csv") for day in days[:3]]
    assert cli.main(["init-contract", *samples, "--name", name, "-o", str(draft)]) == 0
    return landing, days, draft


def every_day_accepted_and_trained(
    draft: Path, landing: Path, days: list[str], tmp_path: Path
) -> Platform:
    """The drafted contract's platform over the landed days, each materialised: every day is
    accepted by the drafted gate and trains its model."""
    platform = Platform(load_contract(draft), tmp_path / "platform")
    platform.landing_dir.mkdir(parents=True)
    for path in landing.iterdir():
        (platform.landing_dir / path.name).write_bytes(path.read_bytes())
    for day in days:
        assert platform.materialize(day).success, day
    records = day_records(platform.instance, platform.key("validated_data"), days)
    assert {day: records[day].reason for day in days if not records[day].accepted} == {}
    assert platform.materialized("model") == set(days)
    return platform


@pytest.mark.parametrize("late", [0, 5])
def test_an_id_counting_on_across_days_is_no_range_label_or_feature_whatever_the_key(
    tmp_path, late
):
    text = orders_draft(tmp_path, late=late)
    document = yaml.safe_load(text)
    # The event time, unique too, was picked as the key: the id is a key of every day all the same.
    assert document["quality"]["row_key"] == ["event_time"]
    order_id = next(c for c in document["columns"] if c["name"] == "order_id")
    assert order_id == {"name": "order_id", "dtype": "int"}
    assert "counts on from day to day" in column_line(text, "order_id")
    offered = [line for line in text.splitlines() if "source: order_id" in line]
    assert offered == [], offered
    # The samples' ids are 1000..2499; day 7's are 3100..3399: no reason to reject it.
    day, frame = orders_day(7, late=late)
    contract = with_label(text, "spend_label")
    assert gate_failures(contract, day, frame) == []


def test_a_heavy_tailed_column_passes_later_days_of_its_distribution(tmp_path):
    contract = with_label(orders_draft(tmp_path), "spend_label")
    # 30 later days drawn exactly as the samples were: an ordinary day is no bad day.
    rejected = {}
    for i in range(5, 35):
        day, frame = orders_day(i)
        failures = gate_failures(contract, day, frame)
        if failures:
            rejected[day] = [f.column for f in failures]
    assert rejected == {}


@pytest.mark.parametrize(
    ("column", "spoil"),
    [
        ("spend", lambda s: s * 1000),  # cents sent as units
        ("spend", lambda s: -s),  # a sign flipped
        ("items", lambda s: s.where(s.index != 3, 99_999)),  # a sentinel
        ("items", lambda s: s.where(s.index != 3, -999)),
    ],
)
def test_drafted_ranges_still_catch_gross_errors(tmp_path, column, spoil):
    contract = with_label(orders_draft(tmp_path), "spend_label")
    day, frame = orders_day(9)
    frame[column] = spoil(frame[column])
    assert column in {f.column for f in gate_failures(contract, day, frame)}


def test_event_times_on_another_day_than_their_files_are_pointed_out(tmp_path):
    # Files named by the day they were exported, the morning after the day of their events.
    paths = []
    for i in range(3):
        day, frame = orders_day(i)
        exported = (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat()
        paths.append(tmp_path / f"orders_{exported}.csv")
        frame.to_csv(paths[-1], index=False)

    text = draft_contract(paths, "orders")

    assert (
        "  # 900 of 900 sample row(s) have an event time on another day than their file's name "
        "carries (orders_2024-03-02.csv holds 2024-03-01T00:"
    ) in text
    assert "quality gate rejects" in text.split("900 of 900")[1].split("\n  column:")[0]
    # Events of the file's own day: nothing to point out.
    assert "on another day than their file's" not in orders_draft(tmp_path / "own")


@pytest.mark.slow
def test_a_team_following_the_docs_gets_its_ordinary_days_accepted_and_models_trained(
    tmp_path, capsys
):
    """docs/contracts.md step by step: draft, choose the label, check-contract, materialise."""
    landing, days, draft = drafted_exports(tmp_path, "orders", lambda i: orders_day(i, late=3))
    label = "# label: {name: spend_label, task: regression, source: spend}"
    draft.write_text(
        draft.read_text()
        .replace(label, label.removeprefix("# "))
        .replace("# - {name: items,", "- {name: items,")
    )
    assert cli.main(["check-contract", str(draft)]) == 0
    capsys.readouterr()

    every_day_accepted_and_trained(draft, landing, days, tmp_path)


def wide_day(i: int) -> tuple[str, pd.DataFrame]:
    """Day i of 150 standard normal features and a label: the same distribution every day."""
    day = (START + dt.timedelta(days=i)).isoformat()
    rng = np.random.default_rng(100 + i)
    frame = pd.DataFrame(
        rng.normal(0, 1, (300, 150)).round(4), columns=[f"f{j:03d}" for j in range(150)]
    )
    times = [
        (pd.Timestamp(day) + pd.Timedelta(seconds=s)).isoformat() for s in range(0, 86_400, 288)
    ]
    frame.insert(0, "ts", times)
    frame["y"] = (frame["f000"] + rng.normal(0, 1, 300)).round(3)
    return day, frame


def test_ordinary_wide_days_pass_the_gate_drafted_from_their_samples(tmp_path):
    paths = []
    for i in range(5):
        day, frame = wide_day(i)
        paths.append(tmp_path / f"wide_{day}.csv")
        frame.to_csv(paths[-1], index=False)
    contract = with_label(draft_contract(paths, "wide"), "y_label")
    rejected = {}
    for i in range(5, 8):
        day, frame = wide_day(i)
        failures = gate_failures(contract, day, frame)
        if failures:
            rejected[day] = sorted({f.column for f in failures})
    assert rejected == {}


def test_a_small_whole_number_span_is_widened_as_its_note_says(tmp_path):
    paths = []
    for i, day in enumerate(["2024-01-01", "2024-01-02"]):
        frame = pd.DataFrame(
            {
                "ts": [f"{day} {h:02d}:15:00" for h in range(20)],
                "level": [1 + (h + i) % 3 for h in range(20)],  # 1 to 3
                "delta": [(h + i) % 5 - 2 for h in range(20)],  # -2 to 2
                "below": [-1 - (h + i) % 4 for h in range(20)],  # -4 to -1
                "amount": [3 * h + i for h in range(20)],
                "price": [1000.25 + (h + i) % 2 * 234.3178 for h in range(20)],
            }
        )
        paths.append(tmp_path / f"shop_{day}.csv")
        frame.to_csv(paths[-1], index=False)

    text = draft_contract(paths, "shop")

    columns = {c["name"]: c for c in yaml.safe_load(text)["columns"]}
    # Never negative: the sign bound, and a far end ten times the largest seen.
    assert (columns["level"]["min"], columns["level"]["max"]) == (0, 30)
    assert "seen 1 to 3; drafted never negative, at most 10x the largest" in column_line(
        text, "level"
    )
    # Both signs: twice the span (4) beyond each end, whole units.
    assert (columns["delta"]["min"], columns["delta"]["max"]) == (-10, 10)
    assert "seen -2 to 2; drafted 2x the span beyond each end" in column_line(text, "delta")
    assert (columns["below"]["min"], columns["below"]["max"]) == (-40, 0)
    assert "seen -4 to -1; drafted never positive, at least 10x the smallest" in column_line(
        text, "below"
    )
    assert "widened by 10%" not in text
    # What was seen, as written: not rounded to 6 digits (1234.57, beyond the largest seen).
    assert "seen 1000.25 to 1234.5678;" in column_line(text, "price")
    # The draft, its label chosen, accepts the days it was drawn from.
    contract = with_label(text, "amount_label")
    for path in paths:
        day = path.stem.split("_")[1]
        assert gate_failures(contract, day, pd.read_csv(path)) == [], day


@pytest.mark.parametrize(("separator", "named"), [(";", "';'"), ("\t", "tabs"), ("|", "'|'")])
def test_samples_separated_otherwise_than_by_commas_are_refused_naming_file_and_separator(
    tmp_path, capsys, separator, named
):
    paths = []
    for i in range(3):
        day, frame = orders_day(i, rows=20)
        paths.append(tmp_path / f"orders_{day}.csv")
        frame.to_csv(paths[-1], index=False, sep=separator)
    reason = (
        "orders_2024-03-01.csv (partition 2024-03-01) is not a readable CSV file: its header is "
        f"separated by {named}, not ','; export it comma-separated"
    )
    with pytest.raises(InferenceError, match=re.escape(reason)):
        draft_contract(paths, "orders")
    # The command says so, as for any sample it cannot read, instead of drafting one column.
    output = tmp_path / "orders.yaml"
    argv = ["init-contract", *map(str, paths), "--name", "orders", "-o", str(output)]
    assert cli.main(argv) == 2
    assert not output.exists()
    assert f"separated by {named}, not ','" in capsys.readouterr().err


MONDAY = dt.date(2024, 3, 4)
PAYMENTS = ["card", "cash", "voucher", "crypto"]


def shop_day(i: int) -> tuple[str, pd.DataFrame]:
    """Day i (from a Monday) of a shop export: fewer rows at weekends, a payment type of 0.3 %.

    The first three days (the samples) happen to hold no 'crypto' payment, too rare to show in
    them; from the fourth day on it is paid 0.3 % of the time, a row or none a day.
    """
    day = MONDAY + dt.timedelta(days=i)
    rng = np.random.default_rng(200 + i)
    rows = 60 if day.weekday() >= 5 else int(rng.integers(250, 400))
    seconds = np.sort(rng.choice(86_400, rows, replace=False))
    shares = [0.6, 0.3, 0.1, 0.0] if i < 3 else [0.6, 0.3, 0.097, 0.003]
    return day.isoformat(), pd.DataFrame(
        {
            "ts": [(pd.Timestamp(day) + pd.Timedelta(seconds=int(s))).isoformat() for s in seconds],
            "payment": rng.choice(PAYMENTS, rows, p=shares),
            "spend": rng.gamma(2, 10, rows).round(2),
        }
    )


def shop_draft(folder: Path, count: int = 3) -> str:
    """The draft of the first `count` shop days (weekdays), as `init-contract` writes it."""
    folder.mkdir(exist_ok=True)
    paths = []
    for i in range(count):
        day, frame = shop_day(i)
        paths.append(folder / f"shop_{day}.csv")
        frame.to_csv(paths[-1], index=False)
    return draft_contract(paths, "shop")


def test_a_category_too_rare_for_the_samples_rejects_no_later_day(tmp_path):
    text = shop_draft(tmp_path)
    payment = next(c for c in yaml.safe_load(text)["columns"] if c["name"] == "payment")
    assert "allowed_values" not in payment
    # What was seen, as the allowed values a person who knows the set is closed would write.
    line = column_line(text, "payment")
    assert "3 values seen" in line
    assert line.endswith("allowed_values: [card, cash, voucher]")
    contract = with_label(text, "spend_label")
    rejected = {}
    crypto_days = 0
    for i in range(3, 23):
        day, frame = shop_day(i)
        crypto_days += int((frame["payment"] == "crypto").any())
        failures = gate_failures(contract, day, frame)
        if failures:
            rejected[day] = [f.column for f in failures]
    assert crypto_days >= 5  # the rare value did come
    assert rejected == {}


def test_the_seen_values_of_a_note_turned_into_allowed_values_close_the_set(tmp_path):
    text = shop_draft(tmp_path)
    line = column_line(text, "payment")
    closed = line.split("  # ")[0].replace("}", f", {line.split(', add ')[1]}}}")
    contract = with_label(text.replace(line, closed), "spend_label")
    assert next(c for c in contract.columns if c.name == "payment").allowed_values == [
        "card",
        "cash",
        "voucher",
    ]
    day, frame = shop_day(3)
    frame["payment"] = frame["payment"].replace("crypto", "cash")
    frame.loc[5, "payment"] = "crypto"
    assert [(f.column, f.rows) for f in gate_failures(contract, day, frame)] == [("payment", [5])]


def test_the_drafted_row_count_passes_a_weekend_and_catches_an_empty_or_duplicated_file(
    tmp_path,
):
    text = shop_draft(tmp_path)  # Monday to Wednesday
    rows = [len(shop_day(i)[1]) for i in range(3)]
    fewest, most = min(rows), max(rows)
    assert yaml.safe_load(text)["quality"]["row_count"] == {"min": fewest // 10, "max": most * 10}
    assert (
        f"  # The samples hold {fewest} to {most} rows a day; drafted a tenth of the fewest (1 "
        "at least) to\n  # 10x the most (gross errors only: an empty or truncated export"
    ) in text
    # The history gate, which judges the count against the days before, is told how to judge
    # a weekend by weekends.
    weekly = "  # history: {reference: {mode: previous_days, days: 28, same_weekday: true}}"
    assert weekly in text
    reference = with_label(text.replace(weekly, weekly.replace("# ", "", 1)), "spend_label")
    assert reference.quality.history.reference is not None
    assert reference.quality.history.reference.same_weekday
    contract = with_label(text, "spend_label")
    # A Saturday of 60 rows is an ordinary day of this shop.
    day, saturday = shop_day(5)
    assert len(saturday) == 60
    assert gate_failures(contract, day, saturday) == []
    # An export cut short, and a file appended to itself many times over, are not.
    day, monday = shop_day(7)
    for spoiled in (monday.iloc[: fewest // 20], pd.concat([monday] * 12)):
        failed = {f.expectation for f in gate_failures(contract, day, spoiled)}
        assert "expect_table_row_count_to_be_between" in failed, len(spoiled)


@pytest.mark.slow
def test_a_shop_following_the_docs_gets_its_weekends_and_rare_payments_accepted(tmp_path, capsys):
    """The documented path on weekday samples: weekends and a rare category are ordinary days."""
    landing, days, draft = drafted_exports(tmp_path, "shop", shop_day)
    label = "# label: {name: spend_label, task: regression, source: spend}"
    draft.write_text(draft.read_text().replace(label, label.removeprefix("# ")))
    assert cli.main(["check-contract", str(draft)]) == 0
    capsys.readouterr()

    every_day_accepted_and_trained(draft, landing, days, tmp_path)


def ids_day(i: int, ids: str) -> tuple[str, pd.DataFrame]:
    """Day i of the order export, its order id counting down, or drawn at random, and the bytes
    of each order's page, a measurement whose whole numbers happen never to repeat."""
    day, frame = orders_day(i)
    rows = len(frame)
    rng = np.random.default_rng(50 + i)
    if ids == "down":
        frame["order_id"] = 5_000_000 - i * rows - np.arange(rows)
    else:
        frame["order_id"] = rng.choice(10**9, rows, replace=False)
    frame["page_bytes"] = np.exp(rng.normal(14, 1.5, rows)).round().astype(int)
    return day, frame


def ids_draft(folder: Path, ids: str, count: int = 3) -> str:
    folder.mkdir(exist_ok=True)
    paths = []
    for i in range(count):
        day, frame = ids_day(i, ids)
        paths.append(folder / f"orders_{day}.csv")
        frame.to_csv(paths[-1], index=False)
    return draft_contract(paths, "orders")


@pytest.mark.parametrize("ids", ["down", "random"])
def test_an_id_counting_down_or_drawn_at_random_is_no_range_label_or_feature(tmp_path, ids):
    text = ids_draft(tmp_path, ids)
    columns = {c["name"]: c for c in yaml.safe_load(text)["columns"]}
    assert columns["order_id"] == {"name": "order_id", "dtype": "int"}
    assert "each of the 900 sample values distinct, spread evenly" in column_line(text, "order_id")
    offered = [line for line in text.splitlines() if "source: order_id" in line]
    assert offered == [], offered
    # A measurement whose values never repeat, but not evenly spread, stays one.
    assert columns["page_bytes"]["min"] == 0
    assert "# label: {name: page_bytes_label, task: regression, source: page_bytes}" in text
    day, frame = ids_day(7, ids)
    assert gate_failures(with_label(text, "spend_label"), day, frame) == []


@pytest.mark.slow
def test_a_team_following_the_docs_gets_no_drift_from_an_id_counting_down(tmp_path, capsys):
    """The documented path, every label candidate's feature but the label's taken in."""
    landing, days, draft = drafted_exports(tmp_path, "orders", lambda i: ids_day(i, "down"))
    label = "# label: {name: spend_label, task: regression, source: spend}"
    lines = [
        line.replace("# - {", "- {", 1) if line.startswith("  # - {name:") else line
        for line in draft.read_text().replace(label, label.removeprefix("# ")).splitlines()
        if "source: spend}" not in line or line.startswith("label:")
    ]
    draft.write_text("\n".join([*lines, ""]))
    assert cli.main(["check-contract", str(draft)]) == 0
    capsys.readouterr()

    platform = every_day_accepted_and_trained(draft, landing, days, tmp_path)
    drifting = {
        day: json.loads(platform.stored("drift_report", day, "json").read_text())[
            "drifting_features"
        ]
        for day in days[1:]
    }
    assert {day: names for day, names in drifting.items() if "order_id" in names} == {}
