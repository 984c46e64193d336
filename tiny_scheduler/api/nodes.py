"""The /nodes resource: agents' heartbeats, the node listing, and drains."""

from __future__ import annotations

from flask import Blueprint, Response

from ..cluster.node_requests import (
    DECODE_HEARTBEAT,
    DECODE_NODE_CHANGE,
    check_node_id,
    parse_drain,
    parse_heartbeat,
)
from ..server.inline import answers_inline, from_memory
from .jobs import read_body
from .replies import json_reply, scheduler

bp = Blueprint("nodes", __name__)


@bp.put("/nodes/<node_id>")
@answers_inline  # memory only, unless the node's facts changed (a commit: a thread)
def heartbeat(node_id: str) -> Response:
    """An agent's heartbeat; the answer carries the node's orders (drain, stop)."""
    check_node_id(node_id)
    beat = parse_heartbeat(read_body(DECODE_HEARTBEAT))
    service = scheduler()
    orders = from_memory(
        lambda: service.nodes.heartbeat_in_memory(node_id, beat),
        lambda: service.nodes.heartbeat(node_id, beat),
    )
    return json_reply(orders.to_wire())


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
