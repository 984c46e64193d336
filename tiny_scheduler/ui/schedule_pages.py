"""The schedules' pages: every schedule with its next and last fire and its last job
(`schedule_list`), and one schedule with the jobs it made lately (`schedule_detail`)."""

from __future__ import annotations

import contextlib
import dataclasses

from .. import errors
from ..domain import jobs
from ..domain.jobs import Job
from ..domain.schedules import Schedule
from ..service import Scheduler
from . import actions

SCHEDULE_JOBS_SECS = 86400
"""How far back a schedule's page looks for the jobs it made (the jobs table has no index by
schedule: the walk costs every job that ended since then, so it stays a day)."""

SCHEDULE_JOBS_SHOWN = 20
"""Jobs listed on a schedule's page, newest first."""


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleRow:
    schedule: Schedule
    last_job: Job | None  # None when it has not fired, or retention removed that job


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleList:
    now: int
    rows: list[ScheduleRow]
    notice: str | None = None
    notice_schedule: str = ""  # the schedule a notice names (the one just deleted)


def schedule_list(service: Scheduler, notice: str = "", named: str = "") -> ScheduleList:
    """Every schedule with its next and last fire, and the status of the last job it made."""
    rows = []
    for schedule in service.schedules.listing():
        last_job = None
        # A job removed by retention is not found; the row says so.
        with contextlib.suppress(errors.NotFound):
            if schedule.last_job_id is not None:
                last_job = service.reads.get(schedule.last_job_id)
        rows.append(ScheduleRow(schedule, last_job))
    named_ok = named.startswith("sched-") and named[6:].isascii() and named[6:].isdigit()
    return ScheduleList(
        now=service.clock.now_us(),
        rows=rows,
        notice=actions.NOTICES.get(notice),
        notice_schedule=named if named_ok else "",
    )


@dataclasses.dataclass(frozen=True, slots=True)
class SchedulePage:
    now: int
    schedule: Schedule
    jobs: list[Job]  # the jobs it made in the last SCHEDULE_JOBS_SECS, newest first
    last_job: Job | None
    notice: str | None
    notice_key: str
    notice_job: str  # the job a run now made, when the notice names one
    window_secs: int = SCHEDULE_JOBS_SECS


def schedule_detail(
    service: Scheduler, schedule_id: str, notice: str = "", notice_job: str = ""
) -> SchedulePage:
    """One schedule with the jobs it made lately; NotFound for an unknown id."""
    schedule = service.schedules.get(schedule_id)
    now = service.clock.now_us()
    made = [
        job
        for job in service.reads.recent_jobs(now - SCHEDULE_JOBS_SECS * 1_000_000)
        if job.schedule_id == schedule.schedule_id
    ]
    made.sort(key=lambda job: job.seq, reverse=True)
    last_job = None
    with contextlib.suppress(errors.NotFound):
        if schedule.last_job_id is not None:
            last_job = service.reads.get(schedule.last_job_id)
    return SchedulePage(
        now=now,
        schedule=schedule,
        jobs=made[:SCHEDULE_JOBS_SHOWN],
        last_job=last_job,
        notice=actions.NOTICES.get(notice),
        notice_key=notice if notice in actions.NOTICES else "",
        notice_job=notice_job if jobs.parse_job_id(notice_job) is not None else "",
    )
