"""GET /leader, and what a standby answers: the leader's answer, or the way to the leader.

With PostgreSQL only the leader serves the API. A standby answers the health check, the
metrics, /leader and /cluster itself; every other call it forwards to the leader and relays
the answer (`forward.py`), so clients need one URL and keep their `Authorization` header.
With `HA_FORWARD=0`, or a request carrying `X-No-Forward: 1`, it answers 307 to the leader's
advertised URL plus the same path and query instead (307 keeps the method and the body).
While no leader is known (a takeover under way, the database out of reach), or the leader
does not answer the forward in time: 503 `no leader` with `Retry-After: 1`. With SQLite the
one daemon always serves.
"""

from __future__ import annotations

from urllib.parse import quote

from flask import Blueprint, Flask, Response, request

from ..server.inline import answers_inline
from . import forward
from .replies import json_reply, scheduler, text_reply

bp = Blueprint("leader", __name__)

NO_LEADER = "no leader"

STANDBY_SERVES = frozenset({"health.health", "leader.leader", "metrics.metrics", "cluster.cluster"})
"""Endpoints a standby answers itself: what load balancers and monitoring ask every daemon,
and the list of daemons (each can tell, so that it can be read while the leader is gone)."""

NO_FORWARD = "X-No-Forward"
"""A request carrying this header set to 1 is redirected (307), never forwarded."""

_NO_LEADER_HEADERS = {"Retry-After": "1"}


def init_app(app: Flask) -> None:
    """Send a standby's requests on to the leader (before auth: the leader checks the key)."""
    app.before_request(to_the_leader)


@bp.get("/leader")
@answers_inline
def leader() -> Response:
    """200 with the leader's URL and epoch on the leader; 503, same shape, on a standby."""
    service = scheduler()
    view = service.terms.leader()
    if view is None:  # SQLite: this daemon is the only one, and leads
        url = service.settings.advertise_url or request.host_url.rstrip("/")
        return json_reply({"leader": url, "epoch": 0})
    return json_reply(
        {"leader": view.leader_url, "epoch": view.epoch}, 200 if view.serving else 503
    )


def to_the_leader() -> Response | None:
    """On a standby, the leader's answer to the current request (forwarded), or the reply that
    sends it there; None on the leader."""
    reply, leader_url = standby_reply()
    if leader_url is None:
        return reply
    try:
        settings = scheduler().settings
        # A heartbeat may wait for work up to the period (its wait_secs is in its body).
        waits = settings.node_heartbeat_secs if request.endpoint == "nodes.heartbeat" else 0.0
        return forward.forward(leader_url, settings.advertise_url, waits)
    except forward.LeaderUnreachable:
        return text_reply(NO_LEADER, 503, _NO_LEADER_HEADERS)


def standby_reply() -> tuple[Response | None, str | None]:
    """(None, None) on the leader; (None, the leader's URL) when the request is to be forwarded;
    else (the reply: 503 or 307, None). Decided from the head alone and never calling the
    leader, so the worker may ask it before `100 Continue` (`answered_before_body`)."""
    service = scheduler()
    if request.endpoint in STANDBY_SERVES or service.terms.is_serving():
        return None, None
    view = service.terms.leader()
    own = service.settings.advertise_url
    # Never to itself: a daemon that sees its own URL in the lease row is about to lead or has
    # just stopped; either way nobody else would answer.
    if view is None or view.leader_url is None or view.leader_url == own:
        return text_reply(NO_LEADER, 503, _NO_LEADER_HEADERS), None
    if service.settings.ha_forward and request.headers.get(NO_FORWARD) != "1":
        if request.headers.get(forward.MARKER) is not None:
            # Another daemon forwarded this to us as the leader, and we are not: its view and
            # ours disagree for a moment (a takeover). Sending it on could loop.
            return text_reply(NO_LEADER, 503, _NO_LEADER_HEADERS), None
        return None, view.leader_url
    # The path as the client sent it (quoted again after WSGI decoded it), and the query as is.
    target = view.leader_url + quote(request.path, safe="/:@!$&'()*+,;=~")
    if request.query_string:
        target += "?" + request.query_string.decode("latin-1")
    return text_reply(f"the leader is {view.leader_url}", 307, {"Location": target}), None
