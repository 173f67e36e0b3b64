"""`ml-platform` given arguments it cannot act on: it says why and what to do, launching nothing."""

import pytest

from ml_platform import cli
from ml_platform.contracts.model import BUNDLED_DIR


@pytest.fixture
def no_webserver(tmp_path, monkeypatch):
    """An instance of its own, and a webserver URL nothing answers at."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("ML_PLATFORM_DAGSTER_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("ML_PLATFORM_LANDING_DIR", str(tmp_path / "landing"))
    monkeypatch.setenv("ML_PLATFORM_LAKE_DIR", str(tmp_path / "lake"))
    return tmp_path


@pytest.mark.parametrize(
    ("dataset", "start", "days", "said"),
    [
        # flights' partitions end on 2013-12-31: the range runs two days past them.
        (
            "flights",
            "2013-12-30",
            "4",
            "2014-01-01 to 2014-01-02 (2 of 4 day(s)) are no partitions of flights, whose "
            "days run from 2013-01-01 to 2013-12-31 (its contract's partitions:)",
        ),
        (
            "synthetic",
            "2023-12-31",
            "1",
            "2023-12-31 (1 of 1 day(s)) are no partitions of synthetic, whose days run from "
            "2024-01-01",
        ),
        # A day that has not ended is no partition yet.
        ("synthetic", "2999-01-01", "1", "a day is one once it has ended (UTC)"),
    ],
)
def test_materialize_of_days_outside_the_partitions_names_them(
    no_webserver, capsys, dataset, start, days, said
):
    argv = ["materialize", "--dataset", dataset, "--start", start, "--days", days]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "nothing launched" in err
    # Not the webserver's absence: the days are what the user must change.
    assert "webserver" not in err


@pytest.mark.parametrize("rows", ["0", "-5"])
def test_reproduce_refuses_a_sample_of_no_rows(no_webserver, capsys, rows):
    # Empty or negative samples fail the step on no data (or in pandas' sampling): a failure
    # of the command's own making, which would pass for the run's.
    with pytest.raises(SystemExit) as stopped:
        cli.main(["reproduce", "0badc0de", "--sample", rows])
    assert stopped.value.code == 2
    assert f"argument --sample: must be at least 1, not {rows}" in capsys.readouterr().err


def test_diagnose_refuses_a_negative_number_of_lines(no_webserver, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["diagnose", "0badc0de", "--lines", "-3"])
    assert stopped.value.code == 2
    assert "argument --lines: must be at least 0, not -3" in capsys.readouterr().err


def test_resources_write_with_no_recorded_day_leaves_the_contract_as_it_is(no_webserver, capsys):
    contract = no_webserver / "synthetic.yaml"
    contract.write_text((BUNDLED_DIR / "synthetic.yaml").read_text())
    before = contract.read_text()
    argv = ["resources", "--dataset", "synthetic", "--write", "--contract", str(contract)]

    # An instance no day ran on (a DAGSTER_HOME other than the runs'): nothing to advise from.
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "no stage of synthetic recorded its use in the last 30 day(s) of the Dagster " in err
    assert f"instance at {no_webserver}" in err and "the contract is left as it is" in err
    assert contract.read_text() == before


def test_resources_contract_without_write_is_refused(no_webserver, capsys):
    assert cli.main(["resources", "--dataset", "synthetic", "--contract", "mine.yaml"]) == 2
    assert "--contract names the file --write writes" in capsys.readouterr().err


def test_score_refuses_an_alias_and_a_version_together(capsys):
    # Given both, one would be ignored: which model scored the file would not be the one asked.
    with pytest.raises(SystemExit) as exited:
        cli.main(["score", "any.csv", "--alias", "challenger", "--version", "daily-2024-01-01"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("dataset", "start", "said"),
    [
        ("flights", "2013-12-31", "2014-01-01 (1 of 2 day(s)) are no days of flights"),
        ("synthetic", "2023-12-31", "2023-12-31 (1 of 2 day(s)) are no days of synthetic"),
    ],
)
def test_land_refuses_days_outside_the_partitions_landing_nothing(
    no_webserver, capsys, dataset, start, said
):
    # Such a file is never read, only alerted as a misfit (flights' had a header and no row).
    assert cli.main(["land", "--dataset", dataset, "--start", start, "--days", "2"]) == 2
    assert said in capsys.readouterr().err
    assert not (no_webserver / "landing").exists() or not any((no_webserver / "landing").iterdir())


def test_land_lands_a_day_that_has_not_ended_yet_as_upstream_may(no_webserver, capsys):
    assert cli.main(["land", "--dataset", "synthetic", "--start", "2999-01-01"]) == 0
    assert (no_webserver / "landing" / "synthetic_2999-01-01.csv").stat().st_size > 0
