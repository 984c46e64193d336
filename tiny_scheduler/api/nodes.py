"""The /nodes resource: agents' heartbeats (waiting for work when they ask), the node listing,
and drains.

A heartbeat with `wait_secs` (spec, "Waiting for work") is parked in the worker's loop
(`waiting.AskAgain`) on its node's signal (`service/node_waits.py`) until it has news: jobs to
hand out, a stop order, a drain change; or until the wait is over. Its effects (the beat, the
reconciliation of `running`, the fence's renewal on the agent's side) happen when it arrives;
each later run only reads the orders again and asks the poll what to hand out.
"""

from __future__ import annotations

from flask import Blueprint, Response, request

from ..clock import SYSTEM
from ..cluster.node_requests import (
    DECODE_HEARTBEAT,
    DECODE_NODE_CHANGE,
    check_node_id,
    parse_drain,
    parse_heartbeat,
)
from ..server.inline import answers_inline, from_memory
from ..server.waiting import PARK_KEY, WAITED_KEY, AskAgain, Prepared, wait_in_thread
from .jobs import read_body
from .replies import json_reply, scheduler

bp = Blueprint("nodes", __name__)


@bp.put("/nodes/<node_id>")
@answers_inline  # memory only, unless the node's facts changed (a commit: a thread)
def heartbeat(node_id: str) -> Response:
    """An agent's heartbeat; the answer carries the node's orders (drain, stop), and when it
    waits for work, the jobs handed to the node."""
    check_node_id(node_id)
    service = scheduler()
    beat = parse_heartbeat(read_body(DECODE_HEARTBEAT), service.settings.node_heartbeat_secs)
    nodes = service.nodes
    signal = nodes.waits.signal(node_id)
    seen = signal.count  # before the look: a change after it wakes the wait
    waited = request.environ.get(WAITED_KEY)
    if waited is None:
        orders = from_memory(
            lambda: nodes.heartbeat_in_memory(node_id, beat),
            lambda: nodes.heartbeat(node_id, beat),
        )
    else:
        orders = nodes.orders(node_id, beat)  # it arrived before it was parked
    if beat.wait_secs is None:
        nodes.waits.told(node_id, orders.drain)
        return json_reply(orders.to_wire())
    # Woken: the slots its listed jobs freed since count too (`woken_want`).
    want = beat.want if waited is None else nodes.woken_want(node_id, beat)
    handed = from_memory(
        lambda: service.dispatch.hand_in_memory(node_id, want),
        lambda: service.dispatch.hand(node_id, want),
    )
    now = SYSTEM.monotonic()
    deadline = waited or now + beat.wait_secs
    due_in = service.dispatch.next_due_in(node_id)  # a delayed job of the node comes due
    if due_in is not None:
        deadline = min(deadline, now + due_in)
    if now < deadline and not nodes.has_news(orders, handed, woken=waited is not None):
        release = nodes.waits.parked(node_id, want or 0)
        if request.environ.get(PARK_KEY):
            # What it answers at the deadline if nothing happens for the node meanwhile:
            # the same orders, no jobs (sent then without running this again).
            nodes.waits.told(node_id, orders.drain)
            quiet = json_reply(orders.to_wire([]))
            prepared = Prepared(quiet.status, list(quiet.headers.items()), quiet.get_data())
            body = AskAgain(signal, seen, deadline, release, prepared)
            return Response(body, status=200, direct_passthrough=True)
        try:  # a server that cannot park: the wait holds this thread
            wait_in_thread(signal, deadline - now)
        finally:
            release()
        orders = nodes.orders(node_id, beat)
        handed = service.dispatch.hand(node_id, nodes.woken_want(node_id, beat))
    nodes.waits.told(node_id, orders.drain)
    return json_reply(orders.to_wire(handed.jobs))


@bp.get("/nodes")
def list_nodes() -> Response:
    return json_reply([node.to_wire() for node in scheduler().nodes.listing()])


@bp.get("/nodes/<node_id>")
def get_node(node_id: str) -> Response:
    return json_reply(scheduler().nodes.get(node_id).to_wire())


@bp.patch("/nodes/<node_id>")
def change_node(node_id: str) -> Response:
    """Drain a node (`{"drain":true}`) or undrain it."""
    drain = parse_drain(read_body(DECODE_NODE_CHANGE))
    return json_reply(scheduler().nodes.set_drain(node_id, drain).to_wire())
