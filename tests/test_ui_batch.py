"""The dashboard's batch comforts and the gaps a newcomer hit (issue 36), in headless Chromium
against a real scheduler: Hold, Release and Retry on the job page and on each row of the jobs
list; an array as one row with a summary of its jobs, and its own page by index; the list
searchable, newest first and paged; a node id that never wraps; a title on every list page;
"live" on every page that follows the job events, and a tab in the background letting its
stream go; the output's first line inside its box, off the top edge; the retries a job gets,
with the scheduler's own number; a job's name in the list; cancelled and timed-out jobs read
as such on the schedule pages, the overview's recent failures and the job's attempts."""

from __future__ import annotations

from typing import Any

import pytest
import test_ui_browser
from helpers import Agent, Api, expect_json, wait_for
from selenium.webdriver.common.by import By
from test_ui_browser import Page

chromium = test_ui_browser.chromium
browser = test_ui_browser.browser
page = test_ui_browser.page

# MAX_JOB_RETRIES not at its default of 1, so a number the job page shows is the daemon's own.
SCHEDULER_ENV = {"MAX_JOB_RETRIES": "3"}


def rows(page: Page) -> list[dict[str, Any]]:
    return page.rows()


def test_hold_and_release_on_the_job_page_and_in_the_list(page: Page, api: Api, node: str) -> None:
    job = api.submit(command="./later.sh", name="nightly-backup")
    job_id = job["job_id"]
    page.open(f"/ui/jobs/{job_id}")
    assert page.text("#job-name") == "nightly-backup"
    page.click(f"button[data-hold='{job_id}']")
    wait_for(lambda: page.text("#notice").startswith("Job held"), message="the hold notice")
    assert page.words("h1") == f"{job_id} pending held nightly-backup"
    assert page.text("#job-waiting-for") == "held"
    assert page.text(f"button[data-hold='{job_id}']") == "Release"
    assert api.job(job_id)["held"] is True

    page.open(f"/ui/jobs?node_id={node}")
    assert [row.get("held") for row in rows(page)] == ["yes"]
    page.click(f"button[data-hold='{job_id}']")
    # Back on the list it was pressed on, the job released.
    wait_for(lambda: rows(page) and "held" not in rows(page)[0], message="the released row")
    assert page.driver.current_url.endswith(f"/ui/jobs?node_id={node}")
    assert "held" not in api.job(job_id)
    assert page.text(f"button[data-hold='{job_id}']") == "Hold"


def test_retry_a_finished_job_from_the_list(page: Page, api: Api, node: str) -> None:
    job = api.submit(command="./flaky.sh", name="flaky")
    assert api.post(f"/jobs/{job['job_id']}/cancel").status_code == 200
    page.open(f"/ui/jobs?node_id={node}")
    assert [row["state"] for row in rows(page)] == ["cancelled"]
    page.click(f"button[data-retry='{job['job_id']}']")
    assert job["job_id"] in page.accept_confirm()
    wait_for(lambda: page.text("#notice-from") == job["job_id"], message="the new job's page")
    new_id = page.driver.current_url.split("/ui/jobs/")[1].split("?")[0]
    assert api.job(new_id)["retry_of"] == job["job_id"]
    assert page.text("#job-retry-of") == job["job_id"]
    assert page.text("#job-name") == "flaky"


def test_an_array_is_one_row_with_a_summary_and_a_page_of_its_own(
    page: Page, api: Api, node: str
) -> None:
    first = api.submit(command="./sweep.sh $TINY_ARRAY_INDEX", array=5, name="sweep")
    number = int(first["job_id"].removeprefix("job-"))
    ids = [f"job-{number + i}" for i in range(5)]
    agent = Agent(api.base_url, node)
    assert agent.claim(ids[1]).status_code == 200
    assert agent.report(ids[1], 0).status_code == 200
    assert api.post(f"/jobs/{ids[2]}/cancel").status_code == 200
    agent.close()
    single = api.submit(command="./after.sh")

    page.open(f"/ui/jobs?node_id={node}")
    listed = rows(page)
    assert [(row["job"], row.get("array"), row.get("size")) for row in listed] == [
        (single["job_id"], None, None),
        (ids[4], first["job_id"], "5"),
    ]
    summary = page.words(f"tr[data-array='{first['job_id']}'] .cell-array-states")
    assert summary == "pending 3 done 1 cancelled 1"
    page.click(f"tr[data-array='{first['job_id']}'] .cell-actions a")
    wait_for(lambda: f"array_id={first['job_id']}" in page.driver.current_url, message="its page")
    assert [row["job"] for row in rows(page)] == ids  # by index
    assert page.words("h1") == f"Array {first['job_id']} sweep"
    assert page.words("#array-summary").startswith(
        "5 jobs, by index: 3 pending, 1 done, 1 cancelled."
    )
    page.open(f"/ui/jobs/{ids[3]}")
    assert page.words("#job-array").startswith(f"{first['job_id']} index 3 of 5")


def test_the_jobs_list_is_searched_newest_first_and_paged(page: Page, api: Api, node: str) -> None:
    made = [api.submit(command=f"./step.sh {n}", name=f"step-{n}") for n in range(30)]
    newest = [job["job_id"] for job in made][::-1]
    page.open(f"/ui/jobs?node_id={node}")
    assert [row["job"] for row in rows(page)] == newest[:25]  # a page, newest first
    page.click("#page-next")
    wait_for(lambda: "before=" in page.driver.current_url, message="the older page")
    assert [row["job"] for row in rows(page)] == newest[25:]
    assert not page.js("return document.getElementById('page-next')")

    page.open("/ui/jobs")
    box = page.driver.find_element(By.ID, "filter-q")
    box.send_keys("step-17")
    page.click("#filter-apply")
    wait_for(lambda: "q=step-17" in page.driver.current_url, message="the search")
    assert [row["job"] for row in rows(page)] == [made[17]["job_id"]]
    page.open(f"/ui/jobs?q={made[3]['job_id']}")
    assert [row["job"] for row in rows(page)] == [made[3]["job_id"]]
    page.open("/ui/jobs?q=STEP.SH+7")  # words of the command, whatever their case
    assert [row["job"] for row in rows(page)] == [made[7]["job_id"]]


def test_a_node_id_never_wraps_in_the_jobs_list(page: Page, api: Api, node: str) -> None:
    api.submit(command="x " * 200)  # a long command takes the room it can
    page.set_width(1400)
    page.open(f"/ui/jobs?node_id={node}")
    lines = page.js(
        "const td = document.querySelector('tr[data-job] td[data-label=Node]');"
        "const range = document.createRange(); range.selectNodeContents(td);"
        "return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size"
    )
    assert lines == 1, "the node id is broken over lines"


@pytest.mark.parametrize(
    ("path", "title"),
    [("/ui/jobs", "Jobs"), ("/ui/queues", "Queues"), ("/ui/schedules", "Schedules")],
)
def test_every_list_page_has_its_title(page: Page, path: str, title: str) -> None:
    page.open(path)
    assert page.words(".page h1").startswith(title)


@pytest.mark.parametrize("path", ["/ui/", "/ui/jobs", "/ui/jobs?status=failed", "/ui/queues"])
def test_every_page_that_follows_job_events_says_live(page: Page, path: str) -> None:
    page.open(path)
    wait_for(lambda: page.text("#refresh-state") == "live", message=f"{path} live")
    assert page.js("return window.tinyScheduler.mode") == "events"


def test_a_tab_in_the_background_lets_its_stream_go_and_takes_it_back(
    page: Page, api: Api, node: str
) -> None:
    page.open(f"/ui/jobs?node_id={node}")
    wait_for(lambda: page.js("return window.tinyScheduler.mode") == "events", message="live")

    def visible(shown: bool) -> None:
        page.js(
            "Object.defineProperty(document, 'hidden', {value: !arguments[0], configurable: true});"
            "document.dispatchEvent(new Event('visibilitychange'))",
            shown,
        )

    visible(False)
    assert page.js("return window.tinyScheduler.mode") == "hidden"
    job = api.submit(command="./while-hidden.sh")
    visible(True)
    wait_for(lambda: page.text("#refresh-state") == "live", message="live again")
    # What happened while it was hidden is on the page once it is shown.
    wait_for(lambda: [row["job"] for row in rows(page)] == [job["job_id"]], message="the job")


def test_the_first_output_line_is_inside_its_box(page: Page, api: Api, node: str) -> None:
    job = api.submit(command="./print.sh")
    agent = Agent(api.base_url, node)
    assert agent.claim(job["job_id"]).status_code == 200
    assert agent.report(job["job_id"], 0, "first line\nsecond line\n").status_code == 200
    agent.close()
    page.open(f"/ui/jobs/{job['job_id']}")
    gap = page.js(
        "const pre = document.getElementById('stdout');"
        "const range = document.createRange(); range.selectNodeContents(pre);"
        "return range.getClientRects()[0].top - pre.getBoundingClientRect().top"
    )
    assert gap >= 8, f"the first line is {gap} px from the box's top edge"


def time_out(api: Api, node: str, job_id: str) -> None:
    """The job ends as its agent reports a timeout (the agent stops a job at its
    `timeout_secs`): `failed` on the wire, with reason `timeout`."""
    agent = Agent(api.base_url, node)
    assert agent.claim(job_id).status_code == 200
    report = {"status": "failed", "exit_code": -1, "stdout": "", "stderr": "", "reason": "timeout"}
    assert agent.api.patch(f"/jobs/{job_id}", report).status_code == 200
    agent.close()
    ended = api.job(job_id)
    assert (ended["status"], ended["reason"]) == ("failed", "timeout")


def test_the_job_page_says_how_many_retries_a_job_gets(page: Page, api: Api, node: str) -> None:
    plain = api.submit(command="./flaky.sh")
    own = api.submit(command="./once.sh", max_retries=0)
    page.open(f"/ui/jobs/{plain['job_id']}")
    assert page.words("#job-retries") == "up to 3 (the scheduler's MAX_JOB_RETRIES)"
    page.open(f"/ui/jobs/{own['job_id']}")
    assert page.words("#job-retries") == "up to 0 (its own)"


def test_the_jobs_list_shows_each_job_s_name(page: Page, api: Api, node: str) -> None:
    # A name of this test's own: the module's scheduler holds other tests' jobs, and the
    # name's link lists every job of that name.
    name = f"list-names-{node}"
    named = api.submit(command="./backup.sh", name=name)
    unnamed = api.submit(command="./other.sh")
    page.open(f"/ui/jobs?node_id={node}")
    assert page.text(f"tr[data-job='{named['job_id']}'] td.cell-name") == name
    assert page.text(f"tr[data-job='{unnamed['job_id']}'] td.cell-name") == "\u2013"  # a dash
    page.click(f"tr[data-job='{named['job_id']}'] td.cell-name a")
    wait_for(lambda: f"name={name}" in page.driver.current_url, message="by its name")
    assert [row["job"] for row in rows(page)] == [named["job_id"]]


def test_a_schedule_s_jobs_read_cancelled_and_timed_out_as_such(
    page: Page, api: Api, node: str
) -> None:
    body = {"name": f"nightly-{node}", "cron": "0 0 1 1 *", "job": {"command": "./report.sh"}}
    schedule_id = expect_json(api.post("/schedules", body), 201)["schedule_id"]

    def run() -> str:
        return str(expect_json(api.post(f"/schedules/{schedule_id}/run"), 201)["job_id"])

    cancelled = run()
    assert api.post(f"/jobs/{cancelled}/cancel").status_code == 200
    timed = run()
    time_out(api, node, timed)

    page.open(f"/ui/schedules/{schedule_id}")
    states = {job: page.words(f"tr[data-job='{job}'] td.cell-status") for job in (cancelled, timed)}
    assert states == {cancelled: "cancelled", timed: "timed out"}
    assert page.words("#schedule-last-job") == f"{timed} timed out"
    page.open("/ui/schedules")
    assert page.words(f"tr[data-schedule='{schedule_id}'] td.last-job") == f"{timed} timed out"
    page.open(f"/ui/jobs/{cancelled}")
    assert page.words("tr[data-attempt='1'] td:nth-child(3)") == "cancelled"


def test_a_timed_out_job_reads_as_such_in_recent_failures_and_its_attempts(
    page: Page, api: Api, node: str
) -> None:
    job_id = api.submit(command="./slow.sh", timeout_secs=5)["job_id"]
    time_out(api, node, job_id)
    page.open("/ui/")
    assert page.words(f"tr[data-failure='{job_id}'] td:last-child") == "timed out"
    page.open(f"/ui/jobs/{job_id}")
    assert page.words("tr[data-attempt='1'] td:nth-child(3)") == "timed out"
