"""Requests that wait for something to happen, without holding a request thread.

Two kinds of answers wait: an output read with `wait` (answer once output arrives, the job
ends, or the wait is over) and an event stream (an answer that never ends, written as events
come). Both would hold one of the request threads the agents need if they waited in it, so
the app hands them to the worker, which parks them in its event loop:

- **Ask again** (`AskAgain`): the view has nothing to answer yet. It returns this body
  instead; a worker that knows it (`worker.py`, which puts `PARK_KEY` in the environ) forgets
  the status and headers, parks the connection, and when `signal` fires or `deadline` passes
  runs the same request again on a thread, with `WAITED_KEY` (the deadline) in the environ;
  the view then answers what it has, or asks again until the deadline. Under any other
  server the view waits in its thread instead (`wait_in_thread`). A view that knows already
  what it would answer at the deadline if nothing happened meanwhile gives it
  (`Prepared`): then that is sent when the deadline passes with the signal quiet, without
  running the request again (thousands of idle agents' heartbeats end that way every few
  seconds).
- **Streams** (`Stream`): the headers go out at once, then the worker's loop writes whatever
  `next_chunk()` has whenever `signal` fires or `next_deadline()` passes, for as long as the
  client reads; a client that stops reading is dropped once its unwritten output passes a
  bound. Under any other server, iterating it blocks its thread (`__iter__`).

`Waiters` counts both against MAX_WAITERS: beyond it, 503 with `Retry-After: 5`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator

from .. import errors
from ..clock import SYSTEM, Clock
from ..notify import Signal

PARK_KEY = "tiny_scheduler.park"
"""In the environ when the worker can park requests (its value: True)."""

WAITED_KEY = "tiny_scheduler.waited"
"""In the environ of a request run again after it was parked: the deadline (monotonic) its
`AskAgain` gave, so that the view knows how long it may still wait."""

TOO_MANY_WAITERS = "too many waiting requests; try again"

END = b""
"""What `Stream.next_chunk` returns when the stream is over."""


class Waiters:
    """How many requests wait at once, at most `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self.count = 0

    def enter(self) -> None:
        """Count one more waiter, or refuse it (503, Retry-After: 5)."""
        with self._lock:
            if self.count >= self.limit:
                raise errors.Unavailable(TOO_MANY_WAITERS, retry_after=5)
            self.count += 1

    def leave(self) -> None:
        with self._lock:
            self.count -= 1


@dataclasses.dataclass(frozen=True, slots=True)
class Prepared:
    """An answer made in advance: WSGI's status line and headers, and the whole body."""

    status: str
    headers: list[tuple[str, str]]
    body: bytes


class AskAgain:
    """A body saying "nothing yet: run this request again when `signal` fires, or at
    `deadline` (monotonic seconds)". `release` is called once the wait is over.
    `at_deadline`: what to answer when the deadline passes and the signal has not fired
    since the view looked (None: run the request again then too)."""

    def __init__(
        self,
        signal: Signal,
        seen: int,
        deadline: float,
        release: Callable[[], None],
        at_deadline: Prepared | None = None,
    ) -> None:
        self.signal = signal
        self.seen = seen  # the signal's count when the view looked: a later firing counts
        self.deadline = deadline
        self.at_deadline = at_deadline
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __iter__(self) -> Iterator[bytes]:
        # A server that does not know this body would send it as an empty answer: never
        # happens, the view only returns it when the worker said it can park.
        self.release()
        return iter(())

    def close(self) -> None:
        self.release()


def wait_in_thread(signal: Signal, seconds: float) -> None:
    """Wait in this thread until `signal` fires or `seconds` pass (servers that cannot park).
    Never in the worker's loop: no view that waits is marked to answer there (inline.py)."""
    woken = threading.Event()
    signal.subscribe(woken.set)
    try:
        woken.wait(seconds)
    finally:
        signal.unsubscribe(woken.set)


class Stream:
    """A body made of chunks as things happen; see the module's notes."""

    def __init__(
        self,
        next_chunk: Callable[[], bytes | None],
        next_deadline: Callable[[], float],
        signal: Signal,
        release: Callable[[], None],
        clock: Clock = SYSTEM,
    ) -> None:
        self.next_chunk = next_chunk
        """Non-blocking: the next bytes to write, None when there are none yet, END at the end."""
        self.next_deadline = next_deadline
        """When (monotonic) `next_chunk` must be asked again even if `signal` did not fire."""
        self.signal = signal
        self._release: Callable[[], None] | None = release
        self._clock = clock

    def close(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            chunk = self.next_chunk()
            if chunk == END:
                return
            if chunk is not None:
                yield chunk
                continue
            wait_in_thread(self.signal, max(0.0, self.next_deadline() - self._clock.monotonic()))
