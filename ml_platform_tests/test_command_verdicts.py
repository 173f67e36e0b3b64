"""`ml-platform materialize` tells a rejected day from a failed one, and reruns it once corrected.

A webserver and daemon of the module's own over a fresh instance with the repository's
dagster.yaml; the command is run as a user runs it, a subprocess reaching the webserver. Apart
from `test_command_runs.py` so that the two modules' runs share the two cores side by side.
"""

from collections.abc import Iterator

import pytest

from ml_platform.contracts import load_contract
from ml_platform_tests.conftest import days_from
from ml_platform_tests.services import RUN_SECONDS, CommandServices

pytestmark = pytest.mark.integration

SYNTHETIC = load_contract("synthetic")


@pytest.fixture(scope="module")
def services(tmp_path_factory) -> Iterator[CommandServices]:
    services = CommandServices(tmp_path_factory.mktemp("command_verdicts"))
    services.start()
    try:
        yield services
    finally:
        services.stop()


def test_the_command_tells_a_rejected_day_from_a_failed_one_and_reruns_it_once_corrected(
    services,
):
    days = days_from("2024-01-01", 3)
    faulty = days[1]
    services.land(SYNTHETIC, days)
    services.land(SYNTHETIC, [faulty], fault="null_burst")

    command = services.materialize("--start", days[0], "--days", "3", "--dataset", "synthetic")
    assert command.wait(timeout=3 * RUN_SECONDS) == 3, services.said()
    out, err = services.said()
    # One line a day says what it did; a rejected day is an outcome, not a failed day.
    outcomes = (" promoted (", " kept champion (challenger) (", " rejected: ")
    assert sum(out.count(f"{days[0]}{o}") for o in outcomes) == 1, out
    assert "FAILED" not in err
    assert f"{faulty} REJECTED by validated_data: failed quality gate" in out
    # The next day's 3-day window lost a day: its model is not trained (a verdict too).
    assert f"{days[2]} REJECTED by model: window below coverage" in out
    assert f"2 of 3 day(s) rejected: {faulty}, {days[2]}" in err

    # A corrected file reruns the rejected days without --force; accepted days are skipped.
    services.land(SYNTHETIC, [faulty])
    again = services.materialize("--start", days[0], "--days", "3", "--dataset", "synthetic")
    assert again.wait(timeout=3 * RUN_SECONDS) == 0, services.said()
    out, _ = services.said()
    assert out.count("already materialised") == 1 and "REJECTED" not in out
