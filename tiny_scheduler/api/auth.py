"""Authentication: the shared bearer token, and which calls are exempt from it.

When `TINYAWS_API_KEY` is set every request needs `Authorization: Bearer <key>`: the scheme
name in any case (HTTP scheme names are case-insensitive), the key compared in constant time.
Exempt: the health check, /leader, the metrics, the OpenAPI document, and (while the agent
exemption is on, because the tiny-aws agent sends no header) the agent's poll and its PATCH.
A plain listing of jobs is not exempt: it shows every job's command, environment and output.

The agent exemption (`AUTH_AGENT_EXEMPT`, `Settings.agent_exempt`) is on only where it is
needed: `auto`, the default, turns it on with a registry (whose nodes may run the tiny-aws
agent) and off with `REGISTRY_URL=builtin` (this project's agents always send the key). While
it is on, it is as narrow as that agent allows: the keyless poll answers only for a node the
node source lists (`_agent_exempt`), and a keyless PATCH is refused (401) for an attempt that
was claimed with a credential (the service decides that, under the job's busy marker, from
`carries_credential`: `fencing.keyless_report_refused`).

Beside the key, a token (`POST /tokens`) is a credential: who presents which, and what each
may do, is `access.py`'s (the role table): this module finds out whether a request needs a
credential, and leaves the rest to `access.identify` and `access.admit`. An exempt call that
carries a good credential anyway is held to that credential's role.

The dashboard under /ui/ is for people in a browser, which cannot be told to send a bearer
header: there the key or a token is also accepted as the password of HTTP Basic (any user
name), and a refusal carries a `Basic` challenge so that the browser asks for it.
"""

from __future__ import annotations

from flask import Flask, Response, request

from .. import errors
from ..domain import roles, validation
from ..server import inline
from . import access
from .replies import scheduler, text_reply

# `/` only redirects to the dashboard, which asks for the key itself.
_ALWAYS_OPEN = frozenset(
    {"health.health", "leader.leader", "metrics.metrics", "openapi.openapi", "root.root"}
)
_UI_PATH = "/ui"
_UI_CHALLENGE = {"WWW-Authenticate": 'Basic realm="tiny-scheduler", charset="UTF-8"'}


def init_app(app: Flask) -> None:
    app.before_request(check)
    app.after_request(access.record)


def check() -> Response | None:
    """The current request's refusal (a reply, or errors.Unauthorized or errors.Forbidden
    raised), or None when its credential may make it or it needs none."""
    settings = scheduler().settings
    if not settings.api_key:
        access.assume(roles.SHARED_KEY)  # auth is off: everyone is the admin
        return None
    if request.endpoint in _ALWAYS_OPEN:
        return None
    path = request.path
    on_ui = path == _UI_PATH or path.startswith(_UI_PATH + "/")
    who = access.identify(settings.api_key, basic_too=on_ui)
    if who is None:
        if settings.agent_exempt and _agent_exempt():
            return None
        if on_ui:
            return text_reply(errors.UNAUTHORIZED, 401, _UI_CHALLENGE)
        raise errors.Unauthorized(errors.UNAUTHORIZED)
    access.admit(who)
    return None


def carries_credential() -> bool:
    """Whether the current request carries an accepted credential (the key or a token); False
    with auth off, where there is none to carry, and for the exempt keyless calls."""
    return bool(scheduler().settings.api_key) and access.identified()


def _agent_exempt() -> bool:
    """Whether a keyless request is one of the tiny-aws agent's calls: its PATCH (the service
    still refuses it for an attempt claimed with a credential), or its poll for a node the
    node source lists (anyone could ask for any name, and read the jobs' environment)."""
    endpoint = request.endpoint or ""
    if endpoint == "jobs.update_job":
        return True
    if endpoint != "jobs.list_jobs":
        return False
    node_id = validation.agent_poll_node(request.args)
    if node_id is None:
        return False
    nodes = scheduler().nodes
    # A poll is answered in the worker's loop: a node the last list misses needs a fresh one.
    return inline.from_memory(
        lambda: nodes.is_listed_in_memory(node_id), lambda: nodes.is_listed(node_id)
    )
