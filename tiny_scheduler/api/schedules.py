"""The /schedules resource: create, list, read, change and delete periodic jobs.

Every call needs the key when one is set (the auth check's default). The rules (checks,
names, fire times) live in `schedules` and the service; these views read the request, call
one service method and shape the reply.
"""

from __future__ import annotations

from flask import Blueprint, Response

from .. import errors
from ..domain.schedules import parse_schedule_request
from .jobs import read_body
from .replies import json_reply, scheduler

bp = Blueprint("schedules", __name__)


@bp.post("/schedules")
def create_schedule() -> Response:
    """A new schedule (201); 409 when its name is taken."""
    change = parse_schedule_request(read_body(errors.DECODE_SCHEDULE), partial=False)
    return json_reply(scheduler().schedules.create(change).to_wire(), 201)


@bp.get("/schedules")
def list_schedules() -> Response:
    """Every schedule, oldest first."""
    return json_reply([schedule.to_wire() for schedule in scheduler().schedules.listing()])


@bp.get("/schedules/<schedule_id>")
def get_schedule(schedule_id: str) -> Response:
    """One schedule."""
    return json_reply(scheduler().schedules.get(schedule_id).to_wire())


@bp.patch("/schedules/<schedule_id>")
def update_schedule(schedule_id: str) -> Response:
    """Change any of its fields but its id (checked like POST /jobs: the body first)."""
    change = parse_schedule_request(read_body(errors.DECODE_SCHEDULE), partial=True)
    return json_reply(scheduler().schedules.update(schedule_id, change).to_wire())


@bp.post("/schedules/<schedule_id>/run")
def run_schedule(schedule_id: str) -> Response:
    """Submit the schedule's job once now, as a fire would (201 with the new Job)."""
    return json_reply(scheduler().schedules.run(schedule_id).to_wire(), 201)


@bp.delete("/schedules/<schedule_id>")
def delete_schedule(schedule_id: str) -> Response:
    """Remove it (204); the jobs it made stay."""
    scheduler().schedules.delete(schedule_id)
    return Response(status=204)
