"""Where ML teams look for models: MLflow's own UI, `mlflow server` on 127.0.0.1 over the lake's
embedded store, shows the dataset's registered model with the champion alias on the version the
platform promoted. Headless Chromium (Debian's) through Playwright, as in `test_ui.py`."""

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from ml_platform.contracts import load_contract
from ml_platform_tests.conftest import Platform, free_port
from ml_platform_tests.test_ui import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS

pytestmark = pytest.mark.integration
DAYS = ["2024-01-01", "2024-01-02"]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def promoted(tmp_path_factory) -> tuple[Platform, str]:
    """Two synthetic days through the daily job; the platform and its champion's name."""
    platform = Platform(load_contract("synthetic"), tmp_path_factory.mktemp("mlflow-ui"))
    platform.land(DAYS[0], len(DAYS))
    for day in DAYS:
        assert platform.materialize(day).success
    champion = platform.registry().alias("champion")
    assert champion is not None
    return platform, champion


@pytest.fixture(scope="module")
def mlflow_ui(promoted, tmp_path_factory) -> Iterator[str]:
    """`mlflow server` on 127.0.0.1 over the platform's store, as `make mlflow-ui` starts it."""
    platform, _ = promoted
    port = free_port()
    log = tmp_path_factory.mktemp("mlflow-server") / "server.log"
    store = f"sqlite:///{platform.lake_dir}/mlflow/mlflow.db"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--backend-store-uri", store]
            + ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={
                **os.environ,
                "MLFLOW_DISABLE_TELEMETRY": "true",
                "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            },
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"mlflow server did not answer:\n{log.read_text()}"
            time.sleep(1)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_the_mlflow_ui_shows_the_champion_alias_on_the_promoted_version(promoted, mlflow_ui):
    platform, champion = promoted
    number = platform.registry().model_version(champion).version
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1200})
            page.goto(f"{mlflow_ui}/#/models/synthetic")
            row = page.get_by_role("row").filter(has_text="@ champion")
            expect(row).to_have_count(1, timeout=60_000)
            expect(row).to_contain_text(f"Version {number}")
            expect(row).to_contain_text(champion)
            page.screenshot(path=SCREENSHOTS / "mlflow-registered-model.png")
        finally:
            browser.close()
