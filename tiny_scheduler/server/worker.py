"""The daemon's gunicorn worker: `gthread`, except that a request thread only ever sees a
request that has arrived in full, and never waits on a client to write its answer.

This module owns the life of a client connection: accepting it, reading every request (head
and body) in the worker's event loop, the deadlines for that (REQUEST_READ_SECS,
BODY_MIN_RATE), the keep-alive idle time (gunicorn's `keepalive` setting), where a received
body waits for its thread (memory up to MEMORY_BODY_BYTES, then an unlinked temporary file),
sending what answers the kernel did not take at once, and closing (a lingering close, in the
loop). It also sizes the connection table to the open-files limit (`connection_limit`).

The design, one selector loop and a pool of request threads:

- The loop holds every connection that waits on its client: for a request to arrive, for
  the client to take an answer, for a lingering close. Only a connection with a whole
  request is handed to a thread (`_hand_over`), and it comes back to the loop when the
  thread is done (`_served`).
- Every write to a connection goes through its `WriteBuffer` (write_buffer.py), which
  gunicorn's code takes for the socket: a non-blocking send, and what the kernel does not
  take waits there for the loop, which sends it when the socket is writable. A thread thus
  finishes an answer that fits the write buffer's bound without waiting for the client at
  all; only an answer larger than that bound makes its thread wait for room, and never
  longer than the client's progress allows (write_buffer.RESPONSE_WRITE_SECS without any
  closes the connection).
- A connection whose answer still waits reads nothing more (`_finish`): a client that does
  not read gets no more of its pipelined requests answered, so what it costs stays bounded.
- Requests that wait on events hold no thread either (waiting.py says what the app hands
  over). An output read that has nothing yet returns `AskAgain`: the connection is parked in
  the loop (`_park`) until the signal it names fires or its deadline passes, and the same
  request then runs again on a thread. An event stream returns a `Stream`: a thread sends
  its headers, then the loop writes its chunks through the write buffer as they come (`_pump`),
  and drops a client whose unsent backlog passes STREAM_BACKLOG_BYTES. The WSGI app is
  called through `_Parking`, which puts `PARK_KEY` in every environ and turns those two
  bodies into exceptions that leave gunicorn's request handling before it writes anything.
- A plain request the app answers inline (inline.py: the agent poll, `/health`, a node's
  heartbeat) is answered in the loop itself (`_hand_over`): no hand-off to a thread and
  back, which cost more than the poll. When the app finds it must wait after all (a commit,
  a peer, the disk), it says so before changing anything, and the request runs again on a
  thread.
- Plain requests (fasthttp.py: nearly all) are parsed by httptools, in C, and answered
  without gunicorn's request and response objects (`_head`, `_answer`), with the same
  environ and the same framing.

The HTTP rules stay gunicorn's: anything fasthttp does not call plain (chunked bodies,
`Expect`, odd targets, a head past a limit, any parse error) goes through gunicorn's parser as
before, so malformed requests get its own 400/414/431 pages, and gunicorn decodes such a
body and formats its answer. The loop only finds where a request ends. Nothing here knows
the app's routes or limits: a body over MAX_REQUEST_BYTES is received like any other and the
app answers 413 as before. The one question asked of the app is before `100 Continue`: an
app with a method
`answered_before_body(environ) -> bool` (the scheduler's checks the key and the declared
length there) says which requests get their final answer at once instead, without their body.

Plain HTTP/1.x only: TLS, HTTP/2 and the PROXY protocol are refused at start-up (the
scheduler uses none of them; a terminating proxy in front can).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import io
import os
import queue
import resource
import selectors
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from gunicorn import http
from gunicorn.http import wsgi
from gunicorn.http.body import Body, ChunkedReader, LengthReader
from gunicorn.http.message import (
    DEFAULT_MAX_HEADERFIELD_SIZE,
    MAX_HEADERS,
    MAX_REQUEST_LINE,
    Request,
)
from gunicorn.http.unreader import Unreader
from gunicorn.workers import gthread

from . import fasthttp, inline
from .waiting import END, PARK_KEY, WAITED_KEY, AskAgain, Stream
from .write_buffer import OUTPUT_BUFFER_BYTES, WriteBuffer

REQUEST_READ_SECS = 10.0
"""Seconds a request may take to arrive in full, counted from its first byte (from the accept
for a connection's first request). Past that (plus the body allowance below) the connection
is closed without an answer: a stalled sender then costs a socket for at most this long."""

BODY_MIN_RATE = 64 * 1024
"""Bytes per second a body must keep up to earn more time: each body byte received moves the
request's deadline on by 1/BODY_MIN_RATE s, so a 100 MB report on a slow link still lands
while a trickle of a few bytes a second is dropped after REQUEST_READ_SECS."""

KEEPALIVE_SECS = 120
"""Seconds an idle kept-alive connection stays open (gunicorn's `keepalive` setting, which
gunicorn_conf sets to this). Agents and the Go CLI reuse connections idle up to 90 s; closing
first races their next request."""

MEMORY_BODY_BYTES = 64 * 1024
"""A body up to this many bytes waits for its thread in memory; a larger one goes to an
unlinked temporary file as it arrives, so memory does not follow body sizes."""

LINGER_SECS = 2.0
"""Seconds a closing connection is read and discarded after our FIN, so that request bytes
still in flight do not make the kernel reset it and destroy the last answer."""

LINGER_BYTES = 64 * 1024
"""Bytes a lingering close reads and discards at most."""

MAX_CONNECTIONS = 10_000
"""Connections the worker holds at most (idle, being read, or being answered)."""

RESERVED_FILES = 256
"""File descriptors kept out of the connection table: the database, logs, the pipes of the
worker, temporary files of bodies being received."""

SWEEP_SECS = 0.5
"""Seconds between sweeps for connections past their deadline."""

NOTIFY_SECS = 1.0
"""Seconds between heartbeats to the arbiter (each one is a syscall; its timeout is 60 s)."""

RECV_BYTES = 64 * 1024
"""Largest single read of a request head or of a body held in memory."""

SPOOL_RECV_BYTES = 256 * 1024
"""Largest single read of a body going to its temporary file."""

ACCEPT_BATCH = 64
"""Connections accepted per wake-up at most, so a burst does not starve the others."""

STREAM_BACKLOG_BYTES = OUTPUT_BUFFER_BYTES
"""Bytes of an event stream that may wait unsent for its client; past that the client reads
too slowly for the stream and is dropped (it reconnects and resumes, or gets a reset)."""

ACCEPT_PAUSE_SECS = 0.5
"""Seconds accepting stops after the process ran out of file descriptors."""

_HEAD_READ = 8192
"""Gunicorn's parser is handed a head in pieces of this size, as its socket reader does, so
it reaches its own size verdicts (414, 431) the same way."""

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# Every read and write passes MSG_DONTWAIT (writes in write_buffer.py), so the sockets' own mode
# never matters and is never switched back and forth.
_NOWAIT = socket.MSG_DONTWAIT
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
_HEX_DIGITS = b"0123456789abcdefABCDEF"

# reading: the loop reads a request; busy: a thread has it; writing: the thread is done and
# its answer still waits in the write buffer; lingering: closing after the last answer.
_READING, _BUSY, _WRITING, _LINGERING, _CLOSED = "reading", "busy", "writing", "lingering", "closed"
# parked: a request waits in the loop to run again; streaming: the loop writes a stream's body.
_PARKED, _STREAMING = "parked", "streaming"


class _Park(Exception):
    """The app asked to run the request again later (raised out of gunicorn's handling)."""

    def __init__(self, ask: AskAgain) -> None:
        super().__init__("parked")
        self.ask = ask


class _Streaming(Exception):
    """The app answered with a stream: its headers are set, its body is the loop's to write."""

    def __init__(self, resp: Any, stream: Stream) -> None:
        super().__init__("streaming")
        self.resp = resp
        self.stream = stream


class _ToThread(Exception):
    """The app needs a thread for a request run in the loop (inline.py): nothing was sent."""


_TO_THREAD = "to a thread"  # what _serve returns for it


class _Parking:
    """The WSGI app as the worker calls it: `PARK_KEY` (and, for a request run again after it
    was parked, `WAITED_KEY`) in the environ, and the two waiting bodies and the inline
    request's `NEEDS_THREAD` turned into the exceptions above before they would be written
    as ordinary bodies."""

    def __init__(self, app: Any, local: threading.local) -> None:
        self.app = app
        self._local = local

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        environ[PARK_KEY] = True
        waited = getattr(self._local, "waited", None)
        if waited is not None:
            environ[WAITED_KEY] = waited
        body = self.app(environ, start_response)
        if body is inline.NEEDS_THREAD:
            raise _ToThread
        if isinstance(body, AskAgain):
            raise _Park(body)
        if isinstance(body, Stream):
            # gunicorn's start_response is its Response's bound method: the response to write
            # the stream's chunks with.
            raise _Streaming(start_response.__self__, body)
        return body

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)


def connection_limit() -> int:
    """Raise this process's soft open-files limit to its hard limit (a forked worker inherits
    it) and return how many connections the worker may then hold.

    Every connection held is a file descriptor, and the usual default soft limit (1024) is far
    below the idle and slow clients the daemon must hold.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_CONNECTIONS + RESERVED_FILES
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass  # stay within the soft limit we have
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(64, min(MAX_CONNECTIONS, soft - RESERVED_FILES))


class _Pool:
    """The request threads, fed from one queue. ThreadPoolExecutor's `submit` builds a Future
    and a work item and takes two locks per request, for results nobody here reads: a
    connection comes back to the loop through the method queue (`_served`).

    Like ThreadPoolExecutor, a thread is started only when none is idle: started all at once,
    the threads take requests in turn, and each one's malloc arena keeps the memory of the
    large bodies it handled (100 reports of 2 MiB grew the worker by 60 MB)."""

    def __init__(self, size: int, log: Any) -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._size = size
        self._idle = threading.Semaphore(0)
        self._log = log
        self._closed = False
        self._threads: list[threading.Thread] = []

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run fn(*args) on a request thread; RuntimeError once shut down."""
        if self._closed:
            raise RuntimeError("the request threads are shut down")
        self._tasks.put((fn, args))
        if not self._idle.acquire(blocking=False) and len(self._threads) < self._size:
            thread = threading.Thread(
                target=self._run, name=f"request-{len(self._threads)}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def shutdown(self, wait: bool = True) -> None:
        """No new tasks; the threads end once the queued ones ran."""
        self._closed = True
        for _ in self._threads:
            self._tasks.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def _run(self) -> None:
        while (task := self._tasks.get()) is not None:
            fn, args = task
            try:
                fn(*args)
            except BaseException:  # the task's own handling failed: keep the thread
                self._log.exception("Error in a request thread")
            self._idle.release()


class _Incomplete(Exception):
    """The head parser asked for bytes that have not arrived yet."""


class _Malformed(Exception):
    """A chunked body's framing is broken: where it ends is unknown."""


class _Received(Unreader):
    """The bytes of a head received so far, as gunicorn's parser reads a socket."""

    def __init__(self, data: bytes | bytearray) -> None:
        super().__init__()
        self.data = data
        self.pos = 0

    def chunk(self, size_hint: int | None = None) -> bytes:
        pos, data = self.pos, self.data
        if pos >= len(data):
            raise _Incomplete
        self.pos = pos + _HEAD_READ
        if pos == 0 and len(data) <= _HEAD_READ and isinstance(data, bytes):
            return data  # the usual case: the whole head in one piece, no copy
        return bytes(data[pos : pos + _HEAD_READ])

    def consumed(self) -> int:
        """Bytes the parser used: what it was served minus what it pushed back."""
        return min(self.pos, len(self.data)) - len(self.buf.getvalue())


class _BodySource(Unreader):
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


class _ChunkScanner:
    """Finds where a chunked body ends in the bytes fed to it, without decoding it: gunicorn's
    ChunkedReader decodes it in the request thread. Anything it cannot frame the way that
    reader would raises _Malformed, and the reader then gives the verdict."""

    __slots__ = ("left", "line", "line_limit", "state", "trailer", "trailer_limit")

    def __init__(self, line_limit: int, trailer_limit: int) -> None:
        self.state = "size"  # size line, chunk data, CRLF after data, trailer lines
        self.left = 0
        self.line = b""
        self.line_limit = line_limit
        self.trailer = 0
        self.trailer_limit = trailer_limit

    def feed(self, data: bytes) -> int:
        """Take the next received bytes; the offset in `data` just past the body's end, or -1
        when the body goes on."""
        i, n = 0, len(data)
        while i < n:
            if self.state == "data":
                step = min(self.left, n - i)
                self.left -= step
                i += step
                if not self.left:
                    self.state = "crlf"
                continue
            end = data.find(b"\n", i)
            if end < 0:
                self.line += data[i:]
                self._check_partial()
                return -1
            line = self.line + data[i : end + 1]
            self.line = b""
            i = end + 1
            if self._line(line):
                return i
        return -1

    def _check_partial(self) -> None:
        limit = self.line_limit if self.state != "trailer" else self.trailer_limit - self.trailer
        if len(self.line) > limit + 2:
            raise _Malformed

    def _line(self, line: bytes) -> bool:
        """Take one whole line; whether the body ends with it."""
        if not line.endswith(b"\r\n"):
            raise _Malformed  # a bare LF
        if self.state == "crlf":
            if line != b"\r\n":
                raise _Malformed
            self.state = "size"
            return False
        if self.state == "trailer":
            if line == b"\r\n":
                return True
            self.trailer += len(line)
            if self.trailer > self.trailer_limit:
                raise _Malformed
            return False
        if len(line) > self.line_limit + 2:
            raise _Malformed
        size, *extension = line[:-2].split(b";", 1)
        if extension:
            size = size.rstrip(b" \t")  # whitespace before an extension only, as gunicorn
        if not size or size.strip(_HEX_DIGITS):
            raise _Malformed
        self.left = int(size, 16)
        self.state = "data" if self.left else "trailer"
        return False


class _Answering:
    """What gunicorn's handle_request takes as a connection: the write buffer as its socket."""

    __slots__ = ("client", "server", "sock")

    def __init__(self, sock: WriteBuffer, client: Any, server: Any) -> None:
        self.sock = sock
        self.client = client
        self.server = server


class _Conn:
    """One client connection and the request being received on it."""

    __slots__ = (
        "answering",
        "armed",
        "body",
        "body_bytes",
        "buf",
        "chunks",
        "client",
        "close_after",
        "deadline",
        "drained",
        "events",
        "idle",
        "keep",
        "length",
        "need",
        "out",
        "req",
        "req_count",
        "scanned",
        "server",
        "sock",
        "spool",
        "state",
        "wake_cb",
    )

    def __init__(
        self,
        sock: socket.socket,
        client: Any,
        server: Any,
        deadline: float,
        wake: Callable[[_Conn], None],
        loop_thread: int,
    ) -> None:
        self.sock = sock
        self.client = client
        self.server = server
        self.out = WriteBuffer(sock, functools.partial(wake, self), loop_thread)
        self.answering = _Answering(self.out, client, server)
        self.state = _READING
        self.events = 0  # what the selector watches the socket for
        self.keep = False  # once written out, whether the answered request lets another come
        self.deadline = deadline
        self.idle = False  # between requests on a kept-alive connection
        self.buf: bytes | bytearray = b""  # head bytes so far, or the next pipelined request
        self.scanned = 0  # bytes of buf already searched for the end of the head
        self.req: Request | fasthttp.Head | None = None  # the head, once it has arrived
        self.req_count = 0
        self.close_after = False
        self.length = 0  # the body's Content-Length
        self.need = 0  # body bytes still to come (Content-Length framing)
        self.chunks: _ChunkScanner | None = None  # chunked framing
        self.body: bytes | bytearray = b""
        self.spool: IO[bytes] | None = None
        self.body_bytes = 0
        self.drained = 0  # bytes discarded by a lingering close
        self.wake_cb: Callable[[], None] | None = None  # subscribed to a parked wait's signal
        self.armed = False  # a stream's wake-up is subscribed

    def reset(self) -> None:
        """Forget the request just served."""
        self.req = None
        self.chunks = None
        self.body = b""
        self.spool = None
        self.body_bytes = self.length = self.need = 0


class BufferingWorker(gthread.ThreadWorker):
    """gunicorn's `gthread` worker with the reading of requests moved into its event loop.

    Idle, slow and silent connections are held by the loop (a selector), never by the thread
    pool; a connection goes to a thread once a whole request (head and body) has arrived, and
    comes back to the loop for the next one.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Connections the loop watches (reading or lingering), swept for deadlines; the idle
        # ones are also in keepalived_conns, which gthread's handle_request counts.
        self.waiting: set[_Conn] = set()
        self.keepalived_conns: set[_Conn] = set()  # type: ignore[assignment]
        # Connections whose answers wait in their write buffer for the socket to be writable,
        # swept for clients that take none of them.
        self.writing: set[_Conn] = set()
        # Requests parked until their signal fires or their deadline passes, and streams
        # whose bodies the loop writes.
        self.parked: dict[_Conn, tuple[Request, AskAgain]] = {}
        self.streams: dict[_Conn, tuple[Any, Stream]] = {}
        self.serving = threading.local()  # per request thread: the deadline of a parked wait
        self.loop_thread = 0  # the thread running the loop (set by run)
        # The app's say on `Expect: 100-continue` requests (set by run, once it is loaded).
        self.answered_before_body: Callable[[dict[str, Any]], bool] | None = None
        self.listener_names: dict[Any, Any] = {}
        self.accept_paused_until = 0.0
        self.recv_buf = bytearray(SPOOL_RECV_BYTES)
        limit_line = self.cfg.limit_request_line
        self.max_line = min(limit_line, MAX_REQUEST_LINE) if limit_line > 0 else MAX_REQUEST_LINE
        fields = self.cfg.limit_request_fields
        self.max_fields = fields if 0 < fields <= MAX_HEADERS else MAX_HEADERS
        field_size = self.cfg.limit_request_field_size
        self.max_field = field_size if field_size > 0 else DEFAULT_MAX_HEADERFIELD_SIZE
        # A partial head this long gets gunicorn's verdict (431) without waiting for its end.
        self.max_head = self.max_line + 2 + self.max_fields * (self.max_field + 2) + 4 + 1
        # Plain requests skip gunicorn's request and response objects (fasthttp.py), unless
        # an access log is asked for: gunicorn writes its lines from those objects.
        self.fast = not self.cfg.accesslog
        self.base_environ: dict[str, Any] = wsgi.base_environ(self.cfg)
        self.script_name = os.environ.get("SCRIPT_NAME", "")
        # Whether the app answers plain requests in the loop (set by run: inline.py).
        self.inline = False
        # Connections whose next pipelined request has arrived, read at the end of a round
        # of events rather than from inside the answer to the last one.
        self.pipelined: collections.deque[_Conn] = collections.deque()

    def get_thread_pool(self) -> _Pool:  # gunicorn's hook: gthread makes its tpool here
        return _Pool(self.cfg.threads, self.log)

    @classmethod
    def check_config(cls, cfg: Any, log: Any) -> None:
        super().check_config(cfg, log)
        if cfg.is_ssl or "h2" in cfg.http_protocols or cfg.proxy_protocol != "off":
            raise RuntimeError(
                "tiny_scheduler.server.worker serves plain HTTP/1.x only: no TLS, HTTP/2 or PROXY "
                "protocol (terminate them in a proxy in front)"
            )

    # --- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        self.loop_thread = threading.get_ident()
        self.answered_before_body = getattr(self.wsgi, "answered_before_body", None)
        self.inline = self.fast and bool(getattr(self.wsgi, "inline_requests", False))
        self.wsgi = _Parking(self.wsgi, self.serving)
        self.poller.register(
            self.method_queue.fileno(), selectors.EVENT_READ, self.method_queue.run_callbacks
        )
        self.set_accept_enabled(True)
        next_sweep = next_notify = 0.0
        while self.alive:
            now = time.monotonic()
            if now >= next_notify:
                self.notify()
                next_notify = now + NOTIFY_SECS
            self._update_accepting(now)
            self._dispatch_events(SWEEP_SECS)
            if not self.is_parent_alive():
                break
            now = time.monotonic()
            if now >= next_sweep:
                self._sweep(now)
                next_sweep = now + SWEEP_SECS
        self._stop()

    def _dispatch_events(self, timeout: float) -> None:
        try:
            events = self.poller.select(timeout)
        except InterruptedError:
            return
        for key, mask in events:
            data = key.data
            try:
                if data.__class__ is _Conn:
                    # Writable first: a connection waits either for its answer to go out or
                    # for its next request, only a 100 Continue may wait during a body.
                    if mask & _WRITE:
                        self._on_writable(data)
                    if mask & _READ and data in self.waiting:
                        self._on_readable(data)
                else:
                    data(key.fileobj)
            except Exception:
                # One connection's surprise must not end the worker and every other one.
                self.log.exception("Error in the connection loop")
                if data.__class__ is _Conn:
                    self._close(data)
        while self.pipelined:
            conn = self.pipelined.popleft()
            try:
                self._next_pipelined(conn)
            except Exception:
                self.log.exception("Error in the connection loop")
                self._close(conn)

    def _stop(self) -> None:
        """Stop gracefully: no new connections; idle ones close soon (a request already on
        its way is still answered, with `Connection: close`); requests being received or
        served get until the graceful timeout."""
        self.set_accept_enabled(False)
        now = time.monotonic()
        soon = now + gthread.STOP_KEEPALIVE_LINGER
        for conn in self.waiting:
            if conn.idle or (conn.state == _READING and not conn.buf and conn.req is None):
                conn.deadline = min(conn.deadline, soon)
        give_up = now + self.cfg.graceful_timeout
        next_notify = 0.0
        while self.nr_conns > 0 and time.monotonic() < give_up:
            now = time.monotonic()
            if now >= next_notify:
                self.notify()
                next_notify = now + NOTIFY_SECS
            self._dispatch_events(0.2)
            self._sweep(time.monotonic())
        for conn in [*self.waiting, *self.writing, *self.parked, *self.streams]:
            self._close(conn)
        self.tpool.shutdown(wait=False)
        self.poller.close()
        self.method_queue.close()
        for listener in self.sockets:
            listener.close()

    def _sweep(self, now: float) -> None:
        """Close the connections past their deadline: idle ones after `keepalive`, requests
        that did not arrive in time, lingering closes that ran out, clients that took none of
        their answers for write_buffer.RESPONSE_WRITE_SECS."""
        expired = [
            conn for conn in self.waiting if now >= conn.deadline + conn.body_bytes / BODY_MIN_RATE
        ]
        for conn in expired:
            if conn.state == _READING and not conn.idle:
                self.log.debug("Closing %s: no whole request in time", conn.client)
            self._close(conn)
        for conn in [conn for conn in self.writing if conn.out.stalled(now)]:
            self.log.debug("Closing %s: it did not read its answers", conn.client)
            self._close(conn)
        for conn in [conn for conn, (_, ask) in self.parked.items() if now >= ask.deadline]:
            self._unpark(conn)
        for conn in [c for c, (_, stream) in self.streams.items() if now >= stream.next_deadline()]:
            self._pump(conn)

    # --- accepting --------------------------------------------------------------------------

    def _update_accepting(self, now: float) -> None:
        can = self.nr_conns < self.worker_connections and now >= self.accept_paused_until
        if can != self._accepting:
            self.set_accept_enabled(can)

    def accept(self, listener: socket.socket) -> None:
        server = self.listener_names.get(listener)
        if server is None:
            server = self.listener_names[listener] = listener.getsockname()
        deadline = time.monotonic() + REQUEST_READ_SECS
        for _ in range(ACCEPT_BATCH):
            if self.nr_conns >= self.worker_connections:
                return
            try:
                sock, client = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # The listener stays readable: without a pause the loop would spin.
                    self.log.warning(
                        "Cannot accept (%s): pausing for %.1f s", exc, ACCEPT_PAUSE_SECS
                    )
                    self.accept_paused_until = time.monotonic() + ACCEPT_PAUSE_SECS
                    self.set_accept_enabled(False)
                    return
                raise
            if sock.gettimeout() is not None:
                sock.settimeout(None)  # a default timeout would make reads wait in the loop
            self.nr_conns += 1
            conn = _Conn(sock, client, server, deadline, self._wake, self.loop_thread)
            self._watch(conn)

    # --- reading a request ----------------------------------------------------------------

    def _watch(self, conn: _Conn) -> None:
        conn.state = _READING
        self.waiting.add(conn)
        self._select(conn)

    def _unwatch(self, conn: _Conn) -> None:
        self.waiting.discard(conn)
        self.keepalived_conns.discard(conn)
        self._select(conn)

    def _select(self, conn: _Conn) -> None:
        """Have the selector watch the socket for what the connection waits for: readable
        while a request (or a lingering close) is read, writable while answers wait."""
        events = (_READ if conn in self.waiting else 0) | (_WRITE if conn in self.writing else 0)
        if events == conn.events:
            return
        with contextlib.suppress(KeyError, ValueError, OSError):
            if not events:
                self.poller.unregister(conn.sock)
            elif conn.events:
                self.poller.modify(conn.sock, events, conn)
            else:
                self.poller.register(conn.sock, events, conn)
        conn.events = events

    def _on_readable(self, conn: _Conn) -> None:
        if conn.state == _LINGERING:
            self._drain(conn)
            return
        sock = conn.sock
        try:
            if conn.spool is not None and conn.chunks is None:
                # A large body of known length: straight from the socket to its file.
                n = sock.recv_into(self.recv_buf, min(conn.need, SPOOL_RECV_BYTES), _NOWAIT)
                if n:
                    self._spooled(conn, n)
                    return
                data = b""
            else:
                size = SPOOL_RECV_BYTES if conn.spool is not None else RECV_BYTES
                data = sock.recv(size, _NOWAIT)
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
        if conn.idle:
            conn.idle = False
            self.keepalived_conns.discard(conn)
            conn.deadline = time.monotonic() + REQUEST_READ_SECS
        self._received(conn, data)

    def _received(self, conn: _Conn, data: bytes | bytearray) -> None:
        if conn.req is None:
            self._head(conn, data)
        else:
            self._body(conn, data)

    def _head(self, conn: _Conn, data: bytes | bytearray) -> None:
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
        received = _Received(buf)
        try:
            req = Request(self.cfg, received, conn.client, conn.req_count + 1)
        except _Incomplete:
            conn.buf = buf
            return
        except Exception as exc:  # gunicorn's verdict on the head: its own error page
            self._refuse(conn, exc)
            return
        self._took_head(conn, req)
        reader = req.body.reader
        if isinstance(reader, ChunkedReader):
            conn.chunks = _ChunkScanner(reader.limit_chunk_size_line, reader.limit_trailer_section)
            conn.need = -1
        else:
            conn.length = conn.need = getattr(reader, "length", 0)
        # `Expect: 100-continue` is answered here, where the body is read, and never from the
        # request thread (gunicorn's place for it), which would send it after the body.
        expects = req._expected_100_continue
        req._expected_100_continue = False
        if expects and self._answered_before_body(conn, req):
            self._without_body(conn, req)
            return
        self._to_body(conn, buf[received.consumed() :])
        if expects and conn.state == _READING:
            # On failure the client sends its body after a pause anyway (or it is gone).
            with contextlib.suppress(OSError):
                conn.out.sendall(_CONTINUE)

    def _took_head(self, conn: _Conn, req: Request | fasthttp.Head) -> None:
        """A whole head was read: gunicorn's (Request) or a plain one (fasthttp.py)."""
        conn.buf = b""
        conn.scanned = 0
        conn.req = req
        conn.req_count += 1

    def _to_body(self, conn: _Conn, rest: bytes | bytearray) -> None:
        """After a head (its framing set): what arrived beyond it is the body's; a request
        without one goes to be answered, one whose body is still to come waits for it."""
        if rest:
            self._body(conn, rest)
        elif conn.need == 0:
            self._hand_over(conn)
        elif conn not in self.waiting:
            self._watch(conn)

    def _answered_before_body(self, conn: _Conn, req: Request) -> bool:
        """Whether the app answers this request whatever its body (a refused key, a declared
        length over its limit): then no `100 Continue` invites the body."""
        ask = self.answered_before_body
        if ask is None:
            return False
        try:
            _, environ = wsgi.create(req, conn.out, conn.client, conn.server, self.cfg)
            return bool(ask(environ))
        except Exception:
            # A head gunicorn cannot make an environ of gets that verdict in the thread, as
            # any other request; the app's own failure is logged and changes nothing.
            self.log.debug("No early verdict on a request of %s", conn.client, exc_info=True)
            return False

    def _without_body(self, conn: _Conn, req: Request) -> None:
        """Hand a request over with an empty body, to be answered and the connection closed:
        its body was never invited, and what of it arrives is drained by the lingering close
        rather than read as the next request."""
        req.body = Body(LengthReader(_BodySource(b"", None), 0))
        req.must_close = True  # the answer says `Connection: close`
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

    def _body(self, conn: _Conn, data: bytes | bytearray) -> None:
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
            except _Malformed:
                end = len(data)
                conn.close_after = True  # its reader will refuse it; the rest is unknown
            done = end >= 0
            if done and end < len(data):
                data, rest = data[:end], data[end:]
        if data and not self._keep(conn, data):
            return
        if done:
            conn.buf = rest
            self._hand_over(conn)
        elif conn not in self.waiting:
            self._watch(conn)

    def _keep(self, conn: _Conn, data: bytes | bytearray) -> bool:
        """Keep received body bytes for the thread; False when they cannot be kept (the
        connection is then closed)."""
        conn.body_bytes += len(data)
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
            self.log.warning("Cannot keep a request body of %s: %s", conn.client, exc)
            self._close(conn)
            return False

    def _spooled(self, conn: _Conn, n: int) -> None:
        """`n` bytes of a large body were read into recv_buf: to its file."""
        conn.need -= n
        conn.body_bytes += n
        try:
            conn.spool.write(memoryview(self.recv_buf)[:n])  # type: ignore[union-attr]
        except OSError as exc:
            self.log.warning("Cannot keep a request body of %s: %s", conn.client, exc)
            self._close(conn)
            return
        if conn.need == 0:
            self._hand_over(conn)

    # --- handing over to a thread and back --------------------------------------------------

    def _hand_over(self, conn: _Conn) -> None:
        """The whole request has arrived: answer it here if it is a plain request the app
        answers inline (inline.py), else give it to a thread."""
        req = conn.req
        assert req is not None
        if conn.spool is not None:
            conn.spool.seek(0)
        plain = req.__class__ is fasthttp.Head
        if not plain and (conn.chunks is not None or conn.length):
            source = _BodySource(bytes(conn.body), conn.spool)
            req.unreader = source
            if conn.chunks is not None:
                req.body = Body(ChunkedReader(req, source))
            else:
                req.body = Body(LengthReader(source, conn.length))
        conn.state = _BUSY
        # Not HEAD: werkzeug drops a HEAD answer's body, and with it NEEDS_THREAD. Not a body
        # in a file: a second run needs it from the start, and the first one closes it.
        if plain and self.inline and req.method != "HEAD" and conn.spool is None:
            # The socket stays registered meanwhile: nothing else runs in the loop until
            # this returns, and a kept-alive connection is then watched as it was.
            with inline.answering():
                outcome = self._serve(conn, req)
            if outcome is not _TO_THREAD:
                self._served(conn, outcome, req)
                return
        self._unwatch(conn)
        try:
            self.tpool.submit(self._serve_and_return, conn, req)
        except RuntimeError:  # the pool is shut down: the worker is exiting
            self._close(conn)

    def _serve_and_return(
        self, conn: _Conn, req: Request | fasthttp.Head, waited: float | None = None
    ) -> None:
        """In a thread: answer the request, then give the connection back to the loop.
        `waited`: the deadline of the parked wait after which it runs again."""
        keep: bool | _Park | _Streaming = False
        self.serving.waited = waited
        try:
            keep = self._serve(conn, req)
        finally:
            self.serving.waited = None
            self.method_queue.defer(self._served, conn, keep, req)

    def _serve(self, conn: _Conn, req: Request | fasthttp.Head) -> bool | _Park | _Streaming | str:
        """Answer one request (in a thread, or inline in the loop); whether the connection
        may serve another, or the waiting the app asked for (the loop takes the connection
        over), or _TO_THREAD: an inline request needs a thread after all."""
        try:
            if req.__class__ is fasthttp.Head:
                return self._answer(conn, req)  # type: ignore[arg-type]
            keep = self.handle_request(req, conn.answering)  # type: ignore[arg-type]
            return bool(keep) and not req.body.failed  # type: ignore[union-attr]
        except _ToThread:
            return _TO_THREAD
        except _Park as park:
            return park
        except _Streaming as streaming:
            try:
                streaming.resp.send_headers()  # at once: the client sees the stream open
            except OSError:
                streaming.stream.close()
                return False
            return streaming
        except http.errors.NoMoreData as exc:
            self.log.debug("Ignored premature client disconnection. %s", exc)
        except StopIteration as exc:
            self.log.debug("Closing connection. %s", exc)
        except BrokenPipeError:  # the write buffer gave up: the client did not read its answers
            self.log.debug("Client %s did not read its answer in time", conn.client)
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                self.log.debug("Ignoring socket error: %s", exc)
            else:
                self.log.exception("Socket error processing request.")
        except Exception as exc:
            # gunicorn's 500 page (its log line names a request it parsed itself).
            self.handle_error(req if isinstance(req, Request) else None, conn.out, conn.client, exc)
        finally:
            if conn.spool is not None:
                conn.spool.close()
        return False

    def _answer(self, conn: _Conn, head: fasthttp.Head) -> bool | _Park | _Streaming:
        """Answer a plain request (fasthttp.py): gunicorn's `handle_request` without its
        request and response objects; whether the connection may serve another."""
        if conn.spool is not None:
            body: IO[bytes] = conn.spool
        else:
            body = io.BytesIO(conn.body)
        environ = fasthttp.environ(
            head, self.base_environ, body, conn.client, conn.server, self.script_name
        )
        environ["gunicorn.socket"] = conn.out
        self.nr += 1
        if self.nr >= self.max_requests and self.alive:
            self.log.info("Autorestarting worker after current request.")
            self.alive = False
        if (
            not self.alive
            or not self.cfg.keepalive
            or len(self.keepalived_conns) >= self.max_keepalived
        ):
            head.must_close = True
        reply = fasthttp.Reply(head, conn.out.sendall)
        respiter = self.wsgi(environ, reply.start_response)
        try:
            for item in respiter:
                reply.write(item)
            reply.close()
        except OSError:
            raise
        except Exception:
            if not reply.headers_sent:
                raise  # gunicorn's 500 page (_serve)
            # Part of the answer is out: a 500 now would garble it. Close instead.
            self.log.exception("Error handling request")
            return False
        finally:
            close = getattr(respiter, "close", None)
            if close is not None:
                close()
        return not reply.should_close()

    def _served(
        self, conn: _Conn, keep: bool | _Park | _Streaming | str, req: Request | fasthttp.Head
    ) -> None:
        """Back from the thread (in the loop): once the answer is out, wait for the next
        request, or close; or park the request, or write its stream."""
        try:
            conn.state = _WRITING  # no thread has it any more
            if conn.out.closed:
                if isinstance(keep, _Park):
                    keep.ask.release()
                elif isinstance(keep, _Streaming):
                    keep.stream.close()
                self._close(conn)
            elif isinstance(keep, _Park):
                self._park(conn, req, keep.ask)
            elif isinstance(keep, _Streaming):
                self._start_stream(conn, keep.resp, keep.stream)
            else:
                self._finish(conn, keep)
        except Exception:
            # Raised here it would also hold up the other callbacks queued with this one.
            self.log.exception("Error in the connection loop")
            self._close(conn)

    # --- parked requests and streams --------------------------------------------------------

    def _park(self, conn: _Conn, req: Request, ask: AskAgain) -> None:
        conn.state = _PARKED
        self.parked[conn] = (req, ask)
        conn.wake_cb = functools.partial(self.method_queue.defer, self._unpark, conn)
        ask.signal.subscribe(conn.wake_cb)
        if ask.signal.count != ask.seen:
            self._unpark(conn)  # it fired between the app's look and the subscription

    def _unpark(self, conn: _Conn) -> None:
        """Run a parked request again on a thread (its signal fired, or its time is up)."""
        entry = self.parked.get(conn)
        if entry is None:
            return
        req, ask = entry
        self._let_go_of_wait(conn)
        conn.state = _BUSY
        try:
            self.tpool.submit(self._serve_and_return, conn, req, ask.deadline)
        except RuntimeError:  # the pool is shut down: the worker is exiting
            conn.state = _WRITING
            self._close(conn)

    def _start_stream(self, conn: _Conn, resp: Any, stream: Stream) -> None:
        conn.state = _STREAMING
        self.streams[conn] = (resp, stream)
        conn.wake_cb = functools.partial(self._stream_woken, conn)
        conn.armed = False
        self._pump(conn)

    def _stream_woken(self, conn: _Conn) -> None:
        """From whichever thread fired the stream's signal."""
        conn.armed = False
        self.method_queue.defer(self._pump, conn)

    def _pump(self, conn: _Conn) -> None:
        """Write what the stream has now (in the loop); drop a client that falls behind."""
        entry = self.streams.get(conn)
        if entry is None:
            return
        resp, stream = entry
        if not conn.armed and conn.wake_cb is not None:
            conn.armed = True  # before reading: a change after the read wakes us again
            stream.signal.subscribe(conn.wake_cb)
        try:
            while True:
                chunk = stream.next_chunk()
                if chunk is None:
                    break
                if chunk == END:
                    resp.close()  # the last chunk
                    self._end_stream(conn, close=False)
                    return
                resp.write(chunk)
        except OSError:
            self._end_stream(conn, close=True)
            return
        if conn.out.pending_bytes > STREAM_BACKLOG_BYTES:
            self.log.debug("Dropping stream client %s: it reads too slowly", conn.client)
            self._end_stream(conn, close=True)

    def _end_stream(self, conn: _Conn, close: bool) -> None:
        if conn not in self.streams:
            return
        self._let_go_of_wait(conn)
        if close:
            self._close(conn)
        else:
            conn.state = _WRITING
            self._finish(conn, False)

    def _let_go_of_wait(self, conn: _Conn) -> None:
        """Stop whatever the connection waits for, a parked request or a stream: its wake-up
        unsubscribed, its place among MAX_WAITERS given back (both bodies' `close`)."""
        parked = self.parked.pop(conn, None)
        streaming = self.streams.pop(conn, None)
        waiting = parked[1] if parked else streaming[1] if streaming else None
        if waiting is None:
            return
        if conn.wake_cb is not None:
            waiting.signal.unsubscribe(conn.wake_cb)
            conn.wake_cb = None
        waiting.close()

    # --- writing answers out -------------------------------------------------------------

    def _wake(self, conn: _Conn) -> None:
        """From the write buffer, in whichever thread wrote: bytes wait to be sent."""
        if threading.get_ident() == self.loop_thread:
            self._want_write(conn)
        else:
            self.method_queue.defer(self._want_write, conn)

    def _want_write(self, conn: _Conn) -> None:
        if conn.state != _CLOSED and conn.out.pending_bytes:
            self.writing.add(conn)
            self._select(conn)

    def _on_writable(self, conn: _Conn) -> None:
        if conn not in self.writing:
            return  # its answer went out earlier in this round of events
        try:
            done = conn.out.flush()
        except OSError:
            done = False  # the write buffer is failed: a thread writing finds out
        if conn.out.closed:
            self._close(conn)
        elif done:
            self.writing.discard(conn)
            self._select(conn)
            if conn.state == _WRITING:
                self._after(conn, conn.keep)

    def _finish(self, conn: _Conn, keep: bool) -> None:
        """The request is answered; carry on (`_after`) once its answer has been sent. Until
        then nothing more is read from the connection: a client that does not read its
        answers gets no more of its pipelined requests answered."""
        if conn.out.pending_bytes:
            self._unwatch(conn)
            conn.state = _WRITING
            conn.keep = keep
            self._want_write(conn)
        else:
            self._after(conn, keep)

    def _after(self, conn: _Conn, keep: bool) -> None:
        conn.reset()
        if not keep or conn.close_after:
            self._linger(conn)
            return
        now = time.monotonic()
        if conn.buf:
            # The client pipelined: the next request (or part of it) is here already. Read
            # at the end of this round (`_next_pipelined`): answered inline, a long pipeline
            # would otherwise recurse, one request deeper each.
            conn.deadline = now + REQUEST_READ_SECS
            self._unwatch(conn)
            conn.state = _READING
            self.pipelined.append(conn)
            return
        conn.idle = True
        conn.deadline = now + self.cfg.keepalive
        if not self.alive:
            conn.deadline = min(conn.deadline, now + gthread.STOP_KEEPALIVE_LINGER)
        self.keepalived_conns.add(conn)
        self._watch(conn)

    def _next_pipelined(self, conn: _Conn) -> None:
        if conn.state != _READING or conn in self.waiting:
            return  # closed meanwhile
        data, conn.buf = conn.buf, b""
        self._head(conn, data)
        if conn.state == _READING and conn not in self.waiting:
            self._watch(conn)

    # --- closing --------------------------------------------------------------------------

    def _refuse(self, conn: _Conn, exc: BaseException) -> None:
        """Send gunicorn's error page for a head it refused, then close."""
        # Through the write buffer, which the loop's writes never wait on; the close follows once
        # the page is out.
        self.handle_error(None, conn.out, conn.client, exc)
        self._finish(conn, False)

    def _linger(self, conn: _Conn) -> None:
        """Close after our answer without losing it: send FIN, read and drop what the client
        still sends for a moment, then close (all in the loop, no thread waits on it)."""
        self._unwatch(conn)
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.reset()
        conn.buf = b""
        conn.idle = False
        conn.deadline = time.monotonic() + LINGER_SECS
        conn.drained = 0
        self._watch(conn)
        conn.state = _LINGERING

    def _drain(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(RECV_BYTES, _NOWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        conn.drained += len(data)
        if not data or conn.drained > LINGER_BYTES:
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if conn.state == _CLOSED:
            return
        self._let_go_of_wait(conn)
        conn.out.fail()
        self.writing.discard(conn)
        self._unwatch(conn)
        if conn.state == _BUSY:
            return  # a thread still has it: closed when it gives it back (_served)
        conn.state = _CLOSED
        if conn.spool is not None:
            conn.spool.close()
            conn.spool = None
        with contextlib.suppress(OSError):
            conn.sock.close()
        self.nr_conns -= 1
