"""The schedule table: every schedule in memory, by id and by name, and the one-at-a-time rule
for changing them.

Schedules are few and change rarely (an operator's edit, a fire every minute at most), so
one lock serializes every change from its check to its commit (`changing`): a name is never
taken twice, and a fire never races an edit or a delete of its schedule. Reads take a short
lock of their own and never wait for a change in progress.

No disk or network I/O here: the service commits, then `put()`s what it committed.

Tests: `tests/test_schedule_firing.py`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator

from ..domain.schedules import Schedule


class ScheduleTable:
    """In-memory schedules; safe to call from any thread."""

    def __init__(self, loaded: Iterable[Schedule] = (), last_seq: int = 0) -> None:
        self._lock = threading.Lock()
        self._changes = threading.Lock()
        self._by_seq: dict[int, Schedule] = {}
        self._by_name: dict[str, int] = {}
        for schedule in sorted(loaded, key=lambda s: s.seq):
            self._by_seq[schedule.seq] = schedule
            self._by_name[schedule.name] = schedule.seq
        self._last_seq = max([last_seq, *self._by_seq])

    def all(self) -> list[Schedule]:
        """Every schedule, oldest first (ids only grow, and the dict keeps insertion order)."""
        with self._lock:
            return list(self._by_seq.values())

    def get(self, seq: int) -> Schedule | None:
        with self._lock:
            return self._by_seq.get(seq)

    def named(self, name: str) -> Schedule | None:
        with self._lock:
            seq = self._by_name.get(name)
            return self._by_seq.get(seq) if seq is not None else None

    def due(self, now: int) -> list[Schedule]:
        """Unpaused schedules whose next fire time has come, oldest first."""
        with self._lock:
            return [
                s
                for s in self._by_seq.values()
                if not s.paused and s.next_run_at is not None and s.next_run_at <= now
            ]

    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        """Hold every other schedule change off while this one is checked and committed."""
        with self._changes:
            yield

    def new_seq(self) -> int:
        """The next schedule number; never handed out twice (call while `changing`)."""
        with self._lock:
            self._last_seq += 1
            return self._last_seq

    def put(self, schedule: Schedule) -> None:
        """Insert a committed schedule, or swap in its committed next version."""
        with self._lock:
            old = self._by_seq.get(schedule.seq)
            if old is not None and old.name != schedule.name:
                del self._by_name[old.name]
            self._by_seq[schedule.seq] = schedule
            self._by_name[schedule.name] = schedule.seq

    def remove(self, seq: int) -> None:
        """Forget a committed deletion; the id stays used."""
        with self._lock:
            old = self._by_seq.pop(seq, None)
            if old is not None:
                del self._by_name[old.name]
