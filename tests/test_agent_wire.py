"""The agent's `Wire` against real loopback servers that keep their connections, through both
of its transports: `plain_http`'s kept sockets (plain http, no proxy) and a `requests` session
(forced here by a proxy in the environment, which loopback calls then do not use).

What the agent counts on whichever carries the call: a standby's redirect followed with the
bearer key kept, `503 no leader` and a silent or absent daemon leaving for the next URL, the URL
that answered asked first next time, `Unreachable` and `outages` when none answers, one kept
connection for a run of calls, and calls from several threads at once each getting their own
reply.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from test_plain_http import Conn, KeptServer, answer_all, kept_servers

from tiny_scheduler import plain_http
from tiny_scheduler.agent.wire import Unreachable, Wire

Start = Callable[[Callable[[Conn, int], None]], KeptServer]


@pytest.fixture(params=["plain", "requests"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    for name in plain_http.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if request.param == "requests":
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9/")
    return str(request.param)


@pytest.fixture
def kept(transport: str) -> Iterator[Start]:
    with kept_servers() as start:
        yield start


def target(head: bytes) -> str:
    return head.split(b" ")[1].decode()


def echo(conn: Conn, number: int = 0) -> None:
    """Every request answered with its own target, so that each caller can tell its reply."""
    while (head := conn.read_request()) is not None:
        body = target(head).encode()
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


def no_leader(conn: Conn, number: int = 0) -> None:
    answer_all(
        conn, number, b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\n\r\nno leader"
    )


def silent(conn: Conn, number: int = 0) -> None:
    while conn.read_request() is not None:
        pass


def nothing_listens() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_standbys_redirect_is_followed_with_the_key(kept: Start, transport: str) -> None:
    leader = kept(echo)

    def standby(conn: Conn, number: int) -> None:
        while (head := conn.read_request()) is not None:
            conn.send(
                b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %s%s\r\nContent-Length: 0\r\n\r\n"
                % (leader.url.encode(), target(head).encode())
            )

    wire = Wire([kept(standby).url], key="sekrit")
    reply = wire.call("GET", "/jobs", params={"status": "pending"})
    wire.close()
    assert (reply.status_code, reply.text) == (200, "/jobs?status=pending")
    (sent,) = leader.requests
    assert b"\r\nAuthorization: Bearer sekrit\r\n" in sent
    assert (b"python-requests" in sent) == (transport == "requests")


def test_no_leader_moves_on_and_the_answering_url_is_asked_first(kept: Start) -> None:
    standby, leader = kept(no_leader), kept(echo)
    wire = Wire([standby.url, leader.url])
    assert [wire.call("PUT", f"/nodes/n{n}", json={}).text for n in range(2)] == [
        "/nodes/n0",
        "/nodes/n1",
    ]
    assert (len(standby.requests), len(leader.requests)) == (1, 2)
    lone = Wire([standby.url])  # no other URL: the 503 is the answer
    assert lone.call("GET", "/jobs").status_code == 503
    assert lone.outages == wire.outages == 0
    wire.close()
    lone.close()


def test_no_answer_anywhere_is_unreachable_and_an_outage(kept: Start) -> None:
    quiet = kept(silent)
    wire = Wire([nothing_listens(), quiet.url, kept(echo).url])
    assert wire.call("GET", "/health", timeout=(1.0, 1.0)).text == "/health"
    assert wire.outages == 0
    wire.close()
    wire = Wire([nothing_listens(), quiet.url])
    with pytest.raises(Unreachable):
        wire.call("PATCH", "/jobs/j", json={}, timeout=(1.0, 0.5))
    assert wire.outages == 1
    wire.close()


def test_a_run_of_calls_goes_on_one_connection_and_close_ends_it(kept: Start) -> None:
    server = kept(echo)
    wire = Wire([server.url])
    for path in ("/nodes/n", "/jobs/j", "/jobs"):
        assert wire.call("PATCH", path, json={"n": 1}).text == path
    assert server.accepted == 1
    wire.close()
    assert server.conns[0].read_request() is None


def test_calls_from_several_threads_each_get_their_own_reply(kept: Start) -> None:
    server = kept(echo)
    wire = Wire([server.url])
    wrong: list[str] = []

    def calls(thread: int) -> None:
        for n in range(25):
            path = f"/jobs/t{thread}-{n}"
            if (got := wire.call("PATCH", path, json={}).text) != path:
                wrong.append(got)

    threads = [threading.Thread(target=calls, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wire.close()
    assert wrong == []
    assert len(server.requests) == 100
    assert server.accepted <= 4  # each thread's connection kept for its next call
