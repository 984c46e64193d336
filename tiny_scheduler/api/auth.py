"""Authentication: the shared bearer token, and which calls are exempt from it.

When `TINYAWS_API_KEY` is set every request needs `Authorization: Bearer <key>`: the scheme
name in any case (HTTP scheme names are case-insensitive), the key compared in constant time.
Exempt: the health check, /leader, the metrics, the OpenAPI document, and (while
`AUTH_AGENT_EXEMPT` is on, because the real agent sends no header) the agent's poll and its
PATCH. A plain listing of jobs is not exempt: it shows every job's command, environment and
output.

The dashboard under /ui/ is for people in a browser, which cannot be told to send a bearer
header: there the key is also accepted as the password of HTTP Basic (any user name), and a
refusal carries a `Basic` challenge so that the browser asks for it.
"""

from __future__ import annotations

import hmac

from flask import Flask, Response, request

from .. import errors
from ..domain import validation
from .replies import scheduler, text_reply

# `/` only redirects to the dashboard, which asks for the key itself.
_ALWAYS_OPEN = frozenset(
    {"health.health", "leader.leader", "metrics.metrics", "openapi.openapi", "root.root"}
)
_UI_PATH = "/ui"
_BEARER = "bearer "  # the scheme, lower-cased, and the one space before the key
_UI_CHALLENGE = {"WWW-Authenticate": 'Basic realm="tiny-scheduler", charset="UTF-8"'}


def init_app(app: Flask) -> None:
    app.before_request(check)


def check() -> Response | None:
    """The current request's refusal (a reply, or errors.Unauthorized raised), or None when
    its key is right or it needs none."""
    settings = scheduler().settings
    if not settings.api_key or _exempt(settings.auth_agent_exempt):
        return None
    if key_matches(request.headers.get("Authorization", ""), settings.api_key):
        return None
    path = request.path
    if path == _UI_PATH or path.startswith(_UI_PATH + "/"):
        if _basic_password_matches(settings.api_key):
            return None
        return text_reply(errors.UNAUTHORIZED, 401, _UI_CHALLENGE)
    raise errors.Unauthorized(errors.UNAUTHORIZED)


def key_matches(header: str, key: str) -> bool:
    """Whether an Authorization header carries the key: `Bearer` in any case, one space, and
    the key, compared in constant time (the scheme is no secret; only the key's comparison
    must not tell how much of it matched)."""
    scheme, given = header[: len(_BEARER)], header[len(_BEARER) :]
    # isascii: lower() maps a few non-ASCII letters onto ASCII ones; a scheme name is ASCII.
    if not scheme.isascii() or scheme.lower() != _BEARER:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), key.encode())


def _basic_password_matches(key: str) -> bool:
    """Whether the request carries HTTP Basic credentials whose password is the key."""
    credentials = request.authorization
    if credentials is None or credentials.type != "basic" or credentials.password is None:
        return False
    given = credentials.password.encode("utf-8", "surrogateescape")
    return hmac.compare_digest(given, key.encode())


def _exempt(agent_exempt: bool) -> bool:
    endpoint = request.endpoint or ""
    if endpoint in _ALWAYS_OPEN:
        return True
    if not agent_exempt:
        return False
    if endpoint == "jobs.update_job":
        return True
    return endpoint == "jobs.list_jobs" and validation.agent_poll_node(request.args) is not None
