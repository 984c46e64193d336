"""The answers on their way to one client connection, and the only place its socket is written.

A `WriteBuffer` stands where gunicorn expects the connection's socket (its response code calls
`sendall`, `sendfile` and the few other socket methods below), so gunicorn still formats
every answer while the writing is ours. Nothing here ever blocks on the client:

- A write goes straight to the kernel with a non-blocking send while nothing waits before it
  (the usual case: one syscall, as before). What the kernel does not take waits here, in
  order, and the worker's event loop is woken (`wake`) to send it when the socket is writable.
- The bytes waiting are bounded: a request thread whose write leaves more than
  OUTPUT_BUFFER_BYTES waiting waits for the loop to make room, and gives up (an OSError, as a
  dead socket gives) when the connection is given up. The loop itself never waits: it only
  queues (a 100 Continue, one of gunicorn's error pages).
- A client must take a PROGRESS_BYTES piece of what waits (or all of it) at least every
  RESPONSE_WRITE_SECS (`stalled`); the loop closes a connection that does not. A client that
  reads nothing thus loses its connection that long after its kernel buffers filled, however
  the kernel's buffers grow by a few bytes at a time meanwhile.

Threads and the loop share a write buffer under its lock; the socket is only ever sent to under
it, and closed by the loop only once no thread uses the connection any more.
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from collections.abc import Callable
from typing import IO

OUTPUT_BUFFER_BYTES = 256 * 1024
"""Bytes of answers that may wait for one client before a request thread writing more waits
for room. Past the answers' own bytes (which the app made anyway) a connection costs at most
this much more memory; answers up to it never hold their thread."""

PROGRESS_BYTES = 64 * 1024
"""A client makes progress when it has taken this many waiting bytes (or all of them)."""

RESPONSE_WRITE_SECS = 60.0
"""Seconds a client may make no progress on the answers waiting for it before the connection
is closed: a client that reads nothing loses it this long after its buffers filled."""

_NOWAIT = socket.MSG_DONTWAIT
_SMALL = 16 * 1024  # waiting pieces smaller than this are joined before a send


class WriteBuffer:
    """The bytes one connection still has to send, and its socket for gunicorn's writers."""

    __slots__ = (
        "closed",
        "cond",
        "loop_thread",
        "pending",
        "pending_bytes",
        "progress_at",
        "progress_left",
        "sock",
        "wake",
    )

    def __init__(self, sock: socket.socket, wake: Callable[[], None], loop_thread: int) -> None:
        self.sock = sock
        self.wake = wake  # tells the loop that bytes wait (called on the first one waiting)
        self.loop_thread = loop_thread  # the loop's writes never wait for room
        self.cond = threading.Condition(threading.Lock())
        self.pending: collections.deque[bytes | memoryview] = collections.deque()
        self.pending_bytes = 0
        self.progress_at = 0.0
        self.progress_left = 0
        self.closed = False

    # --- for the loop ----------------------------------------------------------------------

    def stalled(self, now: float) -> bool:
        """Whether bytes wait and the client made no progress on them for too long."""
        return self.pending_bytes > 0 and now >= self.progress_at + RESPONSE_WRITE_SECS

    def flush(self) -> bool:
        """Send what the kernel takes now; whether nothing waits any more. Raises OSError
        when the connection is dead (the write buffer is then failed)."""
        with self.cond:
            self._push()
            return not self.pending_bytes

    def fail(self) -> None:
        """Give the connection up: drop what waits; writes from now on raise BrokenPipeError
        (a thread waiting for room gets it at once)."""
        with self.cond:
            self._fail_locked()

    # --- gunicorn's socket -----------------------------------------------------------------

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        """Send `data` or queue what the kernel does not take (see the module's docstring)."""
        with self.cond:
            if self.closed:
                raise BrokenPipeError("the connection was given up")
            view = memoryview(data).cast("B")
            first = not self.pending
            if first:
                sent = self._send(view)
                if sent == len(view):
                    return
                view = view[sent:]
                self.progress_at = time.monotonic()
                self.progress_left = PROGRESS_BYTES
            # A caller may reuse its buffer once we return: keep a copy unless it is bytes.
            self.pending.append(view if isinstance(data, bytes) else bytes(view))
            self.pending_bytes += len(view)
            if first:
                self.wake()  # the first bytes waiting: the loop sends from now on
            if threading.get_ident() != self.loop_thread:
                self._wait_for_room()

    def send(self, data: bytes | bytearray | memoryview) -> int:
        self.sendall(data)
        return len(data)

    def sendfile(self, file: IO[bytes], offset: int = 0, count: int | None = None) -> int:
        """A file's bytes as plain writes: they go through the same queue and bounds."""
        file.seek(offset)
        total = 0
        while count is None or total < count:
            size = PROGRESS_BYTES if count is None else min(PROGRESS_BYTES, count - total)
            piece = file.read(size)
            if not piece:
                break
            self.sendall(piece)
            total += len(piece)
        return total

    def fileno(self) -> int:
        return self.sock.fileno()

    def gettimeout(self) -> float:
        return 0.0  # gunicorn's write_nonblock then writes without switching modes

    def settimeout(self, value: float | None) -> None:
        pass  # nothing here waits on the socket

    def setblocking(self, flag: bool) -> None:
        pass

    def shutdown(self, how: int) -> None:
        """gunicorn's abort of an answer it cannot finish: the worker closes the connection
        after the thread returns (and after what was written), so there is nothing to do."""

    def recv(self, size: int) -> bytes:
        return b""  # the loop reads the connection; gunicorn's lingering close reads nothing

    def close(self) -> None:
        pass  # the worker closes the socket, once nothing uses it

    # --- under the lock --------------------------------------------------------------------

    def _send(self, view: memoryview) -> int:
        """Bytes of `view` the kernel takes now, without waiting."""
        try:
            return self.sock.send(view, _NOWAIT)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            self._fail_locked()
            raise

    def _push(self) -> None:
        """Send waiting bytes until the kernel takes no more or none wait."""
        pending = self.pending
        while pending:
            if len(pending) > 1 and len(pending[0]) < _SMALL:
                self._join_head()
            head = pending[0]
            sent = self._send(head if isinstance(head, memoryview) else memoryview(head))
            if not sent:
                break
            self.pending_bytes -= sent
            self.progress_left -= sent
            if sent == len(head):
                pending.popleft()
            else:
                pending[0] = memoryview(head)[sent:]
            if self.progress_left <= 0 or not pending:
                self.progress_at = time.monotonic()
                self.progress_left = PROGRESS_BYTES
        if self.pending_bytes <= OUTPUT_BUFFER_BYTES:
            self.cond.notify_all()

    def _join_head(self) -> None:
        """Many small writes (a streamed listing) become one send of up to PROGRESS_BYTES."""
        pending, parts, size = self.pending, [], 0
        while pending and size < PROGRESS_BYTES:
            part = pending.popleft()
            parts.append(part)
            size += len(part)
        pending.appendleft(b"".join(parts))

    def _wait_for_room(self) -> None:
        """In a request thread: wait while more than OUTPUT_BUFFER_BYTES wait to be sent."""
        while self.pending_bytes > OUTPUT_BUFFER_BYTES and not self.closed:
            # The loop gives a stalled connection up (and wakes us); the second allowance
            # only matters when the loop is gone (the worker exiting).
            left = self.progress_at + 2 * RESPONSE_WRITE_SECS - time.monotonic()
            if left <= 0:
                self._fail_locked()
                break
            self.cond.wait(left)
        if self.closed:
            raise BrokenPipeError("the connection was given up")

    def _fail_locked(self) -> None:
        self.closed = True
        self.pending.clear()
        self.pending_bytes = 0
        self.cond.notify_all()

    def __repr__(self) -> str:
        return f"<WriteBuffer {self.pending_bytes} bytes waiting{' closed' if self.closed else ''}>"
