"""Which connections the worker holds when clients open more than it may: the connection
caps (`MAX_CONNECTIONS`, `MAX_CONNECTIONS_PER_CLIENT`) and the choice of what to close.

Every connection the worker holds costs a file descriptor and a place in its loop's selector,
and until it was capped, a client with ten thousand idle keep-alives and a stream of silent new
connections filled the table: the worker stopped accepting, and `/health`, the agent poll and
a standby's forwards waited in the kernel's backlog for seconds. Now a new connection is always
accepted, and room is made for it:

- near a cap (at `HIGH_WATER` of it: 90 %), each new connection closes one **sheddable**
  connection, the oldest: an idle kept-alive connection (between requests) or a head-less one
  (accepted, not one byte of a request yet), by how long it has been so. Of the new
  connection's own address first (whoever opens connections pays with their own oldest),
  then of anyone. So an idle keep-alive is kept its full `keepalive` (120 s) for as long as
  the table stays below 90 % of its caps;
- the per-address cap counts each client address's connections alike: one address flooding
  the worker sheds its own connections long before it gets near the total;
- only when nothing can be shed (every connection is in a request, being answered or
  parked) and a cap is reached, the new connection gets `503 too many connections` with
  `Retry-After: 1` (written by the loop, `connections.TOO_MANY_CONNECTIONS`) and is closed.

A request being received, answered, or parked (an event stream, a waiting read) is never
shed: its deadlines bound it (`connections.REQUEST_READ_SECS`, `MAX_WAITERS`).

Pure bookkeeping, no sockets: the loop (connections.py) tells it what each connection is
doing and closes what it names. Tests: `tests/test_admission.py` (the rules), and
`tests/test_connection_flood.py` (a real daemon, clients from several loopback addresses).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

HIGH_WATER = 0.9
"""The share of a cap from which each new connection closes a sheddable one."""

C = TypeVar("C", bound=Hashable)


def high_water(cap: int) -> int:
    """The count of connections from which a new one sheds an old one (at least 1 below the
    cap when the cap allows, so that the cap itself is kept for what cannot be shed)."""
    return max(1, min(cap - 1, int(cap * HIGH_WATER))) if cap > 1 else 1


class Admission(Generic[C]):
    """The connections held, by address, and which of them may be shed, oldest first."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total = max(1, total)
        self.per_client = max(1, min(per_client, self.total))
        self._total_high = high_water(self.total)
        self._client_high = high_water(self.per_client)
        self.count = 0
        self._of: dict[str | None, int] = {}  # connections held per address
        # Sheddable connections, oldest first (insertion order: when each became sheddable),
        # all of them and per address.
        self._sheddable: dict[C, str | None] = {}
        self._sheddable_of: dict[str | None, dict[C, None]] = {}

    def held_by(self, address: str | None) -> int:
        return self._of.get(address, 0)

    @property
    def sheddable(self) -> int:
        return len(self._sheddable)

    def busiest(self) -> tuple[str | None, int]:
        """The address holding the most connections, and how many (for the log)."""
        if not self._of:
            return None, 0
        address = max(self._of, key=self._of.__getitem__)
        return address, self._of[address]

    # --- what the loop tells ------------------------------------------------------------

    def opened(self, conn: C, address: str | None) -> None:
        """A connection was accepted (head-less: sheddable until its first byte)."""
        self.count += 1
        self._of[address] = self._of.get(address, 0) + 1
        self.idle(conn, address)

    def idle(self, conn: C, address: str | None) -> None:
        """The connection waits for a request that has not begun: sheddable, as the newest."""
        self.busy(conn)
        self._sheddable[conn] = address
        self._sheddable_of.setdefault(address, {})[conn] = None

    def busy(self, conn: C) -> None:
        """A request began on the connection (or it lingers, or is parked): not sheddable."""
        if conn not in self._sheddable:
            return
        address = self._sheddable.pop(conn)
        of = self._sheddable_of[address]
        del of[conn]
        if not of:
            del self._sheddable_of[address]

    def closed(self, conn: C, address: str | None) -> None:
        self.busy(conn)
        self.count -= 1
        left = self._of[address] - 1
        if left:
            self._of[address] = left
        else:
            del self._of[address]

    # --- the decision ---------------------------------------------------------------------

    def to_shed(self, address: str | None) -> list[C]:
        """The connections to close to make room for one more from `address` (nothing is
        changed: the loop closes them, and tells `closed`)."""
        chosen: list[C] = []
        if address is not None and self.held_by(address) >= self._client_high:
            oldest = self._oldest_of(address, chosen)
            if oldest is not None:
                chosen.append(oldest)
        if self.count - len(chosen) >= self._total_high:
            oldest = self._oldest_of(address, chosen)
            if oldest is None:
                oldest = next((conn for conn in self._sheddable if conn not in chosen), None)
            if oldest is not None:
                chosen.append(oldest)
        return chosen

    def has_room(self, address: str | None) -> bool:
        """Whether one more connection from `address` fits under both caps now."""
        if self.count >= self.total:
            return False
        return address is None or self.held_by(address) < self.per_client

    def _oldest_of(self, address: str | None, besides: list[C]) -> C | None:
        for conn in self._sheddable_of.get(address, ()):
            if conn not in besides:
                return conn
        return None
