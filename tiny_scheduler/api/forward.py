"""Forwarding a standby's request to the leader, and relaying the leader's answer back.

A standby (PostgreSQL, `HA_FORWARD=1`) does not redirect its clients: it makes the same call
to the leader's advertised URL itself and relays the answer, so that a client needs one URL
for the whole cluster and its `Authorization` header reaches the leader (Go's HTTP client,
like many, drops it on a redirect that changes host). What goes to the leader is what came:
method, request-target (path and query exactly as sent), every end-to-end header, and the
body. Only the hop-by-hop headers (RFC 9110 7.6.1) and `Host` are left out, and two headers
are added: `X-Forwarded-By`, so that a request is never forwarded twice (a loop between two
daemons that each believe the other leads), and `X-Forwarded-Client`, the client's address,
which the leader's audit trail records (a client's own copies of either are dropped).

Memory stays bounded whatever the sizes: the body is read from `wsgi.input` (which our worker
has spooled to a file past 64 KiB) and sent a chunk at a time, with the Content-Length it came
with or chunked as it came; the answer is relayed as a WSGI iterable a chunk at a time.

Deadlines, like every peer call (`peers.py`), are totals, not per read: connecting, sending
the body and receiving the answer's head must end within `HEAD_SECS` (plus the `wait` a long
poll asks for, or the heartbeat period for a heartbeat, which may wait for work that long),
or the client gets 503 `no leader` with `Retry-After: 1`; the answer's body
then has `RELAY_SECS` in all (an event stream through a standby ends then, and the client
resumes it with `Last-Event-ID`).
"""

from __future__ import annotations

import http.client
import logging
import time
from collections.abc import Iterator
from typing import IO
from urllib.parse import quote, urlsplit

from flask import Response, request

from ..cluster import peers
from ..server import inline

log = logging.getLogger(__name__)

MARKER = "X-Forwarded-By"
"""Added to every forwarded request, with the forwarding daemon's advertised URL."""

CLIENT_ADDRESS = "X-Forwarded-Client"
"""Added to every forwarded request: the address of the standby's client, which the leader's
audit trail records (it believes it only from a daemon sharing the database, `access`)."""

HEAD_SECS = 10.0
"""Seconds from the start of a forward until the leader's answer has begun (its status and
headers): a 6 MiB agent report on loopback takes well under a second."""

MAX_WAIT_SECS = 30.0
"""The longest `wait` a long poll may ask for (`GET /jobs/{id}/output?wait=`); the leader
holds the answer's head that long, so the head deadline grows by it."""

RELAY_SECS = 300.0
"""Seconds the answer's body may take to arrive in full once its head is in."""

CHUNK_BYTES = 256 * 1024
"""Bytes read, sent and relayed at a time: the forward's memory, whatever the body's size."""

LOG_EVERY_SECS = 5.0
"""At most one warning per this many seconds about a leader that did not answer (during a
takeover every request fails the same way)."""

# Headers that belong to one connection, not to the request (RFC 9110 7.6.1), with Host (the
# leader's, set by the connection) and the framing headers this module sets itself. Date and
# Server are the leader's server's own: the standby's server writes its own.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "host",
        "content-length",
    }
)
_OURS = frozenset({MARKER.lower(), CLIENT_ADDRESS.lower()})  # set here, never a client's copy
_NOT_RELAYED = _HOP_BY_HOP - {"content-length"} | {"date", "server"}

_last_warning = 0.0


class _Relayed(Response):
    """The leader's answer as it came: no default Content-Type added, no length computed."""

    default_mimetype = None
    automatically_set_content_length = False


class LeaderUnreachable(Exception):
    """The leader did not begin its answer within the deadline."""


def forward(leader_url: str, own_url: str | None, may_wait_secs: float = 0.0) -> Response:
    """Make the current request at `leader_url` and return its answer, streamed; raises
    LeaderUnreachable when the leader cannot be reached or does not answer in time.
    `may_wait_secs`: how long the leader may hold this request's answer on purpose (a
    heartbeat that waits for work), beside a long poll's `wait`."""
    inline.may_wait()
    leader = urlsplit(leader_url)
    start = time.monotonic()
    deadline = start + HEAD_SECS + max(_asked_wait(), may_wait_secs)
    conn = peers.BoundedConnection(
        leader.hostname or "127.0.0.1",
        leader.port or (443 if leader.scheme == "https" else 80),
        deadline,
        leader.scheme == "https",
    )
    try:
        _send(conn, leader.netloc, leader.path.rstrip("/") + _target(), own_url)
        answer = conn.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        _warn(f"forward to the leader {leader_url} failed: {exc or type(exc).__name__}")
        raise LeaderUnreachable(str(exc)) from None
    conn.extend(time.monotonic() + RELAY_SECS)
    headers = [(k, v) for k, v in answer.getheaders() if k.lower() not in _NOT_RELAYED]
    if answer.chunked:
        # Our server frames the body again for its client; a length, when the leader sent
        # one, is relayed as it is (no chunking then).
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
    status = f"{answer.status} {answer.reason}".rstrip()
    return _Relayed(_relay(conn, answer), status=status, headers=headers, direct_passthrough=True)


def _asked_wait() -> float:
    """The `wait` a long poll asks the leader for (0 when none, or one that does not parse:
    the leader answers that one at once, with 400)."""
    raw = request.args.get("wait")
    try:
        return min(max(float(raw), 0.0), MAX_WAIT_SECS) if raw else 0.0
    except ValueError:
        return 0.0


def _target() -> str:
    """The request-target exactly as the client sent it (gunicorn keeps it as RAW_URI)."""
    raw = request.environ.get("RAW_URI")
    if isinstance(raw, str) and raw.startswith("/"):
        return raw
    target = quote(request.path, safe="/:@!$&'()*+,;=~")
    if request.query_string:
        target += "?" + request.query_string.decode("latin-1")
    return target


def _send(conn: http.client.HTTPConnection, host: str, target: str, own: str | None) -> None:
    environ = request.environ
    # Accept-Encoding is forwarded only when the client sent one (http.client would add its own).
    conn.putrequest(request.method, target, skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", host)
    connection_tokens = {
        token.strip().lower() for token in request.headers.get("Connection", "").split(",")
    }
    for name, value in request.headers.items():
        lower = name.lower()
        if lower in _HOP_BY_HOP or lower in connection_tokens or lower in _OURS:
            continue
        conn.putheader(name, value)
    conn.putheader(MARKER, own or "unknown")
    conn.putheader(CLIENT_ADDRESS, request.remote_addr or "")
    body: IO[bytes] = environ["wsgi.input"]
    length = environ.get("CONTENT_LENGTH")
    chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
    if length:
        conn.putheader("Content-Length", length)
    elif chunked:
        conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    if length:
        left = int(length)
        while left > 0:
            data = body.read(min(CHUNK_BYTES, left))
            if not data:
                raise http.client.IncompleteRead(b"", left)  # the client's body ended early
            conn.send(data)
            left -= len(data)
    elif chunked:
        while data := body.read(CHUNK_BYTES):
            conn.send(b"%x\r\n%b\r\n" % (len(data), data))
        conn.send(b"0\r\n\r\n")


def _relay(conn: http.client.HTTPConnection, answer: http.client.HTTPResponse) -> Iterator[bytes]:
    """The answer's body a chunk at a time, as it arrives (read1: an event stream's events go
    on at once, not when a chunk is full). A leader that breaks off mid-body raises here, and
    our server then closes the client's connection: a cut answer never looks complete."""
    try:
        while data := answer.read1(CHUNK_BYTES):
            yield data
    finally:
        conn.close()


def _warn(message: str) -> None:
    global _last_warning
    now = time.monotonic()
    if now - _last_warning >= LOG_EVERY_SECS:
        _last_warning = now
        log.warning("%s", message)
