"""The /users resource: every user with its jobs, fair-share usage and limit, and changing a
user's limit (`max_running`). The rules live in the service and the job table."""

from __future__ import annotations

from flask import Blueprint, Response

from .. import errors
from ..domain import validation
from .jobs import read_body
from .replies import json_reply, scheduler

bp = Blueprint("users", __name__)


@bp.get("/users")
def list_users() -> Response:
    """Every user that has jobs, a limit or usage that counts, sorted by name."""
    return json_reply([view.to_wire() for view in scheduler().users.listing()])


@bp.put("/users/<name>")
def set_user(name: str) -> Response:
    """Replace a user's limit (stored durably); 200 with the user."""
    settings = validation.parse_user_settings(name, read_body(errors.DECODE_USER))
    return json_reply(scheduler().users.update(settings).to_wire())
