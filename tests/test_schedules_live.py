"""Schedules against the real daemon under gunicorn: the /schedules API over HTTP, and firing
across stops, SIGKILLs and restarts on the same database.

A real daemon fires on the real clock, and a test cannot wait until 3 a.m.: the firing tests
stop the daemon, set a schedule's stored next fire time into the past (as if the daemon had
been down when it came), and start it again. Everything else is the daemon's own doing.
"""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import SchedulerFactory, stop_scheduler
from helpers import Agent, Api, expect_error, expect_json, wait_for

from tiny_scheduler.clock import SYSTEM
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.domain import jobs, schedules

MINUTE = 60_000_000
YEARLY = "0 0 1 1 *"  # after a fire, nothing more happens during a test


def schedule_body(**fields: Any) -> dict[str, Any]:
    return {"name": "nightly-backup", "cron": "0 3 * * *", "job": {"command": "backup"}, **fields}


def this_year_start() -> int:
    """00:00 UTC on the 1st of January of this year: a YEARLY fire time in the past."""
    year = time.gmtime().tm_year
    return jobs.parse_time(f"{year}-01-01T00:00:00Z")


def rewind(db_path: str, schedule_id: str, next_run_at: int, forget_last: bool = False) -> None:
    """Set a stopped daemon's stored next fire time, as if it had been down when it came;
    with `forget_last`, also lose the record of the last fire (a crash between a fire's job and
    the schedule's update, were they not one transaction)."""
    seq = schedules.parse_schedule_id(schedule_id)
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE schedules SET next_run_at = ? WHERE seq = ?", (next_run_at, seq))
        if forget_last:
            conn.execute(
                "UPDATE schedules SET last_run_at = NULL, last_job_seq = NULL WHERE seq = ?",
                (seq,),
            )
    conn.close()


def jobs_of(api: Api, schedule_id: str) -> list[dict[str, Any]]:
    return [job for job in api.jobs(limit=10000) if job.get("schedule_id") == schedule_id]


def metric(api: Api, name: str, labels: str = "") -> float:
    text = api.get("/metrics").text
    found = re.search(rf"^tiny_scheduler_{name}{re.escape(labels)} (\S+)$", text, re.M)
    assert found, (name, labels)
    return float(found.group(1))


def looked_at(api: Api, schedule_id: str, after: int) -> dict[str, Any] | None:
    """The schedule once the daemon has handled its due fire times (its next run is after
    `after`); None before."""
    schedule = expect_json(api.get(f"/schedules/{schedule_id}"), 200)
    next_run = schedule.get("next_run_at")
    return schedule if next_run and jobs.parse_time(next_run) > after else None


# --- the API over HTTP ------------------------------------------------------------------------


def test_create_read_list_change_and_delete(api: Api) -> None:
    created = expect_json(api.post("/schedules", schedule_body(timezone="Europe/Berlin")), 201)
    schedule_id = created["schedule_id"]
    assert list(created) == [
        *("schedule_id", "name", "cron", "timezone", "job", "overlap", "catch_up", "paused"),
        *("created_at", "next_run_at"),
    ]
    assert created["job"] == {"command": "backup", "job_type": "run"}
    assert (created["overlap"], created["catch_up"], created["paused"]) == ("skip", False, False)
    assert created["next_run_at"].endswith(("T01:00:00.000000Z", "T02:00:00.000000Z"))
    assert expect_json(api.get(f"/schedules/{schedule_id}"), 200) == created
    assert created in expect_json(api.get("/schedules"), 200)

    changed = expect_json(
        api.patch(f"/schedules/{schedule_id}", {"cron": "@hourly", "paused": True}), 200
    )
    assert (changed["cron"], changed["paused"]) == ("@hourly", True)
    assert "next_run_at" not in changed  # paused: it will not run
    resumed = expect_json(api.patch(f"/schedules/{schedule_id}", {"paused": False}), 200)
    assert resumed["next_run_at"].endswith(":00:00.000000Z")
    # A GET's object sent back as it is changes nothing.
    assert expect_json(api.patch(f"/schedules/{schedule_id}", resumed), 200) == resumed

    reply = api.request("DELETE", f"/schedules/{schedule_id}")
    assert (reply.status_code, reply.content) == (204, b"")
    expect_error(api.get(f"/schedules/{schedule_id}"), 404, "schedule not found")
    expect_error(api.request("DELETE", f"/schedules/{schedule_id}"), 404, "schedule not found")


def test_the_checks_and_their_texts(api: Api) -> None:
    expect_error(api.post("/schedules", b"[]"), 400, "failed to decode schedule")
    expect_error(api.post("/schedules", schedule_body(name="a b")), 400, schedules.NAME_MESSAGE)
    expect_error(
        api.post("/schedules", schedule_body(cron="@reboot")),
        400,
        "cron @reboot is not supported: use five fields or one of @hourly, @daily, @weekly,"
        " @monthly, @yearly",
    )
    expect_error(
        api.post("/schedules", schedule_body(job={"command": "x", "port": 0.5})),
        400,
        "port must be an integer between 1 and 65535",
    )
    expect_error(
        api.post(
            "/schedules", schedule_body(job={"command": "x", "delay_secs": 1, "not_before": 1})
        ),
        400,
        "use not_before or delay_secs, not both",
    )
    first = expect_json(api.post("/schedules", schedule_body(name="taken")), 201)
    expect_error(
        api.post("/schedules", schedule_body(name="taken")), 409, "schedule taken already exists"
    )
    other = expect_json(api.post("/schedules", schedule_body(name="other")), 201)
    expect_error(
        api.patch(f"/schedules/{other['schedule_id']}", {"name": "taken"}),
        409,
        "schedule taken already exists",
    )
    expect_error(
        api.patch(f"/schedules/{first['schedule_id']}", {"overlap": "x"}),
        400,
        schedules.OVERLAP_MESSAGE,
    )
    for unknown in ("sched-0", "sched-999999", "job-1", "7", "sched-01"):
        expect_error(api.get(f"/schedules/{unknown}"), 404, "schedule not found")
        expect_error(api.patch(f"/schedules/{unknown}", {}), 404, "schedule not found")


def test_every_schedule_route_needs_the_key(scheduler_factory: SchedulerFactory) -> None:
    proc = scheduler_factory({"TINYAWS_API_KEY": "sekrit"})
    with_key, without = Api(proc.url, key="sekrit"), Api(proc.url)
    try:
        schedule_id = expect_json(with_key.post("/schedules", schedule_body()), 201)["schedule_id"]
        for method, path in [
            ("POST", "/schedules"),
            ("GET", "/schedules"),
            ("GET", f"/schedules/{schedule_id}"),
            ("PATCH", f"/schedules/{schedule_id}"),
            ("DELETE", f"/schedules/{schedule_id}"),
        ]:
            reply = without.request(method, path, data=b'{"paused":true}')
            expect_error(reply, 401, "unauthorized")
        assert expect_json(with_key.get(f"/schedules/{schedule_id}"), 200)["paused"] is False
    finally:
        with_key.close()
        without.close()


# --- firing in the real daemon ------------------------------------------------------------------


def restart(
    scheduler_factory: SchedulerFactory, proc: SchedulerProcess, *rewinds: tuple[str, int, bool]
) -> SchedulerProcess:
    """Stop the daemon cleanly, rewind schedules in its file, start it again on that file."""
    stop_scheduler(proc)
    for schedule_id, next_run_at, forget_last in rewinds:
        rewind(proc.db_path, schedule_id, next_run_at, forget_last)
    return scheduler_factory(db_path=Path(proc.db_path))


def test_sigkill_right_after_a_fire_leaves_one_job_per_fire_time(
    scheduler_factory: SchedulerFactory,
) -> None:
    proc = scheduler_factory()
    api = Api(proc.url)
    body = schedule_body(cron=YEARLY, catch_up=True, overlap="allow")
    schedule_id = expect_json(api.post("/schedules", body), 201)["schedule_id"]
    api.close()
    fire_at = this_year_start()
    proc = restart(scheduler_factory, proc, (schedule_id, fire_at, False))
    api = Api(proc.url)
    (job,) = wait_for(lambda: jobs_of(api, schedule_id), message="the catch-up fire")
    api.close()
    proc.kill()  # right after the fire: the reply above was the first sign of it

    for forget_last in (False, True):
        # Back from the crash; the second time, as if the crash had also taken the schedule's
        # record of the fire (its cursor back at that fire time).
        if forget_last:
            stop_scheduler(proc)
            rewind(proc.db_path, schedule_id, fire_at, forget_last=True)
        proc = scheduler_factory(db_path=Path(proc.db_path))
        api = Api(proc.url)
        schedule = wait_for(lambda api=api: looked_at(api, schedule_id, fire_at), message="a look")
        assert [j["job_id"] for j in jobs_of(api, schedule_id)] == [job["job_id"]]
        assert schedule["last_job_id"] == job["job_id"]
        assert schedule["last_run_at"] == jobs.format_time(fire_at)
        api.close()


def test_overlap_skip_with_a_running_job(scheduler_factory: SchedulerFactory, node: str) -> None:
    proc = scheduler_factory()
    api = Api(proc.url)
    schedule_id = expect_json(
        api.post("/schedules", schedule_body(cron=YEARLY, catch_up=True)), 201
    )["schedule_id"]
    api.close()
    fire_at = this_year_start()
    proc = restart(scheduler_factory, proc, (schedule_id, fire_at, False))
    api, agent = Api(proc.url), Agent(proc.url, node)
    (job,) = wait_for(lambda: jobs_of(api, schedule_id), message="the first fire")
    assert agent.claim(job["job_id"]).status_code == 200
    api.close()
    agent.close()

    proc = restart(scheduler_factory, proc, (schedule_id, fire_at + MINUTE, False))
    api = Api(proc.url)
    try:
        schedule = wait_for(lambda: looked_at(api, schedule_id, fire_at + MINUTE), message="a look")
        assert [j["job_id"] for j in jobs_of(api, schedule_id)] == [job["job_id"]]
        assert api.job(job["job_id"])["status"] == "running"
        assert schedule["last_job_id"] == job["job_id"]
        assert metric(api, "schedule_skips_total", '{cause="overlap"}') == 1
        assert metric(api, "schedule_fires_total") == 0
        skipped = f"fire at {jobs.format_time(fire_at + MINUTE)} skipped: its previous job"
        wait_for(lambda: skipped in Path(proc.log_path or "").read_text(), message=skipped)
    finally:
        api.close()


@pytest.mark.timeout(240)  # it may wait most of a minute for a minute's start
def test_catch_up_after_a_ten_minute_stop(scheduler_factory: SchedulerFactory) -> None:
    proc = scheduler_factory()
    api = Api(proc.url)
    caught = expect_json(
        api.post("/schedules", schedule_body(name="caught", cron="* * * * *", catch_up=True)), 201
    )["schedule_id"]
    dropped = expect_json(
        api.post("/schedules", schedule_body(name="dropped", cron="* * * * *")), 201
    )["schedule_id"]
    api.close()
    # Restart early in a minute: a first look that fell past the next minute boundary would
    # find that minute's fire due (a regular fire, for both schedules), not missed. Within its
    # first 10 s, so that a restart slowed by a busy machine still has 50 s.
    wait_for(lambda: SYSTEM.now_us() % MINUTE < 10_000_000, timeout=70, message="a minute's start")
    # As if the daemon had stopped ten minutes ago: the next fire time it had then.
    stopped_at = SYSTEM.now_us() - 10 * MINUTE
    first_missed = (stopped_at // MINUTE + 1) * MINUTE
    proc = restart(
        scheduler_factory, proc, (caught, first_missed, False), (dropped, first_missed, False)
    )
    back_at = SYSTEM.now_us()
    api = Api(proc.url)
    try:
        done = wait_for(
            lambda: all(looked_at(api, s, back_at) for s in (caught, dropped)), message="looks"
        )
        assert done
        # The daemon's first look may fall just past a minute boundary after `back_at`: the
        # latest missed fire is then that minute, so it is bounded by when the looks were seen.
        looked_by = SYSTEM.now_us()
        (job,) = jobs_of(api, caught)
        schedule = expect_json(api.get(f"/schedules/{caught}"), 200)
        latest = jobs.parse_time(schedule["last_run_at"])
        assert schedule["last_job_id"] == job["job_id"]
        assert back_at - MINUTE < latest <= looked_by and latest % MINUTE == 0
        assert jobs_of(api, dropped) == []
        missed = (latest - first_missed) // MINUTE + 1  # every whole minute, 10 or 11 of them
        assert missed >= 10
        assert metric(api, "schedule_catch_ups_total") == 1
        assert metric(api, "schedule_skips_total", '{cause="missed"}') == 2 * missed - 1
        wait_for(
            lambda: Path(proc.log_path or "").read_text().count("(dropped): fire at") >= missed,
            message=f"{missed} lines of dropped fires",
        )
        assert Path(proc.log_path or "").read_text().count("(dropped): fire at") == missed
    finally:
        api.close()


def test_a_paused_schedule_does_not_fire(scheduler_factory: SchedulerFactory) -> None:
    proc = scheduler_factory()
    api = Api(proc.url)
    body = schedule_body(cron=YEARLY, catch_up=True)
    paused = expect_json(api.post("/schedules", {**body, "name": "p", "paused": True}), 201)
    running = expect_json(api.post("/schedules", {**body, "name": "r"}), 201)
    api.close()
    fire_at = this_year_start()
    proc = restart(
        scheduler_factory,
        proc,
        (paused["schedule_id"], fire_at, False),
        (running["schedule_id"], fire_at, False),
    )
    api = Api(proc.url)
    try:
        # The twin that is not paused fires at the first look; that look saw both.
        wait_for(lambda: jobs_of(api, running["schedule_id"]), message="the twin's fire")
        assert jobs_of(api, paused["schedule_id"]) == []
        still = expect_json(api.get(f"/schedules/{paused['schedule_id']}"), 200)
        assert still["paused"] is True and "next_run_at" not in still and "last_run_at" not in still
        resumed = expect_json(
            api.patch(f"/schedules/{paused['schedule_id']}", {"paused": False}), 200
        )
        assert jobs.parse_time(resumed["next_run_at"]) > SYSTEM.now_us()
        assert jobs_of(api, paused["schedule_id"]) == []
    finally:
        api.close()


def test_the_job_of_a_fire_is_a_job_like_any_other(
    scheduler_factory: SchedulerFactory, node: str
) -> None:
    proc = scheduler_factory()
    api = Api(proc.url)
    body = schedule_body(cron=YEARLY, catch_up=True, job={"command": "b", "env_vars": {"K": "v"}})
    schedule_id = expect_json(api.post("/schedules", body), 201)["schedule_id"]
    api.close()
    proc = restart(scheduler_factory, proc, (schedule_id, this_year_start(), False))
    api, agent = Api(proc.url), Agent(proc.url, node)
    try:
        (job,) = wait_for(lambda: jobs_of(api, schedule_id), message="the fire")
        assert job["status"] == "pending" and job["env_vars"] == {"K": "v"}
        assert [polled.job_id for polled in agent.poll()] == [job["job_id"]]
    finally:
        api.close()
        agent.close()
