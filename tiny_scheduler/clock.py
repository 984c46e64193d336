"""The clock, handed in rather than reached for.

Every decision that depends on time (timeouts, lost nodes, delayed jobs, leases, schedule
fires, how long a node list is fresh) reads one of two readings from a `Clock` it was given:

- `now_us()`: wall-clock microseconds since the epoch, the time stored on jobs and shown;
- `monotonic()`: seconds that only go forward, for intervals measured inside this process.

The daemon runs on `SYSTEM`. Tests of pure decisions run on a `ManualClock`, which moves only
when the test moves it: a rule can be checked exactly at its boundary, with no sleep. There is
no second wall clock to reach for: the dashboard reads the service's `clock` too.

Deadlines on I/O in the plumbing (the storage writer, the lock file, connecting to PostgreSQL,
forwarding over HTTP, the client's retries, the dashboard's cost of a chart) keep reading
`time.monotonic()`: they bound real waits and real work, which a clock that a test holds still
would never end, and no rule of the scheduler depends on them.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["SYSTEM", "Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def now_us(self) -> int:
        """Wall-clock microseconds since the Unix epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary start that never go backwards."""
        ...


class SystemClock:
    """The machine's clocks."""

    @staticmethod
    def now_us() -> int:
        return time.time_ns() // 1000

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()


SYSTEM: Clock = SystemClock()


class ManualClock:
    """A clock that stands still until told to move: both readings move together."""

    def __init__(self, now_us: int = 1_800_000_000_000_000) -> None:
        self._now_us = now_us
        self._monotonic = 1000.0

    def now_us(self) -> int:
        return self._now_us

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, secs: float) -> None:
        """Move both readings forward by `secs` seconds."""
        if secs < 0:
            raise ValueError("a clock does not go back")
        self._now_us += round(secs * 1_000_000)
        self._monotonic += secs

    def set_us(self, now_us: int) -> None:
        """Move the wall clock to `now_us` (forward only); the monotonic reading follows."""
        self.advance((now_us - self._now_us) / 1_000_000)
