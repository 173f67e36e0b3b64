"""`dg` from the repository root, and the run environment without the dev tools.

What `make run` prints before the UI is up (no Dagster warning) is checked by
test_integration.py's `make run` test.
"""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ml_platform.definitions import defs
from ml_platform_tests.conftest import REPO

BIN = Path(sys.executable).parent
UV = REPO / ".tools" / "bin" / "uv"


def canonical(name: str) -> str:
    """A distribution's name as the lock and the installer compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture
def instance_env(tmp_path, monkeypatch) -> dict[str, str]:
    """The environment `make` gives Dagster: an instance directory with dagster.yaml linked in,
    the bundled contracts, and a landing zone and lake of the test's own.
    """
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").symlink_to(REPO / "dagster.yaml")
    for name in ("ML_PLATFORM_DATASET", "ML_PLATFORM_CONTRACTS"):
        monkeypatch.delenv(name, raising=False)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "ML_PLATFORM_LANDING_DIR": str(tmp_path / "landing"),
        "ML_PLATFORM_LAKE_DIR": str(tmp_path / "lake"),
    }
    return env


@pytest.mark.slow
def test_dg_lists_every_dataset_of_the_code_location_from_the_root(instance_env):
    listed = subprocess.run(
        [str(BIN / "dg"), "list", "defs", "--json"],
        cwd=REPO,
        env={**instance_env, "VIRTUAL_ENV": sys.prefix},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert listed.returncode == 0, listed.stderr
    # dg warns on stderr when its project settings or environment look wrong.
    assert "warning" not in listed.stderr.lower(), listed.stderr
    definitions = json.loads(listed.stdout)

    assets = {asset["asset_key"] for asset in definitions["assets"]}
    served = defs().resolve_asset_graph().get_all_asset_keys()
    assert assets == {key.to_user_string() for key in served}
    assert {"flights/raw_data", "synthetic/raw_data"} <= assets
    jobs = {job["name"] for job in definitions["jobs"]}
    assert {"flights_daily_pipeline_job", "synthetic_daily_pipeline_job"} <= jobs


@pytest.mark.slow
def test_a_fresh_run_environment_holds_no_dev_tool_and_runs_the_platform(tmp_path):
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"VIRTUAL_ENV", "UV_COMPILE_BYTECODE"}
    }
    env |= {
        "UV_PROJECT_ENVIRONMENT": str(tmp_path / "venv"),
        "UV_PYTHON": os.path.realpath(sys.executable),
        "UV_NO_PROGRESS": "1",
    }

    def uv(*args: str) -> str:
        # Offline: the cache of the environment running this test holds every locked wheel.
        done = subprocess.run(
            [str(UV), *args, "--frozen", "--offline"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def locked(*groups: str) -> set[str]:
        exported = uv("export", "--no-hashes", "--no-emit-project", *groups)
        return {canonical(line.split("==")[0]) for line in exported.splitlines() if "==" in line}

    uv("sync", "--no-dev")
    python = tmp_path / "venv" / "bin" / "python"
    names = "import importlib.metadata as m; print(*(d.name for d in m.distributions()))"
    listing = subprocess.run(
        [str(python), "-c", names], capture_output=True, text=True, check=True, timeout=120
    )
    installed = {canonical(name) for name in listing.stdout.split()} - {"ml-platform"}

    dev_only = locked() - locked("--no-dev")
    group = tomllib.loads((REPO / "pyproject.toml").read_text())["dependency-groups"]["dev"]
    tools = {canonical(re.split(r"[\[=<>~ ]", requirement)[0]) for requirement in group}
    # The dev group's tools and what they alone pull in (moto brings cfn-lint and flask).
    assert tools | {"cfn-lint"} <= dev_only
    assert installed & dev_only == set()
    assert installed <= locked("--no-dev")

    # Run from elsewhere, so the platform is the environment's, not the checkout's on sys.path.
    for command in (
        [str(python), "-c", "import ml_platform.definitions"],
        [str(tmp_path / "venv" / "bin" / "ml-platform"), "--help"],
    ):
        ran = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, f"{command}: {ran.stderr}"
    assert "materialize" in ran.stdout
