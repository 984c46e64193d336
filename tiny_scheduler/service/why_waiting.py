"""Why a pending job waits: one short text for the job page, the CLI and the API
(`waiting_for` of `GET /jobs/{id}`). Pure: given the job and what it waits on, never the
table or the clock itself.

The reasons are checked in the order they would have to clear: a person releases its hold
(`held`: said first, whatever else it waits for, because only a person ends it), its
dependencies end, its `not_before` passes, its queue hands work out again, its owner may run
another job, a node that can run it at all (its labels, `node_ids` and size), what it needs
frees on its node (a slot, or CPUs, memory and GPUs), the bigger job ahead of it on its node
starts (backfill: it fits what is free, but its timeout would end after that job can start),
its node's agent polls.

Tests: `tests/test_why_waiting.py`, `tests/test_workflow_queues.py`, `tests/test_delayed.py`,
`tests/test_workflow_dependencies.py`, `tests/test_batch_comforts.py`, `tests/test_fit.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..domain import fit, jobs, queues, users
from ..domain.fit import NOT_HELD, Capacity, HeldBack, Resources
from ..domain.jobs import Job
from ..domain.queues import QueueSettings
from ..domain.users import UserSettings

HELD = "held"
"""What a held job waits for: its release (`POST /jobs/{id}/release`)."""


def waiting_for(
    job: Job,
    unmet: Sequence[int],
    queue: QueueSettings | None,
    queue_running: int,
    node: Capacity,
    free: Resources,
    now: int,
    user: UserSettings | None = None,
    user_running: int = 0,
    held_back: HeldBack = NOT_HELD,
) -> str | None:
    """What the job waits for, or None when it is not pending. `unmet`: the dependencies it
    still waits for; `queue` and `queue_running`: its queue's settings (None: never set) and
    running `run` jobs; `node` and `free`: what its node has, and has free now; `user` and
    `user_running`: its owner's limit (None: none) and running `run` jobs; `held_back`: what
    backfill keeps waiting on its node now (`fit.Picker.explain`)."""
    if job.status != jobs.PENDING:
        return None
    if job.held:
        return HELD
    if unmet:
        return "dependencies: " + ", ".join(jobs.job_id_of(seq) for seq in unmet)
    if not job.is_due(now):
        assert job.not_before is not None
        return f"not before {_moment(job.not_before)}"
    if queue is not None and queues.room(queue, queue_running) == 0:
        return queues.refusal(queue, queue_running)
    user_room = users.room(user, user_running)
    if user is not None and user_room == 0:
        return users.refusal(user, user_running)
    need = fit.need_of(job)
    selector = ",".join(f"{name}={value}" for name, value in (job.node_selector or {}).items())
    where = f"a node with {selector}" if selector else job.node_id
    if not fit.could_run(job, node):
        return f"a node that can run it ({job.node_id} cannot)"
    if not free.covers(need):
        plain = need.cpus == 1 and free.memory_mb >= need.memory_mb and free.gpus >= need.gpus
        if plain and not selector:
            return f"a free slot on {job.node_id}"
        return f"{fit.shortfall(need, free)} on {where}"
    head = held_back.head
    if head is not None and head.seq != job.seq:
        if job.seq in held_back.refused:
            return (
                f"behind {head.job_id} (backfill: its timeout ends after {head.job_id} can start)"
            )
        unlimited = queues.room(queue, queue_running) is None and user_room is None
        if held_back.too_deep and job.seq not in held_back.looked_at and unlimited:
            # Past the depth backfill looks at (and in no limited queue or user's order, the
            # other reason a poll would not see it): it waits for the head to start.
            return (
                f"behind {head.job_id} (backfill looks at most {fit.BACKFILL_DEPTH} jobs past it)"
            )
    return f"the agent on {job.node_id} to take it"


def _moment(us: int) -> str:
    """RFC 3339, to the second when it falls on one (as people write them)."""
    text = jobs.format_time(us)
    return text.replace(".000000Z", "Z")
