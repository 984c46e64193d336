"""GET /leader, and what a standby answers: the way to the leader.

With PostgreSQL only the leader serves the API. A standby answers every call but the health
check, the metrics and /leader with 307 to the leader's advertised URL plus the same path and
query (307 keeps the method and the body), or 503 `no leader` with `Retry-After: 1` while no
leader is known (a takeover is under way). With SQLite the one daemon always serves.
"""

from __future__ import annotations

from urllib.parse import quote

from flask import Blueprint, Flask, Response, request

from .replies import json_reply, scheduler, text_reply

bp = Blueprint("leader", __name__)

NO_LEADER = "no leader"

STANDBY_SERVES = frozenset({"health.health", "leader.leader", "metrics.metrics"})
"""Endpoints a standby answers itself: what load balancers and monitoring ask every daemon."""


def init_app(app: Flask) -> None:
    """Send a standby's requests on to the leader (before auth: the leader checks the key)."""
    app.before_request(to_the_leader)


@bp.get("/leader")
def leader() -> Response:
    """200 with the leader's URL and epoch on the leader; 503, same shape, on a standby."""
    service = scheduler()
    view = service.leader()
    if view is None:  # SQLite: this daemon is the only one, and leads
        url = service.settings.advertise_url or request.host_url.rstrip("/")
        return json_reply({"leader": url, "epoch": 0})
    return json_reply(
        {"leader": view.leader_url, "epoch": view.epoch}, 200 if view.serving else 503
    )


def to_the_leader() -> Response | None:
    """On a standby, the reply that sends the current request on; None on the leader."""
    service = scheduler()
    if request.endpoint in STANDBY_SERVES or service.is_serving():
        return None
    view = service.leader()
    if view is None or view.leader_url is None:
        return text_reply(NO_LEADER, 503, {"Retry-After": "1"})
    # The path as the client sent it (quoted again after WSGI decoded it), and the query as is.
    target = view.leader_url + quote(request.path, safe="/:@!$&'()*+,;=~")
    if request.query_string:
        target += "?" + request.query_string.decode("latin-1")
    return text_reply(f"the leader is {view.leader_url}", 307, {"Location": target})
