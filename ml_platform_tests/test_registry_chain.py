"""The registry's chain over a range is the same however the range is split into runs.

Twelve synthetic days (one of them rejected by its quality gate, so a tombstone all the way down,
and a weekly full retrain on the Sunday) run one by one as the sensor runs them, and as ranges
split into runs of 3 and all days as a backfill runs them: the evaluations' chunks in reverse
order (they judge each candidate alone), the chain's in date order (registered_model and
champion_performance depend on their own day before). Every split reaches the same decisions,
the same champion after each day, the same alias history and the same monitoring.
"""

import json
from pathlib import Path
from typing import Any

import pytest

from ml_platform.platform.records import day_records
from ml_platform_tests.conftest import DAILY_ASSETS, Platform, contract_with, days_from
from ml_platform_tests.test_backfill_range import materialize_range

pytestmark = pytest.mark.slow

DAYS = days_from("2024-01-01", 12)  # Monday 1 January to Friday 12 January
REJECTED = "2024-01-05"
SUNDAY = "2024-01-07"  # the weekly retrain's day: its candidate is judged on the 8th
INGESTION = ["raw_data", "validated_data", "features"]
EVALUATION = ["model", "evaluation_report"]
WEEKLY = ["full_model", "full_evaluation_report"]
CHAIN = ["registered_model", "champion_performance"]


def landed(tmp_path: Path, name: str) -> Platform:
    # A five-day window: the weekly retrain's (every day so far) differs from the daily one's.
    platform = Platform(contract_with(tmp_path, "synthetic", window_days=5), tmp_path / name)
    platform.land(DAYS[0], len(DAYS))
    platform.land(REJECTED, 1, fault="out_of_range")
    return platform


def one_by_one(platform: Platform) -> None:
    """The daily job day after day, and the weekly job on the Sunday, as automation runs them."""
    for day in DAYS:
        assert platform.materialize(day, selection=DAILY_ASSETS).success, day
        if day == SUNDAY:
            assert platform.materialize(day, selection=WEEKLY).success


def in_runs(platform: Platform, size: int) -> None:
    """A backfill's runs of `size` days: evaluations in any order, the chain in date order."""
    chunks = [DAYS[i : i + size] for i in range(0, len(DAYS), size)]
    for chunk in chunks:
        assert materialize_range(platform, chunk[0], chunk[-1], INGESTION).success, chunk
    for chunk in reversed(chunks):
        assert materialize_range(platform, chunk[0], chunk[-1], EVALUATION).success, chunk
    assert materialize_range(platform, SUNDAY, SUNDAY, WEEKLY).success
    for chunk in chunks:
        assert materialize_range(platform, chunk[0], chunk[-1], CHAIN).success, chunk


def stored(platform: Platform, asset: str, day: str) -> dict[str, Any] | None:
    path = platform.stored(asset, day, "json")
    return json.loads(path.read_text()) if path.exists() else None


def registrations(platform: Platform, days: list[str]) -> dict[str, Any]:
    """What registered_model decided each day, without run ids or times."""
    registered = {}
    for day in days:
        value = stored(platform, "registered_model", day)
        registered[day] = value and {
            "decision": value["decision"],
            "outcome": value["outcome"],
            "champion_before": value["champion_before"],
            "champion_after": value["champion_after"],
            "challenger_after": value["challenger_after"],
            "candidates": [
                {
                    key: candidate.get(key)
                    for key in ("candidate", "decision", "champion_met", "alias", "improvements")
                }
                for candidate in value["candidates"]
            ],
        }
    return registered


def chain_of(platform: Platform) -> dict[str, Any]:
    """What the chain decided, without run ids, times or the environment."""
    registered = registrations(platform, DAYS)
    history = json.loads((platform.lake_dir / "synthetic/registry/alias_history.json").read_text())
    verdicts = {
        asset: {
            day: (record.verdict, record.accepted)
            for day, record in day_records(platform.instance, platform.key(asset), DAYS).items()
        }
        for asset in ("evaluation_report", *CHAIN)
    }
    return {
        "evaluations": {
            day: (report or {}).get("decision")
            for day in DAYS
            for report in [stored(platform, "evaluation_report", day)]
        },
        "registered": registered,
        "history": [
            (move["alias"], move["version"], move["previous"], move["partition"])
            for move in history
        ],
        "monitoring": {day: stored(platform, "champion_performance", day) for day in DAYS},
        "verdicts": verdicts,
    }


def test_the_chain_is_the_same_one_by_one_and_in_runs_of_3_and_all_days(tmp_path):
    expected = landed(tmp_path, "one_by_one")
    one_by_one(expected)
    chain = chain_of(expected)

    # What the days did: the first model promoted, later candidates judged against the
    # champion the day before left, the rejected day a tombstone down to the monitoring, and
    # the Sunday's weekly candidate judged on Monday before Monday's own.
    registered = chain["registered"]
    assert registered[DAYS[0]]["decision"] == "promote"
    assert registered[DAYS[0]]["champion_before"] is None
    assert registered[REJECTED] is None and chain["monitoring"][REJECTED] is None
    assert chain["verdicts"]["registered_model"][REJECTED] == ("no accepted input", False)
    decisions = {value["decision"] for value in registered.values() if value}
    assert "promote" in decisions and decisions & {"challenger", "reject"}, decisions
    accepted = [day for day in DAYS if registered[day] is not None]
    for before, after in zip(accepted, accepted[1:], strict=False):
        assert registered[after]["champion_before"] == registered[before]["champion_after"]
        monitored = chain["monitoring"][after]
        assert monitored["champion_version"] == registered[before]["champion_after"]
    monday = registered["2024-01-08"]["candidates"]
    assert [c["candidate"] for c in monday] == [f"full-{SUNDAY}", "daily-2024-01-08"]
    assert monday[0]["champion_met"] == registered[SUNDAY]["champion_after"]
    # Every alias move went forward in time.
    champions = [move[1].split("-", 1)[1] for move in chain["history"] if move[0] == "champion"]
    assert champions == sorted(champions)

    # Runs of 1 (and of 7 and 30) on 30 real days: test_registry_chain_flights.py.
    for size in (3, len(DAYS)):
        split = landed(tmp_path, f"runs_of_{size}")
        in_runs(split, size)
        found = chain_of(split)
        for part in chain:
            assert found[part] == chain[part], (size, part)
