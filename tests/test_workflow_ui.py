"""The dashboard's workflow parts (issue 25), in process (Flask's test client on a real app
and store): the queues page with pause and resume, and the job page saying what a waiting job
waits for."""

from __future__ import annotations

import re

from conftest import AppFactory

SAME_SITE = {"Sec-Fetch-Site": "same-origin"}


def test_the_queues_page_lists_queues_and_pauses_and_resumes_them(
    make_app: AppFactory, node: str
) -> None:
    client = make_app().test_client()
    for _ in range(2):
        assert client.post("/jobs", json={"command": "true", "queue": "nightly"}).status_code == 201
    assert client.put("/queues/nightly", json={"max_running": 4}).status_code == 200
    page = client.get("/ui/queues").get_data(as_text=True)
    row = re.search(r'<tr id="queue-nightly".*?</tr>', page, re.S)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(0), re.S)
    assert cells[1:4] == ["2", "0", "4"]
    assert 'data-queue-action="pause"' in row.group(0)

    paused = client.post("/ui/queues/nightly", data={"paused": "1"}, headers=SAME_SITE)
    assert paused.status_code == 303
    assert client.get("/queues").get_json() == [
        {"queue": "nightly", "pending": 2, "running": 0, "max_running": 4, "paused": True}
    ]
    page = client.get("/ui/queues").get_data(as_text=True)
    assert 'data-queue="nightly" data-paused="yes"' in page
    assert 'data-queue-action="resume"' in page

    client.post("/ui/queues/nightly", data={"paused": "0"}, headers=SAME_SITE)
    assert client.get("/queues").get_json()[0]["paused"] is False


def test_a_pause_from_another_site_is_refused(make_app: AppFactory) -> None:
    client = make_app().test_client()
    refused = client.post(
        "/ui/queues/nightly", data={"paused": "1"}, headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert refused.status_code == 403
    assert client.get("/queues").get_json() == []


def test_the_job_page_says_what_a_waiting_job_waits_for(make_app: AppFactory, node: str) -> None:
    client = make_app().test_client()
    first = client.post("/jobs", json={"command": "true"}).get_json()
    then = client.post(
        "/jobs", json={"command": "true", "depends_on": [first["job_id"]], "queue": "q1"}
    ).get_json()
    page = client.get(f"/ui/jobs/{then['job_id']}").get_data(as_text=True)
    assert f'<dd id="job-waiting-for">dependencies: {first["job_id"]}</dd>' in page
    assert 'id="job-queue"' in page
    due = client.get(f"/ui/jobs/{first['job_id']}").get_data(as_text=True)
    assert "job-waiting-for" in due  # due, pending: waiting for its agent
    client.patch(f"/jobs/{first['job_id']}", json={"status": "running"})
    running = client.get(f"/ui/jobs/{first['job_id']}").get_data(as_text=True)
    assert "job-waiting-for" not in running
