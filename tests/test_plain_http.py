"""`plain_http.call`, the command line's quick transport, against a real socket server on
loopback that sends each reply as raw bytes: a body framed by Content-Length, by chunks or by
the end of the connection, the request as it arrives (one packet: head and JSON body), and
the three ways of getting no answer (nothing listens, nothing answers, the answer breaks off).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

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
