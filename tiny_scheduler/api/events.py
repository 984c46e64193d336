"""GET /events: every job change as a server-sent event, resumable with `Last-Event-ID`.

Each event is `event: job`, `id: N`, `data: {"job_id","status","node_id","reason",
"retry_count"}`; a comment line goes out at least every `COMMENT_SECS` so that proxies and
clients know the stream is alive. A `Last-Event-ID` (header, or `last_event_id` in the query
for clients that cannot set headers) older than the daemon's window, or from another run,
starts the stream with `event: reset`: the client should read the jobs afresh.

The stream is a `waiting.Stream`: under this project's worker it costs no request thread.
"""

from __future__ import annotations

from flask import Blueprint, Response, request

from .. import errors
from ..clock import SYSTEM
from ..server.waiting import Stream
from ..state.event_log import EventLog
from .replies import scheduler

bp = Blueprint("events", __name__)

COMMENT_SECS = 15.0
LAST_EVENT_ID_MESSAGE = "Last-Event-ID must be an event id"
BATCH = 500
"""Events written at most per chunk."""


@bp.get("/events")
def events() -> Response:
    service = scheduler()
    raw = request.headers.get("Last-Event-ID") or request.args.get("last_event_id")
    log = service.events
    if raw is None or raw == "":
        after = log.last_id()
    elif raw.isascii() and raw.isdigit() and len(raw) < 20:
        after = int(raw)
    else:
        raise errors.BadRequest(LAST_EVENT_ID_MESSAGE)
    service.waiters.enter()
    feed = _Feed(log, after)
    stream = Stream(feed.next_chunk, feed.next_deadline, log.signal, service.waiters.leave)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return Response(stream, 200, headers, mimetype="text/event-stream", direct_passthrough=True)


class _Feed:
    """What one stream has sent, and what it sends next."""

    def __init__(self, log: EventLog, after: int) -> None:
        self._log = log
        self._after = after
        self._first = True
        self._comment_at = SYSTEM.monotonic() + COMMENT_SECS

    def next_chunk(self) -> bytes | None:
        found, lost = self._log.since(self._after, BATCH)
        parts: list[bytes] = []
        if self._first:
            self._first = False
            # The retry hint, and the first bytes out at once (clients see the stream open).
            parts.append(b"retry: 2000\n\n")
            if lost:
                self._after = self._log.last_id()
                found = []
                parts.append(b"event: reset\ndata: {}\n\n")
        elif lost:
            # Fell behind the window while connected (it reads too slowly): start afresh.
            self._after = self._log.last_id()
            found = []
            parts.append(b"event: reset\ndata: {}\n\n")
        for event_id, data in found:
            parts.append(b"event: job\nid: %d\ndata: %s\n\n" % (event_id, data))
            self._after = event_id
        now = SYSTEM.monotonic()
        if not parts and now >= self._comment_at:
            parts.append(b": keep-alive\n\n")
        if parts:
            self._comment_at = now + COMMENT_SECS
            return b"".join(parts)
        return None

    def next_deadline(self) -> float:
        return self._comment_at
