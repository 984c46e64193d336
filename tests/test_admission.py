"""What the worker closes when clients open more connections than it may hold
(`tiny_scheduler/server/admission.py`), on its pure bookkeeping: near a cap (90 %) each new
connection sheds the oldest idle or head-less one, of its own address first; below that
nothing is shed; a connection in a request is never shed; when nothing can be shed, a full
cap refuses. The same rules on a live daemon, with real sockets from several loopback
addresses, are in tests/test_connection_flood.py."""

from __future__ import annotations

import itertools

import pytest

from tiny_scheduler.server.admission import Admission, high_water

_ids = itertools.count()


class Conn:
    """A connection as admission sees it: any hashable thing."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.id = next(_ids)

    def __repr__(self) -> str:
        return f"{self.address}#{self.id}"


class Loop:
    """What the worker's loop does with admission's answers: close what it names, then open
    the new connection if there is room."""

    def __init__(self, total: int, per_client: int) -> None:
        self.admission: Admission[Conn] = Admission(total, per_client)
        self.open: set[Conn] = set()
        self.shed: list[Conn] = []
        self.refused = 0

    def connect(self, address: str, busy: bool = False) -> Conn | None:
        for victim in self.admission.to_shed(address):
            self.close(victim)
            self.shed.append(victim)
        if not self.admission.has_room(address):
            self.refused += 1
            return None
        conn = Conn(address)
        self.admission.opened(conn, address)
        self.open.add(conn)
        if busy:
            self.admission.busy(conn)
        return conn

    def close(self, conn: Conn) -> None:
        self.admission.closed(conn, conn.address)
        self.open.discard(conn)


def test_high_water_is_90_percent_and_leaves_room_below_the_cap() -> None:
    assert [high_water(cap) for cap in (10_000, 2_000, 20, 10, 2, 1)] == [9000, 1800, 18, 9, 1, 1]


def test_below_90_percent_nothing_is_shed() -> None:
    loop = Loop(total=100, per_client=20)
    conns = [loop.connect("10.0.0.1") for _ in range(18)]
    assert loop.shed == [] and all(conns)


def test_near_a_clients_cap_each_new_connection_sheds_its_own_oldest_idle() -> None:
    loop = Loop(total=100, per_client=20)
    first = [loop.connect("10.0.0.1") for _ in range(18)]
    other = loop.connect("10.0.0.2")
    assert loop.shed == []  # another address's connection sheds nothing of this one
    for _ in range(50):
        assert loop.connect("10.0.0.1") is not None
    # Oldest first, and never beyond 90 % of the client's cap.
    assert loop.shed[:18] == first
    assert loop.admission.held_by("10.0.0.1") == 18
    assert other in loop.open and loop.refused == 0


def test_a_connection_that_became_idle_again_is_the_newest() -> None:
    loop = Loop(total=100, per_client=10)
    a, b, *_ = [loop.connect("10.0.0.1") for _ in range(9)]
    assert a is not None and b is not None
    loop.admission.busy(a)  # a request on it...
    loop.admission.idle(a, "10.0.0.1")  # ...answered: idle again, the newest now
    loop.connect("10.0.0.1")
    assert loop.shed == [b]


def test_connections_in_a_request_are_never_shed_and_a_full_cap_refuses() -> None:
    loop = Loop(total=100, per_client=5)
    busy = [loop.connect("10.0.0.1", busy=True) for _ in range(5)]
    assert all(busy)
    assert loop.connect("10.0.0.1") is None
    assert loop.refused == 1 and loop.shed == []
    assert loop.connect("10.0.0.2") is not None  # other addresses are not held back
    loop.close(busy[0])  # a request ended and its connection closed: room again
    assert loop.connect("10.0.0.1") is not None


def test_near_the_total_cap_the_new_connections_own_address_pays_first() -> None:
    loop = Loop(total=100, per_client=100)
    crowd = [loop.connect(f"10.0.1.{i % 9}") for i in range(89)]
    mine = loop.connect("10.0.0.1")
    assert loop.shed == [] and mine is not None  # 90 open: at the high water
    again = loop.connect("10.0.0.1")
    assert loop.shed == [mine]  # its own oldest, not the crowd's
    assert loop.connect("10.0.0.3") is not None  # an address with none: the oldest of all
    assert loop.shed == [mine, crowd[0]]
    assert again in loop.open and loop.admission.count == 90


def test_the_issues_flood_from_one_address_leaves_room_for_everyone_else() -> None:
    """10,000 idle keep-alives and a stream of silent connections from one address: that
    address stays at 90 % of its own cap, and a client elsewhere always gets in."""
    loop = Loop(total=10_000, per_client=2_000)
    for _ in range(10_000):
        assert loop.connect("127.0.0.2") is not None
    for _ in range(2_000):
        assert loop.connect("127.0.0.2") is not None  # silent ones: head-less, sheddable
        assert loop.connect("127.0.0.1", busy=True) is not None
        loop.close(next(c for c in loop.open if c.address == "127.0.0.1"))
    assert loop.admission.held_by("127.0.0.2") == 1_800
    assert loop.refused == 0


@pytest.mark.parametrize("total", [64, 100, 10_000])
def test_the_per_client_cap_never_exceeds_the_total(total: int) -> None:
    assert Admission(total, 10**9).per_client == total
