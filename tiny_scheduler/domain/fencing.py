"""Fencing: at most one copy of a job runs at once, and only the current copy's word counts.

Two rules, both pure, with their tests in `tests/test_fencing.py`:

- **Which report a job takes** (`stale_report`, `keyless_report_refused`). An attempt is
  named by its node and its number (`retry_count`, counted from 0 on the wire): the attempt
  number is the fencing token.
  A report (a claim, a final report, live output) that names an attempt other than the job's
  current one is stale: it gets 409 and is never taken as the current attempt's result. An
  attempt claimed by a report that named it (this project's agent) takes only reports that
  name it too; one claimed without (the tiny-aws agent, whose reports carry no names) takes
  reports without names, as before. With auth on, an attempt claimed with a credential
  takes no keyless report either: the agent exemption lets keyless reports through for the
  tiny-aws agent, and without this anyone who reached the port could end such an attempt.
- **When a node's work may be given up** (`fence_secs_auto`, `fence_refusal`, `lost_at`). An
  agent stops its own jobs once no heartbeat answer from the leader has come for its fence
  (`--fence-secs`); the scheduler fails a lost node's running jobs (and runs them elsewhere)
  only once that fence has surely passed: `fence_secs` plus two heartbeat periods after the
  node's last heartbeat, and never before `NODE_LOST_SECS`. So the retried copy starts after
  the first copy was stopped.
"""

from __future__ import annotations

from .jobs import RUNNING, Job

FENCE_CAP_SECS = 30.0
"""The longest fence `auto` picks: jobs of a node cut off from every scheduler stop within
half a minute, even when the scheduler waits far longer before it calls the node lost."""

FENCE_FLOOR_SECS = 5.0
"""The shortest fence `auto` picks (or three heartbeat periods, when longer): a fence must
ride out a restart of the agent and a slow heartbeat or two, or it would stop healthy work.
Where NODE_LOST_SECS leaves less room, the scheduler waits for the fence (`lost_at`)."""


def stale_report(job: Job, node_id: str | None, attempt: int | None, claim: bool) -> str | None:
    """Why a report is not for the job's current attempt (the 409's text), or None when it
    is. `node_id`/`attempt`: what the report names (None: not named); `claim`: the report is
    the claim (`PATCH running`), which may name the pending job's next attempt."""
    named = node_id is not None or attempt is not None
    if not named:
        # The tiny-aws agent's report: taken as before, but never for an attempt that a
        # naming agent claimed (a stray unnamed report must not end that attempt).
        if job.named_claim and job.status == RUNNING and not claim:
            return _stale(job)
        return None
    if (attempt is not None and attempt != job.retry_count) or (
        node_id is not None and node_id != job.node_id
    ):
        return _stale(job)
    return None


def keyless_report_refused(job: Job, auth_on: bool, credential: bool, claim: bool) -> bool:
    """Whether a report must be refused (401) for carrying no credential: with auth on, an
    attempt claimed with one (this project's agent, which always sends the key) takes no
    keyless report, the agent exemption's included. A keyless claim of a pending job is the
    tiny-aws agent's and stays allowed; so is every report of an attempt claimed without one."""
    return auth_on and not credential and not claim and job.keyed_claim


def _stale(job: Job) -> str:
    # People count attempts from 1 (the wire from 0): this text is for people.
    return f"stale report: {job.job_id} is on attempt {job.retry_count + 1} on {job.node_id}"


def fence_secs_auto(node_lost_secs: float, heartbeat_secs: float) -> float:
    """The fence an agent takes by default: as long as it may be (so a short outage of the
    scheduler stops nothing) while still ending before the scheduler calls the node lost,
    with two heartbeat periods and a second to spare; at most `FENCE_CAP_SECS`, and never
    below `FENCE_FLOOR_SECS` or three heartbeat periods (a scheduler set to lose nodes faster
    than that then waits for the fence before it runs their jobs elsewhere: `lost_at`)."""
    room = node_lost_secs - 2 * heartbeat_secs - 1
    floor = max(FENCE_FLOOR_SECS, 3 * heartbeat_secs)
    return min(FENCE_CAP_SECS, max(room, floor))


def fence_refusal(asked_secs: float, node_lost_secs: float, heartbeat_secs: float) -> str | None:
    """Why an agent's explicit `--fence-secs` cannot keep its promise with this scheduler
    (its jobs could still run when the scheduler starts them elsewhere), or None."""
    limit = fence_secs_auto(node_lost_secs, heartbeat_secs)
    if asked_secs <= limit:
        return None
    return (
        f"--fence-secs {asked_secs:g} is longer than this scheduler allows ({limit:g}, from "
        f"its NODE_LOST_SECS {node_lost_secs:g} and heartbeats every {heartbeat_secs:g}s)"
    )


def lost_at(
    last_beat: float, fence_secs: float | None, heartbeat_secs: float, node_lost_secs: float
) -> float:
    """The earliest moment (on the clock of `last_beat`, the node's last heartbeat) at which
    the scheduler may fail a silent node's running jobs: `NODE_LOST_SECS` after it, and for a
    node that fences, not before its fence has passed with two heartbeat periods to spare (its
    agent counts the fence from the last answer it got, which is no earlier than that
    heartbeat)."""
    wait = node_lost_secs
    if fence_secs is not None:
        wait = max(wait, fence_secs + 2 * heartbeat_secs)
    return last_beat + wait
