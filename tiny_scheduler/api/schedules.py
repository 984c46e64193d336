"""The /schedules resource: create, list, read, change and delete periodic jobs.

Every call needs a credential when auth is on; a user may create schedules and change its
own (the role table, `access`). A schedule records its creator as its `owner`, and the jobs
it fires are that owner's. The rules (checks, names, fire times) live in `schedules` and the
service; these views read the request, call one service method and shape the reply.
"""

from __future__ import annotations

from flask import Blueprint, Response

from .. import errors
from ..domain.schedules import parse_schedule_request
from . import access
from .jobs import read_body
from .replies import json_reply, scheduler

bp = Blueprint("schedules", __name__)


@bp.post("/schedules")
def create_schedule() -> Response:
    """A new schedule (201); 409 when its name is taken."""
    change = parse_schedule_request(read_body(errors.DECODE_SCHEDULE), partial=False)
    assert change.job is not None
    access.check_request(change.job)
    schedule = scheduler().schedules.create(change, owner=access.owner())
    return json_reply(access.shown_schedule(schedule.to_wire()), 201)


@bp.get("/schedules")
def list_schedules() -> Response:
    """Every schedule, oldest first."""
    found = scheduler().schedules.listing()
    return json_reply([access.shown_schedule(schedule.to_wire()) for schedule in found])


@bp.get("/schedules/<schedule_id>")
def get_schedule(schedule_id: str) -> Response:
    """One schedule."""
    return json_reply(access.shown_schedule(scheduler().schedules.get(schedule_id).to_wire()))


@bp.patch("/schedules/<schedule_id>")
def update_schedule(schedule_id: str) -> Response:
    """Change any of its fields but its id (checked like POST /jobs: the body first)."""
    change = parse_schedule_request(read_body(errors.DECODE_SCHEDULE), partial=True)
    access.check_target()
    if change.job is not None:
        access.check_request(change.job)
    schedule = scheduler().schedules.update(schedule_id, change)
    return json_reply(access.shown_schedule(schedule.to_wire()))


@bp.post("/schedules/<schedule_id>/run")
def run_schedule(schedule_id: str) -> Response:
    """Submit the schedule's job once now, as a fire would (201 with the new Job)."""
    return json_reply(access.shown(scheduler().schedules.run(schedule_id).to_wire()), 201)


@bp.delete("/schedules/<schedule_id>")
def delete_schedule(schedule_id: str) -> Response:
    """Remove it (204); the jobs it made stay."""
    scheduler().schedules.delete(schedule_id)
    return Response(status=204)
