"""The registry when the contract changes under the champion, MLflow's in-call retries, and a
run whose worker cannot load the code: each fails with a class and a reason a person acts on."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.platform.failures import DEPENDENCY_MISMATCH, error_chain
from ml_platform.platform.run_events import classify_outcome, run_outcome
from ml_platform_tests.conftest import Platform, days_from

RETRY_VARIABLES = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR")

# What MLflow's REST client will do in a process that imported the platform: its retries and
# the longest it sleeps between them (urllib3's exponential backoff, capped by MLflow's limit).
MLFLOW_RETRIES = """
import json
import ml_platform.platform.tracking
from mlflow.environment_variables import (
    MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR as factor,
    MLFLOW_HTTP_REQUEST_MAX_RETRIES as retries,
)
sleeps = [factor.get() * 2 ** (n - 1) for n in range(1, retries.get() + 1)]
print(json.dumps({"retries": retries.get(), "factor": factor.get(), "sleeps": sum(sleeps)}))
"""


def mlflow_retries(**environ: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in RETRY_VARIABLES}
    result = subprocess.run(
        [sys.executable, "-c", MLFLOW_RETRIES],
        env={**env, **environ},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_one_attempt_of_a_step_retries_mlflow_for_seconds_not_minutes():
    # MLflow's defaults sleep 2 + 4 + ... + 128 s in one call; the steps' retry policy retries.
    found = mlflow_retries()
    assert found["retries"] <= 3
    assert found["sleeps"] <= 10


@pytest.mark.parametrize("name", RETRY_VARIABLES)
def test_an_mlflow_retry_setting_the_user_chose_stands(name):
    found = mlflow_retries(**{name: "6"})
    assert found["retries" if name.endswith("RETRIES") else "factor"] == 6


# A code location whose run worker cannot import a module the code server could: the run worker
# is a process the code server starts (multiprocessing), as after a deploy that left a package
# out of the image the runs are launched in.
UNLOADABLE_IN_THE_RUN_WORKER = """
import multiprocessing

import dagster as dg

if multiprocessing.parent_process() is not None:
    import ml_platform_module_not_installed  # noqa: F401


@dg.asset
def one():
    return 1


defs = dg.Definitions(assets=[one], jobs=[dg.define_asset_job("one_job", selection=[one])])
"""

# The instance launches a run at once (no daemon), in a run worker of the code server.
LAUNCHING_INSTANCE = """
run_coordinator:
  module: dagster.core.run_coordinator
  class: DefaultRunCoordinator
telemetry:
  enabled: false
"""


def test_a_run_worker_that_cannot_import_a_module_is_a_dependency_mismatch(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(LAUNCHING_INSTANCE)
    (tmp_path / "defs.py").write_text(UNLOADABLE_IN_THE_RUN_WORKER)
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    subprocess.run(
        [str(Path(sys.executable).with_name("dagster")), "job", "launch", "-f", "defs.py"]
        + ["-j", "one_job"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        check=True,
    )
    instance = dg.DagsterInstance.from_config(str(home))
    [run] = instance.get_runs()
    # The run worker fails at once; the code server records the run failed when it exits.
    for _ in range(600):
        run = instance.get_run_by_id(run.run_id)
        if run.is_finished:
            break
        time.sleep(0.1)
    assert run.status == dg.DagsterRunStatus.FAILURE
    outcome = run_outcome(instance, run.run_id, succeeded=False)
    assert outcome is not None and not outcome.step_failures
    classification = classify_outcome(outcome)
    assert classification.failure_class == DEPENDENCY_MISMATCH, classification
    assert "ml_platform_module_not_installed" in classification.reason
    assert "ml_platform_module_not_installed" in outcome.run_message
    assert "Could not load job definition" in outcome.run_message


def test_a_contract_that_renames_a_feature_the_champion_needs_stops_the_registry_saying_so(
    tmp_path,
):
    # The champion of the first day learnt `x4`; from the second day on the contract calls it
    # `x4_value` (same column), so the champion cannot be scored on a candidate's rows.
    first, second = days_from("2024-01-01", 2)
    before = Platform(load_contract("synthetic"), tmp_path)
    before.land(first, 2)
    assert before.materialize(first).success
    assert before.registry().alias("champion") == f"daily-{first}"
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    for feature in document["features"]:
        if feature["name"] == "x4":
            feature["name"] = "x4_value"
    changed = tmp_path / "synthetic.yaml"
    changed.write_text(yaml.safe_dump(document))
    after = Platform(load_contract(changed), tmp_path)
    after.instance = before.instance  # the same records: the chain goes on
    # The window's features under the new names, as the model step asks (the champion's day's
    # registered_model is not rerun: its decision stands).
    assert after.materialize(first, ["features"]).success

    # (drift_report's reference days hold no `x4_value`: that is the drift check's to say.)
    result = after.materialize(
        second,
        [
            "raw_data",
            "validated_data",
            "features",
            "model",
            "evaluation_report",
            "registered_model",
        ],
    )

    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert failure.step_key == after.node("registered_model")
    data = failure.step_failure_data
    # Not retried (a contract waits for a person), and said in words a person acts on.
    assert data.user_failure_data is not None
    assert "KeyError" not in data.error.message
    description = data.user_failure_data.description
    assert f"daily-{first}" in description
    assert "'x4'" in description and second in description
    assert "replay promote" in description
    # Typed, so the failure classes can tell it from a bug.
    assert "ChampionFeaturesError" in error_chain(data.error)[-1]
    assert [
        e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY
    ] == []
    # The champion serves on; nothing of the day is recorded.
    assert after.registry().alias("champion") == f"daily-{first}"
    assert second not in after.materialized("registered_model")
