"""What a person sees: headless Chromium against a real dagster-webserver over materialised days.

Two real flights days are landed and materialised with the CLI into a temporary instance; the
webserver serves them from workspace.yaml as a user runs it. Playwright drives the system's
Chromium (no browser download). Screenshots land in test-output/screenshots/ for CI artifacts.
"""

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from ml_platform import cli
from ml_platform_tests.conftest import ALL_ASSETS, REPO, free_port

pytestmark = pytest.mark.integration
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = REPO / "test-output" / "screenshots"
DAYS = ["2013-01-01", "2013-01-02"]
DAY = DAYS[-1]
BIN = Path(sys.executable).parent
# Pages query GraphQL on a shared 2-core machine: give them time before calling it a failure.
expect.set_options(timeout=60_000)


def wait_until_serving(url: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "dagster-webserver exited before serving"
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(1)
    raise AssertionError(f"dagster-webserver did not serve {url} within {timeout}s")


@pytest.fixture(scope="module")
def ui(tmp_path_factory) -> Iterator[str]:
    """The URL of a webserver serving two materialised days of flights."""
    root = tmp_path_factory.mktemp("ui")
    home = root / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {
        "DAGSTER_HOME": str(home),
        "ML_PLATFORM_DATASET": "flights",
        "ML_PLATFORM_LANDING_DIR": str(root / "landing"),
        "ML_PLATFORM_LAKE_DIR": str(root / "lake"),
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        assert cli.main(["land", "flights", "--start", DAYS[0], "--days", str(len(DAYS))]) == 0
        code = cli.main(["materialize", "--start", DAYS[0], "--days", str(len(DAYS))])
    # The first day's one-day model may be rejected: an outcome, not a failed run.
    assert code == 0

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (root / "webserver.log").open("w")
    proc = subprocess.Popen(
        [
            str(BIN / "dagster-webserver"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-w",
            "workspace.yaml",
        ],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until_serving(url, proc)
        yield url
    finally:
        # The webserver and its code server stop on SIGTERM (10-20 s); the group goes at once.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


@pytest.fixture
def page(ui) -> Iterator[Page]:
    assert CHROMIUM.exists(), (
        f"{CHROMIUM} is missing: install Debian's chromium (`make system-packages`)"
    )
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1600, "height": 1200}, base_url=ui)
        context.set_default_timeout(60_000)
        page = context.new_page()
        # Dagster's "Join the community" dialog appears on some first visits; dismiss it whenever.
        page.add_locator_handler(
            page.get_by_role("button", name="Skip"), lambda button: button.click()
        )
        try:
            yield page
        finally:
            browser.close()


def test_asset_graph_shows_the_five_core_assets(page):
    page.goto("/assets/evaluation_report?view=lineage&lineageScope=upstream&lineageDepth=5")
    for asset in ALL_ASSETS:
        if asset == "features":
            # "features" is also the name of its group's box: the node is the second match.
            expect(page.get_by_text(asset, exact=True)).to_have_count(2)
        else:
            expect(page.get_by_text(asset, exact=True).first).to_be_visible()
    page.screenshot(path=SCREENSHOTS / "asset-graph.png")


def test_a_partitions_checks_are_visible_with_their_runbook_link(page):
    page.goto("/assets/validated_data?view=checks&checkDetail=gx_validity")
    for check in [
        "gx_schema",
        "gx_completeness",
        "gx_validity",
        "gx_uniqueness",
        "gx_volume",
        "gx_partition_day",
    ]:
        expect(page.get_by_text(check, exact=True).first).to_be_visible()
    expect(page.get_by_text("docs/runbook.md#check-gx_validity")).to_be_visible()
    page.get_by_text("Execution history", exact=True).click()
    passed = f"flights_{DAY}.csv (partition {DAY}): all gx_validity expectations pass."
    expect(page.get_by_text(passed)).to_be_visible()
    page.screenshot(path=SCREENSHOTS / "partition-checks.png")


def test_evaluation_report_renders_with_its_plots(page):
    page.goto(f"/assets/evaluation_report?view=partitions&partition={DAY}")
    page.get_by_text("[Show Markdown]").first.click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_text(f"Evaluation of the model of {DAY}")).to_be_visible()
    plots = dialog.locator("img[src^='data:image/svg+xml']")
    expect(plots.first).to_be_visible()
    alts = [plots.nth(i).get_attribute("alt") for i in range(plots.count())]
    assert {"ROC curve", "Precision-recall curve", "Confusion matrix"} <= set(alts), alts
    for i in range(plots.count()):
        # Decoded and drawn: a broken data URI leaves naturalWidth at 0.
        assert plots.nth(i).evaluate("img => img.complete && img.naturalWidth > 100"), alts[i]
    page.screenshot(path=SCREENSHOTS / "evaluation-report.png")
