"""`plain_http.call`, the command line's quick transport, against a real socket server on
loopback that sends each reply as raw bytes: a body framed by Content-Length, by chunks or by
the end of the connection, the request as it arrives (one packet: head and JSON body), and
the three ways of getting no answer (nothing listens, nothing answers, the answer breaks off).

Then `plain_http.Pool`, the agent's transport, against a server that keeps connections open
and counts them: a second call goes on the first call's connection; one the server closed or
spoiled while it lay idle is left for a fresh one (and a request sent on it just before is sent
once more, on a fresh one); one that may have reached the server is never sent twice; a reply
that asks to close ends its connection; replies framed in every way follow each other on one.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tiny_scheduler import plain_http


class RawServer:
    """Accepts connections one after another; to each it sends `reply` after reading the
    request's head and body (unless `reply` is None: then it holds the connection open)."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, body = data.split(b"\r\n\r\n", 1)
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            while len(body) < length:
                body += conn.recv(65536)
            self.requests.append(head + b"\r\n\r\n" + body)
            if self.reply is None:
                self.held.append(conn)
                continue
            conn.sendall(self.reply)
            conn.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def serve() -> Iterator[list[RawServer]]:
    made: list[RawServer] = []
    yield made
    for server in made:
        server.close()


def started(serve: list[RawServer], reply: bytes | None) -> RawServer:
    server = RawServer(reply)
    serve.append(server)
    return server


def test_a_json_post_goes_whole_and_its_reply_is_read_by_its_length(
    serve: list[RawServer],
) -> None:
    server = started(
        serve,
        b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 18\r\n"
        b'Retry-After: 3\r\n\r\n{"job_id":"job-1"}trailing junk never read',
    )
    reply = plain_http.call(
        "POST",
        f"{server.url}/jobs",
        timeout=(2.0, 5.0),
        json={"command": "echo é"},
        headers={"Idempotency-Key": "k1"},
    )
    assert (reply.status_code, reply.ok) == (201, True)
    assert reply.json() == {"job_id": "job-1"}
    assert reply.headers["retry-after"] == reply.headers.get("Retry-After") == "3"
    assert "Content-Type" in reply.headers and "X-Other" not in reply.headers
    (sent,) = server.requests
    head, body = sent.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /jobs HTTP/1.1\r\n")
    assert b"\r\nIdempotency-Key: k1" in head and b"\r\nConnection: close" in head
    assert json.loads(body) == {"command": "echo é"}


def test_a_query_and_a_chunked_reply(serve: list[RawServer]) -> None:
    server = started(
        serve,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4\r\n[1, \r\n3;ext=1\r\n2]\n\r\n0\r\n\r\n",
    )
    reply = plain_http.call(
        "GET", f"{server.url}/jobs", timeout=(2.0, 5.0), params={"status": "pending", "q": "a b"}
    )
    assert reply.json() == [1, 2]
    assert reply.url == f"{server.url}/jobs?status=pending&q=a+b"
    assert server.requests[0].startswith(b"GET /jobs?status=pending&q=a+b HTTP/1.1\r\n")


def test_a_reply_ended_by_the_connection_and_an_error_status(serve: list[RawServer]) -> None:
    server = started(
        serve, b"HTTP/1.0 404 NOT FOUND\r\nContent-Type: text/plain\r\n\r\nnot found\n"
    )
    reply = plain_http.call("GET", f"{server.url}/nope", timeout=(2.0, 5.0))
    assert (reply.status_code, reply.ok, reply.text) == (404, False, "not found\n")


def test_nothing_listening_is_no_answer_that_never_arrived() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(plain_http.NoAnswer) as caught:
            plain_http.call("GET", f"http://127.0.0.1:{port}/health", timeout=(2.0, 2.0))
    assert (caught.value.timed_out, caught.value.arrived) == (False, False)


def test_no_reply_in_time_may_have_arrived(serve: list[RawServer]) -> None:
    server = started(serve, None)
    with pytest.raises(plain_http.NoAnswer) as caught:
        plain_http.call("POST", f"{server.url}/jobs", timeout=(2.0, 0.5), json={})
    assert (caught.value.timed_out, caught.value.arrived) == (True, True)


def test_a_reply_cut_short_is_no_answer(serve: list[RawServer]) -> None:
    server = started(serve, b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial')
    with pytest.raises(plain_http.NoAnswer) as caught:
        plain_http.call("GET", f"{server.url}/jobs/job-1", timeout=(2.0, 2.0))
    assert (caught.value.timed_out, caught.value.arrived) == (False, True)


def test_only_plain_http_without_a_proxy_is_carried(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in plain_http.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert plain_http.usable_for("http://127.0.0.1:9001")
    assert not plain_http.usable_for("https://sched.example:9001")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert not plain_http.usable_for("http://sched.example:9001")


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Conn:
    """One accepted connection of a `KeptServer`, as its handler sees it."""

    def __init__(self, server: KeptServer, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.data = b""

    def read_request(self) -> bytes | None:
        """The next request, head and body (recorded in `server.requests`); None when the
        client closed the connection."""
        while b"\r\n\r\n" not in self.data:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.data += chunk
        head, self.data = self.data.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        while len(self.data) < length:
            self.data += self.sock.recv(65536)
        body, self.data = self.data[:length], self.data[length:]
        self.server.requests.append(head + b"\r\n\r\n" + body)
        return head

    def send(self, *pieces: bytes) -> None:
        """Send `pieces` apart, a moment between them: a reply the client must put together."""
        for number, piece in enumerate(pieces):
            if number:
                time.sleep(0.02)
            self.sock.sendall(piece)

    def wait_readable(self) -> None:
        """Until the client's next request has begun to arrive (read none of it)."""
        select.select([self.sock], [], [], 10.0)


class KeptServer:
    """Accepts connections and hands each, on a thread of its own, to `handle(conn, number)`
    (`number`: 0 for the first accepted); counts the connections and records the requests."""

    def __init__(self, handle: Callable[[Conn, int], None]) -> None:
        self.handle = handle
        self.accepted = 0
        self.requests: list[bytes] = []
        self.conns: list[Conn] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.sock.accept()
            except OSError:
                return
            conn = Conn(self, sock)
            self.conns.append(conn)
            number, self.accepted = self.accepted, self.accepted + 1
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: Conn, number: int) -> None:
        with contextlib.suppress(OSError):  # the test closed the server under it
            self.handle(conn, number)

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.sock.close()


def answer_all(conn: Conn, number: int = 0, reply: bytes = OK) -> None:
    """A server's usual way: every request answered, the connection kept until the client
    closes it."""
    while conn.read_request() is not None:
        conn.send(reply)


@contextlib.contextmanager
def kept_servers() -> Iterator[Callable[[Callable[[Conn, int], None]], KeptServer]]:
    """A maker of keep-alive test servers, each serving with the handler it is given; all
    closed at the end."""
    made: list[KeptServer] = []

    def start(handle: Callable[[Conn, int], None]) -> KeptServer:
        made.append(KeptServer(handle))
        return made[-1]

    try:
        yield start
    finally:
        for server in made:
            server.close()


@pytest.fixture
def kept() -> Iterator[Callable[[Callable[[Conn, int], None]], KeptServer]]:
    with kept_servers() as start:
        yield start


@pytest.fixture
def pool() -> Iterator[plain_http.Pool]:
    made = plain_http.Pool()
    yield made
    made.close()


def test_a_second_call_goes_on_the_first_ones_connection(
    kept: Callable[[Callable[[Conn, int], None]], KeptServer], pool: plain_http.Pool
) -> None:
    server = kept(answer_all)
    for _ in range(3):
        reply = pool.request("PATCH", f"{server.url}/jobs/j", timeout=(2.0, 5.0), json={})
        assert (reply.status_code, reply.text) == (200, "ok")
    assert (server.accepted, len(server.requests)) == (1, 3)
    assert all(b"Connection: close" not in sent for sent in server.requests)
    pool.close()
    assert server.conns[0].read_request() is None  # closing the pool closed its connection


def test_a_connection_spoiled_while_idle_is_left_for_a_fresh_one(
    kept: Callable[[Callable[[Conn, int], None]], KeptServer], pool: plain_http.Pool
) -> None:
    idle, spoiled = threading.Event(), threading.Event()

    def handle(conn: Conn, number: int) -> None:
        if number:
            return answer_all(conn)
        conn.read_request()
        conn.send(OK)
        idle.wait(10.0)
        # What some servers say as they time an idle connection out: a reply to no request.
        conn.send(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
        conn.sock.close()
        spoiled.set()

    server = kept(handle)
    assert pool.request("GET", f"{server.url}/a", timeout=(2.0, 5.0)).status_code == 200
    idle.set()
    assert spoiled.wait(10.0)  # on loopback, what was sent has arrived
    assert pool.request("GET", f"{server.url}/b", timeout=(2.0, 5.0)).status_code == 200
    assert (server.accepted, len(server.requests)) == (2, 2)


@pytest.mark.parametrize("how", ["reset", "end"])
def test_a_request_on_a_connection_closed_unread_goes_once_more_on_a_fresh_one(
    kept: Callable[[Callable[[Conn, int], None]], KeptServer], pool: plain_http.Pool, how: str
) -> None:
    def handle(conn: Conn, number: int) -> None:
        if number:
            return answer_all(conn)
        conn.read_request()
        conn.send(OK)
        # The server's keep-alive timeout strikes as the next request comes: it is never read.
        conn.wait_readable()
        if how == "reset":
            conn.sock.close()  # with bytes unread: a reset
        else:
            conn.sock.shutdown(socket.SHUT_WR)

    server = kept(handle)
    assert pool.request("GET", f"{server.url}/a", timeout=(2.0, 5.0)).status_code == 200
    reply = pool.request("POST", f"{server.url}/b", timeout=(2.0, 5.0), json={"n": 1})
    assert (reply.status_code, reply.text) == (200, "ok")
    assert server.accepted == 2
    assert [sent.split(b" ")[1] for sent in server.requests] == [b"/a", b"/b"]


@pytest.mark.parametrize(
    "how, timed_out, kept_first",
    [
        ("closed unanswered", False, False),
        # Closed unanswered on a kept connection is not here: the client cannot tell it from
        # the keep-alive timeout above, and sends the request once more.
        ("silent", True, False),
        ("silent", True, True),
        ("cut short", False, False),
        ("cut short", False, True),
    ],
)
def test_a_request_the_server_read_is_never_sent_twice(
    kept: Callable[[Callable[[Conn, int], None]], KeptServer],
    pool: plain_http.Pool,
    how: str,
    timed_out: bool,
    kept_first: bool,
) -> None:
    def handle(conn: Conn, number: int) -> None:
        if number:
            return answer_all(conn)
        if kept_first:
            conn.read_request()
            conn.send(OK)
        conn.read_request()
        if how == "closed unanswered":
            conn.sock.close()
        elif how == "cut short":
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Le")
            conn.sock.close()
        else:
            conn.read_request()  # until the client gives up and closes

    server = kept(handle)
    if kept_first:
        assert pool.request("GET", f"{server.url}/a", timeout=(2.0, 5.0)).status_code == 200
    with pytest.raises(plain_http.NoAnswer) as caught:
        pool.request("POST", f"{server.url}/jobs", timeout=(2.0, 1.0), json={})
    assert (caught.value.timed_out, caught.value.arrived) == (timed_out, True)
    assert server.accepted == 1
    assert len(server.requests) == 1 + kept_first


@pytest.mark.parametrize(
    "reply, connections",
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", 2),
        (b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, Close\r\nContent-Length: 2\r\n\r\nok", 2),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 2),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", 1),
        (OK, 1),
    ],
    ids=["1.1-close", "1.1-close-among-others", "1.0", "1.0-keep-alive", "1.1"],
)
def test_a_reply_that_asks_to_close_ends_its_connection(
    kept: Callable[[Callable[[Conn, int], None]], KeptServer],
    pool: plain_http.Pool,
    reply: bytes,
    connections: int,
) -> None:
    # The server keeps every connection open whatever it said: the client's choice is tested.
    server = kept(lambda conn, number: answer_all(conn, number, reply))
    for _ in range(2):
        assert pool.request("GET", f"{server.url}/a", timeout=(2.0, 5.0)).text == "ok"
    assert server.accepted == connections


def test_replies_framed_every_way_follow_each_other_on_one_connection(
    kept: Callable[[Callable[[Conn, int], None]], KeptServer], pool: plain_http.Pool
) -> None:
    def handle(conn: Conn, number: int) -> None:
        conn.read_request()
        conn.send(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n[1, ",
            b"\r\n3;ext=1\r\n2]\n\r",
            b"\n0\r\nX-Trailer: 1\r\n",
            b"\r\n",
        )
        conn.read_request()
        conn.send(b'HTTP/1.1 201 Created\r\nContent-Length: 9\r\n\r\n{"a"', b":  1}")
        conn.read_request()
        conn.send(b"HTTP/1.1 204 No Content\r\n\r\n")
        conn.read_request()
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")  # a HEAD's: no body
        answer_all(conn)

    server = kept(handle)
    url = f"{server.url}/jobs"
    assert pool.request("GET", url, timeout=(2.0, 5.0)).json() == [1, 2]
    assert pool.request("POST", url, timeout=(2.0, 5.0), json={}).content == b'{"a":  1}'
    assert pool.request("DELETE", url, timeout=(2.0, 5.0)).content == b""
    assert pool.request("HEAD", url, timeout=(2.0, 5.0)).headers["Content-Length"] == "5"
    assert pool.request("GET", url, timeout=(2.0, 5.0)).text == "ok"
    assert (server.accepted, len(server.requests)) == (1, 5)
