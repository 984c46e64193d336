"""GET /schedule: the node the next submission would be placed on."""

from __future__ import annotations

from flask import Blueprint, Response

from .replies import json_reply, scheduler

bp = Blueprint("schedule", __name__)


@bp.get("/schedule")
def schedule() -> Response:
    """Pick the next healthy node exactly as a submission would."""
    return json_reply({"node_id": scheduler().reads.next_node()})
