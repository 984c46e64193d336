"""Authentication: the shared bearer token, and which calls are exempt from it.

When `TINYAWS_API_KEY` is set every request needs `Authorization: Bearer <key>`: the scheme
name in any case (HTTP scheme names are case-insensitive), the key compared in constant time.
Exempt: the health check, /leader, the metrics, the OpenAPI document, and (while
`AUTH_AGENT_EXEMPT` is on, because the real agent sends no header) the agent's poll and its
PATCH. A plain listing of jobs is not exempt: it shows every job's command, environment and
output.

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
        if _exempt(settings.auth_agent_exempt):
            return None
        if on_ui:
            return text_reply(errors.UNAUTHORIZED, 401, _UI_CHALLENGE)
        raise errors.Unauthorized(errors.UNAUTHORIZED)
    access.admit(who)
    return None


def _exempt(agent_exempt: bool) -> bool:
    endpoint = request.endpoint or ""
    if endpoint in _ALWAYS_OPEN:
        return True
    if not agent_exempt:
        return False
    if endpoint == "jobs.update_job":
        return True
    return endpoint == "jobs.list_jobs" and validation.agent_poll_node(request.args) is not None
