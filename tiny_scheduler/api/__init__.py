"""The HTTP API: blueprints for jobs, nodes, schedule, schedules, health, the leader and the
OpenAPI document, authentication, and error replies.

Views only translate between HTTP and the service: read the request, call one service method,
shape the reply. Every rule lives in the service or below it.
"""

from __future__ import annotations

from flask import Flask

from . import (
    auth,
    events,
    health,
    jobs,
    leader,
    metrics,
    nodes,
    openapi,
    output,
    replies,
    schedule,
    schedules,
)


def init_app(app: Flask) -> None:
    """Register the blueprints, the auth check and the error handlers on `app`."""
    replies.init_app(app)
    leader.init_app(app)  # first: a standby sends every request on, the leader checks the key
    auth.init_app(app)
    app.register_blueprint(health.bp)
    app.register_blueprint(leader.bp)
    app.register_blueprint(schedule.bp)
    app.register_blueprint(jobs.bp)
    app.register_blueprint(schedules.bp)
    app.register_blueprint(nodes.bp)
    app.register_blueprint(output.bp)
    app.register_blueprint(events.bp)
    app.register_blueprint(openapi.bp)
    app.register_blueprint(metrics.bp)
