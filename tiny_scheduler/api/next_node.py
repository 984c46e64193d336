"""GET /schedule: the node the next submission would be placed on (a placement preview; the
wire path keeps the seed's name, the code says what it is)."""

from __future__ import annotations

from flask import Blueprint, Response

from .replies import json_reply, scheduler

# Named "schedule" as before: the endpoint is a label of the request metrics, and dashboards
# and alerts keyed on `schedule.schedule` must keep working.
bp = Blueprint("schedule", __name__)


@bp.get("/schedule", endpoint="schedule")
def next_node() -> Response:
    """Pick the next healthy node exactly as a submission would."""
    return json_reply({"node_id": scheduler().reads.next_node()})
