"""A registered champion whose files are lost from the registry's artifact store: the steps that
load it stop with a named data failure that says what is wrong, and rerunning the day that
registered it writes the files again from the day's stored model when its checksum matches."""

import json
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import dagster as dg
import joblib
import pytest
import yaml

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.platform.failures import DATA
from ml_platform.platform.run_events import classify_outcome, run_outcome
from ml_platform.registry.store import MODEL_FILE, RegistryError, registered_on
from ml_platform_tests.conftest import Platform, days_from

FIRST, SECOND, THIRD = days_from("2024-01-01", 3)
CHAMPION = f"daily-{FIRST}"


def version_folder(platform: Platform, version: str) -> Path:
    """The local folder of a version's files in the lake's embedded MLflow."""
    source = platform.registry().model_version(version).source
    return Path(unquote(urlparse(source).path))


def synthetic(tmp_path: Path, name: str, **evaluation) -> Platform:
    """The synthetic dataset over the lake in `tmp_path`, its evaluation settings overridden."""
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["evaluation"].update(evaluation)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return Platform(load_contract(path), tmp_path)


def unbeatable_champion(tmp_path: Path) -> Platform:
    """FIRST's model is the champion, which SECOND's candidate did not beat.

    No candidate can (an improvement of 10 in rmse), so the champion is a past day's model:
    the latest recorded day of registered_model is SECOND.
    """
    platform = synthetic(tmp_path, "unbeatable", change_thresholds={"rmse": 10.0})
    platform.land(FIRST, 3)
    for day in (FIRST, SECOND):
        assert platform.materialize(day).success
    assert platform.registry().aliases() == {
        "champion": CHAMPION,
        "challenger": f"daily-{SECOND}",
    }
    return platform


def stopped_on_champion(platform: Platform) -> dict[str, str]:
    """THIRD's registered_model and champion_performance, each stopped: their descriptions.

    Each run is checked to be classed a data failure, as the failure alerts class it, and not
    retried.
    """
    # A failed registered_model skips the monitoring after it in a run: it runs on its own too.
    runs = {
        "registered_model": platform.materialize(THIRD),
        "champion_performance": platform.materialize(THIRD, ["champion_performance"]),
    }
    descriptions = {}
    for asset, result in runs.items():
        assert not result.success
        descriptions[asset] = platform.step_failure(result, asset).user_failure_data.description
        outcome = run_outcome(platform.instance, result.run_id, succeeded=False)
        assert outcome is not None
        assert classify_outcome(outcome).failure_class == DATA, classify_outcome(outcome)
        retried = [
            e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY
        ]
        assert retried == []
    return descriptions


def test_a_lost_champion_file_is_a_named_data_failure_that_says_what_is_wrong(tmp_path):
    platform = unbeatable_champion(tmp_path)
    (version_folder(platform, CHAMPION) / MODEL_FILE).unlink()

    for asset, description in stopped_on_champion(platform).items():
        assert f"{asset} {THIRD}: the champion {CHAMPION}" in description
        # Registered, its file gone: not "not in the registry".
        assert "is in the registry but is damaged" in description, description
        assert f"{MODEL_FILE} is missing" in description
        # The way out names the day whose rerun restores it.
        assert f"Rerun registered_model for {FIRST}" in description


def test_a_champion_file_that_fails_its_checksum_is_named_as_such(tmp_path):
    platform = unbeatable_champion(tmp_path)
    (version_folder(platform, CHAMPION) / MODEL_FILE).write_bytes(b"not the model")

    with pytest.raises(RegistryError, match="does not match its checksum"):
        platform.registry().load(CHAMPION)
    for description in stopped_on_champion(platform).values():
        assert f"{MODEL_FILE} does not match its checksum" in description


def test_a_champion_whose_model_version_was_deleted_is_said_not_to_be_in_the_registry(tmp_path):
    platform = unbeatable_champion(tmp_path)
    registry = platform.registry()
    registry.client.delete_model_version("synthetic", registry.model_version(CHAMPION).version)

    for asset, description in stopped_on_champion(platform).items():
        assert f"{asset} {THIRD}: the champion {CHAMPION}" in description
        assert "is not in the registry" in description and "deleted in MLflow" in description


@pytest.mark.parametrize("lost", ["model file", "whole folder"])
def test_rerunning_the_champions_day_restores_its_lost_files(tmp_path, lost):
    platform = unbeatable_champion(tmp_path)
    folder = version_folder(platform, CHAMPION)
    if lost == "model file":
        (folder / MODEL_FILE).unlink()
    else:
        shutil.rmtree(folder)
    assert not platform.materialize(THIRD).success

    # What the failure says to do.
    rerun = platform.materialize(FIRST, ["registered_model"])

    assert rerun.success
    record = json.loads(platform.stored("registered_model", FIRST, "json").read_text())
    assert "restored" in record["outcome"] and MODEL_FILE in record["outcome"], record["outcome"]
    registry = platform.registry()
    # The same model version, whole again: its checksum is the registered one.
    assert registry.aliases() == {"champion": CHAMPION, "challenger": f"daily-{SECOND}"}
    assert str(registry.model_version(CHAMPION).version) == "1"
    assert registry.load(CHAMPION).window == [FIRST]
    assert registry.manifest(CHAMPION)["partition"] == FIRST
    assert platform.materialize(THIRD).success

    # The rerun's record keeps the lineage manifest: a second loss is restored the same way.
    shutil.rmtree(folder)
    assert platform.materialize(FIRST, ["registered_model"]).success
    assert registry.manifest(CHAMPION)["partition"] == FIRST


def test_the_day_whose_rerun_restores_a_version_is_the_day_that_registered_it():
    # A weekly full retrain of D's data is judged, and registered, on the day after.
    assert registered_on(f"daily-{FIRST}") == FIRST
    assert registered_on(f"full-{FIRST}") == SECOND


def test_aliases_that_cannot_be_set_back_to_a_lost_champion_are_a_data_failure(tmp_path):
    platform = unbeatable_champion(tmp_path)
    registry = platform.registry()
    # Someone moved the champion by hand; then the recorded champion's file was lost.
    registry.client.set_registered_model_alias(
        "synthetic", "champion", registry.model_version(f"daily-{SECOND}").version
    )
    (version_folder(platform, CHAMPION) / MODEL_FILE).unlink()
    # THIRD's candidate is rejected (no model reaches the value threshold): the champion is
    # not loaded to judge it, and the step stops only when it sets the aliases back.
    strict = synthetic(tmp_path, "strict", value_thresholds={"r2": 0.9999})
    strict.instance = platform.instance

    result = strict.materialize(THIRD)

    assert not result.success
    description = strict.step_failure(result, "registered_model").user_failure_data.description
    assert "the aliases cannot be set" in description and f"{MODEL_FILE} is missing" in description
    assert f"Rerun registered_model for {FIRST}" in description
    outcome = run_outcome(strict.instance, result.run_id, succeeded=False)
    assert outcome is not None
    assert classify_outcome(outcome).failure_class == DATA, classify_outcome(outcome)
    # The way out it names works here too: the rerun restores the file and sets the aliases.
    assert strict.materialize(FIRST, ["registered_model"]).success
    assert strict.registry().aliases() == {"champion": CHAMPION, "challenger": f"daily-{SECOND}"}
    assert strict.materialize(THIRD).success


def test_rerunning_the_latest_recorded_day_registers_its_lost_champion_anew(tmp_path):
    # The champion's day is the latest recorded one: its rerun judges it again, as the first
    # run did, and registers the version anew, whole; the alias follows the name to it.
    platform = synthetic(tmp_path, "synthetic")
    platform.land(FIRST, 2)
    assert platform.materialize(FIRST).success
    lost = platform.registry().model_version(CHAMPION).version
    (version_folder(platform, CHAMPION) / MODEL_FILE).unlink()
    failed = platform.materialize(SECOND)
    assert not failed.success
    description = platform.step_failure(failed, "registered_model").user_failure_data.description
    assert f"Rerun registered_model for {FIRST}" in description

    assert platform.materialize(FIRST, ["registered_model"]).success

    registry = platform.registry()
    assert registry.alias("champion") == CHAMPION
    assert registry.model_version(CHAMPION).version != lost
    assert platform.materialize(SECOND).success


def test_a_champion_whose_days_model_was_trained_again_is_not_restored_from_it(tmp_path):
    platform = unbeatable_champion(tmp_path)
    (version_folder(platform, CHAMPION) / MODEL_FILE).unlink()
    # FIRST's model materialised again since: trained on the same window, not the same bytes.
    retrained = joblib.load(platform.stored("model", FIRST, "joblib"))
    retrained.pipeline.retrained_at = "a later run"
    platform.put("model", FIRST, retrained, "joblib")

    rerun = platform.materialize(FIRST, ["registered_model"])

    assert not rerun.success
    description = platform.step_failure(rerun, "registered_model").user_failure_data.description
    assert f"{CHAMPION}, the live champion, cannot be made whole again" in description
    assert f"the stored model of {FIRST} is not the registered one" in description
    assert "from a backup" in description and "Rerun registered_model" not in description
    outcome = run_outcome(platform.instance, rerun.run_id, succeeded=False)
    assert outcome is not None
    assert classify_outcome(outcome).failure_class == DATA
    assert not (version_folder(platform, CHAMPION) / MODEL_FILE).exists()
