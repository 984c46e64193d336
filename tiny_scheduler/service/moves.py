"""Which jobs go where: the pure decisions of moving work, apart from committing the moves.

Nothing here touches the table, the store or a clock: each function is given what it needs
(loads, node lists, jobs, times) and returns its verdict, so every rule can be checked at any
instant without a daemon.

- **Taking over** (an idle node's poll, `JOB_STEALING`): which nodes give work (`donors`),
  and whether a candidate job may still move once it is held (`still_movable`).
- **Nodes down** (the scan): which busy nodes are down, since when, and which of them count
  as lost (`judge_nodes`).
- **A poll as evidence** (`claims_disproved`): the tiny-aws agent runs a `run` job inline and
  polls nothing until it has reported it, so a poll from its node well after a claim there
  proves that the claimed job no longer runs: the claim's answer never reached the agent (it
  never started the job), or the job ended and its report was lost (it is never repeated).
  The two cannot be told apart from here, so both are treated as an attempt lost by its
  agent: it fails with `lost by its agent` and the retry rule applies (reason `node_lost`
  when no retry is left). Only polls without a key count (the agent sends none; a person who
  lists a node's pending jobs with a key is not an agent), `service` jobs never (the agent
  starts them detached and goes on polling), and nodes whose agent heartbeats never (this
  project's agent runs several jobs at once and polls meanwhile; its heartbeat's `running`
  list is the evidence there).

Tests: `tests/test_moving_work.py`, `tests/test_decisions.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

from ..domain import fit, jobs
from ..domain.jobs import Job
from ..domain.nodes import Nodes
from ..domain.placement import NodeLoad, Placement

CLAIM_EVIDENCE_SECS = 1.0
"""How long after a claim was committed a poll from its node counts as proof that the claimed
job does not run: the agent polls again only after its poll interval (3 s), and a report it
sent just before its poll has been committed by then."""

LOST_BY_AGENT = jobs.LOST_BY_AGENT
"""The stderr of an attempt that the node's agent shows it is not running."""


def within_slots(found: Sequence[Job], want: int, before: Sequence[Job] = ()) -> list[Job]:
    """The jobs of `found`, in their order, that fit in `want` free slots left after the
    jobs `before` (a `run` job takes its CPUs of them, a service none): what a waiting
    heartbeat's `want` lets through of the poll's answer."""
    left = want - sum(fit.need_of(job).cpus for job in before)
    kept = []
    for job in found:
        cpus = fit.need_of(job).cpus
        if cpus <= left:
            kept.append(job)
            left -= cpus
    return kept


def donors(loads: Iterable[NodeLoad], nodes: Nodes) -> list[str]:
    """The nodes whose waiting jobs an idle node may take: those that cannot start them."""
    return [load.node_id for load in loads if Placement.gives_work(load, nodes)]


def stays_where_it_is(loads: Iterable[NodeLoad], nodes: Nodes) -> Callable[[Job], bool]:
    """For the waiting jobs of donor nodes, offered in their order (by priority, then age):
    whether each is one its own node will start itself, because it fits in what that node has
    free after the jobs before it there. Jobs of a node that takes no work never stay."""
    free = {load.node_id: load.available for load in loads if nodes.accepts(load.node_id)}

    def stays(job: Job) -> bool:
        left = free.get(job.node_id)
        if left is None:
            return False
        need = fit.need_of(job)
        if not left.covers(need):
            return False
        free[job.node_id] = left - need
        return True

    return stays


def still_movable(job: Job, candidate: Job, offered_recently: bool, to_node: str) -> bool:
    """Whether a candidate chosen for moving to `to_node` may still move now that it is held
    busy: it is where it was when chosen, still pending, and its own node's agent was not
    just offered it (the claim and the move take turns; exactly one of them may happen). A
    retry never moves back to the node its last attempt failed on: its placement chose
    another node on purpose."""
    if job.attempts and job.attempts[-1].node_id == to_node:
        return False
    return job.node_id == candidate.node_id and jobs.can_move(job) and not offered_recently


def claims_disproved(running: Sequence[Job], polled_at_us: int) -> list[Job]:
    """The `run` jobs running on a node whose tiny-aws agent polled at `polled_at_us` that it
    cannot be running (see the module's notes)."""
    margin = int(CLAIM_EVIDENCE_SECS * 1_000_000)
    return [
        job
        for job in running
        if job.job_type == jobs.RUN
        and job.running_at is not None
        and job.running_at <= polled_at_us - margin
    ]


@dataclasses.dataclass(frozen=True, slots=True)
class NodeVerdict:
    """What the scan does about the busy nodes that are down."""

    down_since: dict[str, float]  # every busy node that is down -> when first seen down
    replace: tuple[str, ...]  # down nodes whose pending jobs go elsewhere now
    lost: tuple[str, ...]  # down nodes gone longer than NODE_LOST_SECS: running work is lost


def judge_nodes(
    busy: Iterable[str],
    nodes: Nodes,
    down_since: Mapping[str, float],
    now: float,
    lost_secs: float,
    held_until: Mapping[str, float] | None = None,
) -> NodeVerdict:
    """Which busy nodes are down (unhealthy or gone from the list), since when (a node that
    came back, or has no work any more, starts afresh), which of them give up their pending
    jobs (all, when some node is healthy to take them), and which count as lost: down for
    longer than `lost_secs`, and past the moment `held_until` names for a node whose agent
    fences (before it, the node's own fence may not have stopped its jobs yet)."""
    held = held_until or {}
    down = sorted(node for node in busy if not nodes.is_healthy(node))
    since = {node: down_since.get(node, now) for node in down}
    replace = tuple(down) if nodes.healthy else ()
    lost = tuple(
        node
        for node in down
        if now - since[node] > lost_secs and now >= held.get(node, float("-inf"))
    )
    return NodeVerdict(since, replace, lost)
