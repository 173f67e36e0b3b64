"""What a person sees: headless Chromium against a real dagster-webserver over materialised days.

The webserver and daemon serve a temporary instance from workspace.yaml as a user runs them; two
real flights days are landed and run through them with the CLI, then a third whose file arrives
damaged and is rejected by its quality gate. Playwright drives the system's Chromium (no browser
download). Screenshots land in test-output/screenshots/ for CI artifacts.
"""

import csv
import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from ml_platform import cli
from ml_platform_tests.conftest import ALL_ASSETS, REPO
from ml_platform_tests.services import DagsterServices

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
# The day after DAYS, delivered with carriers the contract does not know: it fails gx_validity.
FAULTY_DAY = "2013-01-03"
UNKNOWN_CARRIER = "ZZ"
DAMAGED_ROWS = 5
BIN = Path(sys.executable).parent
# Pages query GraphQL on a shared 2-core machine: give them time before calling it a failure.
expect.set_options(timeout=60_000)


def damage_carriers(path: Path, rows: int = DAMAGED_ROWS) -> None:
    """Rewrite a landed flights file with an unknown carrier code on its first rows.

    A broken upstream export as a user would receive it: every other field keeps its text.
    """
    table = list(csv.reader(io.StringIO(path.read_text())))
    carrier = table[0].index("carrier")
    for row in table[1 : rows + 1]:
        row[carrier] = UNKNOWN_CARRIER
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(table)
    path.write_text(out.getvalue())


@pytest.fixture(scope="module")
def ui(tmp_path_factory) -> Iterator[str]:
    """The URL of a webserver serving two materialised days of flights and one rejected day."""
    services = DagsterServices(tmp_path_factory.mktemp("ui"))
    services.env["ML_PLATFORM_DATASET"] = "flights"
    services.start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            for name, value in services.env.items():
                patch.setenv(name, value)
            land = ["land", "--dataset", "flights", "--start", DAYS[0], "--days", str(len(DAYS))]
            assert cli.main(land) == 0
            code = cli.main(["materialize", "--start", DAYS[0], "--days", str(len(DAYS))])
            # The first day's one-day model may be rejected: an outcome, not a failed run.
            assert code == 0
            assert cli.main(["land", "--dataset", "flights", "--start", FAULTY_DAY]) == 0
            damage_carriers(services.landing / f"flights_{FAULTY_DAY}.csv")
            # The quality gate rejects the day at validated_data: a verdict of the day, recorded
            # by a run that succeeds, which the command's exit code tells from a failed run.
            faulty = cli.main(["materialize", "--start", FAULTY_DAY, "--days", "1"])
            assert faulty == cli.REJECTED_EXIT
        yield services.env["ML_PLATFORM_DAGSTER_URL"]
    finally:
        services.stop()


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
    page.goto("/assets/flights/evaluation_report?view=lineage&lineageScope=upstream&lineageDepth=5")
    # flights marks no feature blocking, so its drift_report is beside the model, not upstream.
    for asset in [a for a in ALL_ASSETS if a != "drift_report"]:
        # A node shows the last part of its key (`flights/features`); groups are
        # `flights_<stage>`.
        expect(page.get_by_text(asset, exact=True).first).to_be_visible()
    page.screenshot(path=SCREENSHOTS / "asset-graph.png")


def test_a_partitions_checks_are_visible_with_their_runbook_link(page):
    page.goto("/assets/flights/validated_data?view=checks&checkDetail=gx_validity")
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


def test_a_rejected_days_check_shows_that_day_failed_with_its_reason(page):
    # The README's way to a day's check result: the asset's Checks tab, a check, its Partitions
    # tab, then the day.
    page.goto("/assets/flights/validated_data")
    page.get_by_role("tab", name="Checks").click()
    page.get_by_text("gx_validity", exact=True).first.click()
    reason = (
        f"flights_{FAULTY_DAY}.csv (partition {FAULTY_DAY}): expect_column_values_to_be_in_set "
        f"failed on column carrier: {DAMAGED_ROWS} of"
    )
    advice = f"e.g. '{UNKNOWN_CARRIER}'. Fix the upstream file and re-land it"
    # The check's overview names the day of its latest result (the faulty day, materialised
    # last); a check of the whole asset shows "Partition —" here.
    expect(page.get_by_text(reason)).to_be_visible()
    expect(page.get_by_text("Partition", exact=True).locator("..")).to_have_text(
        f"Partition{FAULTY_DAY}"
    )
    # The asset has tabs of its own (one is also "Partitions"): these are the check's.
    check_tabs = page.get_by_role("tablist").filter(
        has=page.get_by_role("tab", name="Execution history")
    )
    check_tabs.get_by_role("tab", name="Execution history").click()
    for day, status in [(FAULTY_DAY, "Failed"), (DAY, "Passed")]:
        row = page.get_by_role("row").filter(has=page.get_by_role("cell", name=day, exact=True))
        expect(row.get_by_role("cell").first).to_have_text(status)
    expect(page.get_by_role("row").filter(has_text=reason)).to_contain_text(advice)

    # The check's status per day of the year, then the failed day's own result.
    check_tabs.get_by_role("tab", name="Partitions").click()
    expect(page.get_by_text("Failed (1)", exact=True)).to_be_visible()
    # The two good days count as passed: their results target their materialisations.
    expect(page.get_by_text("Passed (2)", exact=True)).to_be_visible()
    page.get_by_placeholder("Filter by partition").fill(FAULTY_DAY)
    # Each day's name is drawn twice, once hidden to measure truncation: click the one shown.
    page.get_by_text(FAULTY_DAY, exact=True).locator("visible=true").first.click()
    detail = (
        page.locator("div")
        .filter(has=page.get_by_role("button", name="View all historical executions"))
        .filter(has_text=reason)
        .last
    )
    expect(detail).to_contain_text(FAULTY_DAY)
    expect(detail).to_contain_text("Failed")
    expect(detail).to_contain_text(advice)
    page.screenshot(path=SCREENSHOTS / "failed-partition-check.png")

    # The day's verdict has its own check, which says the delivery was rejected and why.
    page.goto("/assets/flights/validated_data?view=checks&checkDetail=delivery_accepted")
    expect(
        page.get_by_text(f"{FAULTY_DAY} was rejected (failed quality gate): ").first
    ).to_be_visible()


def test_the_evaluation_report_renders_and_its_metrics_plot_across_days(page):
    page.goto(f"/assets/flights/evaluation_report?view=partitions&partition={DAY}")
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
    page.keyboard.press("Escape")

    # The README's way to an asset's plots: Overview, Metadata, the Plots toggle, then Events
    # (the Partitions view plots only the last 120 days of 2013, none of them materialised).
    page.get_by_role("tab", name="Overview").click()
    page.get_by_role("button", name="Plots").click()
    page.get_by_role("button", name="Events").click()
    # The innermost block holding both the metric's title and a chart is that metric's plot.
    plot = (
        page.locator("div")
        .filter(has=page.get_by_text("roc_auc", exact=True))
        .filter(has=page.get_by_role("img"))
        .last
    )
    chart = plot.get_by_role("img")
    expect(chart).to_be_visible()
    assert chart.evaluate("canvas => canvas.width > 100 && canvas.height > 100")
    chart.scroll_into_view_if_needed()
    page.screenshot(path=SCREENSHOTS / "metadata-plots.png")


def test_the_rejected_day_is_on_the_rejected_days_page_without_opening_a_check(page):
    # The README's page for "which days were rejected": the dataset's rejected_days asset, which
    # every run of the daily job recomputes from the day records.
    page.goto("/assets/flights/rejected_days")
    expect(page.get_by_text("rejected_day_list", exact=True).first).to_be_visible()
    expect(page.get_by_text(FAULTY_DAY, exact=True).first).to_be_visible()
    expect(page.get_by_text("failed quality gate", exact=True).first).to_be_visible()
    # One list for the dataset, replaced by each run, not a file per day.
    expect(page.get_by_text("flights/rejected_days/all.json", exact=True)).to_be_visible()
    page.screenshot(path=SCREENSHOTS / "rejected-days.png")
