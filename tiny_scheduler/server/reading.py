"""Reading a request in the event loop: its head, then its body, until it has arrived whole.

A head is found by its blank line. A plain one (fasthttp.py: nearly all) is parsed by
httptools, in C; anything else goes to gunicorn's own parser, so malformed requests get its
own 400/414/431 pages, and a head gunicorn would refuse before its end is handed to it at once
(`_verdict_due`) rather than left to time out. A body is received by its framing, without
decoding it: a Content-Length is counted, a chunked body is scanned for its end
(`ChunkScanner`; gunicorn's ChunkedReader decodes it later, in the thread). A body waits for
its thread in memory up to MEMORY_BODY_BYTES, then in an unlinked temporary file written as it
arrives. Nothing here knows the app's routes or limits, with one exception: before sending
`100 Continue`, an app with a method `answered_before_body(environ) -> bool` (the scheduler
checks the key and the declared length there) says which requests get their final answer at
once instead, without their body.

Once a request is whole it goes to `_hand_over` (answering.py).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from typing import TYPE_CHECKING, Any

from . import fasthttp, gunicorn_private
from .chunked import ChunkScanner, Malformed
from .connections import LINGERING, NOWAIT, READING, RECV_BYTES, REQUEST_READ_SECS, Conn

if TYPE_CHECKING:
    from .gunicorn_private import Request

MEMORY_BODY_BYTES = 64 * 1024
"""A body up to this many bytes waits for its thread in memory; a larger one goes to an
unlinked temporary file as it arrives, so memory does not follow body sizes."""

SPOOL_RECV_BYTES = 256 * 1024
"""Largest single read of a body going to its temporary file."""

NO_ROOM = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 53\r\n"
    b"Retry-After: 5\r\n"
    b"Connection: close\r\n"
    b"\r\n"
    b"no room to receive the request body (TMPDIR is full)\n"
)
"""The answer to a request whose body could not be kept (its temporary file could not be
written): nothing was done, so it may be sent again (the agent's spool does)."""

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class RequestReading:
    """Reading requests off readable connections (a mixin of BufferingWorker, worker.py).

    Calls `_hand_over` (answering.py) with each whole request, and the loop's `_watch`,
    `_close`, `_refuse` and `_drain` (connections.py)."""

    def _init_reading(self) -> None:
        self.recv_buf = bytearray(SPOOL_RECV_BYTES)
        self.max_line, self.max_fields, self.max_field = gunicorn_private.head_limits(self.cfg)
        # A partial head this long gets gunicorn's verdict (431) without waiting for its end.
        self.max_head = self.max_line + 2 + self.max_fields * (self.max_field + 2) + 4 + 1
        # The app's say on `Expect: 100-continue` requests (set by _wire_app, once it is
        # loaded).
        self.answered_before_body: Any = None

    def _on_readable(self, conn: Conn) -> None:
        if conn.state == LINGERING:
            self._drain(conn)
            return
        sock = conn.sock
        try:
            if conn.spool is not None and conn.chunks is None:
                # A large body of known length: straight from the socket to its file.
                n = sock.recv_into(self.recv_buf, min(conn.need, SPOOL_RECV_BYTES), NOWAIT)
                if n:
                    self._spooled(conn, n)
                    return
                data = b""
            else:
                size = SPOOL_RECV_BYTES if conn.spool is not None else RECV_BYTES
                data = sock.recv(size, NOWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            if conn.req is not None:
                # The client stopped sending inside a body and waits for the verdict: the
                # body reader meets the end as it would on the socket (the app says 400).
                conn.close_after = True
                self._hand_over(conn)
            else:
                # Nothing, or a partial head: dropped, as gunicorn's parser does.
                self._close(conn)
            return
        if conn.shed:  # a request begins: no longer idle or head-less (admission.py)
            self._sheddable(conn, False)
        if conn.idle:
            conn.idle = False
            self.keepalived_conns.discard(conn)
            conn.deadline = time.monotonic() + REQUEST_READ_SECS
        self._received(conn, data)

    def _received(self, conn: Conn, data: bytes | bytearray) -> None:
        if conn.req is None:
            self._head(conn, data)
        else:
            self._body(conn, data)

    def _head(self, conn: Conn, data: bytes | bytearray) -> None:
        if conn.buf:
            buf = conn.buf if isinstance(conn.buf, bytearray) else bytearray(conn.buf)
            buf += data
        else:
            buf = data
        scanned, conn.scanned = conn.scanned, len(buf)
        end = buf.find(b"\r\n\r\n", max(scanned - 3, 0))
        if end < 0 and not self._verdict_due(buf, scanned):
            conn.buf = buf
            return
        # TCP only: for a UNIX socket gunicorn makes SERVER_NAME of the Host header; its own
        # path stays the one for those.
        if end >= 0 and self.fast and conn.client.__class__ is tuple:
            head = fasthttp.parse_head(buf, end + 4, self.max_line, self.max_field, self.max_fields)
            if head is not None:
                self._took_head(conn, head)
                conn.length = conn.need = head.content_length
                self._to_body(conn, buf[end + 4 :])
                return
        received = gunicorn_private.HeadBytes(buf)
        try:
            req = gunicorn_private.parse_request(
                self.cfg, received, conn.client, conn.req_count + 1
            )
        except gunicorn_private.Incomplete:
            conn.buf = buf
            return
        except Exception as exc:  # gunicorn's verdict on the head: its own error page
            self._refuse(conn, exc)
            return
        self._took_head(conn, req)
        framing = gunicorn_private.body_framing(req)
        if isinstance(framing, tuple):
            conn.chunks = ChunkScanner(*framing)
            conn.need = -1
        else:
            conn.length = conn.need = framing
        # `Expect: 100-continue` is answered here, where the body is read, and never from the
        # request thread (gunicorn's place for it), which would send it after the body.
        expects = gunicorn_private.take_expect_continue(req)
        if expects and self._answered_before_body(conn, req):
            self._without_body(conn, req)
            return
        self._to_body(conn, buf[received.consumed() :])
        if expects and conn.state == READING:
            # On failure the client sends its body after a pause anyway (or it is gone).
            with contextlib.suppress(OSError):
                conn.out.sendall(_CONTINUE)

    def _took_head(self, conn: Conn, req: Request | fasthttp.Head) -> None:
        """A whole head was read: gunicorn's (Request) or a plain one (fasthttp.py)."""
        conn.buf = b""
        conn.scanned = 0
        conn.req = req
        conn.req_count += 1

    def _to_body(self, conn: Conn, rest: bytes | bytearray) -> None:
        """After a head (its framing set): what arrived beyond it is the body's; a request
        without one goes to be answered, one whose body is still to come waits for it."""
        if rest:
            self._body(conn, rest)
        elif conn.need == 0:
            self._hand_over(conn)
        elif conn not in self.waiting:
            self._watch(conn)

    def _answered_before_body(self, conn: Conn, req: Request) -> bool:
        """Whether the app answers this request whatever its body (a refused key, a declared
        length over its limit): then no `100 Continue` invites the body."""
        ask = self.answered_before_body
        if ask is None:
            return False
        try:
            environ = gunicorn_private.environ_of(req, conn.out, conn.client, conn.server, self.cfg)
            return bool(ask(environ))
        except Exception:
            # A head gunicorn cannot make an environ of gets that verdict in the thread, as
            # any other request; the app's own failure is logged and changes nothing.
            self.log.debug("No early verdict on a request of %s", conn.client, exc_info=True)
            return False

    def _without_body(self, conn: Conn, req: Request) -> None:
        """Hand a request over with an empty body, to be answered and the connection closed:
        its body was never invited, and what of it arrives is drained by the lingering close
        rather than read as the next request."""
        gunicorn_private.give_no_body(req)  # the answer says `Connection: close`
        conn.close_after = True
        conn.chunks = None
        conn.length = conn.need = 0
        conn.buf = b""
        self._hand_over(conn)

    def _verdict_due(self, buf: bytes | bytearray, scanned: int) -> bool:
        """Whether gunicorn would refuse this unfinished head already: a bare LF, a request
        line or a head over its limits. Without this such a head would just wait until its
        deadline and be dropped without the 400/414/431 answer."""
        n = len(buf)
        if n > self.max_head:
            return True
        if n > self.max_line + 2 and buf.find(b"\r\n", 0, self.max_line + 2) < 0:
            return True
        at = buf.find(b"\n", max(scanned - 1, 0))
        while at >= 0:
            if at == 0 or buf[at - 1] != 13:
                return True
            at = buf.find(b"\n", at + 1)
        return False

    def _body(self, conn: Conn, data: bytes | bytearray) -> None:
        rest: bytes | bytearray = b""
        if conn.chunks is None:
            take = min(conn.need, len(data))
            if take < len(data):
                data, rest = data[:take], data[take:]
            conn.need -= take
            done = conn.need == 0
        else:
            try:
                end = conn.chunks.feed(bytes(data))
            except Malformed:
                end = len(data)
                conn.close_after = True  # its reader will refuse it; the rest is unknown
            done = end >= 0
            if done and end < len(data):
                data, rest = data[:end], data[end:]
        if data and not self._keep(conn, data):
            return
        if done:
            conn.buf = rest
            self._body_done(conn)
        elif conn not in self.waiting:
            self._watch(conn)

    def _keep(self, conn: Conn, data: bytes | bytearray) -> bool:
        """Keep received body bytes for the thread (or drop them, `_no_room`); False when the
        connection was closed instead."""
        conn.body_bytes += len(data)
        if conn.dropping:
            return True
        try:
            if conn.spool is not None:
                conn.spool.write(data)
                return True
            if not conn.body:
                conn.body = data
            else:
                if not isinstance(conn.body, bytearray):
                    conn.body = bytearray(conn.body)
                conn.body += data
            if len(conn.body) > MEMORY_BODY_BYTES:
                conn.spool = tempfile.TemporaryFile()  # noqa: SIM115 - closed after the request
                conn.spool.write(conn.body)
                conn.body = b""
            return True
        except OSError as exc:
            self._no_room(conn, exc)
            return True

    def _spooled(self, conn: Conn, n: int) -> None:
        """`n` bytes of a large body were read into recv_buf: to its file."""
        conn.need -= n
        conn.body_bytes += n
        try:
            conn.spool.write(memoryview(self.recv_buf)[:n])  # type: ignore[union-attr]
        except OSError as exc:
            self._no_room(conn, exc)
        if conn.need == 0:
            self._body_done(conn)

    def _body_done(self, conn: Conn) -> None:
        """The whole body has arrived: to be answered; or, when it could not be kept, the
        connection closes after the answer it already has."""
        if not conn.dropping:
            self._hand_over(conn)
            return
        conn.reset()
        conn.buf = b""
        self._finish(conn, False)

    def _no_room(self, conn: Conn, exc: OSError) -> None:
        """The body cannot be kept (TMPDIR is full, or failing): answer 503 at once, read the
        rest of the body and drop it (a client that sends its whole body before it reads the
        answer would otherwise meet a reset and never see it), then close."""
        self.log.warning("Cannot keep a request body of %s: %s; answered 503", conn.client, exc)
        if conn.spool is not None:
            with contextlib.suppress(OSError):
                conn.spool.close()
            conn.spool = None
        conn.body = b""
        conn.dropping = True
        conn.close_after = True
        with contextlib.suppress(OSError):  # the write buffer takes it without waiting
            conn.out.sendall(NO_ROOM)
