"""The /queues resource: every queue with its counts and settings, and changing a queue's
settings (its limit, whether it is paused). Both need the key when one is set (the auth
check's default); the rules live in the service and the job table."""

from __future__ import annotations

from flask import Blueprint, Response

from .. import errors
from ..domain import validation
from .jobs import read_body
from .replies import json_reply, scheduler

bp = Blueprint("queues", __name__)


@bp.get("/queues")
def list_queues() -> Response:
    """Every queue that has jobs or settings, sorted by name."""
    return json_reply([view.to_wire() for view in scheduler().queues.listing()])


@bp.put("/queues/<name>")
def set_queue(name: str) -> Response:
    """Replace a queue's settings (stored durably); 200 with the queue."""
    settings = validation.parse_queue_settings(name, read_body(errors.DECODE_QUEUE))
    return json_reply(scheduler().queues.update(settings).to_wire())
