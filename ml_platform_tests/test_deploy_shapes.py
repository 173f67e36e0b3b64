"""The ECS recipe and the compose stack as Dagster and AWS will read them: what a run task is
made of (the launching daemon's container definition, the code server's image), which secrets
it may hold, which roles its processes may hand to ECS, and what comes back after a crash.
"""

import os

import pytest
import yaml
from dagster_aws.ecs import EcsRunLauncher
from dagster_aws.ecs.container_context import EcsContainerContext

from ml_platform.platform.settings import DEFAULT_BACKFILL_DAYS_PER_RUN
from ml_platform_tests.conftest import REPO
from ml_platform_tests.test_deploy import cloudformation

PRODUCTION = yaml.safe_load((REPO / "deploy/dagster.yaml").read_text())
COMPOSE = yaml.safe_load((REPO / "deploy/docker-compose.yaml").read_text())
RESOURCES = cloudformation()["Resources"]


def container(task: str, name: str) -> dict:
    [found] = [
        c for c in RESOURCES[task]["Properties"]["ContainerDefinitions"] if c["Name"] == name
    ]
    return found


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def test_the_code_server_tells_the_run_launcher_its_image():
    # EcsRunLauncher starts each run in the image the code location reports, and `dagster
    # code-server start` reports DAGSTER_CURRENT_IMAGE; unset, every launch fails with
    # "Could not determine image to use for the run".
    environment = {e["Name"]: e["Value"] for e in container("CodeServerTask", "run")["Environment"]}
    assert environment.get("DAGSTER_CURRENT_IMAGE") == {"!Ref": "Image"}


def test_the_run_launcher_resolves_its_variables_on_the_daemon_and_copies_no_secret(monkeypatch):
    # The daemon launches the runs: its container is what the launcher sees, ECS's secrets
    # included (ECS sets them as variables).
    daemon = container("ControlTask", "daemon")
    for name in list(os.environ):
        if name.startswith(("ML_PLATFORM_", "MLFLOW_", "DAGSTER_", "AWS_")):
            monkeypatch.delenv(name)
    for variable in daemon["Environment"]:
        monkeypatch.setenv(variable["Name"], "a value of the template")
    secrets = {secret["Name"] for secret in daemon["Secrets"]}
    for name in secrets:
        monkeypatch.setenv(name, "a value of Secrets Manager")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    launcher = EcsRunLauncher(**PRODUCTION["run_launcher"]["config"])

    # What the launcher adds to the run's task definition at each launch: a name the daemon
    # lacks raises there, and a secret's value would be written into the task definition.
    environment = EcsContainerContext(env_vars=launcher.env_vars).get_environment_dict()

    assert secrets & set(environment) == set()
    # use_current_ecs_task_config: the run's container is a copy of the daemon's, its
    # `secrets` (references to Secrets Manager) included; that is how runs get them.
    assert launcher.use_current_ecs_task_config is True


def test_a_launch_lists_no_tagged_secret_and_keeps_the_daemons_secrets(monkeypatch):
    # By default EcsRunLauncher lists, at each launch, the account's secrets tagged `dagster`
    # (Secrets Manager's ListSecrets, which the task role may not call: every launch would fail
    # AccessDenied) and puts those it finds in place of the daemon's container's secrets.
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    launcher = EcsRunLauncher(**PRODUCTION["run_launcher"]["config"])
    assert launcher.secrets_tags == []
    granted = {
        action
        for policy in RESOURCES["TaskRole"]["Properties"]["Policies"]
        for statement in policy["PolicyDocument"]["Statement"]
        for action in as_list(statement["Action"])
    }
    assert not any(action.startswith("secretsmanager:") for action in granted)
    # What a launch adds to the copy of the daemon's container: nothing, so its secrets stay.
    context = EcsContainerContext(secrets_tags=launcher.secrets_tags, secrets=launcher.secrets)
    assert context.get_secrets_dict(secrets_manager=None) == {}


def test_runs_load_the_code_location_the_code_server_serves():
    # A run task copies the daemon's container; its definitions must be the code server's.
    def platform(c: dict) -> tuple[dict, dict]:
        environment = {
            e["Name"]: e["Value"] for e in c["Environment"] if e["Name"] != "DAGSTER_CURRENT_IMAGE"
        }
        return environment, {s["Name"]: s["ValueFrom"] for s in c["Secrets"]}

    assert platform(container("ControlTask", "daemon")) == platform(
        container("CodeServerTask", "run")
    )


def test_the_processes_hand_ecs_exactly_the_platforms_two_roles():
    # RunTask of a run's or a step's task needs iam:PassRole on both of its roles, whatever the
    # stack is named, and on no other role of the account.
    statements = [
        statement
        for policy in RESOURCES["TaskRole"]["Properties"].get("Policies", [])
        for statement in policy["PolicyDocument"]["Statement"]
    ] + [
        statement
        for resource in RESOURCES.values()
        if resource["Type"] == "AWS::IAM::Policy"
        and {"!Ref": "TaskRole"} in resource["Properties"]["Roles"]
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]
    ]
    passing = [s for s in statements if "iam:PassRole" in as_list(s["Action"])]
    passed = [resource for s in passing for resource in as_list(s["Resource"])]
    assert sorted(passed, key=str) == [
        {"!GetAtt": "ExecutionRole.Arn"},
        {"!GetAtt": "TaskRole.Arn"},
    ]
    for statement in passing:
        assert statement["Condition"] == {
            "StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}
        }


@pytest.mark.parametrize("service", sorted(COMPOSE["services"]))
def test_every_compose_service_comes_back_after_a_crash_or_a_reboot(service):
    # Without a restart policy a daemon that exits (a database outage it cannot ride out)
    # stays down, and with it every sensor and schedule, with nothing in the UI to say so.
    assert COMPOSE["services"][service].get("restart") == "unless-stopped"


def test_the_backfill_chunk_size_is_a_parameter_of_the_stack():
    # docs/production.md asks to size a backfill's runs to the tasks allowed at once; the code
    # server (which splits ranges) and the runs (copies of the daemon) must agree on it.
    parameter = cloudformation()["Parameters"]["BackfillDaysPerRun"]
    assert parameter["Type"] == "Number" and parameter["MinValue"] == 1
    assert parameter["Default"] == DEFAULT_BACKFILL_DAYS_PER_RUN
    for task, name in (("CodeServerTask", "run"), ("ControlTask", "daemon")):
        environment = {e["Name"]: e["Value"] for e in container(task, name)["Environment"]}
        assert environment["ML_PLATFORM_BACKFILL_DAYS_PER_RUN"] == {"!Ref": "BackfillDaysPerRun"}
