"""Schedules: their changes (create, update, delete) and their fires.

A fire is decided by `schedules.plan` (pure: which fire times to skip, which one to fire) and
carried out here: the job is made exactly as `POST /jobs` would make it (`Lifecycle.new_job`),
and it is committed together with the schedule's new state, under a dedupe key that names the
schedule and the fire time, so a fire time never gets two jobs, whatever crashed when.

A run now (`ScheduleOps.run`, an operator's "do it once more, now") is a fire outside the cron
times: the same job, committed the same way, but under a fresh dedupe key, since it has no
fire time to be unique for; it leaves the next fire time alone.
"""

from __future__ import annotations

import logging
import uuid

from .. import errors
from ..domain import jobs, schedules, validation
from ..domain.jobs import Job
from ..domain.schedules import Fired, Schedule, ScheduleChange
from .core import Core, schedule_seq
from .lifecycle import Lifecycle

log = logging.getLogger("tiny_scheduler.service")


class ScheduleOps:
    """Schedule changes and fires."""

    def __init__(self, core: Core, lifecycle: Lifecycle) -> None:
        self._core = core
        self._lifecycle = lifecycle

    def listing(self) -> list[Schedule]:
        """Every schedule, oldest first."""
        return self._core.schedules.all()

    def get(self, schedule_id: str) -> Schedule:
        schedule = self._core.schedules.get(schedule_seq(schedule_id))
        if schedule is None:
            raise errors.NotFound(errors.SCHEDULE_NOT_FOUND)
        return schedule

    def create(self, change: ScheduleChange, now: int | None = None, owner: str = "") -> Schedule:
        """A new schedule from a checked POST body (name, cron and job given), durable before
        this returns; its first fire time is the first after `now` (default: the clock).
        Conflict for a taken name. `owner`: the user whose token created it (its jobs'
        owner; "" for the shared key)."""
        with self._core.schedules.changing():
            assert change.name is not None and change.cron is not None and change.job is not None
            self._check_name_free(change.name)
            self._check_fits(change.job)
            now = self._core.now() if now is None else now
            schedule = Schedule(
                seq=self._core.schedules.new_seq(),
                name=change.name,
                cron=change.cron,
                timezone=change.timezone or schedules.DEFAULT_TIMEZONE,
                job=change.job,
                overlap=change.overlap or schedules.Overlap.SKIP,
                catch_up=bool(change.catch_up),
                paused=bool(change.paused),
                created_at=now,
                owner=owner,
            )
            schedule = schedule.evolve(next_run_at=schedules.next_fire(schedule, now))
            self._core.store.save_schedule(schedule)
            self._core.schedules.put(schedule)
        log.info(
            "schedule %s (%s) created: %r in %s, next run %s",
            schedule.schedule_id,
            schedule.name,
            schedule.cron,
            schedule.timezone,
            _time_or_none(schedule.next_run_at),
        )
        return schedule

    def update(self, schedule_id: str, change: ScheduleChange, now: int | None = None) -> Schedule:
        """Change the given fields. A new cron or time zone, or a resume, computes the next
        fire time afresh from `now` (default: the clock): times that passed while it was
        paused do not fire."""
        with self._core.schedules.changing():
            old = self.get(schedule_id)
            given = change.given()
            if given.get("name", old.name) != old.name:
                self._check_name_free(given["name"])
            if "job" in given:
                self._check_fits(given["job"])
            new = old.evolve(**given)
            timing = (new.cron, new.timezone) != (old.cron, old.timezone)
            if timing or (old.paused and not new.paused):
                now = self._core.now() if now is None else now
                new = new.evolve(next_run_at=schedules.next_fire(new, now))
            if new != old:
                self._core.store.save_schedule(new)
                self._core.schedules.put(new)
        if new != old:
            log.info("schedule %s (%s) changed: %s", new.schedule_id, new.name, sorted(given))
        return new

    def delete(self, schedule_id: str) -> None:
        """Remove a schedule; the jobs it made stay, and its id is never used again."""
        with self._core.schedules.changing():
            schedule = self.get(schedule_id)
            self._core.store.delete_schedule(schedule.seq)
            self._core.schedules.remove(schedule.seq)
        log.info("schedule %s (%s) deleted", schedule.schedule_id, schedule.name)

    def due(self, now: int) -> list[Schedule]:
        """Unpaused schedules whose next fire time has come by `now`."""
        return self._core.schedules.due(now)

    def fire(
        self, seq: int, now: int, since: int, failure: schedules.SkipCause | None = None
    ) -> Fired | None:
        """Look at one due schedule at `now` and do what `schedules.plan` decides: skip fire
        times, and submit the job of the latest one exactly as POST /jobs would, with
        `schedule_id` set. The job and the schedule's new state are committed together, and
        the job's dedupe key names the schedule and fire time, so a fire time never gets two
        jobs, whatever crashed when. None when nothing was due (any more).

        A fire that fails (no node, the store) leaves the schedule at that fire time, to be
        tried again on the next look; the fire times skipped before it are committed."""
        with self._core.schedules.changing():
            schedule = self._core.schedules.get(seq)
            if schedule is None:
                return None
            previous = self._core.table.get(schedule.last_job_seq or 0)
            active = previous is not None and previous.status in (jobs.PENDING, jobs.RUNNING)
            plan = schedules.plan(schedule, now, since, active, failure)
            if plan is None:
                return None
            if plan.fire_at is None:
                self._save_schedule(schedule.evolve(next_run_at=plan.cursor))
                return Fired(schedule, plan)
            unfit = self._core.placement.never_fits(schedule.job)
            if unfit is not None:
                # Nodes changed since it was made: no known node could run its job now.
                log.warning(
                    "schedule %s (%s): fire at %s skipped: no node can run this job: %s",
                    schedule.schedule_id,
                    schedule.name,
                    jobs.format_time(plan.fire_at),
                    unfit,
                )
                self._save_schedule(schedule.evolve(next_run_at=plan.cursor))
                return Fired(schedule, plan)
            try:
                job, created = self._fire(schedule, plan.fire_at, plan.cursor)
            except (errors.PlacementError, errors.StoreError) as exc:
                if plan.skipped:
                    self._save_schedule(schedule.evolve(next_run_at=plan.latest))
                return Fired(schedule, plan, error=exc)
        if created:
            self._core.created(job, "schedule")
        return Fired(schedule, plan, job, created)

    def run(self, schedule_id: str) -> Job:
        """Submit the schedule's job once, now, as a fire would (paused or not: someone asked
        for it); the schedule records it as its last job, so `overlap: skip` waits for it.
        NotFound for an unknown id; PlacementError when no node can take it."""
        with self._core.schedules.changing():
            schedule = self.get(schedule_id)
            now = self._core.now()
            # Fresh each time: two runs now are two jobs, unlike two looks at one fire time.
            key = f"sched:{schedule.schedule_id}:now:{uuid.uuid4().hex}"
            with self._core.table.deduplicating(key):
                node_id = self._core.placement.place(schedule.job.instance_id, wants=schedule.job)
                with self._core.table.creating() as seq:
                    job = self._lifecycle.new_job(
                        schedule.job, key, seq, node_id, schedule.schedule_id, schedule.owner
                    )
                    ran = schedule.evolve(last_run_at=now, last_job_seq=seq)
                    self._core.store.save_schedule(ran, job)
                    self._core.table.put(job)
                self._core.schedules.put(ran)
        self._core.created(job, "schedule")
        log.info("schedule %s (%s) run now: %s", schedule.schedule_id, schedule.name, job.job_id)
        return job

    def _fire(self, schedule: Schedule, fire_at: int, cursor: int | None) -> tuple[Job, bool]:
        key = schedules.fire_key(schedule.seq, fire_at)
        with self._core.table.deduplicating(key) as existing:
            if existing is not None:
                # The fire made its job before a crash took the schedule's own update: record
                # that job rather than make a second one.
                self._save_schedule(
                    schedule.evolve(
                        next_run_at=cursor, last_run_at=fire_at, last_job_seq=existing.seq
                    )
                )
                return existing, False
            node_id = self._core.placement.place(schedule.job.instance_id, wants=schedule.job)
            with self._core.table.creating() as seq:
                job = self._lifecycle.new_job(
                    schedule.job, key, seq, node_id, schedule.schedule_id, schedule.owner
                )
                fired = schedule.evolve(next_run_at=cursor, last_run_at=fire_at, last_job_seq=seq)
                self._core.store.save_schedule(fired, job)
                self._core.table.put(job)
            self._core.schedules.put(fired)
        return job, True

    def _check_fits(self, job: validation.JobRequest) -> None:
        if not job.instance_id:
            self._lifecycle.check_fits(job)

    def _save_schedule(self, schedule: Schedule) -> None:
        self._core.store.save_schedule(schedule)
        self._core.schedules.put(schedule)

    def _check_name_free(self, name: str) -> None:
        if self._core.schedules.named(name) is not None:
            raise errors.Conflict(f"schedule {name} already exists")


def _time_or_none(us: int | None) -> str:
    return jobs.format_time(us) if us is not None else "never"
