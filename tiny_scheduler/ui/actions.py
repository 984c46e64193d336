"""What the dashboard's buttons change, and the notices that say how it went.

Each action calls one service operation, exactly what the API's matching call does, and
answers a notice key; the page it leads to shows that key's text (`NOTICES`). URLs carry only
keys, never text, so a link cannot make a page say something the scheduler did not.
"""

from __future__ import annotations

import dataclasses

from .. import errors
from ..domain import jobs
from ..domain.schedules import ScheduleChange
from ..domain.validation import JobRequest
from ..service import Scheduler

NOTICES = {
    "cancelled": "Job cancelled.",
    "stopped": "Job stopped: its node's agent has been told to end it.",
    "conflict": "It had already ended: nothing to cancel.",
    "retry": "Submitted again as a new job, with the request of",
    "drained": "Node drained: it gets no new job and its waiting jobs went elsewhere.",
    "undrained": "Node undrained: it takes new jobs again.",
    "paused": "Schedule paused: it does not fire until resumed.",
    "resumed": "Schedule resumed.",
    "ran": "Schedule run now, as the new job",
    "no_node": "Not run: no node can take its job now.",
    "deleted": "Deleted schedule",
}

# Fields a retry must not repeat: a time in the past, or a delay that already passed once.
_NOT_REPEATED = frozenset({"not_before", "delay_secs"})

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
    """Submit a finished job's request again as a new job, `owner`'s (whoever pressed the
    button); the new job's id (NotFound for an unknown id, PlacementError when no node can
    take it)."""
    old = service.reads.get(job_id)
    request = JobRequest(
        **{
            field.name: getattr(old, field.name)
            for field in dataclasses.fields(JobRequest)
            if field.name not in _NOT_REPEATED and hasattr(old, field.name)
        }
    )
    new, _ = service.jobs.submit(request, source="dashboard", owner=owner)
    return new.job_id


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
    return job.is_final
