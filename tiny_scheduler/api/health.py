"""GET /health (and /health/scheduler, the path the API gateway forwards): whether the scheduler
can take work (its store can be written), its version, its `MAX_JOB_RETRIES`; with PostgreSQL
also its role; and `"agent_exempt":true` while the tiny-aws agent's calls go without the key."""

from __future__ import annotations

from flask import Blueprint, Response

from ..server.inline import answers_inline
from ..version import version
from .replies import json_reply, scheduler

bp = Blueprint("health", __name__)


@bp.get("/health")
@bp.get("/health/scheduler")
@answers_inline
def health() -> Response:
    """200 healthy, or 503 unhealthy when the job store cannot be written (a standby: when
    the database cannot be reached)."""
    # The version lets `tiny-scheduler version` (and an operator's curl) tell which build a
    # daemon runs, e.g. halfway through a rolling upgrade.
    service = scheduler()
    body = service.terms.health()
    if service.settings.agent_exempt:
        # Whoever watches the daemon sees that keyless agent calls are let in.
        body["agent_exempt"] = True
    body["version"] = version()
    # The retries a job without its own `max_retries` gets: a plain job's wire form leaves
    # that field out (the spec keeps it to the seven always-present fields), so this is where
    # `tiny-scheduler status` reads the number instead of naming the variable.
    body["max_job_retries"] = service.settings.max_job_retries
    return json_reply(body, 200 if body["status"] == "healthy" else 503)
