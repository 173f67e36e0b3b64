"""`ml-platform check-contract` lists every mistake of a contract at once: field type errors and
the cross-field mistakes elsewhere, each with its line, without inventing mistakes that depend
on how a broken field will be fixed."""

import yaml

from ml_platform.cli import main
from ml_platform.contracts.model import bundled_contracts


def check(tmp_path, capsys, change) -> tuple[int, list[str], str]:
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    change(document)
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    code = main(["check-contract", str(path)])
    err = capsys.readouterr().err
    return code, [line.strip() for line in err.splitlines() if line.startswith("  - ")], err


def line_of(tmp_path, text: str) -> int:
    lines = (tmp_path / "contract.yaml").read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


def test_a_type_error_and_a_cross_field_mistake_are_both_reported(tmp_path, capsys):
    def two_mistakes(document):
        document["columns"][1]["nullable"] = "sometimes"  # not a boolean
        document["label"]["source"] = "no_such_column"  # a column nobody declared

    code, problems, err = check(tmp_path, capsys, two_mistakes)

    assert code == 2 and "2 problem(s) in the contract" in err
    assert problems == [
        f"- line {line_of(tmp_path, 'sometimes')}: columns[1].nullable: Input should be a valid "
        "boolean, unable to interpret input (got 'sometimes')",
        f"- line {line_of(tmp_path, 'no_such_column')}: label.source: 'no_such_column' is not "
        "a declared column",
    ]


def test_mistakes_that_depend_on_a_broken_field_are_not_guessed(tmp_path, capsys):
    def mistakes(document):
        document["label"]["task"] = "regresion"  # misspelt
        # Unknown for a regression, right for a classification: it depends on the fix above.
        document["evaluation"]["value_thresholds"]["f1"] = 0.5
        document["columns"][1]["dtype"] = "integer"
        document["leakage_columns"] = ["nope"]  # wrong whatever the two are fixed to
        document["quality"]["row_kee"] = ["x1"]  # misspelt key

    code, problems, _ = check(tmp_path, capsys, mistakes)

    assert code == 2
    assert [p.split(": ")[1] for p in problems] == [
        "columns[1].dtype",
        "label.task",
        "leakage_columns[0]",
        "quality.row_kee",
    ]
    assert "'nope' is not a declared column" in problems[2]
    assert not any("f1" in p for p in problems)


def test_a_broken_required_text_field_says_the_cross_field_checks_wait(tmp_path, capsys):
    def mistakes(document):
        document["name"] = "Synthetic Data"  # not a lowercase identifier
        document["leakage_columns"] = ["nope"]

    code, problems, err = check(tmp_path, capsys, mistakes)

    assert code == 2 and [p.split(": ")[1] for p in problems] == ["name"]
    assert "cross-field checks (declared columns, label, features, metrics) run once" in err
