"""The recent job changes, numbered, for `GET /events` (server-sent events).

Every committed change of a job (submitted, claimed, finished, retried, moved) becomes one
event `{"job_id","status","node_id","reason","retry_count"}` with an id one above the
previous. The log keeps the last `WINDOW` of them in memory: a client that reconnects with
`Last-Event-ID` gets what followed that id, or, when the id is older than the window (or from
another run of the daemon), a `reset` first, after which it should read the jobs afresh.

Ids start each run at the wall clock in microseconds, so an id of an earlier run is never
taken for one of this run (it is smaller than every id here, hence "too old").

Tests: `tests/test_live_output.py` (the event stream).
"""

from __future__ import annotations

import collections
import threading

import orjson

from ..clock import Clock
from ..domain.jobs import Job
from ..notify import Signal

WINDOW = 10_000
"""Events kept for resuming streams."""


class EventLog:
    """The numbered recent changes, and a signal fired on each."""

    def __init__(self, clock: Clock, window: int = WINDOW) -> None:
        self._lock = threading.Lock()
        self._events: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=window)
        self._next_id = clock.now_us()
        self.signal = Signal()

    def add(self, job: Job) -> None:
        data = {
            "job_id": job.job_id,
            "status": str(job.status),
            "node_id": job.node_id,
            "retry_count": job.retry_count,
        }
        if job.reason is not None:
            data["reason"] = str(job.reason)
        with self._lock:
            self._next_id += 1
            self._events.append((self._next_id, orjson.dumps(data)))
        self.signal.fire()

    def last_id(self) -> int:
        with self._lock:
            return self._next_id

    def since(self, after: int, limit: int = 1000) -> tuple[list[tuple[int, bytes]], bool]:
        """The events after id `after` (at most `limit`, oldest first), and whether some
        were lost: `after` is older than the window."""
        with self._lock:
            if after > self._next_id:
                return [], True  # not an id of this run
            if not self._events:
                return [], after < self._next_id
            first = self._events[0][0]
            lost = after < first - 1
            start = max(0, after - first + 1)
            found = [self._events[i] for i in range(start, min(len(self._events), start + limit))]
        return found, lost
