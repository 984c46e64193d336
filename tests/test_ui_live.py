"""The dashboard kept current without reloading on a timer, in a real browser (headless
Chromium, as tests/test_ui_browser.py drives it) against a real scheduler: a running job's
output growing on its page as its agent sends it (skipped bytes marked), the lists following
the job events, and the fall back to reloading when the event stream is refused."""

from __future__ import annotations

from typing import Any

import test_ui_browser
from conftest import SchedulerFactory
from helpers import Agent, Api, wait_for
from test_ui_browser import Page

# The smallest cap the daemon takes: a test can overrun it with one append.
SCHEDULER_ENV = {"MAX_OUTPUT_BYTES": "256"}

# The browser fixtures of the dashboard's tests, for this module's own scheduler.
chromium = test_ui_browser.chromium
browser = test_ui_browser.browser
page = test_ui_browser.page


def running_job(api: Api, **fields: Any) -> tuple[dict[str, Any], Agent]:
    """A job claimed by its node's agent, and that agent (close it when done)."""
    job = api.submit(**fields)
    agent = Agent(api.base_url, job["node_id"])
    assert agent.claim(job["job_id"]).status_code == 200
    return job, agent


def send(api: Api, job_id: str, stdout: str = "", stderr: str = "") -> None:
    """What a job printed, as its agent sends it while the job runs."""
    reply = api.post(f"/jobs/{job_id}/output", {"stdout": stdout, "stderr": stderr})
    assert reply.status_code == 204, reply.text


def test_a_running_jobs_output_grows_on_its_page(page: Page, api: Api, node: str) -> None:
    job, agent = running_job(api, command="./train.sh")
    job_id = job["job_id"]
    try:
        page.open(f"/ui/jobs/{job_id}")
        page.js("window.stillTheSamePage = true")
        send(api, job_id, stdout="epoch 1\n")
        wait_for(lambda: page.text("#stdout") == "epoch 1\n", message="the first line")
        send(api, job_id, stdout="epoch 2\n", stderr="warning: slow disk\n")
        wait_for(lambda: page.text("#stdout") == "epoch 1\nepoch 2\n", message="the second")
        wait_for(lambda: page.text("#stderr") == "warning: slow disk\n", message="stderr")

        # The end: the page shows the final report's output and follows no more.
        assert agent.report(job_id, 0, "epoch 1\nepoch 2\ndone\n", "").status_code == 200
        wait_for(lambda: page.text("h1 .badge") == "done", message="the end")
        wait_for(lambda: page.text("#stdout") == "epoch 1\nepoch 2\ndone\n", message="final")
        assert not page.js("return document.querySelector('pre[data-stream]')")
        assert page.js("return window.stillTheSamePage") is True
    finally:
        agent.close()


def test_output_the_cap_dropped_is_marked(page: Page, api: Api, node: str) -> None:
    job, agent = running_job(api, command="./noisy.sh")
    job_id = job["job_id"]
    try:
        page.open(f"/ui/jobs/{job_id}")
        send(api, job_id, stdout="start\n")
        wait_for(lambda: page.text("#stdout") == "start\n", message="the first line")
        # 1000 bytes at once past a cap of 256: of the 1006 sent, the kept tail starts at byte
        # 750, and the page had read 6: 744 bytes were never seen.
        burst = "".join(f"{n:09d}\n" for n in range(100))
        send(api, job_id, stdout=burst)
        kept = burst[-256:]
        expected = f"start\n[… 744 bytes skipped …]\n{kept}"
        wait_for(
            lambda: page.text("#stdout") == expected,
            message=lambda: f"{page.text('#stdout')!r} == {expected!r}",
        )
        assert page.text("#stdout .skipped") == "[… 744 bytes skipped …]\n"
    finally:
        agent.close()


def test_the_jobs_list_follows_the_job_events(page: Page, api: Api, node: str) -> None:
    page.open(f"/ui/jobs?node_id={node}")
    wait_for(lambda: page.js("return window.tinyScheduler.mode") == "events", message="live")
    assert page.text("#refresh-state") == "live"
    page.js("window.stillTheSamePage = true")

    job = api.submit(command="./appears.sh")
    wait_for(lambda: [row["job"] for row in page.rows()] == [job["job_id"]], message="new row")
    agent = Agent(api.base_url, node)
    assert agent.claim(job["job_id"]).status_code == 200
    wait_for(lambda: page.rows()[0]["status"] == "running", message="the row's new status")
    assert agent.report(job["job_id"], 0, "", "").status_code == 200
    agent.close()
    wait_for(lambda: page.rows()[0]["status"] == "done", message="the row's end")

    assert page.js("return window.stillTheSamePage") is True  # updated in place
    assert page.js("return window.tinyScheduler.events") >= 3  # submitted, claimed, done
    # Driven by the events: in this mode the page does not reload on the short timer.
    assert page.js("return window.tinyScheduler.mode") == "events"


def test_a_jobs_page_leaves_other_jobs_events_alone(page: Page, api: Api, node: str) -> None:
    job = api.submit(command="./mine.sh")
    page.open(f"/ui/jobs/{job['job_id']}")
    wait_for(lambda: page.js("return window.tinyScheduler.mode") == "events", message="live")
    api.submit(command="./someone-elses.sh")
    # Read and let go: a busy cluster's events must not reload every open job page.
    wait_for(lambda: page.js("return window.tinyScheduler.ignored") >= 1, message="ignored")
    agent = Agent(api.base_url, node)
    assert agent.claim(job["job_id"]).status_code == 200
    agent.close()
    wait_for(lambda: page.text("h1 .badge") == "running", message="its own event")


def test_the_overview_follows_the_job_events(page: Page, api: Api, node: str) -> None:
    page.open("/ui/")
    wait_for(lambda: page.js("return window.tinyScheduler.mode") == "events", message="live")
    row = f"tr[data-node='{node}'] td.node-pending"
    job = api.submit(command="./shows-up.sh")
    wait_for(lambda: job["job_id"] in page.text(row), message="the job under its node")


def test_without_the_event_stream_the_page_reloads_on_the_timer(
    browser: Any, scheduler_factory: SchedulerFactory, node: str
) -> None:
    # MAX_WAITERS=0: every event stream is refused (503), as when the daemon is full.
    other = scheduler_factory(env={"MAX_WAITERS": "0"})
    view = Page(browser, other.url)
    api = Api(other.url)
    try:
        view.open(f"/ui/jobs?node_id={node}")
        wait_for(lambda: view.text("#refresh-state") == "auto-refresh every 5 s", message="timer")
        assert view.js("return window.tinyScheduler.mode") == "timer"
        job = api.submit(command="./found-by-the-timer.sh")
        wait_for(
            lambda: [row["job"] for row in view.rows()] == [job["job_id"]],
            timeout=20,
            message="the job, by a reload on the timer",
        )
        assert view.js("return window.tinyScheduler.events") == 0
    finally:
        api.close()
        browser.get("about:blank")  # before its scheduler stops
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        # The refused stream is the one error the console may show.
        assert all("/ui/events" in e["message"] for e in errors), errors


def test_a_broken_event_stream_falls_back_to_the_timer(
    browser: Any, scheduler_factory: SchedulerFactory, node: str
) -> None:
    other = scheduler_factory()
    view = Page(browser, other.url)
    try:
        view.open(f"/ui/jobs?node_id={node}")
        wait_for(lambda: view.js("return window.tinyScheduler.mode") == "events", message="live")
        other.stop()  # the stream breaks, as when the daemon restarts
        wait_for(lambda: view.js("return window.tinyScheduler.mode") == "timer", message="timer")
        other.start(timeout=30)
        api = Api(other.url)
        job = api.submit(command="./found-after-the-restart.sh")
        api.close()
        wait_for(
            lambda: [row["job"] for row in view.rows()] == [job["job_id"]],
            timeout=20,
            message="the job, by a reload on the timer",
        )
        assert view.text("#refresh-state") == "auto-refresh every 5 s"
    finally:
        browser.get("about:blank")  # before its scheduler stops
        browser.get_log("browser")  # the refused reloads while it was down


def test_the_live_feeds_work_with_the_dashboards_key(
    browser: Any, scheduler_factory: SchedulerFactory, node: str
) -> None:
    # With a key, the browser logs in to /ui/ (HTTP Basic) and sends nothing to /events or
    # /jobs/…/output: the feeds must come from under /ui/ for the page to get them.
    key = "dashboard-key-0451"
    other = scheduler_factory(env={"TINYAWS_API_KEY": key})
    view = Page(browser, other.url.replace("http://", f"http://operator:{key}@"))
    api = Api(other.url, key=key)
    job, agent = running_job(api, command="./with-a-key.sh")
    try:
        view.open(f"/ui/jobs/{job['job_id']}")
        wait_for(lambda: view.js("return window.tinyScheduler.mode") == "events", message="live")
        send(api, job["job_id"], stdout="behind a key\n")
        wait_for(lambda: view.text("#stdout") == "behind a key\n", message="the output")
        assert agent.report(job["job_id"], 0, "behind a key\n", "").status_code == 200
        wait_for(lambda: view.text("h1 .badge") == "done", message="the end, from an event")
    finally:
        agent.close()
        api.close()
        browser.get("about:blank")  # before its scheduler stops
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors


def test_a_503_with_retry_after_holds_the_reloads_until_then(
    browser: Any, scheduler_factory: SchedulerFactory, node: str
) -> None:
    """The scheduler answers a reload `503 too many connections` with `Retry-After`: the page
    says so and asks nothing more until then (a crowd of open dashboards must not come back
    every 5 s). The 503 is the page's own fetch, answered in the browser (as a full daemon
    would answer it), so that nothing else is refused meanwhile."""
    other = scheduler_factory(env={"MAX_WAITERS": "0"})  # no stream: reloads on the timer
    view = Page(browser, other.url)
    try:
        view.open(f"/ui/jobs?node_id={node}")
        wait_for(lambda: view.js("return window.tinyScheduler.mode") == "timer", message="timer")
        view.js(
            "window.refusals = 0;"
            "window.fetch = function () {"
            "  window.refusals += 1;"
            "  return Promise.resolve(new Response('too many connections\\n',"
            "    {status: 503, headers: {'Retry-After': '3600'}}));"
            "};"
        )
        wait_for(lambda: view.js("return window.refusals") == 1, timeout=20, message="a reload")
        wait_for(
            lambda: view.text("#refresh-state").startswith("the scheduler is busy; next look in"),
            message="the page to say it waits",
        )
        held = view.js("return window.tinyScheduler.heldUntil - Date.now()")
        assert 3_595_000 <= held <= 5_400_000  # an hour, up to half as much again
        ticks = view.js("return window.tinyScheduler.ticks")
        wait_for(
            lambda: view.js("return window.tinyScheduler.ticks") >= ticks + 2,
            timeout=20,
            message="two more ticks of the timer",
        )
        assert view.js("return window.refusals") == 1  # held: no reload meanwhile
    finally:
        browser.get("about:blank")  # before its scheduler stops
