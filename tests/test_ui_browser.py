"""The dashboard in a real browser: Debian's headless Chromium, driven through Selenium and its
chromedriver, against a real scheduler under gunicorn with jobs run by agents.

Checked: every page loads without a console error, the overview's counts, chart, nodes and
the reasons of recent failures, the nodes page's slots and jobs, the filters and paging of the
jobs list, a job's outputs, attempts, hidden environment values and how it ended, cancelling,
and the page refreshing itself; and every page at a phone's 400 px and a desktop's 1400 px:
nothing wider than the screen and nothing scrolling sideways inside it, the header's links and
Pause button on screen and clickable, schedule cards labelled, and no hover-only information on
a touch screen. The buttons are tests/test_ui_actions.py's; the live feeds test_ui_live.py's.

Screenshots go to test-artifacts/. With `UPDATE_SCREENSHOTS=1`, the screen-fit test also writes
each page at both widths to docs/screenshots/ (and the overview at 1400 px to
docs/dashboard.png), the pictures docs/dashboard.md shows:
`UPDATE_SCREENSHOTS=1 .venv/bin/pytest tests/test_ui_browser.py -k fits_the_screen`.

Without chromium and chromedriver on PATH the browser tests are skipped with one line saying
how to get them (`TEST_REQUIRE_BROWSER=1` makes that a failure: `.ci/run` installs them and sets
it). The checks that need no browser run either way.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import unavailable
from helpers import Agent, Api, wait_for
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry

BROWSER_PROGRAMS = ("chromium", "chromedriver")
"""Debian's headless browser and its WebDriver server, looked up on PATH."""
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
DOC_SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
SECRET = "s3cr3t-token-value"
EXACT_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC$")
VIEWPORT_HEIGHT = 900
"""CSS pixels of screen height while a width is emulated."""

WIDTHS = (400, 1400)
"""A phone's and a desktop's screen width, in CSS pixels."""

BROWSER_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1000",
)


# --- the browser -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """The paths of chromium and chromedriver. Session-wide, so that without them the tests
    are skipped before any scheduler starts for them."""
    found = {name: shutil.which(name) for name in BROWSER_PROGRAMS}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        unavailable(
            f"{' and '.join(missing)} not found: to run the dashboard's browser tests, "
            "apt-get install chromium chromium-driver",
            "TEST_REQUIRE_BROWSER",
        )
    return found["chromium"] or "", found["chromedriver"] or ""


@pytest.fixture(scope="module")
def browser(
    chromium: tuple[str, str],
    scheduler: SchedulerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WebDriver]:
    """One headless Chromium for the module (closed before the scheduler stops)."""
    binary, driver_path = chromium
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in BROWSER_ARGS:
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: Selenium Manager never runs, so nothing is downloaded.
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(20)
    yield driver
    driver.quit()


class Page:
    """The browser on one scheduler's dashboard, read through small atomic scripts: the page
    replaces its content every few seconds, so element handles may go stale at any time."""

    def __init__(self, driver: WebDriver, base_url: str) -> None:
        self.driver = driver
        self.base_url = base_url
        self.width: int | None = None  # the emulated screen width, when one is set

    def open(self, path: str) -> None:
        self.driver.get(self.base_url + path)
        wait_for(lambda: self.js("return document.readyState") == "complete", message="load")

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def text(self, css: str) -> str:
        return self.js(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", css
        )

    def words(self, css: str) -> str:
        """The element's text as one line, as a sentence reads (innerText would break it
        where the layout puts its parts side by side)."""
        return self.js(
            "const e = document.querySelector(arguments[0]);"
            "return e ? e.textContent.replace(/\\s+/g, ' ').trim() : ''",
            css,
        )

    def texts(self, css: str) -> list[str]:
        return self.js(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText.trim())", css
        )

    def rows(self) -> list[dict[str, str]]:
        """The jobs list's rows, as their data attributes."""
        return self.js(
            "return [...document.querySelectorAll('tr[data-job]')].map(r => ({...r.dataset}))"
        )

    def click(self, css: str) -> None:
        def clicked() -> bool:
            try:
                self.driver.find_element(By.CSS_SELECTOR, css).click()
            except StaleElementReferenceException:
                return False  # replaced by a refresh between finding and clicking: again
            return True

        wait_for(clicked, message=f"a click on {css}")

    def accept_confirm(self) -> str:
        def alert() -> Any:
            try:
                return self.driver.switch_to.alert
            except NoAlertPresentException:
                return None

        dialog = wait_for(alert, message="the confirm dialog")
        question = dialog.text
        dialog.accept()
        return question

    def screenshot(self, name: str, docs: str | None = None) -> Path:
        """The whole page (the window grows to its height for the shot) as a test artifact;
        with `UPDATE_SCREENSHOTS=1`, copied to docs/screenshots/`docs`.png as well."""
        path = self._shoot(name)
        if docs is not None and os.environ.get("UPDATE_SCREENSHOTS", "").strip() == "1":
            DOC_SHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, DOC_SHOTS / f"{docs}.png")
            if docs == "overview-1400":
                shutil.copyfile(path, DOC_SHOTS.parent / "dashboard.png")
        return path

    def _shoot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        if self.width is not None:
            height = self.js("return document.documentElement.scrollHeight")
            self._emulate(self.width, max(VIEWPORT_HEIGHT, height))
            try:
                assert self.driver.save_screenshot(str(path)), f"no screenshot for {name}"
            finally:
                self._emulate(self.width, VIEWPORT_HEIGHT)
            return path
        size = self.driver.get_window_size()
        height = self.js("return document.documentElement.scrollHeight")
        self.driver.set_window_size(size["width"], max(size["height"], height + 200))
        try:
            assert self.driver.save_screenshot(str(path)), f"no screenshot for {name}"
        finally:
            self.driver.set_window_size(size["width"], size["height"])
        return path

    def set_width(self, width: int | None) -> None:
        """Show pages `width` CSS pixels wide, as a phone (below 600) or a desktop would;
        None goes back to the window's own size."""
        self.width = width
        if width is None:
            self.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        else:
            self._emulate(width, VIEWPORT_HEIGHT)

    def _emulate(self, width: int, height: int) -> None:
        # The window cannot be made narrower than the browser's minimum; the viewport can.
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600}
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)

    def off_screen(self, css: str) -> list[str]:
        """The elements matching `css` that are not wholly on screen, visible and the topmost
        thing at their centre (what a tap there would hit)."""
        return self.js(
            """
            return [...document.querySelectorAll(arguments[0])].filter(e => {
              const r = e.getBoundingClientRect();
              const shown = getComputedStyle(e).visibility === 'visible' && r.width && r.height;
              const inside = r.left >= 0 && r.top >= 0 && r.right <= window.innerWidth;
              const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
              return !(shown && inside && hit && (hit === e || e.contains(hit)));
            }).map(e => e.id || e.innerText || e.outerHTML.slice(0, 80));
            """,
            css,
        )

    def sideways_scrollers(self) -> list[str]:
        """Elements whose content is wider than they are and that scroll it sideways."""
        return self.js(
            """
            return [...document.querySelectorAll('body *')].filter(e => {
              const x = getComputedStyle(e).overflowX;
              return (x === 'auto' || x === 'scroll') && e.scrollWidth > e.clientWidth + 1;
            }).map(e => e.id || e.className || e.tagName);
            """
        )

    def console_errors(self) -> list[dict[str, Any]]:
        return [entry for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"]


@pytest.fixture
def page(browser: WebDriver, scheduler: SchedulerProcess) -> Iterator[Page]:
    """The browser, with the console checked for errors after each test."""
    browser.get_log("browser")  # what earlier tests left
    view = Page(browser, scheduler.url)
    try:
        yield view
    finally:
        if view.width is not None:
            view.set_width(None)
    errors = view.console_errors()
    assert not errors, f"browser console errors: {errors}"


# --- the cluster's jobs ------------------------------------------------------------------------


@dataclasses.dataclass
class Jobs:
    trained: dict[str, Any]  # done, with env vars
    tested: dict[str, Any]  # failed once, then done on another node
    migrated: dict[str, Any]  # failed for good
    running: dict[str, Any]
    service: dict[str, Any]
    pending: list[dict[str, Any]]


def _run(url: str, job: dict[str, Any], exit_code: int, stdout: str = "", stderr: str = "") -> None:
    """Claim and finish one attempt, as the job's node's agent would."""
    agent = Agent(url, job["node_id"])
    assert agent.claim(job["job_id"]).status_code == 200
    assert agent.report(job["job_id"], exit_code, stdout, stderr).status_code == 200
    agent.close()


@pytest.fixture(scope="module")
def jobs(scheduler: SchedulerProcess, registry_server: FakeRegistry) -> Iterator[Jobs]:
    """A small, lived-in cluster: jobs done, retried, failed, running, pending."""
    url = scheduler.url
    api = Api(url)
    trained = api.submit(
        command="python train.py --epochs 3",
        env_vars={"DATASET": "s3://datasets/cifar10", "API_TOKEN": SECRET},
    )
    _run(url, trained, 0, stdout="epoch 1 loss 0.91\nepoch 2 loss 0.55\nepoch 3 loss 0.38\n")
    tested = api.submit(command="make test")
    _run(
        url,
        tested,
        2,
        "collected 48 items\n",
        "FAILED test_upload.py::test_retry - ConnectionReset\n",
    )
    _run(url, api.job(tested["job_id"]), 0, stdout="48 passed in 3.1s\n")
    migrated = api.submit(command="./migrate.sh --to 42")
    for _ in range(2):
        _run(url, api.job(migrated["job_id"]), 1, stderr='ERROR: relation "users" does not exist\n')
    running = api.submit(command="sleep 600 && ./report.sh")
    service = api.submit(command="python -m http.server 8080", job_type="service", port=8080)
    for job in (running, service):
        agent = Agent(url, job["node_id"])
        assert agent.claim(job["job_id"]).status_code == 200
        agent.close()
    pending = [api.submit(command=f"./backup.sh --shard {shard}") for shard in (1, 2)]
    yield Jobs(
        trained=trained,
        tested=api.job(tested["job_id"]),
        migrated=api.job(migrated["job_id"]),
        running=running,
        service=service,
        pending=pending,
    )
    api.close()


@pytest.fixture
def cluster(registry: FakeRegistry, jobs: Jobs) -> Jobs:
    """The jobs, with node-a..c healthy and node-d unhealthy in the registry."""
    registry.set_node("node-d", status="unhealthy")
    return jobs


# --- the pages ---------------------------------------------------------------------------------


def test_overview_shows_counts_nodes_and_failures(page: Page, cluster: Jobs, api: Api) -> None:
    page.open("/ui/")
    counts = api.get("/health").json()["jobs"]
    failed = api.jobs(status="failed")
    apart = {
        state: sum(job.get("reason") == reason for job in failed)
        for state, reason in (("cancelled", "cancelled"), ("timed out", "timeout"))
    }
    shown = page.js(
        "return Object.fromEntries([...document.querySelectorAll('a.count')]"
        ".map(a => [a.dataset.status, a.querySelector('.number').innerText]))"
    )
    # Cancelled and timed-out jobs are counted apart from the failures (issue 36).
    assert shown == {
        **{status: str(n) for status, n in counts.items()},
        "failed": str(counts["failed"] - sum(apart.values())),
        **{state: str(n) for state, n in apart.items()},
        "total": str(sum(counts.values())),
    }

    health = page.js(
        "return Object.fromEntries([...document.querySelectorAll('tr[data-node]')]"
        ".map(r => [r.dataset.node, r.querySelector('.badge').innerText]))"
    )
    assert health == {
        "node-a": "healthy",
        "node-b": "healthy",
        "node-c": "healthy",
        "node-d": "unhealthy",
    }
    running_node = cluster.running["node_id"]
    assert cluster.running["job_id"] in page.text(f"tr[data-node='{running_node}'] td.node-running")
    for job in cluster.pending:
        assert job["job_id"] in page.text(f"tr[data-node='{job['node_id']}'] td.node-pending")

    # The daemon you are on: with SQLite the only one, leading.
    daemons = page.text("#daemons")
    assert f"You are on {api.base_url}, the leader." in daemons, daemons

    failures = page.text("table.failures")
    assert cluster.migrated["job_id"] in failures
    assert 'relation "users" does not exist' in failures  # the last line of its stderr
    assert cluster.tested["job_id"] in failures  # its first attempt failed
    # The Reason column says why, not what the job printed.
    reasons = page.js(
        "return [...document.querySelectorAll('tr[data-failure]')]"
        ".map(r => [r.dataset.failure, r.querySelector('.cell-reason').innerText])"
    )
    assert [cluster.migrated["job_id"], "exit 1"] in reasons
    assert [cluster.tested["job_id"], "exit 2"] in reasons

    times = page.js(
        "return [...document.querySelectorAll('time')].map(t => [t.title, t.innerText])"
    )
    assert times
    for title, text in times:
        assert EXACT_TIME.match(title), title
        assert text == "just now" or re.fullmatch(r"\d+ (s|min) ago", text), text
    page.screenshot("ui-overview")


def test_jobs_list_filters_and_pages(page: Page, cluster: Jobs, api: Api) -> None:
    page.open("/ui/jobs?limit=200")
    everything = [row["job"] for row in page.rows()]
    # Newest first, as the command line lists (issue 36: the dashboard listed oldest first).
    assert everything == [job["job_id"] for job in api.jobs()][::-1]
    page.open("/ui/jobs")
    page.screenshot("ui-jobs")

    Select(page.driver.find_element(By.ID, "filter-status")).select_by_visible_text("failed")
    page.click("#filter-apply")
    wait_for(lambda: "status=failed" in page.driver.current_url, message="the status filter")
    failed = page.rows()
    assert cluster.migrated["job_id"] in [row["job"] for row in failed]
    assert {row["state"] for row in failed} == {"failed"}

    page.open("/ui/jobs")
    Select(page.driver.find_element(By.ID, "filter-type")).select_by_visible_text("service")
    page.click("#filter-apply")
    wait_for(lambda: "job_type=service" in page.driver.current_url, message="the type filter")
    assert [row["job"] for row in page.rows()] == [cluster.service["job_id"]]

    node = cluster.running["node_id"]
    page.open("/ui/jobs")
    page.driver.find_element(By.ID, "filter-node").send_keys(node)
    page.click("#filter-apply")
    wait_for(lambda: f"node_id={node}" in page.driver.current_url, message="the node filter")
    on_node = [row["job"] for row in page.rows()]
    assert on_node == [job["job_id"] for job in api.jobs(node_id=node)][::-1]
    assert cluster.running["job_id"] in on_node

    page.open("/ui/jobs?limit=3")
    assert [row["job"] for row in page.rows()] == everything[:3]
    page.click("#page-next")
    wait_for(lambda: f"before={everything[2]}" in page.driver.current_url, message="page two")
    assert [row["job"] for row in page.rows()] == everything[3:6]
    page.click("#page-first")
    wait_for(lambda: "before=" not in page.driver.current_url, message="page one again")
    assert [row["job"] for row in page.rows()] == everything[:3]


def test_job_page_shows_outputs_attempts_and_hides_env_values(page: Page, cluster: Jobs) -> None:
    tested = cluster.tested
    page.open(f"/ui/jobs/{tested['job_id']}")
    assert page.text("#job-command") == "make test"
    assert "48 passed" in page.text("#stdout")
    attempts = page.js(
        "return [...document.querySelectorAll('tr[data-attempt]')]"
        ".map(r => [...r.cells].slice(0, 4).map(c => c.innerText.trim()))"
    )
    first_node = tested["attempts"][0]["node_id"]
    assert attempts == [["1", first_node, "failed", "2"], ["2", tested["node_id"], "done", "0"]]
    assert first_node != tested["node_id"]  # the retry went elsewhere
    page.click("#attempt-1-output summary")
    assert "ConnectionReset" in page.text("#attempt-1-output")
    page.screenshot("ui-job")

    page.open(f"/ui/jobs/{cluster.trained['job_id']}")
    assert page.texts("table.env code:not(.env-value)") == ["DATASET", "API_TOKEN"]
    assert SECRET not in page.driver.page_source
    page.click("#env-show")
    wait_for(lambda: SECRET in page.texts("code.env-value"), message="the env values")
    assert "epoch 3 loss 0.38" in page.text("#stdout")


def test_cancel_a_pending_job(page: Page, cluster: Jobs, api: Api) -> None:
    job = api.submit(command="./cleanup.sh")
    page.open(f"/ui/jobs/{job['job_id']}")
    assert page.text("h1 .badge") == "pending"
    page.click(f"button[data-cancel='{job['job_id']}']")
    assert job["job_id"] in page.accept_confirm()
    wait_for(lambda: page.text("#notice") == "Job cancelled.", message="the cancel notice")
    assert page.words("h1") == f"{job['job_id']} cancelled"
    assert page.text(f"button[data-cancel='{job['job_id']}']") == ""  # nothing left to cancel
    assert (api.job(job["job_id"])["status"], api.job(job["job_id"])["reason"]) == (
        "failed",
        "cancelled",
    )
    assert not page.js("return document.querySelector('button[data-cancel]')")


def test_page_refreshes_itself(page: Page, cluster: Jobs, api: Api) -> None:
    job = api.submit(command="echo refreshed")
    page.open(f"/ui/jobs/{job['job_id']}")
    assert page.text("h1 .badge") == "pending"
    page.js("window.stillTheSamePage = true")
    _run(page.base_url, job, 0, stdout="refreshed!\n")
    wait_for(lambda: page.text("h1 .badge") == "done", timeout=20, message="an automatic refresh")
    assert page.text("#stdout").strip() == "refreshed!"
    assert page.js("return window.stillTheSamePage") is True  # updated in place, not reloaded
    assert page.text("#refresh-state") == "live"  # moved by the job's events


def test_overview_chart_shows_the_last_hour(page: Page, cluster: Jobs, api: Api) -> None:
    listed = api.jobs()
    counts = api.get("/health").json()["jobs"]
    # Everything here happened within the hour: every job was submitted in the window, every
    # failed attempt that was retried and every end falls inside it. The chart counts jobs by
    # how they ended, as the cards do (issue 36: "failed 13" counted attempts, the card 7).
    ended = [job.get("reason") for job in listed if job["status"] == "failed"]
    expected = {
        "submitted": str(len(listed)),
        "done": str(counts["done"]),
        "failed": str(sum(reason not in ("cancelled", "timeout") for reason in ended)),
        "cancelled": str(ended.count("cancelled")),
        "retried": str(sum(job["retry_count"] for job in listed)),
        "now": str(counts["pending"]),
    }

    def shown() -> dict[str, str]:
        page.open("/ui/")
        return page.js(
            "const rates = document.getElementById('chart-rates').dataset;"
            "const queue = document.getElementById('chart-queue').dataset;"
            "return {submitted: rates.submitted, done: rates.done, failed: rates.failed,"
            " cancelled: rates.cancelled, retried: rates.retried, now: queue.now}"
        )

    # The chart may be a few seconds old (it is recomputed as often as its cost allows).
    wait_for(lambda: shown() == expected, timeout=20, message=lambda: f"{shown()} == {expected}")
    lines = page.js(
        "return [...document.querySelectorAll('#chart-rates polyline')]"
        ".map(p => p.getAttribute('points').split(' ').length)"
    )
    assert lines == [60, 60, 60]
    assert page.js("return document.querySelectorAll('#chart-queue path').length") == 1
    minutes = page.js(
        "return [...document.querySelectorAll('#chart-rates rect.minute title')]"
        ".map(t => t.textContent)"
    )
    assert len(minutes) == 60
    assert re.fullmatch(MINUTE_LABEL, minutes[-1])
    # The card and the chart say the same of the last hour: every failure here is that recent.
    card = page.js("return document.querySelector('a.count-failed .number').innerText")
    assert card == expected["failed"]
    # Drawn on the server as plain shapes: nothing for the browser to fetch.
    assert not page.js("return document.querySelector('svg image, svg use, svg foreignObject')")


def test_nodes_page_shows_slots_load_and_jobs(page: Page, cluster: Jobs, api: Api) -> None:
    page.open("/ui/nodes")
    cards = page.js(
        "return Object.fromEntries([...document.querySelectorAll('.node-card')]"
        ".map(c => [c.dataset.node, {...c.dataset, health: c.querySelector('.badge').innerText}]))"
    )
    running = api.jobs(status="running")
    pending = api.jobs(status="pending")
    for node_id, card in cards.items():
        on_node = [job for job in running if job["node_id"] == node_id]
        assert card["slots"] == "1"  # MAX_JOBS_PER_NODE's default
        assert card["running"] == str(len(on_node))
        assert card["used"] == str(sum(job["job_type"] == "run" for job in on_node))
        assert card["pending"] == str(sum(job["node_id"] == node_id for job in pending))
        # The load placement compares: waiting run jobs + slots in use, per slot.
        waiting = [job for job in pending if job["node_id"] == node_id]
        assert card["queued"] == str(sum(job["job_type"] == "run" for job in waiting))
        load = (int(card["queued"]) + int(card["used"])) / int(card["slots"])
        shown = page.text(f".node-card[data-node='{node_id}'] .load")
        assert shown == f"{round(load * 100)} %"
    assert {node: card["health"] for node, card in cards.items()} == {
        "node-a": "healthy",
        "node-b": "healthy",
        "node-c": "healthy",
        "node-d": "unhealthy",
    }
    service_card = cards[cluster.service["node_id"]]
    assert int(service_card["running"]) > int(service_card["used"])  # a service takes no slot
    running_node = cluster.running["node_id"]
    assert cluster.running["job_id"] in page.text(f".node-card[data-node='{running_node}']")
    for job in cluster.pending:
        assert job["job_id"] in page.text(f".node-card[data-node='{job['node_id']}']")
    page.screenshot("ui-nodes")


def test_job_header_says_how_the_job_ended(page: Page, cluster: Jobs) -> None:
    page.open(f"/ui/jobs/{cluster.migrated['job_id']}")
    assert page.words("h1") == f"{cluster.migrated['job_id']} failed (exit 1)"
    page.open(f"/ui/jobs/{cluster.trained['job_id']}")
    assert page.words("h1") == f"{cluster.trained['job_id']} done"


def test_job_page_says_running_since_only_while_it_runs(page: Page, cluster: Jobs) -> None:
    page.open(f"/ui/jobs/{cluster.running['job_id']}")
    labels = page.texts(".facts dt")
    assert "Running since" in labels
    assert "Finished" not in labels
    page.open(f"/ui/jobs/{cluster.trained['job_id']}")
    labels = page.texts(".facts dt")
    assert "Running since" not in labels
    assert {"Started", "Finished"} <= set(labels)
    assert page.js("return document.querySelector('#job-started time') !== null")


# --- every page on a phone and on a desktop ----------------------------------------------------

MINUTE_LABEL = (
    r"\d\d:\d\d UTC: \d+ submitted, \d+ done, \d+ failed, \d+ cancelled, \d+ timed out,"
    r" \d+ retried, \d+ waiting"
)
"""A chart minute's numbers, as its tooltip and the readout give them."""

HEADER_CONTROLS = "header.bar a, #refresh-toggle"
"""What a person must be able to reach on every page: the header's links and Pause."""


PAGES = ("overview", "nodes", "node", "jobs", "job", "schedules", "schedule", "queues")
"""Every kind of page the dashboard has."""


@pytest.fixture(scope="module")
def a_schedule(scheduler: SchedulerProcess, jobs: Jobs) -> dict[str, Any]:
    """A schedule that has made a job (run now), for the schedules' pages."""
    api = Api(scheduler.url)
    body = {
        "name": "nightly-backup-of-the-warehouse",
        "cron": "0 3 * * *",
        "timezone": "Europe/Berlin",
        "job": {"command": "./backup.sh --all --compress --to s3://backups/warehouse/nightly"},
    }
    created = api.post("/schedules", body).json()
    assert api.post(f"/schedules/{created['schedule_id']}/run").status_code == 201
    api.close()
    return created


def page_path(name: str, cluster: Jobs, schedule: dict[str, Any]) -> str:
    paths = {
        "overview": "/ui/",
        "nodes": "/ui/nodes",
        "node": f"/ui/nodes/{cluster.running['node_id']}",
        "jobs": "/ui/jobs",
        "job": f"/ui/jobs/{cluster.tested['job_id']}",
        "schedules": "/ui/schedules",
        "schedule": f"/ui/schedules/{schedule['schedule_id']}",
        "queues": "/ui/queues",
    }
    return paths[name]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", PAGES)
def test_every_page_fits_the_screen(
    page: Page, cluster: Jobs, a_schedule: dict[str, Any], name: str, width: int
) -> None:
    page.set_width(width)
    page.open(page_path(name, cluster, a_schedule))
    assert page.js("return window.innerWidth") == width
    assert page.js("return document.documentElement.scrollWidth <= window.innerWidth"), (
        f"{name} is wider than {width} px"
    )
    # Nor does any part of it hide columns behind a sideways scroll of its own.
    assert page.sideways_scrollers() == [], f"{name} scrolls sideways inside at {width} px"
    assert page.off_screen(HEADER_CONTROLS) == []
    assert page.text("#refresh-toggle") in ("Pause", "Resume")
    if name == "overview":
        assert page.js("return document.querySelectorAll('.chart svg').length") == 2
    page.screenshot(f"ui-{name}-{width}", docs=f"{name}-{width}")


@pytest.mark.parametrize("width", WIDTHS)
def test_the_jobs_list_is_cards_on_a_phone_and_a_table_on_a_desktop(
    page: Page, cluster: Jobs, width: int
) -> None:
    page.set_width(width)
    page.open("/ui/jobs?limit=200")
    header = page.js("return getComputedStyle(document.querySelector('table.jobs thead')).display")
    assert (header == "none") is (width < 600)
    assert [row["job"] for row in page.rows()][-1:] == [cluster.trained["job_id"]]


def test_schedule_cards_keep_their_labels_on_a_phone(
    page: Page, a_schedule: dict[str, Any]
) -> None:
    page.set_width(400)
    page.open("/ui/schedules")
    row = f"tr[data-schedule='{a_schedule['schedule_id']}']"
    shown = page.js(
        "return [...document.querySelectorAll(arguments[0] + ' td')]"
        ".filter(td => td.dataset.label)"
        ".map(td => getComputedStyle(td, '::before').content + td.innerText)",
        row,
    )
    assert '"Cron "0 3 * * *' in shown
    assert '"Time zone "Europe/Berlin' in shown
    assert '"Overlap "skip' in shown
    assert len(shown) == 7  # every cell but the id and the name, which speak for themselves


def test_a_touch_screen_is_never_told_to_hover(page: Page, cluster: Jobs) -> None:
    page.set_width(400)
    page.driver.execute_cdp_cmd(
        "Emulation.setTouchEmulationEnabled", {"enabled": True, "maxTouchPoints": 1}
    )
    try:
        page.open("/ui/")
        assert page.js("return matchMedia('(hover: none)').matches")
        assert "hover" not in page.text("body").lower()
        assert "tap or point at a minute" in page.text("#activity-title")
        # A minute's numbers, which a mouse gets as a tooltip, come up on a tap.
        page.js(
            "const r = [...document.querySelectorAll('#chart-rates rect.minute')].at(-1);"
            "r.dispatchEvent(new MouseEvent('click', {bubbles: true}))"
        )
        assert re.fullmatch(MINUTE_LABEL, page.text("#chart-readout"))
    finally:
        page.driver.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": False})


def test_pause_works_on_a_phone(page: Page, cluster: Jobs) -> None:
    page.set_width(400)
    page.open("/ui/")
    assert page.text("#refresh-toggle") == "Pause"
    page.click("#refresh-toggle")
    try:
        assert page.text("#refresh-toggle") == "Resume"
        assert page.text("#refresh-state") == "auto-refresh paused"
    finally:
        page.click("#refresh-toggle")  # the choice is remembered: don't leave it paused
    assert page.text("#refresh-toggle") == "Pause"


# --- without a browser: what the pages refuse --------------------------------------------------


def test_cross_site_cancel_is_refused(scheduler: SchedulerProcess, api: Api) -> None:
    job = api.submit(command="./keep-me.sh")
    url = f"{scheduler.url}/ui/jobs/{job['job_id']}/cancel"
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "http://elsewhere.invalid"}):
        refused = requests.post(url, headers=headers, allow_redirects=False, timeout=10)
        assert refused.status_code == 403, headers
        assert api.job(job["job_id"])["status"] == "pending"
    same = {"Sec-Fetch-Site": "same-origin", "Origin": scheduler.url}
    done = requests.post(url, headers=same, allow_redirects=False, timeout=10)
    assert done.status_code == 303
    assert done.headers["Location"].endswith(f"/ui/jobs/{job['job_id']}?notice=cancelled")
    assert api.job(job["job_id"])["reason"] == "cancelled"


def test_pages_are_not_cached_framed_or_found_when_missing(scheduler: SchedulerProcess) -> None:
    missing = requests.get(f"{scheduler.url}/ui/jobs/job-987654", timeout=10)
    assert missing.status_code == 404
    assert missing.headers["Content-Type"].startswith("text/html")
    assert "There is no job job-987654." in missing.text
    overview = requests.get(f"{scheduler.url}/ui/", timeout=10)
    assert overview.headers["Cache-Control"] == "no-store"
    assert "frame-ancestors 'none'" in overview.headers["Content-Security-Policy"]


def test_overview_survives_a_registry_outage(
    scheduler: SchedulerProcess, registry: FakeRegistry, jobs: Jobs
) -> None:
    registry.fault = "error"

    def overview_after_the_fault() -> requests.Response | None:
        # A page asked while a fetch begun before the fault is still on its way shares that
        # fetch's answer (concurrent requests share one): the next page sees the fault.
        page = requests.get(f"{scheduler.url}/ui/", timeout=10)
        assert page.status_code == 200
        return page if "Registry: failed to reach registry." in page.text else None

    overview = wait_for(overview_after_the_fault, timeout=30, message="the page to see the fault")
    # Nodes with jobs are still listed, their health unknown rather than gone.
    node = jobs.running["node_id"]
    assert re.search(rf'data-node="{node}">.*?badge-unknown', overview.text, re.DOTALL)
