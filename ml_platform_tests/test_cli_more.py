"""`ml-platform` on usage shapes nobody designed for: ranges past the calendar, look-backs past
the year 1, an instance that cannot be opened, output piped into a reader that goes away.

Each is a clear one-line error and an exit code (2 usage or configuration, 1 something found
wrong), never a traceback.
"""

import os
import signal
import subprocess
import sys

import pytest

from ml_platform import cli
from ml_platform.contracts.model import BUNDLED_DIR


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An instance of its own, and a webserver URL nothing answers at."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("ML_PLATFORM_DAGSTER_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("ML_PLATFORM_LANDING_DIR", str(tmp_path / "landing"))
    monkeypatch.setenv("ML_PLATFORM_LAKE_DIR", str(tmp_path / "lake"))
    return tmp_path


@pytest.mark.parametrize(
    "argv",
    [
        ["materialize", "--dataset", "synthetic", "--start", "9999-12-31", "--days", "2"],
        ["land", "--dataset", "synthetic", "--start", "2024-01-01", "--days", "3000000"],
        ["rejected", "--dataset", "synthetic", "--start", "9999-12-30", "--days", "5"],
        ["replay", "changed.yaml", "--start", "9999-12-31", "--days", "2"],
    ],
    ids=["materialize", "land", "rejected", "replay"],
)
def test_a_range_running_past_the_last_date_is_a_usage_error(home, capsys, argv):
    # Each of --start and --days is valid alone; together they ran into an OverflowError.
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "argument --days:" in err and "run past 9999-12-31" in err, err
    assert not (home / "landing").exists()


@pytest.mark.parametrize("command", ["health", "resources"])
@pytest.mark.parametrize("days", ["inf", "1e9"])
def test_a_look_back_past_the_year_1_is_a_usage_error(home, capsys, command, days):
    # Past the year 1 the look-back's start is no datetime: the instance's query raised.
    with pytest.raises(SystemExit) as stopped:
        cli.main([command, "--days", days])
    assert stopped.value.code == 2
    assert f"must reach back no further than the year 1, not {days} days" in (
        capsys.readouterr().err
    )


def test_a_long_look_back_still_reads_every_run(home, capsys):
    # A look-back of centuries (all the runs there are) was answered, and still is.
    assert cli.main(["health", "--days", "100000"]) == 0
    assert "jobs (success rate):" in capsys.readouterr().out


BROKEN = {
    "unparsable": "run_storage: [\n",
    "unknown-key": "telemetry:\n  enabled: false\nno_such_setting: 1\n",
    "driver-not-installed": (
        "storage:\n  postgres:\n    postgres_db:\n      username: u\n      password: p\n"
        "      hostname: 127.0.0.1\n      db_name: d\n      scheme: postgresql+nosuchdriver\n"
    ),
}
COMMANDS = {
    "diagnose": ["diagnose", "0badc0de"],
    "health": ["health"],
    "rejected": ["rejected", "--dataset", "synthetic", "--days", "2"],
    "materialize": ["materialize", "--dataset", "synthetic", "--start", "2024-01-01"],
}


@pytest.mark.parametrize("argv", COMMANDS.values(), ids=COMMANDS.keys())
@pytest.mark.parametrize("yaml_text", BROKEN.values(), ids=BROKEN.keys())
def test_a_broken_dagster_yaml_is_a_configuration_error_naming_the_instance(
    home, capsys, yaml_text, argv
):
    (home / "dagster.yaml").write_text(yaml_text)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: the Dagster instance at {home} cannot be opened ("), err
    assert "fix its dagster.yaml" in err and "Traceback" not in err


def test_a_dagster_home_that_is_no_directory_is_a_configuration_error(home, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(home / "missing"))
    assert cli.main(["diagnose", "0badc0de"]) == 2
    err = capsys.readouterr().err
    assert f"the Dagster instance at {home / 'missing'} cannot be opened" in err
    assert "is not a directory or does not exist" in err


def test_no_dagster_home_is_a_configuration_error(home, monkeypatch, capsys):
    monkeypatch.delenv("DAGSTER_HOME")
    assert cli.main(["health"]) == 2
    assert capsys.readouterr().err.startswith("error: DAGSTER_HOME is not set: set it to")


def test_an_instance_whose_database_does_not_answer_is_a_failure_not_a_traceback(home, capsys):
    # A real PostgreSQL client against a port nothing listens on: the storage, not the
    # configuration, is what is wrong (it may come back), so exit 1.
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nstorage:\n  postgres:\n    postgres_db:\n"
        "      username: u\n      password: p\n      hostname: 127.0.0.1\n      port: 9\n"
        "      db_name: d\n      scheme: postgresql+psycopg2\n"
    )
    assert cli.main(["diagnose", "0badc0de"]) == 1
    err = capsys.readouterr().err
    assert f"error: the Dagster instance at {home} cannot be opened" in err
    assert "is the storage its dagster.yaml names up and reachable from here?" in err


@pytest.mark.parametrize(
    "argv",
    [["rejected", "--dataset", "synthetic"], ["check-contract", "synthetic"]],
    ids=["rejected", "check-contract"],
)
def test_output_into_a_reader_that_went_away_ends_as_sigpipe_ends_a_program(home, argv):
    # `ml-platform rejected | head -0`: the reader is gone before the first line. Buffered as
    # a pipe is by default (no PYTHONUNBUFFERED), a short output meets it only at exit.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ml_platform.cli", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            check=False,
            env=env,
        )
    finally:
        os.close(write)
    assert done.returncode == 128 + signal.SIGPIPE, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


def external_contract(tmp_path):
    """The synthetic contract as a team's dataset whose files an external system delivers."""
    text = (BUNDLED_DIR / "synthetic.yaml").read_text()
    text = text.replace("kind: synthetic\n  seed: 7\n  rows_per_day: 1000\n", "kind: external\n")
    text = text.replace("name: synthetic", "name: orders", 1)
    path = tmp_path / "orders.yaml"
    path.write_text(text)
    assert cli.main(["check-contract", str(path)]) == 0
    return path


LAND = ["land", "--start", "2024-01-01", "--days", "2"]
REFUSED_LANDINGS = {
    # An upstream-delivered dataset: the platform has no rows to generate.
    "external": (None, [], "is delivered by an external system"),
    # Switches the flights source has no such thing as.
    "flights-fault": (
        "flights",
        ["--fault", "missing_column"],
        "--fault: switches of the synthetic dataset only, not of flights",
    ),
    "unknown-drift-feature": (
        "synthetic",
        ["--drift-feature", "nosuch"],
        "--drift-feature: drift applies to one of",
    ),
    "infinite-drift": (
        "synthetic",
        ["--drift-feature", "x1", "--drift-sd", "inf"],
        "--drift-sd must be a finite number",
    ),
    # Good files landed where the user asked for damaged or drifted ones, in silence.
    "fault-day-without-fault": (
        "synthetic",
        ["--fault-day", "2024-01-02"],
        "--fault-day names the days --fault damages",
    ),
    "fault-day-not-landed": (
        "synthetic",
        ["--fault", "missing_column", "--fault-day", "2024-02-01"],
        "--fault-day 2024-02-01 is no day landed (2024-01-01 to 2024-01-02)",
    ),
    "drift-from-without-feature": (
        "synthetic",
        ["--drift-from", "2024-01-02"],
        "--drift-from is the first day --drift-feature drifts",
    ),
}


@pytest.mark.parametrize(
    ("dataset", "switches", "said"), REFUSED_LANDINGS.values(), ids=REFUSED_LANDINGS.keys()
)
def test_land_refuses_switches_it_cannot_honour_landing_nothing(
    home, capsys, dataset, switches, said
):
    if dataset is None:
        dataset = str(external_contract(home))
        capsys.readouterr()
    argv = [*LAND, "--dataset", dataset, *switches]
    if dataset == "flights":  # a day of flights' partitions (2013)
        argv[2] = "2013-01-01"
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "nothing landed" in err, err
    assert not (home / "landing").exists() or not any((home / "landing").iterdir())


def test_land_damages_the_fault_day_it_names_and_only_it(home, capsys):
    argv = [*LAND, "--dataset", "synthetic", "--fault", "missing_column"]
    assert cli.main([*argv, "--fault-day", "2024-01-02"]) == 0
    landed = home / "landing"
    first = (landed / "synthetic_2024-01-01.csv").read_text().splitlines()[0]
    second = (landed / "synthetic_2024-01-02.csv").read_text().splitlines()[0]
    assert "x3" in first.split(",") and "x3" not in second.split(",")


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (
            "s3://bucket/landing/",
            "ML_PLATFORM_LANDING_URL='s3://bucket/landing/' is an S3 location",
        ),
        (None, "set ML_PLATFORM_LANDING_DIR"),
    ],
    ids=["s3-zone", "no-zone"],
)
def test_land_without_a_local_landing_directory_is_a_configuration_error(
    home, monkeypatch, capsys, url, said
):
    # A setting to change, as every other configuration error: exit 2, not 1.
    monkeypatch.delenv("ML_PLATFORM_LANDING_DIR")
    monkeypatch.delenv("ML_PLATFORM_LANDING_URL", raising=False)
    if url is not None:
        monkeypatch.setenv("ML_PLATFORM_LANDING_URL", url)
    assert cli.main(["land", "--dataset", "synthetic", "--start", "2024-01-01"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {said}")


def test_rejected_over_days_that_are_no_partitions_names_them(home, capsys):
    # A mistyped year answered "no rejected day", as if those days had been checked.
    argv = ["rejected", "--dataset", "flights", "--start", "2014-01-01", "--days", "3"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "2014-01-01 to 2014-01-03 (3 of 3 day(s)) are no partitions of flights" in err, err


def test_ctrl_c_while_landing_stops_as_shells_expect_leaving_whole_files(home):
    # A month landed by hand, interrupted after its first day: no traceback, and every file
    # in the zone is a whole day (landing writes each atomically).
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = ["land", "--dataset", "synthetic", "--start", "2024-01-01", "--days", "300"]
    with subprocess.Popen(
        [sys.executable, "-m", "ml_platform.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # A pytest-xdist worker ignores SIGINT, and an ignored signal stays ignored across exec:
        # the command gets Ctrl-C as a shell's foreground process does.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as command:
        assert command.stdout is not None
        while not command.stdout.readline().startswith("[  1/300]"):
            assert command.poll() is None, "land ended before its first day"
        command.send_signal(signal.SIGINT)
        out, err = command.communicate(timeout=120)
    assert command.returncode == 128 + signal.SIGINT, err
    assert "Traceback" not in err and "stopped by SIGINT" in err, err
    landed = sorted((home / "landing").iterdir())
    assert 1 <= len(landed) < 300
    for path in landed:
        assert len(path.read_text().splitlines()) == 1001, path  # a header and the day's rows
