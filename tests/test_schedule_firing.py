"""The firing logic on the harness (`harness.py`): the real service and schedules loop object
on an in-memory store, with a clock that is set, not waited for. Nothing here sleeps until
3 a.m.

What is checked: a fire is a submission exactly like POST /jobs with `schedule_id`; one job per
fire time, also when a crash took the schedule's update after its job was committed; a fire
that finds no node is tried again until the next fire time, then skipped with its cause and
logged; overlap, catch-up and pause; the metrics of fires and skips; the dashboard's view;
a job's resources kept in the schedule and its fires, a job no node could run refused when the
schedule is made and a fire of one skipped.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import orjson
import pytest
from flask import Flask
from harness import Harness

from tiny_scheduler import errors
from tiny_scheduler.clock import ManualClock
from tiny_scheduler.domain import jobs, schedules, validation
from tiny_scheduler.domain.schedules import ScheduleChange
from tiny_scheduler.metrics import metrics_of


def us(text: str) -> int:
    value = validation.parse_rfc3339(text)
    assert value is not None
    return value


def at(text: str) -> Harness:
    """A scheduler whose clock reads `text`; it runs schedules from then on."""
    return Harness(clock=ManualClock(us(text)))


def create(h: Harness, **fields: Any) -> schedules.Schedule:
    body = {"name": "s", "cron": "* * * * *", "job": {"command": "backup"}, **fields}
    change = schedules.parse_schedule_request(orjson.dumps(body), partial=False)
    return h.service.schedules.create(change, now=h.clock.now_us())


def tick_at(h: Harness, text: str) -> int:
    h.clock.set_us(us(text))
    return h.firing.tick()


def jobs_of(h: Harness, schedule: schedules.Schedule) -> list[jobs.Job]:
    found = h.service.reads.list_jobs(validation.JobQuery(limit=10000)).jobs
    return [job for job in found if job.schedule_id == schedule.schedule_id]


def metric(app: Flask, name: str, **labels: str) -> float:
    value = metrics_of(app).registry.get_sample_value(f"tiny_scheduler_{name}", labels)
    assert value is not None, name
    return value


def test_each_fire_time_submits_the_job_as_post_jobs_would() -> None:
    h = at("2026-11-30T10:20:30Z")
    app = h.app()
    job = {"command": "backup", "env_vars": {"A": "1"}, "timeout_secs": 60}
    schedule = create(h, job=job, overlap="allow")
    assert schedule.next_run_at == us("2026-11-30T10:21:00Z")
    assert tick_at(h, "2026-11-30T10:20:59.999999Z") == 0
    assert tick_at(h, "2026-11-30T10:21:00.4Z") == 1
    assert tick_at(h, "2026-11-30T10:21:30Z") == 0  # that fire time is done
    assert tick_at(h, "2026-11-30T10:22:00.1Z") == 1
    made = jobs_of(h, schedule)
    assert len(made) == 2
    first = made[0]
    assert (first.command, first.env_vars, first.timeout_secs) == ("backup", {"A": "1"}, 60)
    assert first.status == jobs.PENDING and first.node_id in ("node-a", "node-b", "node-c")
    assert first.to_wire()["schedule_id"] == schedule.schedule_id
    assert h.stored(first.job_id).schedule_id == schedule.schedule_id
    now = h.service.schedules.get(schedule.schedule_id)
    assert now.last_run_at == us("2026-11-30T10:22:00Z")
    assert now.last_job_id == made[1].job_id
    assert now.next_run_at == us("2026-11-30T10:23:00Z")
    assert h.database.schedules[schedule.seq] == now  # committed, not only shown
    assert metric(app, "schedule_fires_total") == 2
    assert metric(app, "jobs_submitted_total", source="schedule") == 2


def test_a_delay_in_the_job_counts_from_the_fire() -> None:
    h = at("2026-11-30T10:20:30Z")
    schedule = create(h, job={"command": "later", "delay_secs": 600})
    tick_at(h, "2026-11-30T10:21:00Z")
    (job,) = jobs_of(h, schedule)
    assert job.not_before == job.created_at + 600 * 1_000_000


def test_one_job_per_fire_time_when_a_crash_took_the_schedules_update(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = at("2026-11-30T10:20:30Z")
    schedule = create(first)
    tick_at(first, "2026-11-30T10:21:00Z")
    (job,) = jobs_of(first, schedule)
    # As if the process died after the fire's job was committed but before the schedule's
    # own update was: the schedule is back at that fire time, its job is in the store.
    stored = first.database.schedules[schedule.seq]
    first.database.schedules[schedule.seq] = dataclasses.replace(
        stored, next_run_at=us("2026-11-30T10:21:00Z"), last_run_at=None, last_job_seq=None
    )
    second = first.restart()
    second.firing.start(since=us("2026-11-30T10:20:59Z"))  # it restarted before that fire time
    caplog.set_level(logging.INFO)
    assert tick_at(second, "2026-11-30T10:21:00.5Z") == 0
    assert [j.job_id for j in jobs_of(second, schedule)] == [job.job_id]
    recorded = second.service.schedules.get(schedule.schedule_id)
    assert (recorded.last_job_id, recorded.next_run_at) == (job.job_id, us("2026-11-30T10:22:00Z"))
    assert "had made" in caplog.text and job.job_id in caplog.text


def test_no_node_is_retried_each_look_until_the_next_fire_time_then_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    h = at("2026-11-30T10:20:30Z")
    app = h.app()
    schedule = create(h, overlap="allow")
    h.set_nodes([])
    assert tick_at(h, "2026-11-30T10:21:00Z") == 0
    assert tick_at(h, "2026-11-30T10:21:30Z") == 0
    assert h.service.schedules.get(schedule.schedule_id).next_run_at == us("2026-11-30T10:21:00Z")
    assert caplog.text.count("fire at 2026-11-30T10:21:00.000000Z failed") == 1  # said once
    # The node comes back within the minute: that same fire time is made, late.
    h.set_nodes(["node-a"])
    assert tick_at(h, "2026-11-30T10:21:45Z") == 1
    assert h.service.schedules.get(schedule.schedule_id).last_run_at == us("2026-11-30T10:21:00Z")
    # Gone again for the whole of the next minute: that fire is given up when the one after
    # it comes, with its cause, and the new one fires.
    h.set_nodes([])
    tick_at(h, "2026-11-30T10:22:00Z")
    tick_at(h, "2026-11-30T10:22:59Z")
    h.set_nodes(["node-a"])
    assert tick_at(h, "2026-11-30T10:23:00.2Z") == 1
    assert "fire at 2026-11-30T10:22:00.000000Z skipped: no node could take" in caplog.text
    assert metric(app, "schedule_skips_total", cause="placement") == 1
    assert len(jobs_of(h, schedule)) == 2


def test_overlap_skip_waits_for_the_previous_job_and_allow_does_not() -> None:
    h = at("2026-11-30T10:20:30Z")
    app = h.app()
    skip = create(h, name="skip")
    allow = create(h, name="allow", overlap="allow")
    tick_at(h, "2026-11-30T10:21:00Z")
    tick_at(h, "2026-11-30T10:22:00Z")  # both first jobs are still pending
    assert len(jobs_of(h, skip)) == 1
    assert len(jobs_of(h, allow)) == 2
    assert metric(app, "schedule_skips_total", cause="overlap") == 1
    (job,) = jobs_of(h, skip)
    h.service.jobs.cancel(job.job_id)
    tick_at(h, "2026-11-30T10:23:00Z")
    assert len(jobs_of(h, skip)) == 2


def test_a_paused_schedule_does_not_fire_and_a_resume_starts_from_now() -> None:
    h = at("2026-11-30T10:20:30Z")
    schedule = create(h, paused=True)
    assert "next_run_at" not in schedule.to_wire()
    for minute in range(21, 30):
        tick_at(h, f"2026-11-30T10:{minute}:00Z")
    assert jobs_of(h, schedule) == []
    resumed = h.service.schedules.update(
        schedule.schedule_id, ScheduleChange(paused=False), now=us("2026-11-30T10:29:10Z")
    )
    assert resumed.next_run_at == us("2026-11-30T10:30:00Z")
    assert tick_at(h, "2026-11-30T10:30:00Z") == 1


def test_catch_up_after_a_ten_minute_stop(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    before = at("2026-11-30T10:00:30Z")
    caught = create(before, name="caught", catch_up=True)
    dropped = create(before, name="dropped")
    # Stopped at 10:00:30 (the next fire time was 10:01); back ten minutes later.
    before.clock.set_us(us("2026-11-30T10:10:40Z"))
    after = before.restart()
    app = after.app()
    tick_at(after, "2026-11-30T10:10:41Z")
    (job,) = jobs_of(after, caught)
    assert after.service.schedules.get(caught.schedule_id).last_run_at == us("2026-11-30T10:10:00Z")
    assert jobs_of(after, dropped) == []
    for schedule in (caught, dropped):
        assert after.service.schedules.get(schedule.schedule_id).next_run_at == us(
            "2026-11-30T10:11:00Z"
        )
    assert metric(app, "schedule_catch_ups_total") == 1
    assert metric(app, "schedule_fires_total") == 1
    assert metric(app, "schedule_skips_total", cause="missed") == 9 + 10
    assert caplog.text.count("(dropped): fire at") == 10
    assert "caught up the fire missed at 2026-11-30T10:10:00.000000Z" in caplog.text
    assert job.created_at == us("2026-11-30T10:10:41Z")


def test_a_fire_time_during_the_run_is_not_a_missed_one() -> None:
    """A look that comes late (a slow tick) still fires: only times before the scheduler
    started running schedules count as missed."""
    h = at("2026-11-30T10:20:30Z")
    schedule = create(h)
    assert tick_at(h, "2026-11-30T10:21:09Z") == 1
    assert jobs_of(h, schedule)[0].schedule_id == schedule.schedule_id


def test_changing_cron_or_zone_recomputes_the_next_fire_and_other_fields_do_not() -> None:
    h = at("2026-11-30T10:20:30Z")
    schedule = create(h, cron="0 3 * * *")
    assert schedule.next_run_at == us("2026-12-01T03:00:00Z")
    when = us("2026-11-30T11:00:00Z")
    moved = h.service.schedules.update(
        schedule.schedule_id, ScheduleChange(timezone="Europe/Berlin"), now=when
    )
    assert moved.next_run_at == us("2026-12-01T02:00:00Z")
    renamed = h.service.schedules.update(schedule.schedule_id, ScheduleChange(name="t"), now=when)
    assert (renamed.name, renamed.next_run_at) == ("t", moved.next_run_at)
    hourly = h.service.schedules.update(
        schedule.schedule_id, ScheduleChange(cron="@hourly"), now=when
    )
    assert hourly.next_run_at == us("2026-11-30T12:00:00Z")


def test_schedules_survive_a_restart_and_ids_are_never_reused() -> None:
    first = at("2026-11-30T10:20:30Z")
    kept = create(first, name="kept", timezone="Asia/Kathmandu", overlap="allow", catch_up=True)
    gone = create(first, name="gone")
    first.service.schedules.delete(gone.schedule_id)
    second = first.restart()
    assert second.service.schedules.listing() == [kept]
    assert create(second, name="new").schedule_id == "sched-3"


def test_the_dashboard_shows_schedules_and_the_job_page_links_its_schedule() -> None:
    h = at("2026-11-30T10:20:30Z")
    fired = create(h, name="fired", job={"command": "backup", "delay_secs": 60})
    paused = create(h, name="resting", paused=True)
    tick_at(h, "2026-11-30T10:21:00Z")
    (job,) = jobs_of(h, fired)
    client = h.app().test_client()

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
    assert f'href="/ui/schedules/{fired.schedule_id}" id="job-schedule"' in job_page
    assert 'id="job-not-before"' in job_page


# --- what a schedule's job needs (Resources and fit) --------------------------------------------


def fitted_at(text: str) -> Harness:
    """A scheduler whose clock reads `text`, with our agents' nodes (builtin registry, CPUs as
    slots): cpu (8 CPUs, 32 GiB) and gpu (4 CPUs, 16 GiB, 2 GPUs, gpu=a100)."""
    h = Harness(clock=ManualClock(us(text)), builtin=True, max_jobs_per_node="auto")
    beat(h)
    return h


def beat(h: Harness, gpus: int = 2) -> None:
    """Both nodes' heartbeats now; `gpus`: what the gpu node's agent reports having."""
    h.heartbeat("cpu", cpu_count=8, memory_mb=32768)
    h.heartbeat("gpu", cpu_count=4, memory_mb=16384, gpus=gpus, labels=(("gpu", "a100"),))


def fire_at(h: Harness, text: str, gpus: int = 2) -> int:
    """The schedules loop's look at `text`, the nodes having just beaten (as they would)."""
    h.clock.set_us(us(text))
    beat(h, gpus)
    return h.firing.tick()


def wire(value: dict[str, Any]) -> Any:
    """What a client reads of `to_wire()`: as JSON (a tuple is a list there)."""
    return orjson.loads(orjson.dumps(value))


NEEDS = {
    "cpus": 2,
    "memory_mb": 512,
    "gpus": 1,
    "node_selector": {"gpu": "a100"},
    "node_ids": ["gpu"],
}


def test_a_schedules_job_keeps_what_it_needs_stored_and_in_every_job_it_fires() -> None:
    h = fitted_at("2026-11-30T10:20:30Z")
    schedule = create(h, job={"command": "train", **NEEDS})
    shown = wire(schedule.to_wire())["job"]
    assert {name: shown[name] for name in NEEDS} == NEEDS
    # Stored with them: a new scheduler on the same database reads the same schedule back.
    assert h.restart().service.schedules.get(schedule.schedule_id) == schedule

    assert fire_at(h, "2026-11-30T10:21:00Z") == 1
    (job,) = jobs_of(h, schedule)
    made = (job.cpus, job.memory_mb, job.gpus, job.node_selector, job.node_ids, job.node_id)
    assert made == (2, 512, 1, {"gpu": "a100"}, ("gpu",), "gpu")
    assert {name: wire(job.to_wire())[name] for name in NEEDS} == NEEDS
    stored = h.stored(job.job_id)
    assert (stored.cpus, stored.gpus, stored.node_ids) == (2, 1, ("gpu",))


def test_a_schedule_whose_job_no_node_could_run_is_refused_when_made_or_changed() -> None:
    h = fitted_at("2026-11-30T10:20:30Z")
    with pytest.raises(errors.BadRequest) as refused:
        create(h, job={"command": "train", "gpus": 4})
    assert refused.value.message == "no node can run this job: needs 4 gpus, the largest node has 2"
    assert h.service.schedules.listing() == []
    # Over HTTP, the same 400.
    client = h.app().test_client()
    body = {"name": "big", "cron": "@daily", "job": {"command": "train", "cpus": 16}}
    answer = client.post("/schedules", json=body)
    assert (answer.status_code, answer.get_data(as_text=True)) == (
        400,
        "no node can run this job: needs 16 cpus, the largest node has 8\n",
    )
    # A change of its job is checked the same way, and changes nothing when refused.
    kept = create(h, job={"command": "train", **NEEDS})
    body = orjson.dumps({"job": {"command": "train", "node_selector": {"gpu": "h100"}}})
    change = schedules.parse_schedule_request(body, partial=True)
    with pytest.raises(errors.BadRequest) as refused:
        h.service.schedules.update(kept.schedule_id, change)
    assert refused.value.message == "no node can run this job: no node has gpu=h100"
    assert h.service.schedules.listing() == [kept]


def test_a_fire_whose_job_no_node_can_run_any_more_is_logged_and_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    h = fitted_at("2026-11-30T10:20:30Z")
    schedule = create(h, job={"command": "train", "gpus": 1})
    # Since it was made, the gpu node's agent has come to report no GPU.
    assert fire_at(h, "2026-11-30T10:21:00Z", gpus=0) == 0
    assert jobs_of(h, schedule) == []
    assert (
        f"schedule {schedule.schedule_id} (s): fire at 2026-11-30T10:21:00.000000Z skipped: "
        "no node can run this job: needs 1 gpus, the largest node has 0"
    ) in caplog.text
    # That fire time is given up (not tried again on every look), the next one is not.
    later = h.service.schedules.get(schedule.schedule_id)
    assert later.next_run_at == us("2026-11-30T10:22:00Z") and later.last_job_id is None
    assert fire_at(h, "2026-11-30T10:21:30Z", gpus=2) == 0
    assert fire_at(h, "2026-11-30T10:22:00Z", gpus=2) == 1
    (job,) = jobs_of(h, schedule)
    assert (job.gpus, job.node_id) == (1, "gpu")
