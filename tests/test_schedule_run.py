"""POST /schedules/{id}/run against the real daemon: the schedule's job submitted once, now,
as a fire would submit it, each call a new job; the cron times are left alone."""

from __future__ import annotations

from helpers import Api, expect_error, expect_json

YEARLY = "0 0 1 1 *"  # no fire of its own during the test


def test_run_now_submits_the_schedules_job_each_time(api: Api, node: str) -> None:
    body = {
        "name": "run-now-report",
        "cron": YEARLY,
        "job": {"command": "./report.sh", "env_vars": {"PERIOD": "daily"}, "timeout_secs": 90},
    }
    created = expect_json(api.post("/schedules", body), 201)
    schedule_id = created["schedule_id"]

    first = expect_json(api.post(f"/schedules/{schedule_id}/run"), 201)
    second = expect_json(api.post(f"/schedules/{schedule_id}/run"), 201)

    assert first["job_id"] != second["job_id"]  # a fresh dedupe key each time
    for job in (first, second):
        assert (job["status"], job["schedule_id"], job["node_id"]) == ("pending", schedule_id, node)
        assert (job["command"], job["env_vars"], job["timeout_secs"]) == (
            "./report.sh",
            {"PERIOD": "daily"},
            90,
        )
    after = expect_json(api.get(f"/schedules/{schedule_id}"), 200)
    assert after["last_job_id"] == second["job_id"]  # overlap: skip waits for it
    assert after["next_run_at"] == created["next_run_at"]

    # A run now is an operator's decision: a paused schedule runs too.
    expect_json(api.patch(f"/schedules/{schedule_id}", {"paused": True}), 200)
    third = expect_json(api.post(f"/schedules/{schedule_id}/run"), 201)
    assert third["schedule_id"] == schedule_id


def test_run_now_of_an_unknown_schedule(api: Api) -> None:
    expect_error(api.post("/schedules/sched-987654/run"), 404, "schedule not found")
