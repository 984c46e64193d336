"""What the dashboard's buttons change, and the notices that say how it went.

Each action calls one service operation, exactly what the API's matching call does, and
answers a notice key; the page it leads to shows that key's text (`NOTICES`). URLs carry only
keys, never text, so a link cannot make a page say something the scheduler did not.
"""

from __future__ import annotations

from .. import errors
from ..domain import jobs
from ..domain.schedules import ScheduleChange
from ..service import Scheduler

NOTICES = {
    "cancelled": "Job cancelled.",
    "stopped": "Job stopped: its node's agent has been told to end it.",
    "conflict": "It had already ended: nothing to cancel.",
    "retry": "Submitted again as a new job, with the request of",
    "not_finished": "It has not ended yet: nothing to retry.",
    "held": "Job held: it stays pending and is not handed out until released.",
    "released": "Job released: it waits for a node like any other again.",
    "not_pending": "It is not pending any more: only a waiting job is held or released.",
    "drained": "Node drained: it gets no new job and its waiting jobs went elsewhere.",
    "undrained": "Node undrained: it takes new jobs again.",
    "paused": "Schedule paused: it does not fire until resumed.",
    "resumed": "Schedule resumed.",
    "ran": "Schedule run now, as the new job",
    "no_node": "Not run: no node can take its job now.",
    "deleted": "Deleted schedule",
}

SCHEDULE_ACTIONS = ("pause", "resume", "run", "delete")


def cancel(service: Scheduler, job_id: str) -> str:
    """Cancel a pending job or stop a running one; the notice key (NotFound passes up)."""
    try:
        job = service.jobs.cancel(job_id)
    except errors.Conflict:
        return "conflict"
    # A cancelled job is failed already; whether it had started shows in `running_at`.
    return "stopped" if job.running_at is not None else "cancelled"


def retry(service: Scheduler, job_id: str, owner: str = "") -> str:
    """Submit a finished job's request again as a new job (`POST /jobs/{id}/retry`), the job
    of `owner` (whoever pressed the button; the shared key's "" keeps the old job's owner);
    the new job's id (NotFound for an unknown id, Conflict for one not finished,
    PlacementError when no node can take it)."""
    return service.jobs.retry_as_new(job_id, source="dashboard", owner=owner or None).job_id


def hold(service: Scheduler, job_id: str, on: bool) -> str:
    """Hold a pending job (`on`) or release it; the notice key (NotFound passes up)."""
    try:
        if on:
            service.jobs.hold(job_id)
        else:
            service.jobs.release(job_id)
    except errors.Conflict:
        return "not_pending"
    return "held" if on else "released"


def drain(service: Scheduler, node_id: str, on: bool) -> str:
    """Drain a node or undrain it; the notice key (NotFound passes up)."""
    service.nodes.set_drain(node_id, on)
    return "drained" if on else "undrained"


def schedule_action(service: Scheduler, schedule_id: str, action: str) -> tuple[str, str]:
    """Pause, resume, run now or delete a schedule: (notice key, the new job's id for a run).
    NotFound passes up."""
    if action in ("pause", "resume"):
        service.schedules.update(schedule_id, ScheduleChange(paused=action == "pause"))
        return ("paused" if action == "pause" else "resumed"), ""
    if action == "run":
        try:
            job = service.schedules.run(schedule_id)
        except errors.PlacementError:
            return "no_node", ""
        return "ran", job.job_id
    service.schedules.delete(schedule_id)
    return "deleted", ""


def can_retry(job: jobs.Job) -> bool:
    """Only an ended job is submitted again: one still waiting or running is still itself."""
    return jobs.can_retry_as_new(job)
