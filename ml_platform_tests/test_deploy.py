"""The deployment files agree with each other and with the repository: the instance configs,
the compose stack, the Dockerfile, the IAM policy and the ECS recipe (CloudFormation, checked
by cfn-lint); Docker and AWS themselves cannot run here.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml
from dagster_aws.ecs import EcsRunLauncher

from ml_platform.definitions import step_executor
from ml_platform.platform.settings import Settings
from ml_platform_tests.conftest import REPO

PRODUCTION = yaml.safe_load((REPO / "deploy/dagster.yaml").read_text())
ONE_MACHINE = yaml.safe_load((REPO / "deploy/local/dagster.yaml").read_text())
COMPOSE = yaml.safe_load((REPO / "deploy/docker-compose.yaml").read_text())


def env_names(node) -> set[str]:
    """Names of the variables an instance config reads with `{env: NAME}`."""
    if isinstance(node, dict):
        if set(node) == {"env"}:
            return {node["env"]}
        return set().union(*(env_names(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(env_names(v) for v in node))
    return set()


def documented_variables() -> set[str]:
    text = (REPO / ".env.example").read_text()
    return set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", text, re.M))


def test_the_one_machine_config_differs_only_in_its_run_launcher():
    assert {k: v for k, v in PRODUCTION.items() if k != "run_launcher"} == {
        k: v for k, v in ONE_MACHINE.items() if k != "run_launcher"
    }
    assert PRODUCTION["run_launcher"]["class"] == "EcsRunLauncher"
    assert PRODUCTION["run_launcher"]["module"] == "dagster_aws.ecs"
    assert ONE_MACHINE["run_launcher"] == {"module": "dagster", "class": "DefaultRunLauncher"}


def test_the_production_run_launcher_accepts_its_config_and_sizes_each_run(monkeypatch):
    # The launcher's own constructor: an unknown or misspelt key fails here, not on deploy.
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    launcher = EcsRunLauncher(**PRODUCTION["run_launcher"]["config"])
    assert set(launcher.run_resources) == {"cpu", "memory"}


def test_production_keeps_the_concurrency_limits_of_the_embedded_instance():
    embedded = yaml.safe_load((REPO / "dagster.yaml").read_text())
    assert PRODUCTION["concurrency"] == embedded["concurrency"]
    assert PRODUCTION["run_queue"] == embedded["run_queue"]
    assert PRODUCTION["run_monitoring"]["enabled"] is True


def test_production_storage_is_postgres_and_compute_logs_s3():
    database = PRODUCTION["storage"]["postgres"]["postgres_db"]
    assert database["scheme"] == "postgresql+psycopg2"
    logs = PRODUCTION["compute_logs"]
    assert (logs["module"], logs["class"]) == (
        "dagster_aws.s3.compute_log_manager",
        "S3ComputeLogManager",
    )
    assert set(logs["config"]) >= {"bucket", "prefix", "endpoint_url"}


def test_every_variable_of_the_configs_is_documented_and_given_by_compose():
    instance = env_names(PRODUCTION) | env_names(
        yaml.safe_load((REPO / "deploy/workspace.yaml").read_text())
    )
    documented = documented_variables()
    assert instance - documented == set(), "variables missing from .env.example"
    for service in ("code-server", "webserver", "daemon"):
        given = set(COMPOSE["services"][service]["environment"])
        assert instance - given == set(), f"{service} lacks variables the instance reads"
    # Run tasks are copies of the daemon's container on ECS: it holds what the run worker
    # reads, the instance's variables and the platform's.
    [daemon] = [
        container
        for container in cloudformation()["Resources"]["ControlTask"]["Properties"][
            "ContainerDefinitions"
        ]
        if container["Name"] == "daemon"
    ]
    given = {v["Name"] for v in daemon["Environment"]} | {s["Name"] for s in daemon["Secrets"]}
    assert env_names(PRODUCTION) <= given
    assert {"ML_PLATFORM_LAKE_URL", "ML_PLATFORM_LANDING_URL", "MLFLOW_TRACKING_URI"} <= given


def test_compose_references_existing_files_and_documented_variables():
    text = (REPO / "deploy/docker-compose.yaml").read_text()
    # `$${NAME}` is a literal for the container's shell, not a variable compose substitutes.
    referenced = set(re.findall(r"(?<!\$)\$\{([A-Z][A-Z0-9_]*)", text))
    assert referenced - documented_variables() == set()
    assert set(COMPOSE["services"]) == {"postgres", "code-server", "webserver", "daemon"}
    build = COMPOSE["services"]["code-server"]["build"]
    assert (REPO / "deploy" / build["context"] / build["dockerfile"]).is_file()
    for name, service in COMPOSE["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (REPO / "deploy" / source).is_file(), f"{name} mounts missing {source}"
    for name in ("webserver", "daemon"):
        # The daemon's is a shell's script (its pools first): its words, as for the webserver.
        words = " ".join(COMPOSE["services"][name]["command"]).split()
        assert words[words.index("-w") + 1] == "/opt/dagster/home/workspace.yaml"
        assert COMPOSE["services"][name]["image"] == COMPOSE["services"]["code-server"]["image"]
    workspace = yaml.safe_load((REPO / "deploy/workspace.yaml").read_text())
    [location] = workspace["load_from"]
    assert location["grpc_server"]["location_name"] == "ml_platform"


def test_the_dockerfile_pins_its_base_installs_the_lock_first_and_runs_unprivileged():
    lines = [line for line in (REPO / "Dockerfile").read_text().splitlines() if line.strip()]
    [base] = [line for line in lines if line.startswith("FROM ")]
    assert re.fullmatch(r"FROM python:3\.11\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base
    copies = [line for line in lines if line.startswith("COPY ")]
    assert "uv.lock" in copies[0] and "ml_platform" in copies[-1], copies
    assert any("uv sync --frozen --no-dev --no-install-project" in line for line in lines)
    # The image runs the platform: no sync brings in the dev group's test and lint tools.
    syncs = [line for line in lines if "uv sync" in line]
    assert syncs and all("--no-dev" in line for line in syncs), syncs
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1] != "USER root"
    assert lines.index(users[-1]) < lines.index(next(li for li in lines if li.startswith("CMD ")))


def test_the_iam_policy_grants_exactly_the_platform_prefixes():
    policy = json.loads((REPO / "deploy/iam-policy.json").read_text())
    grants = {
        resource: set(statement["Action"])
        for statement in policy["Statement"]
        for resource in statement["Resource"]
    }
    bucket = "arn:aws:s3:::ml-platform-data"
    # A failed multipart upload (boto3 sends a file over 8 MB in parts: an MLflow artifact, a
    # compute log) is aborted where it is written, or its parts stay stored and billed.
    writes = {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"}
    assert grants == {
        f"{bucket}/landing/*": {"s3:GetObject"},
        f"{bucket}/lake/*": writes,
        f"{bucket}/compute-logs/*": writes,
        bucket: {"s3:ListBucket"},
    }
    [listing] = [s for s in policy["Statement"] if s["Action"] == ["s3:ListBucket"]]
    assert listing["Condition"]["StringLike"]["s3:prefix"] == [
        "landing/*",
        "lake/*",
        "compute-logs/*",
    ]
    assert all(s["Effect"] == "Allow" for s in policy["Statement"])
    # The production guide documents the policy, and the README leads to it.
    production = (REPO / "docs" / "production.md").read_text()
    assert "IAM" in production and "deploy/iam-policy.json" in production
    assert "docs/production.md" in (REPO / "README.md").read_text()


def cloudformation() -> dict:
    """deploy/cloudformation.yaml, its intrinsic functions (!Ref, !Sub, ...) as {tag: value}."""

    class Loader(yaml.SafeLoader):
        pass

    def tagged(loader: yaml.SafeLoader, tag: str, node: yaml.Node) -> dict:
        if isinstance(node, yaml.ScalarNode):
            return {f"!{tag}": loader.construct_scalar(node)}
        if isinstance(node, yaml.SequenceNode):
            return {f"!{tag}": loader.construct_sequence(node, deep=True)}
        return {f"!{tag}": loader.construct_mapping(node, deep=True)}  # type: ignore[arg-type]

    Loader.add_multi_constructor("!", tagged)
    return yaml.load((REPO / "deploy/cloudformation.yaml").read_text(), Loader=Loader)


def test_the_cloudformation_template_passes_cfn_lint():
    lint = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "deploy/cloudformation.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_on_ecs_each_step_is_a_task_sized_by_its_own_tags():
    resources = cloudformation()["Resources"]
    # Runs are tasks whose container, named "run", is a copy of the daemon's that launched
    # them (EcsRunLauncher with the current task's config); the steps' tasks are the run's,
    # overriding that container.
    [daemon] = [
        container
        for container in resources["ControlTask"]["Properties"]["ContainerDefinitions"]
        if container["Name"] == "daemon"
    ]
    environment = {e["Name"]: e["Value"] for e in daemon["Environment"]}
    assert environment["ML_PLATFORM_EXECUTOR"] == "ecs"
    launcher = yaml.safe_load((REPO / "deploy/dagster.yaml").read_text())["run_launcher"]
    assert launcher["class"] == "EcsRunLauncher"
    assert launcher["config"]["use_current_ecs_task_config"] is True
    settings = Settings({"ML_PLATFORM_EXECUTOR": environment["ML_PLATFORM_EXECUTOR"]})
    assert step_executor(settings).name == "ecs"
    # The processes may start tasks, and hand them the two roles (test_deploy_shapes.py).
    policies = [
        *resources["TaskRole"]["Properties"]["Policies"],
        *(r["Properties"] for r in resources.values() if r["Type"] == "AWS::IAM::Policy"),
    ]
    granted = {
        action
        for policy in policies
        for statement in policy["PolicyDocument"]["Statement"]
        for action in (
            [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]
        )
    }
    assert {"ecs:RunTask", "ecs:DescribeTasks", "ecs:StopTask", "iam:PassRole"} <= granted


def test_run_monitoring_may_read_the_last_lines_of_this_stacks_task_logs_alone():
    # EcsRunLauncher's message of a run worker that died ends with its container's last log
    # lines, read with logs:GetLogEvents from the stream awslogs writes for it.
    resources = cloudformation()["Resources"]
    statements = [
        statement
        for policy in resources["TaskRole"]["Properties"]["Policies"]
        for statement in policy["PolicyDocument"]["Statement"]
        if "logs:GetLogEvents" in statement["Action"]
    ]
    [reading] = statements
    assert reading["Action"] in ("logs:GetLogEvents", ["logs:GetLogEvents"])
    containers = [
        container
        for resource in resources.values()
        if resource["Type"] == "AWS::ECS::TaskDefinition"
        for container in resource["Properties"]["ContainerDefinitions"]
    ]
    prefixes = {c["LogConfiguration"]["Options"]["awslogs-stream-prefix"] for c in containers}
    assert {c["LogConfiguration"]["Options"]["awslogs-group"]["!Ref"] for c in containers} == {
        "Logs"
    }
    [prefix] = prefixes
    assert reading["Resource"] == {
        "!Sub": "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}:log-group:${Logs}"
        f":log-stream:{prefix}/*"
    }


def test_every_deployed_daemon_stores_the_pools_limits_before_it_starts():
    # ml_platform/platform/pools.py: without them, Dagster's queue starts the first runs of a
    # pool all at once. test_production.py runs the same before its daemon, against PostgreSQL.
    [daemon] = [
        container
        for container in cloudformation()["Resources"]["ControlTask"]["Properties"][
            "ContainerDefinitions"
        ]
        if container["Name"] == "daemon"
    ]
    for command in (COMPOSE["services"]["daemon"]["command"], daemon["Command"]):
        shell, flag, script = command
        assert (shell, flag) == ("sh", "-c")
        assert script.startswith("ml-platform pools && exec dagster-daemon run -w "), script


def test_the_templates_data_policy_is_the_iam_policy_file():
    def as_list(value) -> list:
        return value if isinstance(value, list) else [value]

    def grants(statements: list[dict]) -> dict[str, tuple]:
        """Each statement by its Sid; the template's ARNs for the bucket the JSON file names."""
        names = {"${AWS::Partition}": "aws", "${DataBucket}": "ml-platform-data"}
        resources = []
        for statement in statements:
            arns = []
            for arn in as_list(statement["Resource"]):
                arn = arn["!Sub"] if isinstance(arn, dict) else arn
                for name, value in names.items():
                    arn = arn.replace(name, value)
                arns.append(arn)
            resources.append(sorted(arns))
        return {
            s["Sid"]: (sorted(as_list(s["Action"])), arns, s.get("Condition"))
            for s, arns in zip(statements, resources, strict=True)
        }

    policy = json.loads((REPO / "deploy/iam-policy.json").read_text())
    policies = cloudformation()["Resources"]["TaskRole"]["Properties"]["Policies"]
    [data] = [p for p in policies if p["PolicyName"] == "data"]
    assert grants(data["PolicyDocument"]["Statement"]) == grants(policy["Statement"])
