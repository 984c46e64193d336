"""The nodes' pages: every node with its health, agent, drain state, slots, load and jobs
(`nodes`), and one node with all of its jobs (`node_detail`).

A node is listed when the registry lists it, when it has jobs, or when its agent heartbeats
(`service.nodes.listing()`, what GET /nodes answers); the registry's health wins while it answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..domain.fit import NOTHING, UNREPORTED_MEMORY, Resources
from ..domain.jobs import Job
from ..service import NodeView, Scheduler
from . import actions
from .pages import GONE, UNKNOWN, node_health

NODE_PENDING_SHOWN = 20
"""Pending jobs listed per node on the Nodes page; the rest are a link away."""

NODE_PAGE_PENDING_SHOWN = 100
"""Pending jobs listed on one node's own page; the rest are a link away."""


@dataclasses.dataclass(frozen=True, slots=True)
class NodeDetail:
    node_id: str
    health: str
    slots: int  # run jobs the node may run at once
    slots_used: int  # running run jobs, and timed-out ones still running (a service takes none)
    queued: int  # due waiting run jobs: with slots_used, the load placement compares
    running: list[Job]  # every running job, services too
    held: list[Job]  # timed out, their process still running: each keeps a slot
    pending: list[Job]  # the oldest waiting ones
    pending_count: int
    info: NodeView | None = None  # what GET /nodes says: source, drain, heartbeat, version
    capacity: Resources = NOTHING  # what it has (memory unreported: see `memory_known`)
    allocated: Resources = NOTHING  # what its running jobs take

    @property
    def memory_known(self) -> bool:
        """Whether its agent reported its memory (a registry node's is unknown)."""
        return self.capacity.memory_mb < UNREPORTED_MEMORY // 2

    @property
    def load(self) -> float:
        """Placement's load: (due waiting run jobs + slots in use) per slot; 1.0 is a node
        exactly full."""
        return (self.queued + self.slots_used) / self.slots

    @property
    def pending_more(self) -> int:
        return self.pending_count - len(self.pending)


@dataclasses.dataclass(frozen=True, slots=True)
class NodesView:
    now: int
    registry_error: str | None
    nodes: list[NodeDetail]


def nodes(service: Scheduler) -> NodesView:
    """Every node the registry lists, that has jobs, or whose agent heartbeats: its health,
    slots, drain state, agent and jobs."""
    health, registry_error = node_health(service)
    # After the registry was asked: the listing reads its cached list, fresh now.
    infos = {info.node_id: info for info in service.nodes.listing()}
    node_ids = sorted(set(health) | service.reads.busy_nodes() | set(infos))
    details = _node_details(service, node_ids, health, registry_error, infos)
    return NodesView(now=service.clock.now_us(), registry_error=registry_error, nodes=details)


@dataclasses.dataclass(frozen=True, slots=True)
class NodePage:
    now: int
    registry_error: str | None
    node: NodeDetail
    notice: str | None


def node_detail(service: Scheduler, node_id: str, notice: str = "") -> NodePage:
    """One node with every job it waits for or runs; NotFound for a node nobody knows."""
    health, registry_error = node_health(service)
    info = service.nodes.get(node_id)
    (detail,) = _node_details(
        service, [node_id], health, registry_error, {node_id: info}, NODE_PAGE_PENDING_SHOWN
    )
    return NodePage(service.clock.now_us(), registry_error, detail, actions.NOTICES.get(notice))


def _node_details(
    service: Scheduler,
    node_ids: list[str],
    health: Mapping[str, str],
    registry_error: str | None,
    infos: Mapping[str, NodeView],
    pending_shown: int = NODE_PENDING_SHOWN,
) -> list[NodeDetail]:
    details = []
    # The slots and loads placement itself uses (MAX_JOBS_PER_NODE=auto: each node's own).
    for load in service.reads.node_loads(node_ids, service.reads.cached_nodes()):
        on_node = service.reads.jobs_on(load.node_id)
        info = infos.get(load.node_id)
        # The registry's word when it answered; else what the listing knows (heartbeats).
        fallback = info.health if info is not None else GONE
        details.append(
            NodeDetail(
                node_id=load.node_id,
                health=health.get(load.node_id, UNKNOWN if registry_error else fallback),
                slots=load.slots,
                slots_used=load.used,
                queued=load.queued,
                running=on_node.running,
                held=on_node.held,
                pending=on_node.pending[:pending_shown],
                pending_count=len(on_node.pending),
                info=info,
                capacity=load.total,
                allocated=load.allocated,
            )
        )
    return details
