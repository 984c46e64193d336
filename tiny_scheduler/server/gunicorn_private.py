"""Every gunicorn internal the worker relies on, in one place, so that an upgrade of gunicorn
is checked here and nowhere else.

gunicorn documents its settings, its hooks and `Worker`'s life cycle; it does not document its
request parser, its body readers, its WSGI glue or the inside of `gthread`. The worker needs
a few of those to keep gunicorn's HTTP rules (its parser's verdicts, its body decoding, its
environ and its response code) while reading in its own loop. Each such use is a small named
function or constant below, with what it leans on; everything was read against
CHECKED_AGAINST, and a new gunicorn wants these read again (`tests/test_fasthttp.py`,
`tests/test_slow_clients.py` and `tests/test_front_door.py` fail loudly on most changes).

What the worker takes from `gthread.ThreadWorker` by inheritance, beside `Worker`'s public
life cycle (`init_process`, `notify`, `alive`, `wsgi`, `cfg`, `log`, `sockets`, `nr`,
`max_requests`, `handle_error`) and gthread's one documented hook (`get_thread_pool`), and
so must also be checked on an upgrade: `handle_request(req, conn)` (the request run through
gunicorn's response code; it reads `keepalived_conns` and `max_keepalived` to decide the
keep-alive), `is_parent_alive()`, `handle_exit` (which wakes the loop through
`method_queue.defer`), and the attributes `poller`, `method_queue`, `tpool`, `nr_conns` and
`worker_connections`, which gthread creates and the worker reuses. gthread's
`set_accept_enabled` with its `_accepting` flag and its `STOP_KEEPALIVE_LINGER` are no longer
used: the worker has its own (`connections.py`).
"""

from __future__ import annotations

from typing import IO, Any

from gunicorn.http import wsgi
from gunicorn.http.body import Body, ChunkedReader, LengthReader
from gunicorn.http.errors import NoMoreData
from gunicorn.http.message import (
    DEFAULT_MAX_HEADERFIELD_SIZE,
    MAX_HEADERS,
    MAX_REQUEST_LINE,
    Request,
)
from gunicorn.http.unreader import Unreader

__all__ = [
    "CHECKED_AGAINST",
    "BodySource",
    "HeadBytes",
    "Incomplete",
    "NoMoreData",
    "Request",
    "base_environ",
    "body_failed",
    "body_framing",
    "environ_of",
    "give_body",
    "give_no_body",
    "head_limits",
    "parse_request",
    "response_of",
    "take_expect_continue",
]

CHECKED_AGAINST = "27.0.1"
"""The gunicorn version every use below was read against."""

_HEAD_READ = 8192
"""gunicorn's parser is handed a head in pieces of this size, as its socket reader does
(`SocketUnreader`'s default, 27.0.1), so it reaches its own size verdicts (414, 431) the same
way."""


def head_limits(cfg: Any) -> tuple[int, int, int]:
    """(request line, header fields, one field's size): the limits gunicorn's parser applies,
    from the settings and the parser's own ceilings (message.py's module constants, 27.0.1)."""
    limit_line = cfg.limit_request_line
    max_line = min(limit_line, MAX_REQUEST_LINE) if limit_line > 0 else MAX_REQUEST_LINE
    fields = cfg.limit_request_fields
    max_fields = fields if 0 < fields <= MAX_HEADERS else MAX_HEADERS
    field_size = cfg.limit_request_field_size
    max_field = field_size if field_size > 0 else DEFAULT_MAX_HEADERFIELD_SIZE
    return max_line, max_fields, max_field


class Incomplete(Exception):
    """The head parser asked for bytes that have not arrived yet."""


class HeadBytes(Unreader):
    """The bytes of a head received so far, as gunicorn's parser reads a socket. Leans on
    `Unreader` calling `chunk()` for more and keeping what the parser pushed back in its
    `buf` (27.0.1)."""

    def __init__(self, data: bytes | bytearray) -> None:
        super().__init__()
        self.data = data
        self.pos = 0

    def chunk(self, size_hint: int | None = None) -> bytes:
        pos, data = self.pos, self.data
        if pos >= len(data):
            raise Incomplete
        self.pos = pos + _HEAD_READ
        if pos == 0 and len(data) <= _HEAD_READ and isinstance(data, bytes):
            return data  # the usual case: the whole head in one piece, no copy
        return bytes(data[pos : pos + _HEAD_READ])

    def consumed(self) -> int:
        """Bytes the parser used: what it was served minus what it pushed back."""
        return min(self.pos, len(self.data)) - len(self.buf.getvalue())


class BodySource(Unreader):
    """A received body as gunicorn's body readers read a socket: from memory, or from the
    temporary file it was spooled to, in pieces of at most gunicorn's own largest read."""

    max_read = 1024 * 1024

    def __init__(self, data: bytes, spool: IO[bytes] | None) -> None:
        super().__init__()
        self.data = data
        self.spool = spool

    def chunk(self, size_hint: int | None = None) -> bytes:
        if self.spool is not None:
            return self.spool.read(min(max(size_hint or 0, 64 * 1024), self.max_read))
        data, self.data = self.data, b""
        return data


def parse_request(cfg: Any, head: HeadBytes, client: Any, number: int) -> Request:
    """gunicorn's parse of a head (raises its verdict, or Incomplete); `number`: the request's
    place on its connection (`Request.__init__`'s `req_number`, 27.0.1)."""
    return Request(cfg, head, client, number)


def take_expect_continue(req: Request) -> bool:
    """Whether the head said `Expect: 100-continue`, and take that answer over: gunicorn sends
    `100 Continue` from `wsgi.create` when `req._expected_100_continue` is set (27.0.1), which
    in a request thread is after the body; the loop sends it where it reads the body."""
    expects = bool(req._expected_100_continue)
    req._expected_100_continue = False
    return expects


def body_framing(req: Request) -> tuple[int, int] | int:
    """How the parsed request's body is framed: (chunk size line limit, trailer limit) for a
    chunked body, else its Content-Length (0 without a body). Read off the body reader gunicorn
    chose (`req.body.reader`: `ChunkedReader`'s limits, `LengthReader.length`, 27.0.1)."""
    reader = req.body.reader
    if isinstance(reader, ChunkedReader):
        return reader.limit_chunk_size_line, reader.limit_trailer_section
    return getattr(reader, "length", 0)


def give_body(
    req: Request, data: bytes, spool: IO[bytes] | None, chunked: bool, length: int
) -> None:
    """Have gunicorn read the body the loop received (in `data`, or in `spool`) as if from the
    socket: its own readers over our source, so a chunked body is decoded and refused by
    gunicorn (`req.body` and `req.unreader` replaced, 27.0.1)."""
    source = BodySource(data, spool)
    req.unreader = source
    if chunked:
        req.body = Body(ChunkedReader(req, source))
    else:
        req.body = Body(LengthReader(source, length))


def give_no_body(req: Request) -> None:
    """The request is answered without its body, and its answer closes the connection
    (`req.must_close`, which gunicorn's Response reads, 27.0.1)."""
    req.body = Body(LengthReader(BodySource(b"", None), 0))
    req.must_close = True


def body_failed(req: Request) -> bool:
    """Whether gunicorn's reader found the body broken (`Body.failed`, 27.0.1): then what
    follows on the connection cannot be trusted to be the next request."""
    return bool(req.body.failed)


def base_environ(cfg: Any) -> dict[str, Any]:
    """The part of gunicorn's environ that is the same for every request (`wsgi.base_environ`)."""
    return wsgi.base_environ(cfg)


def environ_of(req: Request, sock: Any, client: Any, server: Any, cfg: Any) -> dict[str, Any]:
    """The environ gunicorn builds for a parsed request (`wsgi.create`, without its response)."""
    return wsgi.create(req, sock, client, server, cfg)[1]


def response_of(start_response: Any) -> Any:
    """The object that writes an answer, from the `start_response` the app was given: with
    gunicorn's it is the bound method of its `Response` (27.0.1), with the plain path's the one
    of `fasthttp.Reply`; both have `send_headers`, `write` and `close`."""
    return start_response.__self__
