"""Authentication: the shared bearer token, and which calls are exempt from it.

When `TINYAWS_API_KEY` is set every request needs `Authorization: Bearer <key>`, compared in
constant time. Exempt: the health check, the metrics, and (while `AUTH_AGENT_EXEMPT` is on,
because the real agent sends no header) the agent's poll and its PATCH. A plain listing of jobs
is not exempt: it shows every job's command, environment and output.
"""

from __future__ import annotations

import hmac

from flask import Flask, request

from .. import errors
from .replies import scheduler

_ALWAYS_OPEN = frozenset({"health.health", "metrics.metrics"})


def init_app(app: Flask) -> None:
    app.before_request(_check)


def _check() -> None:
    settings = scheduler().settings
    if not settings.api_key or _exempt(settings.auth_agent_exempt):
        return
    if not key_matches(request.headers.get("Authorization", ""), settings.api_key):
        raise errors.Unauthorized(errors.UNAUTHORIZED)


def key_matches(header: str, key: str) -> bool:
    """Whether an Authorization header carries the key, compared in constant time."""
    expected = f"Bearer {key}".encode()
    return hmac.compare_digest(header.encode("utf-8", "surrogateescape"), expected)


def _exempt(agent_exempt: bool) -> bool:
    endpoint = request.endpoint or ""
    if endpoint in _ALWAYS_OPEN:
        return True
    if not agent_exempt:
        return False
    if endpoint == "jobs.update_job":
        return True
    return (
        endpoint == "jobs.list_jobs"
        and bool(request.args.get("node_id"))
        and request.args.get("status") == "pending"
    )
