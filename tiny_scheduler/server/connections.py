"""The life of a client connection in the worker's event loop: accepting it, watching it,
its deadlines, sending what its write buffer holds, keeping it alive, closing it.

One selector loop holds every connection that waits on its client: for a request to arrive
(reading.py reads it), for the client to take an answer, for a lingering close. Only a
connection with a whole request is handed over to be answered (answering.py), and it comes
back here once answered (`_finish`). A connection whose answer still waits reads nothing more:
a client that does not read gets no more of its pipelined requests answered, so what it costs
stays bounded. Every write goes through the connection's `WriteBuffer` (write_buffer.py),
which this loop flushes when the socket is writable.

Every new connection is accepted and given room (admission.py: near a cap the oldest idle or
head-less connection is closed; when nothing can be shed, `503 too many connections`), so a
flood of connections never leaves the loop waiting for the kernel's backlog.

Also here: the request threads (`Pool`) and the open-files limit the connection table needs
(`open_files`). Nothing here parses HTTP or knows the app.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import functools
import queue
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from ..config import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_CLIENT
from .admission import Admission
from .write_buffer import WriteBuffer

if TYPE_CHECKING:
    from . import fasthttp
    from .chunked import ChunkScanner
    from .gunicorn_private import Request

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

STOP_LINGER_SECS = 2.0
"""Seconds a stopping worker keeps its idle connections open, for a request a client may be
sending already (answered with `Connection: close`). gthread's own STOP_KEEPALIVE_LINGER has
the same value; ours is our own constant so that nothing depends on gthread's."""

LINGER_SECS = 2.0
"""Seconds a closing connection is read and discarded after our FIN, so that request bytes
still in flight do not make the kernel reset it and destroy the last answer."""

LINGER_BYTES = 64 * 1024
"""Bytes a lingering close reads and discards at most."""

RESERVED_FILES = 256
"""File descriptors kept out of the connection table: the database, logs, the pipes of the
worker, temporary files of bodies being received."""

SWEEP_SECS = 0.5
"""Seconds between sweeps for connections past their deadline."""

NOTIFY_SECS = 1.0
"""Seconds between heartbeats to the arbiter (each one is a syscall; its timeout is 60 s)."""

RECV_BYTES = 64 * 1024
"""Largest single read of a request head, of a body held in memory, or of a lingering close."""

ACCEPT_BATCH = 64
"""Connections accepted per wake-up at most, so a burst does not starve the others."""

ACCEPT_PAUSE_SECS = 0.5
"""Seconds accepting stops after the process ran out of file descriptors."""

TOO_MANY_CONNECTIONS = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 21\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"\r\n"
    b"too many connections\n"
)
"""The answer of a connection for which nothing could be shed (admission.py): the API's own
error shape, written by the loop before a request is read."""

CROWDING_LOG_SECS = 60.0
"""At most one log line per this many seconds about connections shed or turned away."""

# Every read and write passes MSG_DONTWAIT (writes in write_buffer.py), so the sockets' own
# mode never matters and is never switched back and forth.
NOWAIT = socket.MSG_DONTWAIT
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE

# A connection's states. reading: the loop reads a request; busy: a thread (or the loop,
# inline) answers it; writing: answered, and its answer still waits in the write buffer;
# lingering: closing after the last answer. parked: a request waits in the loop to run again;
# streaming: the loop writes a stream's body (both parking.py).
READING, BUSY, WRITING, LINGERING, CLOSED = "reading", "busy", "writing", "lingering", "closed"
PARKED, STREAMING = "parked", "streaming"


@dataclasses.dataclass(frozen=True, slots=True)
class OpenFiles:
    """The open-files limit as the daemon found and left it, and the connections it allows."""

    before: int  # the soft limit at start (-1: unlimited)
    soft: int  # the soft limit now (-1: unlimited)
    hard: int  # the hard limit (-1: unlimited)
    connections: int  # connections the worker holds at most: MAX_CONNECTIONS, if they fit
    wanted: int  # MAX_CONNECTIONS

    def describe(self) -> str:
        """For the banner: the open-files limit, and whether the daemon raised it."""
        if self.soft == -1:
            return "open files: unlimited"
        if self.soft != self.before:
            return f"open files: raised from {self.before} to the hard limit, {self.soft}"
        if self.soft == self.hard or self.hard == -1:
            return f"open files: {self.soft}, the hard limit"
        return f"open files: {self.soft}; raising it to the hard limit {self.hard} failed"


def open_files(max_connections: int = DEFAULT_MAX_CONNECTIONS) -> OpenFiles:
    """Raise this process's soft open-files limit to its hard limit (a forked worker inherits
    it), and say how many connections the worker may then hold: `max_connections`, or fewer
    when the limit leaves no room for them beside RESERVED_FILES.

    Every connection held is a file descriptor, and the usual default soft limit (1024) is far
    below the idle and slow clients the daemon must hold.
    """
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = before
    infinite = resource.RLIM_INFINITY
    # An unlimited hard limit cannot be the soft one (the kernel caps open files anyway):
    # then as many as the connections need.
    target = hard if hard != infinite else max(max_connections + RESERVED_FILES, soft)
    if soft != infinite and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # stay within the soft limit we have
    if soft == infinite:
        allowed = max_connections
    else:
        allowed = max(64, min(max_connections, soft - RESERVED_FILES))
    number = lambda value: -1 if value == infinite else int(value)  # noqa: E731
    return OpenFiles(number(before), number(soft), number(hard), allowed, max_connections)


class Pool:
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


class GunicornConn:
    """What gunicorn's handle_request takes as a connection: the write buffer as its socket."""

    __slots__ = ("client", "server", "sock")

    def __init__(self, sock: WriteBuffer, client: Any, server: Any) -> None:
        self.sock = sock
        self.client = client
        self.server = server


class Conn:
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
        "dropping",
        "events",
        "host",
        "idle",
        "keep",
        "length",
        "need",
        "out",
        "req",
        "req_count",
        "scanned",
        "server",
        "shed",
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
        wake: Callable[[Conn], None],
        loop_thread: int,
    ) -> None:
        self.sock = sock
        self.client = client
        # The client's address, whose connections count together (None: a UNIX socket).
        self.host: str | None = client[0] if client.__class__ is tuple else None
        self.server = server
        self.shed = True  # sheddable (admission.py): head-less now, idle later
        self.out = WriteBuffer(sock, functools.partial(wake, self), loop_thread)
        self.answering = GunicornConn(self.out, client, server)
        self.state = READING
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
        self.chunks: ChunkScanner | None = None  # chunked framing
        self.body: bytes | bytearray = b""
        self.spool: IO[bytes] | None = None
        self.body_bytes = 0
        # The body could not be kept (no room in TMPDIR): its answer is out, the rest of it
        # is read and dropped, then the connection closes (reading.py, `_no_room`).
        self.dropping = False
        self.drained = 0  # bytes discarded by a lingering close
        self.wake_cb: Callable[[], None] | None = None  # subscribed to a parked wait's signal
        self.armed = False  # a stream's wake-up is subscribed

    def reset(self) -> None:
        """Forget the request just served."""
        self.req = None
        self.chunks = None
        self.body = b""
        self.spool = None
        self.dropping = False
        self.body_bytes = self.length = self.need = 0


class ConnectionLoop:
    """The worker's loop and its connections (a mixin of BufferingWorker, worker.py).

    From the other parts it calls `_on_readable` (reading.py), `_wire_app` (worker.py),
    `_wake_due`, `_next_deadline_in`, `_sweep_waits`, `_waits` and `_let_go_of_wait`
    (parking.py); it uses gthread's `poller`, `method_queue`, `tpool`, `nr_conns` and
    `worker_connections` (gunicorn_private.py lists them)."""

    def _init_connections(self) -> None:
        # Connections the loop watches (reading or lingering), swept for deadlines; the idle
        # ones are also in keepalived_conns, which gthread's handle_request counts.
        self.waiting: set[Conn] = set()
        self.keepalived_conns: set[Conn] = set()  # type: ignore[assignment]
        # Connections whose answers wait in their write buffer for the socket to be writable,
        # swept for clients that take none of them.
        self.writing: set[Conn] = set()
        # Connections whose next pipelined request has arrived, read at the end of a round
        # of events rather than from inside the answer to the last one.
        self.pipelined: collections.deque[Conn] = collections.deque()
        self.loop_thread = 0  # the thread running the loop (set by run)
        self.listener_names: dict[Any, Any] = {}
        self.accepting = False  # whether the listeners are in the selector
        self.accept_paused_until = 0.0
        # The caps (the per-client one is the app's to say: `_wire_app`).
        self.admission: Admission[Conn] = Admission(
            self.worker_connections, DEFAULT_MAX_CONNECTIONS_PER_CLIENT
        )
        self.crowding = [0, 0]  # connections shed, turned away since the last log line
        self.crowding_logged = 0.0

    # --- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        self.loop_thread = threading.get_ident()
        self._wire_app()
        self.poller.register(
            self.method_queue.fileno(), selectors.EVENT_READ, self.method_queue.run_callbacks
        )
        self._accept_from_listeners(True)
        next_sweep = next_notify = 0.0
        while self.alive:
            now = time.monotonic()
            if now >= next_notify:
                self.notify()
                next_notify = now + NOTIFY_SECS
            self._update_accepting(now)
            self._dispatch_events(min(SWEEP_SECS, self._next_deadline_in(now)))
            if not self.is_parent_alive():
                break
            now = time.monotonic()
            self._wake_due(now)
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
                if data.__class__ is Conn:
                    # Writable first: a connection waits either for its answer to go out or
                    # for its next request, only a 100 Continue may wait during a body.
                    if mask & WRITE:
                        self._on_writable(data)
                    if mask & READ and data in self.waiting:
                        self._on_readable(data)
                else:
                    data(key.fileobj)
            except Exception:
                # One connection's surprise must not end the worker and every other one.
                self.log.exception("Error in the connection loop")
                if data.__class__ is Conn:
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
        its way is still answered, with `Connection: close`); waits end now (`_end_waits`);
        requests being received or served get until the graceful timeout."""
        self._accept_from_listeners(False)
        now = time.monotonic()
        soon = now + STOP_LINGER_SECS
        for conn in self.waiting:
            if conn.idle or (conn.state == READING and not conn.buf and conn.req is None):
                conn.deadline = min(conn.deadline, soon)
        self._end_waits(now)
        give_up = now + self.cfg.graceful_timeout
        next_notify = 0.0
        while self.nr_conns > 0 and time.monotonic() < give_up:
            now = time.monotonic()
            if now >= next_notify:
                self.notify()
                next_notify = now + NOTIFY_SECS
            self._dispatch_events(0.2)
            self._sweep(time.monotonic())
        for conn in [*self.waiting, *self.writing, *self._waits()]:
            self._close(conn)
        self.tpool.shutdown(wait=False)
        self.poller.close()
        self.method_queue.close()
        for listener in self.sockets:
            listener.close()

    def _sweep(self, now: float) -> None:
        """Close the connections past their deadline: idle ones after `keepalive`, requests
        that did not arrive in time, lingering closes that ran out, clients that took none of
        their answers for write_buffer.RESPONSE_WRITE_SECS; and wake the waits that are due."""
        expired = [
            conn for conn in self.waiting if now >= conn.deadline + conn.body_bytes / BODY_MIN_RATE
        ]
        for conn in expired:
            if conn.state == READING and not conn.idle:
                self.log.debug("Closing %s: no whole request in time", conn.client)
            self._close(conn)
        for conn in [conn for conn in self.writing if conn.out.stalled(now)]:
            self.log.debug("Closing %s: it did not read its answers", conn.client)
            self._close(conn)
        self._sweep_waits(now)

    # --- accepting --------------------------------------------------------------------------

    def _accept_from_listeners(self, enabled: bool) -> None:
        """Put the listeners in the selector, or take them out (gthread's set_accept_enabled,
        with our own flag instead of its private `_accepting`)."""
        if enabled == self.accepting:
            return
        for listener in self.sockets:
            if enabled:
                listener.setblocking(False)
                self.poller.register(listener, READ, self.accept)
            else:
                self.poller.unregister(listener)
        self.accepting = enabled

    def _update_accepting(self, now: float) -> None:
        # Always, but for a pause after the process ran out of descriptors: a connection over
        # a cap is given room or an answer (`_admit`), never left in the kernel's backlog.
        can = now >= self.accept_paused_until
        if can != self.accepting:
            self._accept_from_listeners(can)
        self._log_crowding(now)

    def accept(self, listener: socket.socket) -> None:
        server = self.listener_names.get(listener)
        if server is None:
            server = self.listener_names[listener] = listener.getsockname()
        deadline = time.monotonic() + REQUEST_READ_SECS
        for _ in range(ACCEPT_BATCH):
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
                    self._accept_from_listeners(False)
                    return
                raise
            if sock.gettimeout() is not None:
                sock.settimeout(None)  # a default timeout would make reads wait in the loop
            host = client[0] if client.__class__ is tuple else None
            if not self._admit(host):
                _turn_away(sock)
                continue
            self.nr_conns += 1
            conn = Conn(sock, client, server, deadline, self._wake, self.loop_thread)
            self.admission.opened(conn, host)
            self._watch(conn)

    # --- room for a connection (admission.py) -----------------------------------------------

    def _admit(self, host: str | None) -> bool:
        """Make room for one more connection from `host`, closing the oldest idle or
        head-less ones near a cap; whether it fits now."""
        admission = self.admission
        for conn in admission.to_shed(host):
            self.log.debug("Closing %s: idle, to make room for a new connection", conn.client)
            self.crowding[0] += 1
            self._close(conn)
        if admission.has_room(host):
            return True
        self.crowding[1] += 1
        return False

    def _sheddable(self, conn: Conn, sheddable: bool) -> None:
        """The connection waits for a request that has not begun (idle, or head-less), or no
        longer does."""
        if sheddable:
            self.admission.idle(conn, conn.host)
        elif conn.shed:
            self.admission.busy(conn)
        conn.shed = sheddable

    def _log_crowding(self, now: float) -> None:
        shed, refused = self.crowding
        if not (shed or refused) or now < self.crowding_logged + CROWDING_LOG_SECS:
            return
        self.crowding = [0, 0]
        self.crowding_logged = now
        address, held = self.admission.busiest()
        self.log.warning(
            "Connections at their limit (%d at most, %d per client address): %d idle or "
            "silent ones closed to make room, %d new ones refused with 503; %d open, the most "
            "from %s (%d)",
            self.admission.total,
            self.admission.per_client,
            shed,
            refused,
            self.admission.count,
            address,
            held,
        )

    # --- what the selector watches ----------------------------------------------------------

    def _watch(self, conn: Conn) -> None:
        conn.state = READING
        self.waiting.add(conn)
        self._select(conn)

    def _unwatch(self, conn: Conn) -> None:
        self.waiting.discard(conn)
        self.keepalived_conns.discard(conn)
        self._select(conn)

    def _select(self, conn: Conn) -> None:
        """Have the selector watch the socket for what the connection waits for: readable
        while a request (or a lingering close) is read, writable while answers wait."""
        events = (READ if conn in self.waiting else 0) | (WRITE if conn in self.writing else 0)
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

    # --- writing answers out -------------------------------------------------------------

    def _wake(self, conn: Conn) -> None:
        """From the write buffer, in whichever thread wrote: bytes wait to be sent."""
        if threading.get_ident() == self.loop_thread:
            self._want_write(conn)
        else:
            self.method_queue.defer(self._want_write, conn)

    def _want_write(self, conn: Conn) -> None:
        if conn.state != CLOSED and conn.out.pending_bytes:
            self.writing.add(conn)
            self._select(conn)

    def _on_writable(self, conn: Conn) -> None:
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
            if conn.state == WRITING:
                self._after(conn, conn.keep)

    def _finish(self, conn: Conn, keep: bool) -> None:
        """The request is answered; carry on (`_after`) once its answer has been sent. Until
        then nothing more is read from the connection: a client that does not read its
        answers gets no more of its pipelined requests answered."""
        if conn.out.pending_bytes:
            self._unwatch(conn)
            conn.state = WRITING
            conn.keep = keep
            self._want_write(conn)
        else:
            self._after(conn, keep)

    def _after(self, conn: Conn, keep: bool) -> None:
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
            conn.state = READING
            self.pipelined.append(conn)
            return
        conn.idle = True
        conn.deadline = now + self.cfg.keepalive
        if not self.alive:
            conn.deadline = min(conn.deadline, now + STOP_LINGER_SECS)
        self.keepalived_conns.add(conn)
        self._sheddable(conn, True)
        self._watch(conn)

    def _next_pipelined(self, conn: Conn) -> None:
        if conn.state != READING or conn in self.waiting:
            return  # closed meanwhile
        data, conn.buf = conn.buf, b""
        self._head(conn, data)
        if conn.state == READING and conn not in self.waiting:
            self._watch(conn)

    # --- closing --------------------------------------------------------------------------

    def _refuse(self, conn: Conn, exc: BaseException) -> None:
        """Send gunicorn's error page for a head it refused, then close."""
        # Through the write buffer, which the loop's writes never wait on; the close follows
        # once the page is out.
        self.handle_error(None, conn.out, conn.client, exc)
        self._finish(conn, False)

    def _linger(self, conn: Conn) -> None:
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
        conn.state = LINGERING

    def _drain(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(RECV_BYTES, NOWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        conn.drained += len(data)
        if not data or conn.drained > LINGER_BYTES:
            self._close(conn)

    def _close(self, conn: Conn) -> None:
        if conn.state == CLOSED:
            return
        self._let_go_of_wait(conn)
        conn.out.fail()
        self.writing.discard(conn)
        self._unwatch(conn)
        if conn.state == BUSY:
            return  # a thread still has it: closed when it gives it back (_served)
        conn.state = CLOSED
        if conn.spool is not None:
            conn.spool.close()
            conn.spool = None
        with contextlib.suppress(OSError):
            conn.sock.close()
        self.nr_conns -= 1
        self.admission.closed(conn, conn.host)


def _turn_away(sock: socket.socket) -> None:
    """Answer a connection there is no room for with 503 `too many connections` and close it,
    without waiting for anything: what the client sent already is read first, so that the
    close does not reset the connection under the answer."""
    with contextlib.suppress(OSError):
        sock.recv(RECV_BYTES, NOWAIT)
    with contextlib.suppress(OSError):
        sock.send(TOO_MANY_CONNECTIONS, NOWAIT)
        sock.shutdown(socket.SHUT_WR)
    sock.close()
