"""The firing logic with a clock the test controls: the real app (service, store on a real
SQLite file, the real registry client against the loopback registry), its own schedules loop
object, and a clock that is set, not waited for. Nothing here sleeps until 3 a.m.

What is checked: a fire is a submission exactly like POST /jobs with `schedule_id`; one job per
fire time, also when a crash took the schedule's update after its job was committed; a fire
that finds no node is tried again until the next fire time, then skipped with its cause and
logged; overlap, catch-up and pause; the metrics of fires and skips.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import set_nodes
from prometheus_client import generate_latest

from tiny_scheduler import Settings, create_app, jobs, schedules, stop_background, validation
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.loops.schedules import ScheduleFiring
from tiny_scheduler.metrics import metrics_of
from tiny_scheduler.schedules import ScheduleChange
from tiny_scheduler.service import Scheduler

MINUTE = 60_000_000


def us(text: str) -> int:
    value = validation.parse_rfc3339(text)
    assert value is not None
    return value


class Clock:
    """The time the loop is told; moved by the test only."""

    def __init__(self, start: str) -> None:
        self.now = us(start)

    def __call__(self) -> int:
        return self.now

    def set(self, text: str) -> None:
        self.now = us(text)


class Rig:
    """One scheduler app on a database file, its schedules loop on a test clock."""

    def __init__(self, db: Path, registry: FakeRegistry, clock: Clock) -> None:
        self.app = create_app(
            Settings(db_path=str(db), registry_url=registry.url, registry_cache_secs=0)
        )
        self.service: Scheduler = self.app.extensions["tiny_scheduler"]
        self.firing: ScheduleFiring = self.app.extensions["tiny_scheduler.background"].schedules
        self.firing.clock = clock
        self.firing.start()  # this scheduler runs schedules from the clock's now on
        self.clock = clock

    def create(self, **fields: Any) -> schedules.Schedule:
        body = {"name": "s", "cron": "* * * * *", "job": {"command": "backup"}, **fields}
        change = schedules.parse_schedule_request(validation.orjson.dumps(body), partial=False)
        return self.service.create_schedule(change, now=self.clock.now)

    def tick_at(self, text: str) -> int:
        self.clock.set(text)
        return self.firing.tick()

    def jobs_of(self, schedule: schedules.Schedule) -> list[jobs.Job]:
        found = self.service.list_jobs(validation.JobQuery(limit=10000)).jobs
        return [job for job in found if job.schedule_id == schedule.schedule_id]

    def metric(self, name: str, **labels: str) -> float:
        registry = metrics_of(self.app).registry
        value = registry.get_sample_value(f"tiny_scheduler_{name}", labels)
        assert value is not None, (name, generate_latest(registry).decode())
        return value

    def close(self) -> None:
        stop_background(self.app)


@pytest.fixture
def rig(tmp_path: Path, registry: FakeRegistry) -> Iterator[Any]:
    made: list[Rig] = []

    def make(clock: Clock) -> Rig:
        rig = Rig(tmp_path / "scheduler.db", registry, clock)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.close()


def test_each_fire_time_submits_the_job_as_post_jobs_would(rig: Any) -> None:
    clock = Clock("2026-11-30T10:20:30Z")
    r = rig(clock)
    job = {"command": "backup", "env_vars": {"A": "1"}, "timeout_secs": 60}
    schedule = r.create(job=job, overlap="allow")
    assert schedule.next_run_at == us("2026-11-30T10:21:00Z")
    assert r.tick_at("2026-11-30T10:20:59.999999Z") == 0
    assert r.tick_at("2026-11-30T10:21:00.4Z") == 1
    assert r.tick_at("2026-11-30T10:21:30Z") == 0  # that fire time is done
    assert r.tick_at("2026-11-30T10:22:00.1Z") == 1
    made = r.jobs_of(schedule)
    assert len(made) == 2
    first = made[0]
    assert (first.command, first.env_vars, first.timeout_secs) == ("backup", {"A": "1"}, 60)
    assert first.status == jobs.PENDING and first.node_id in ("node-a", "node-b", "node-c")
    assert first.to_wire()["schedule_id"] == schedule.schedule_id
    now = r.service.get_schedule(schedule.schedule_id)
    assert now.last_run_at == us("2026-11-30T10:22:00Z")
    assert now.last_job_id == made[1].job_id
    assert now.next_run_at == us("2026-11-30T10:23:00Z")
    assert r.metric("schedule_fires_total") == 2
    assert r.metric("jobs_submitted_total", source="schedule") == 2


def test_a_delay_in_the_job_counts_from_the_fire(rig: Any) -> None:
    r = rig(Clock("2026-11-30T10:20:30Z"))
    schedule = r.create(job={"command": "later", "delay_secs": 600})
    r.tick_at("2026-11-30T10:21:00Z")
    (job,) = r.jobs_of(schedule)
    assert job.not_before == job.created_at + 600 * 1_000_000


def test_one_job_per_fire_time_when_a_crash_took_the_schedules_update(
    rig: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock("2026-11-30T10:20:30Z")
    first = rig(clock)
    schedule = first.create()
    first.tick_at("2026-11-30T10:21:00Z")
    (job,) = first.jobs_of(schedule)
    first.close()
    # As if the process died after the fire's job was committed but before the schedule's
    # own update was: the schedule is back at that fire time, its job is on disk.
    with sqlite3.connect(tmp_path / "scheduler.db") as conn:
        conn.execute(
            "UPDATE schedules SET next_run_at = ?, last_run_at = NULL, last_job_seq = NULL",
            (us("2026-11-30T10:21:00Z"),),
        )
    conn.close()
    second = rig(Clock("2026-11-30T10:20:59Z"))  # it restarted before that fire time
    caplog.set_level(logging.INFO)
    assert second.tick_at("2026-11-30T10:21:00.5Z") == 0
    assert [j.job_id for j in second.jobs_of(schedule)] == [job.job_id]
    recorded = second.service.get_schedule(schedule.schedule_id)
    assert (recorded.last_job_id, recorded.next_run_at) == (job.job_id, us("2026-11-30T10:22:00Z"))
    assert "had made" in caplog.text and job.job_id in caplog.text


def test_no_node_is_retried_each_look_until_the_next_fire_time_then_skipped(
    rig: Any, registry: FakeRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    r = rig(Clock("2026-11-30T10:20:30Z"))
    schedule = r.create(overlap="allow")
    set_nodes(registry, [])
    assert r.tick_at("2026-11-30T10:21:00Z") == 0
    assert r.tick_at("2026-11-30T10:21:30Z") == 0
    assert r.service.get_schedule(schedule.schedule_id).next_run_at == us("2026-11-30T10:21:00Z")
    assert caplog.text.count("fire at 2026-11-30T10:21:00.000000Z failed") == 1  # said once
    # The node comes back within the minute: that same fire time is made, late.
    set_nodes(registry, ["node-a"])
    assert r.tick_at("2026-11-30T10:21:45Z") == 1
    assert r.service.get_schedule(schedule.schedule_id).last_run_at == us("2026-11-30T10:21:00Z")
    # Gone again for the whole of the next minute: that fire is given up when the one after
    # it comes, with its cause, and the new one fires.
    set_nodes(registry, [])
    r.tick_at("2026-11-30T10:22:00Z")
    r.tick_at("2026-11-30T10:22:59Z")
    set_nodes(registry, ["node-a"])
    assert r.tick_at("2026-11-30T10:23:00.2Z") == 1
    assert "fire at 2026-11-30T10:22:00.000000Z skipped: no node could take" in caplog.text
    assert r.metric("schedule_skips_total", cause="placement") == 1
    assert len(r.jobs_of(schedule)) == 2


def test_overlap_skip_waits_for_the_previous_job_and_allow_does_not(rig: Any) -> None:
    r = rig(Clock("2026-11-30T10:20:30Z"))
    skip = r.create(name="skip")
    allow = r.create(name="allow", overlap="allow")
    r.tick_at("2026-11-30T10:21:00Z")
    r.tick_at("2026-11-30T10:22:00Z")  # both first jobs are still pending
    assert len(r.jobs_of(skip)) == 1
    assert len(r.jobs_of(allow)) == 2
    assert r.metric("schedule_skips_total", cause="overlap") == 1
    (job,) = r.jobs_of(skip)
    r.service.cancel(job.job_id)
    r.tick_at("2026-11-30T10:23:00Z")
    assert len(r.jobs_of(skip)) == 2


def test_a_paused_schedule_does_not_fire_and_a_resume_starts_from_now(rig: Any) -> None:
    r = rig(Clock("2026-11-30T10:20:30Z"))
    schedule = r.create(paused=True)
    assert "next_run_at" not in schedule.to_wire()
    for minute in range(21, 30):
        r.tick_at(f"2026-11-30T10:{minute}:00Z")
    assert r.jobs_of(schedule) == []
    resumed = r.service.update_schedule(
        schedule.schedule_id, ScheduleChange(paused=False), now=us("2026-11-30T10:29:10Z")
    )
    assert resumed.next_run_at == us("2026-11-30T10:30:00Z")
    assert r.tick_at("2026-11-30T10:30:00Z") == 1


def test_catch_up_after_a_ten_minute_stop(rig: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    before = rig(Clock("2026-11-30T10:00:30Z"))
    caught = before.create(name="caught", catch_up=True)
    dropped = before.create(name="dropped")
    before.close()  # stopped at 10:00:30; the next fire time was 10:01
    after = rig(Clock("2026-11-30T10:10:40Z"))  # back ten minutes later
    after.tick_at("2026-11-30T10:10:41Z")
    (job,) = after.jobs_of(caught)
    assert after.service.get_schedule(caught.schedule_id).last_run_at == us("2026-11-30T10:10:00Z")
    assert after.jobs_of(dropped) == []
    for schedule in (caught, dropped):
        assert after.service.get_schedule(schedule.schedule_id).next_run_at == us(
            "2026-11-30T10:11:00Z"
        )
    assert after.metric("schedule_catch_ups_total") == 1
    assert after.metric("schedule_fires_total") == 1
    assert after.metric("schedule_skips_total", cause="missed") == 9 + 10
    assert caplog.text.count("(dropped): fire at") == 10
    assert "caught up the fire missed at 2026-11-30T10:10:00.000000Z" in caplog.text
    assert job.created_at > 0


def test_a_fire_time_during_the_run_is_not_a_missed_one(rig: Any) -> None:
    """A look that comes late (a slow tick) still fires: only times before the scheduler
    started running schedules count as missed."""
    r = rig(Clock("2026-11-30T10:20:30Z"))
    schedule = r.create()
    assert r.tick_at("2026-11-30T10:21:09Z") == 1
    assert r.jobs_of(schedule)[0].schedule_id == schedule.schedule_id


def test_changing_cron_or_zone_recomputes_the_next_fire_and_other_fields_do_not(
    rig: Any,
) -> None:
    r = rig(Clock("2026-11-30T10:20:30Z"))
    schedule = r.create(cron="0 3 * * *")
    assert schedule.next_run_at == us("2026-12-01T03:00:00Z")
    at = us("2026-11-30T11:00:00Z")
    moved = r.service.update_schedule(
        schedule.schedule_id, ScheduleChange(timezone="Europe/Berlin"), now=at
    )
    assert moved.next_run_at == us("2026-12-01T02:00:00Z")
    renamed = r.service.update_schedule(schedule.schedule_id, ScheduleChange(name="t"), now=at)
    assert (renamed.name, renamed.next_run_at) == ("t", moved.next_run_at)
    hourly = r.service.update_schedule(schedule.schedule_id, ScheduleChange(cron="@hourly"), now=at)
    assert hourly.next_run_at == us("2026-11-30T12:00:00Z")


def test_schedules_survive_a_restart_and_ids_are_never_reused(rig: Any) -> None:
    clock = Clock("2026-11-30T10:20:30Z")
    first = rig(clock)
    kept = first.create(name="kept", timezone="Asia/Kathmandu", overlap="allow", catch_up=True)
    gone = first.create(name="gone")
    first.service.delete_schedule(gone.schedule_id)
    first.close()
    second = rig(clock)
    assert second.service.list_schedules() == [kept]
    assert second.create(name="new").schedule_id == "sched-3"


def test_the_dashboard_shows_schedules_and_the_job_page_links_its_schedule(rig: Any) -> None:
    r = rig(Clock("2026-11-30T10:20:30Z"))
    fired = r.create(name="fired", job={"command": "backup", "delay_secs": 60})
    paused = r.create(name="resting", paused=True)
    r.tick_at("2026-11-30T10:21:00Z")
    (job,) = r.jobs_of(fired)
    client = r.app.test_client()

    page = client.get("/ui/schedules").get_data(as_text=True)
    row = page[page.index(f'id="{fired.schedule_id}"') :].split("</tr>")[0]
    assert "fired" in row and "* * * * *" in row and 'data-paused="no"' in row
    assert f'href="/ui/jobs/{job.job_id}"' in row and "badge-pending" in row
    assert 'datetime="2026-11-30T10:22:00.000000Z"' in row  # the next fire
    assert 'datetime="2026-11-30T10:21:00.000000Z"' in row  # the last fire
    resting = page[page.index(f'id="{paused.schedule_id}"') :].split("</tr>")[0]
    assert 'data-paused="yes"' in resting and "badge-paused" in resting
    assert 'href="/ui/schedules"' in page  # in the navigation

    job_page = client.get(f"/ui/jobs/{job.job_id}").get_data(as_text=True)
    assert f'href="/ui/schedules#{fired.schedule_id}" id="job-schedule"' in job_page
    assert 'id="job-not-before"' in job_page
