"""Schedule firing: every SCHEDULE_TICK_SECS, each schedule whose next fire time has come is
looked at once, through the service, which skips or fires as `schedules.plan` decides and
commits the outcome.

This loop owns only what lives between looks: when this scheduler began running schedules
(fire times before that were missed while no scheduler ran, which `catch_up` is about), and
why the last fire of a schedule failed (no node, the store), so that a fire retried on every
look until its schedule's next fire time is, once given up, skipped with that cause. It logs
one line for every skipped fire and tells its observers (the metrics) of fires, catch-ups and
skips. One schedule's failure is logged and never ends the sweep.

The clock is a parameter, so that tests can run the firing logic at any moment of any year.
Once the scheduler has a leader (PostgreSQL HA), only the leader runs this loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import Enum

from .. import errors
from ..domain import jobs
from ..domain.schedules import Fired, Schedule, SkipCause
from ..service import Scheduler

log = logging.getLogger(__name__)

SKIPS_LOGGED = 20
"""Skipped fire times logged one line each per look; beyond that, the missed fire times in
the middle of a long outage share one line (an every-minute schedule down for a day would
otherwise log 1440 lines at start-up). The last one always has its own line."""


class Outcome(str, Enum):
    """What became of a fire time, as told to observers."""

    __str__ = str.__str__

    FIRED = "fired"  # a job was made for it (a catch-up is also told as CAUGHT_UP)
    CAUGHT_UP = "caught_up"  # it was missed while no scheduler ran, and catch_up made its job
    SKIPPED = "skipped"  # no job will be made for it; the cause comes along


FireObserver = Callable[[Outcome, "SkipCause | None"], None]
"""Called as observer(outcome, cause) for each fire time handled (cause only for SKIPPED)."""


class ScheduleFiring:
    """The schedules loop's tick and the little it remembers between ticks."""

    def __init__(self, service: Scheduler, clock: Callable[[], int] | None = None) -> None:
        self.service = service
        self.clock = service.clock.now_us if clock is None else clock
        self.since = self.clock()
        self.observers: list[FireObserver] = []
        self._failures: dict[int, tuple[int, SkipCause]] = {}  # seq -> (fire time, cause)

    def start(self, since: int | None = None) -> None:
        """Schedules run from now, or from `since`: fire times before it were missed while
        none ran."""
        self.since = self.clock() if since is None else since

    def tick(self) -> int:
        """Look at every due schedule once; returns how many jobs were made."""
        now = self.clock()
        made = 0
        for schedule in self.service.schedules.due(now):
            try:
                made += self.look(schedule, now)
            except errors.ServiceError as exc:
                log.warning("schedule %s: %s", schedule.schedule_id, exc.message)
            except Exception:
                log.exception("schedule %s: look failed", schedule.schedule_id)
        return made

    def look(self, schedule: Schedule, now: int) -> int:
        """Fire or skip what is due of one schedule; 1 when a job was made."""
        failed = self._failures.get(schedule.seq)
        failure = failed[1] if failed and failed[0] == schedule.next_run_at else None
        fired = self.service.schedules.fire(schedule.seq, now, self.since, failure)
        if fired is None:
            return 0
        self._report_skips(fired)
        if fired.error is not None:
            self._report_failure(fired)
            return 0
        self._failures.pop(schedule.seq, None)
        if fired.job is None:
            return 0
        self._report_fire(fired)
        return 1 if fired.created else 0

    # --- telling what happened ----------------------------------------------------------------

    def _report_skips(self, fired: Fired) -> None:
        schedule, plan = fired.schedule, fired.plan
        skipped = plan.skipped
        for _instant, cause in skipped:
            self._tell(Outcome.SKIPPED, cause)
        if len(skipped) <= SKIPS_LOGGED and not plan.skipped_more:
            logged, middle, last = skipped, (), ()
        else:
            logged, middle, last = (
                skipped[: SKIPS_LOGGED - 1],
                skipped[SKIPS_LOGGED - 1 : -1],
                skipped[-1:],
            )
        for instant, cause in logged:
            self._log_skip(schedule, instant, cause)
        if middle:
            # Past the first few, a long outage's missed fire times share one line (they all
            # have the same cause: only the first and the last fire time can have another).
            log.warning(
                "schedule %s (%s): %d more fire times from %s to %s skipped%s: %s",
                schedule.schedule_id,
                schedule.name,
                len(middle),
                jobs.format_time(middle[0][0]),
                jobs.format_time(middle[-1][0]),
                " (and the ones after them, too many to count)" if plan.skipped_more else "",
                _SAYS[SkipCause.MISSED],
            )
        for instant, cause in last:
            self._log_skip(schedule, instant, cause)

    def _log_skip(self, schedule: Schedule, instant: int, cause: SkipCause) -> None:
        log.warning(
            "schedule %s (%s): fire at %s skipped: %s",
            schedule.schedule_id,
            schedule.name,
            jobs.format_time(instant),
            _SAYS[cause],
        )

    def _report_failure(self, fired: Fired) -> None:
        schedule, plan, error = fired.schedule, fired.plan, fired.error
        assert plan.fire_at is not None and error is not None
        cause = SkipCause.PLACEMENT if isinstance(error, errors.PlacementError) else SkipCause.STORE
        first = self._failures.get(schedule.seq) != (plan.fire_at, cause)
        self._failures[schedule.seq] = (plan.fire_at, cause)
        # Tried again on every look until the next fire time: say so once, not every second.
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "schedule %s (%s): fire at %s failed (%s); trying again until %s",
            schedule.schedule_id,
            schedule.name,
            jobs.format_time(plan.fire_at),
            error.message,
            jobs.format_time(plan.cursor) if plan.cursor is not None else "it gives up",
        )

    def _report_fire(self, fired: Fired) -> None:
        schedule, plan, job = fired.schedule, fired.plan, fired.job
        assert plan.fire_at is not None and job is not None
        when = jobs.format_time(plan.fire_at)
        if not fired.created:
            log.warning(
                "schedule %s (%s): fire at %s had made %s before a restart; recorded it",
                schedule.schedule_id,
                schedule.name,
                when,
                job.job_id,
            )
            return
        self._tell(Outcome.FIRED, None)
        if plan.catch_up:
            self._tell(Outcome.CAUGHT_UP, None)
        log.info(
            "schedule %s (%s): %s at %s: %s on node %s",
            schedule.schedule_id,
            schedule.name,
            "caught up the fire missed" if plan.catch_up else "fired",
            when,
            job.job_id,
            job.node_id,
        )

    def _tell(self, outcome: Outcome, cause: SkipCause | None) -> None:
        for observer in self.observers:
            try:
                observer(outcome, cause)
            except Exception:
                log.exception("schedule observer failed on %s", outcome)


_SAYS = {
    SkipCause.OVERLAP: "its previous job is still pending or running (overlap: skip)",
    SkipCause.MISSED: "no scheduler was running at that time"
    " (catch_up runs only the latest missed fire, and only when on)",
    SkipCause.PLACEMENT: "no node could take the job before the next fire time",
    SkipCause.STORE: "the store could not record the fire before the next fire time",
}
