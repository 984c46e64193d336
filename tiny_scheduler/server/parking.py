"""Requests that wait on events without holding a thread: parked requests and streams.

waiting.py says what the app hands over. An output read that has nothing yet returns
`AskAgain`: the connection is parked in the loop (`_park`) until the signal it names fires or
its deadline passes, and the same request then runs again on a thread (`_unpark`). An event
stream returns a `Stream`: a thread sends its headers, then the loop writes its chunks
through the write buffer as they come (`_pump`), and drops a client whose unsent backlog
passes STREAM_BACKLOG_BYTES.

The app is called through `ParkingApp`, which puts `PARK_KEY` in every environ and turns the
bodies the loop must act on into exceptions that leave gunicorn's request handling before it
writes anything: the two waiting ones, and an inline request's `NEEDS_THREAD` (inline.py).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import threading
import time
from typing import Any

from . import gunicorn_private, inline
from .connections import BUSY, PARKED, STREAMING, WRITING, Conn
from .fasthttp import Head, Reply
from .waiting import END, PARK_KEY, WAITED_KEY, AskAgain, Prepared, Stream
from .write_buffer import OUTPUT_BUFFER_BYTES

WAKE_BATCH = 32
"""Parked requests whose time is up that the loop runs again between two looks at its sockets:
thousands of waiting heartbeats end every few seconds, and running hundreds of them at once
would make every other request wait behind them."""

STREAM_BACKLOG_BYTES = OUTPUT_BUFFER_BYTES
"""Bytes of an event stream that may wait unsent for its client; past that the client reads
too slowly for the stream and is dropped (it reconnects and resumes, or gets a reset)."""


TO_THREAD = "to a thread"
"""What answering's `_serve` returns when an inline request needs a thread after all."""


class Park(Exception):
    """The app asked to run the request again later (raised out of gunicorn's handling)."""

    def __init__(self, ask: AskAgain) -> None:
        super().__init__("parked")
        self.ask = ask


class Streaming(Exception):
    """The app answered with a stream: its headers are set, its body is the loop's to write."""

    def __init__(self, resp: Any, stream: Stream) -> None:
        super().__init__("streaming")
        self.resp = resp
        self.stream = stream


class ToThread(Exception):
    """The app needs a thread for a request run in the loop (inline.py): nothing was sent."""


class ParkingApp:
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
            raise ToThread
        if isinstance(body, AskAgain):
            raise Park(body)
        if isinstance(body, Stream):
            # The response that start_response belongs to writes the stream's chunks.
            raise Streaming(gunicorn_private.response_of(start_response), body)
        return body

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)


class Parking:
    """Parked requests and streams in the loop (a mixin of BufferingWorker, worker.py).

    Calls `_serve_and_return`, or `_serve` and `_served` when it runs inline (answering.py),
    to run a parked request again, and the loop's
    `_finish` and `_close` (connections.py); the loop calls `_wake_due` and
    `_next_deadline_in` every round, and `_sweep_waits`, `_waits` and `_let_go_of_wait`."""

    def _init_parking(self) -> None:
        # Requests parked until their signal fires or their deadline passes, and streams
        # whose bodies the loop writes.
        self.parked: dict[Conn, tuple[Any, AskAgain]] = {}
        self.streams: dict[Conn, tuple[Any, Stream]] = {}
        # The parked requests by deadline, soonest first (an entry whose wait has ended
        # otherwise is skipped when it comes up).
        self._deadlines: list[tuple[float, int, Conn, AskAgain]] = []
        self._order = itertools.count()
        # Per thread that answers (a request thread, or the loop's for an inline one): the
        # deadline of the parked wait the request runs again after (`_serve_and_return` and
        # `_unpark` set it, ParkingApp reads it into WAITED_KEY).
        self.serving = threading.local()

    def _waits(self) -> list[Conn]:
        """The connections parked or streaming."""
        return [*self.parked, *self.streams]

    def _sweep_waits(self, now: float) -> None:
        """Ask the streams that are due (parked requests: `_wake_due`, every round)."""
        for conn in [c for c, (_, stream) in self.streams.items() if now >= stream.next_deadline()]:
            self._pump(conn)

    def _wake_due(self, now: float, limit: float = WAKE_BATCH) -> None:
        """Run again up to `limit` parked requests whose time is up, soonest first."""
        deadlines = self._deadlines
        woken = 0
        while deadlines and deadlines[0][0] <= now and woken < limit:
            _, _, conn, ask = heapq.heappop(deadlines)
            entry = self.parked.get(conn)
            if entry is not None and entry[1] is ask:
                self._unpark(conn)
                woken += 1

    def _next_deadline_in(self, now: float) -> float:
        """Seconds until the soonest parked request's time is up (inf: none parked)."""
        deadlines = self._deadlines
        while deadlines:
            _, _, conn, ask = deadlines[0]
            entry = self.parked.get(conn)
            if entry is not None and entry[1] is ask:
                return max(0.0, deadlines[0][0] - now)
            heapq.heappop(deadlines)  # its wait ended otherwise
        return math.inf

    def _end_waits(self, now: float) -> None:
        """The worker is stopping: a parked request is answered now with what there is (its
        wait is over), a stream ends cleanly (its client resumes from its last event id at
        whichever daemon answers next). Else each would hold the worker for the whole
        graceful timeout, and a restart would take that long. Waits that begin while it
        stops (a request woken on a thread at that moment, a new one on a kept-alive
        connection) end as they begin (`_park`, `_start_stream`)."""
        for conn, (_, ask) in list(self.parked.items()):
            self._answer_now(conn, ask, now)
        for conn in list(self.streams):
            self._end_stream_now(conn)

    def _answer_now(self, conn: Conn, ask: AskAgain, now: float) -> None:
        """Run a parked request again at once, its wait over: it answers with what there is."""
        ask.deadline = now
        self._unpark(conn)

    def _end_stream_now(self, conn: Conn) -> None:
        resp, _ = self.streams[conn]
        try:
            resp.close()  # the last chunk
        except OSError:
            self._end_stream(conn, close=True)
            return
        self._end_stream(conn, close=False)

    def _park(self, conn: Conn, req: Any, ask: AskAgain) -> None:
        # An inline request (a waiting heartbeat) is still watched for its next request:
        # nothing is read from a parked connection, and its read deadline no longer holds.
        self._unwatch(conn)
        conn.state = PARKED
        self.parked[conn] = (req, ask)
        heapq.heappush(self._deadlines, (ask.deadline, next(self._order), conn, ask))
        conn.wake_cb = functools.partial(self.method_queue.defer, self._unpark, conn)
        ask.signal.subscribe(conn.wake_cb)
        if not self.alive:
            self._answer_now(conn, ask, time.monotonic())  # stopping: no wait begins now
        elif ask.signal.count != ask.seen:
            self._unpark(conn)  # it fired between the app's look and the subscription

    def _unpark(self, conn: Conn) -> None:
        """Run a parked request again (its signal fired, or its time is up): in the loop when
        the app answers it inline (a waiting heartbeat: thousands of them renewed every few
        seconds must not each cost a hand-off to a thread), else on a thread."""
        entry = self.parked.get(conn)
        if entry is None:
            return
        req, ask = entry
        self._let_go_of_wait(conn)
        conn.state = BUSY
        if ask.at_deadline is not None and ask.signal.count == ask.seen and req.__class__ is Head:
            self._served(conn, self._send_prepared(conn, req, ask.at_deadline), req)
            return
        if self._runs_inline(conn, req):
            self.serving.waited = ask.deadline
            try:
                with inline.answering():
                    outcome = self._serve(conn, req)
            finally:
                self.serving.waited = None
            if outcome is not TO_THREAD:
                self._served(conn, outcome, req)
                return
        try:
            self.tpool.submit(self._serve_and_return, conn, req, ask.deadline)
        except RuntimeError:  # the pool is shut down: the worker is exiting
            conn.state = WRITING
            self._close(conn)

    def _send_prepared(self, conn: Conn, head: Head, answer: Prepared) -> bool:
        """Write an answer the view made in advance (nothing happened during its wait);
        whether the connection may serve another request."""
        reply = Reply(head, conn.out.sendall)
        try:
            reply.start_response(answer.status, answer.headers)
            reply.write(answer.body)
            reply.close()
        except OSError:
            return False
        return not reply.should_close()

    def _start_stream(self, conn: Conn, resp: Any, stream: Stream) -> None:
        conn.state = STREAMING
        self.streams[conn] = (resp, stream)
        conn.wake_cb = functools.partial(self._stream_woken, conn)
        conn.armed = False
        self._pump(conn)
        if not self.alive and conn in self.streams:
            self._end_stream_now(conn)  # stopping: what there is, then the end

    def _stream_woken(self, conn: Conn) -> None:
        """From whichever thread fired the stream's signal."""
        conn.armed = False
        self.method_queue.defer(self._pump, conn)

    def _pump(self, conn: Conn) -> None:
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

    def _end_stream(self, conn: Conn, close: bool) -> None:
        if conn not in self.streams:
            return
        self._let_go_of_wait(conn)
        if close:
            self._close(conn)
        else:
            conn.state = WRITING
            self._finish(conn, False)

    def _let_go_of_wait(self, conn: Conn) -> None:
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
