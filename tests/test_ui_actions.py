"""The dashboard's buttons in a real browser (headless Chromium, as tests/test_ui_browser.py
drives it) against a real scheduler: stopping a running job, retrying a finished one as a new
job, draining a node, and a schedule's pause, resume, run now and delete. Each is checked on
the page and through the API, which is what the button must have changed."""

from __future__ import annotations

from typing import Any

import pytest
import test_ui_browser
from helpers import Agent, Api, expect_json, wait_for
from test_ui_browser import Page

from tiny_scheduler.dev.registry import FakeRegistry

# The browser fixtures of the dashboard's tests, for this module's own scheduler.
chromium = test_ui_browser.chromium
browser = test_ui_browser.browser
page = test_ui_browser.page


def claimed(api: Api, **fields: Any) -> dict[str, Any]:
    """A job submitted and claimed by its node's agent: running."""
    job = api.submit(**fields)
    agent = Agent(api.base_url, job["node_id"])
    assert agent.claim(job["job_id"]).status_code == 200
    agent.close()
    return api.job(job["job_id"])


def test_stop_a_running_job(page: Page, api: Api, node: str) -> None:
    job = claimed(api, command="sleep 3600")
    job_id = job["job_id"]
    page.open(f"/ui/jobs/{job_id}")
    assert page.text(f"button[data-cancel='{job_id}']") == "Stop"
    page.click(f"button[data-cancel='{job_id}']")
    question = page.accept_confirm()
    assert question == f"Stop {job_id}? Its process on {node} will be ended."
    wait_for(lambda: page.text("#notice").startswith("Job stopped"), message="the notice")
    assert page.words("h1") == f"{job_id} cancelled"
    ended = api.job(job_id)
    assert (ended["status"], ended["reason"]) == ("failed", "cancelled")
    # The node's agent hears of it at its next heartbeat.
    beat = api.request("PUT", f"/nodes/{node}", json={"cpu_count": 1, "running": [job_id]})
    assert expect_json(beat, 200)["stop"] == [job_id]


def test_the_jobs_list_says_stop_for_running_and_cancel_for_waiting(
    page: Page, api: Api, node: str
) -> None:
    running = claimed(api, command="sleep 3600")
    waiting = api.submit(command="./later.sh")
    page.open(f"/ui/jobs?node_id={node}")
    buttons = page.js(
        "return Object.fromEntries([...document.querySelectorAll('button[data-cancel]')]"
        ".map(b => [b.dataset.cancel, b.innerText]))"
    )
    assert buttons == {running["job_id"]: "Stop", waiting["job_id"]: "Cancel"}


def test_stop_of_a_job_that_ended_meanwhile_is_refused(page: Page, api: Api, node: str) -> None:
    job = claimed(api, command="./quick.sh")
    job_id = job["job_id"]
    page.open(f"/ui/jobs/{job_id}")
    page.click("#refresh-toggle")  # hold the page still: the job must end behind its back
    try:
        assert page.text("#refresh-toggle") == "Resume"
        agent = Agent(page.base_url, node)
        assert agent.report(job_id, 0, "ok\n", "").status_code == 200
        agent.close()
        page.click(f"button[data-cancel='{job_id}']")
        page.accept_confirm()
        wait_for(lambda: page.text("#notice"), message="the refusal notice")
        assert page.text("#notice") == "It had already ended: nothing to cancel. This job is done."
        assert api.job(job_id)["status"] == "done"
    finally:
        if page.text("#refresh-toggle") == "Resume":
            page.click("#refresh-toggle")  # the choice is remembered: don't leave it paused


def test_retry_a_finished_job_as_a_new_job(page: Page, api: Api, node: str) -> None:
    job = claimed(api, command="./flaky.sh --once", env_vars={"MODE": "strict"}, timeout_secs=42)
    agent = Agent(api.base_url, node)
    assert agent.report(job["job_id"], 3, "", "flaked\n").status_code == 200
    assert agent.claim(job["job_id"]).status_code == 200  # its one retry (MAX_JOB_RETRIES)
    assert agent.report(job["job_id"], 3, "", "flaked again\n").status_code == 200
    agent.close()
    page.open(f"/ui/jobs/{job['job_id']}")
    assert page.words("h1") == f"{job['job_id']} failed (exit 3)"
    page.click("#retry")
    assert job["job_id"] in page.accept_confirm()
    wait_for(lambda: page.text("#notice-from") == job["job_id"], message="the new job's page")
    new_id = page.driver.current_url.split("/ui/jobs/")[1].split("?")[0]
    assert new_id != job["job_id"]
    new = api.job(new_id)
    assert (new["status"], new["command"], new["env_vars"], new["timeout_secs"]) == (
        "pending",
        "./flaky.sh --once",
        {"MODE": "strict"},
        42,
    )
    assert page.words("h1") == f"{new_id} pending"
    assert not page.js("return document.getElementById('retry')")  # not before it ends


def test_drain_and_undrain_a_node(page: Page, api: Api, registry: FakeRegistry) -> None:
    node, other = "node-drain-me", "node-stays"
    registry.set_node(node, status="healthy")
    registry.set_node(other, status="healthy")
    waiting = [api.submit(command=f"./step.sh {n}") for n in range(4)]
    on_node = [job["job_id"] for job in waiting if job["node_id"] == node]
    assert on_node  # placement spreads them over both
    page.open(f"/ui/nodes/{node}")
    assert page.text("#node-drain") == "Drain"
    page.click("#node-drain")
    assert "its waiting jobs go to other nodes" in page.accept_confirm()
    wait_for(lambda: page.text("#notice").startswith("Node drained"), message="the notice")
    assert page.text("#node-draining") == "draining"
    assert expect_json(api.get(f"/nodes/{node}"), 200)["drain"] is True
    assert {api.job(job_id)["node_id"] for job_id in on_node} == {other}

    page.click("#node-drain")
    assert page.accept_confirm().startswith(f"Undrain {node}?")
    wait_for(lambda: page.text("#notice").startswith("Node undrained"), message="the notice")
    assert expect_json(api.get(f"/nodes/{node}"), 200)["drain"] is False
    assert page.text("#node-drain") == "Drain"


def test_nodes_page_shows_what_the_agents_say(page: Page, api: Api, registry: FakeRegistry) -> None:
    node = "node-with-agent"
    registry.set_node(node, status="healthy")
    beat = {
        "cpu_count": 4,
        "running": [],
        "version": "tiny-scheduler-agent 9.9",
        "labels": {"rack": "r7"},
    }
    expect_json(api.request("PUT", f"/nodes/{node}", json=beat), 200)
    expect_json(api.patch(f"/nodes/{node}", {"drain": True}), 200)
    try:
        page.open("/ui/nodes")
        card = f".node-card[data-node='{node}']"
        facts = page.js(
            "return Object.fromEntries([...document.querySelectorAll(arguments[0] + ' dt')]"
            ".map(dt => [dt.innerText, dt.nextElementSibling.innerText]))",
            card,
        )
        assert facts["Source"] == "registry"
        assert facts["Drain"] == "draining"
        assert facts["Agent"] == "tiny-scheduler-agent 9.9 · 4 CPUs"
        assert facts["Labels"] == "rack=r7"
        assert facts["Heartbeat"] in ("just now", *(f"{n} s ago" for n in range(1, 60)))
        page.click(f"{card} a.node-name")
        wait_for(lambda: page.driver.current_url.endswith(f"/ui/nodes/{node}"), message="its page")
        assert page.text("#node-drain") == "Undrain"
        facts = page.js(
            "return Object.fromEntries([...document.querySelectorAll('.node-facts dt')]"
            ".map(dt => [dt.innerText, dt.nextElementSibling.innerText]))"
        )
        assert facts["Agent"] == "tiny-scheduler-agent 9.9 · 4 CPUs"
        assert (facts["Running"], facts["Pending"], facts["Drain"]) == ("0", "0", "draining")
        assert facts["Slots"] == "0 of 1 in use · load 0 %"
    finally:
        expect_json(api.patch(f"/nodes/{node}", {"drain": False}), 200)


@pytest.fixture
def schedule(api: Api, node: str) -> dict[str, Any]:
    body = {"name": f"report-{node}", "cron": "0 0 1 1 *", "job": {"command": "./report.sh"}}
    return expect_json(api.post("/schedules", body), 201)


def test_a_schedules_page_pauses_resumes_runs_and_deletes_it(
    page: Page, api: Api, schedule: dict[str, Any]
) -> None:
    schedule_id = schedule["schedule_id"]
    page.open("/ui/schedules")
    page.click(f"tr[data-schedule='{schedule_id}'] td.cell-name a")
    wait_for(lambda: page.driver.current_url.endswith(f"/ui/schedules/{schedule_id}"), message="it")
    assert page.text("#schedule-command") == "./report.sh"

    def act(button: str, notice: str) -> str:
        page.click(f"#schedule-{button}")
        question = page.accept_confirm()
        wait_for(lambda: page.text("#notice").startswith(notice), message=f"{button}'s notice")
        return question

    assert act("pause", "Schedule paused") == f"Pause {schedule['name']}?"
    assert expect_json(api.get(f"/schedules/{schedule_id}"), 200)["paused"] is True
    assert page.text("#schedule-paused") == "paused"
    act("resume", "Schedule resumed")
    assert expect_json(api.get(f"/schedules/{schedule_id}"), 200)["paused"] is False

    act("run", "Schedule run now")
    job_id = page.text("#notice-job")
    job = api.job(job_id)
    assert (job["schedule_id"], job["command"]) == (schedule_id, "./report.sh")
    assert page.js(
        "return [...document.querySelectorAll('tr[data-job]')].map(r => r.dataset.job)"
    ) == [job_id]
    assert job_id in page.text("#schedule-last-job")

    assert "The jobs it made stay." in act("delete", "Deleted schedule")
    assert page.driver.current_url.split("?")[0].endswith("/ui/schedules")
    assert page.text("#notice") == f"Deleted schedule {schedule_id}; the jobs it made stay."
    assert api.get(f"/schedules/{schedule_id}").status_code == 404
    assert api.job(job_id)["schedule_id"] == schedule_id


def test_a_job_links_to_its_schedule_and_node(
    page: Page, api: Api, schedule: dict[str, Any], node: str
) -> None:
    job = expect_json(api.post(f"/schedules/{schedule['schedule_id']}/run"), 201)
    page.open(f"/ui/jobs/{job['job_id']}")
    page.click("#job-schedule")
    wait_for(lambda: "/ui/schedules/" in page.driver.current_url, message="the schedule's page")
    assert page.words("h1").startswith(schedule["name"])
    page.open(f"/ui/jobs/{job['job_id']}")
    page.click("#job-node")
    wait_for(lambda: page.driver.current_url.endswith(f"/ui/nodes/{node}"), message="the node")


def test_actions_sent_from_another_site_are_refused(
    api: Api, node: str, schedule: dict[str, Any]
) -> None:
    # No browser: a form on another site posting to each button's address, as a browser
    # would send it (with the operator's saved credentials, were a key set).
    done = claimed(api, command="./finished.sh")
    agent = Agent(api.base_url, node)
    assert agent.report(done["job_id"], 0, "", "").status_code == 200
    agent.close()
    schedule_id = schedule["schedule_id"]
    posts = {
        f"/ui/jobs/{done['job_id']}/retry": {},
        f"/ui/nodes/{node}/drain": {"drain": "1"},
        f"/ui/schedules/{schedule_id}/pause": {},
        f"/ui/schedules/{schedule_id}/run": {},
        f"/ui/schedules/{schedule_id}/delete": {},
    }
    before = len(api.jobs())
    for path, form in posts.items():
        refused = api.request(
            "POST",
            path,
            data=form,
            headers={"Sec-Fetch-Site": "cross-site"},
            allow_redirects=False,
        )
        assert refused.status_code == 403, path
    assert len(api.jobs()) == before  # no retry, no run now
    assert expect_json(api.get(f"/nodes/{node}"), 200)["drain"] is False
    assert expect_json(api.get(f"/schedules/{schedule_id}"), 200)["paused"] is False
