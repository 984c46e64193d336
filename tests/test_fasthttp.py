"""The plain-request path (fasthttp.py) against gunicorn's own objects: for a plain head, the
same environ as gunicorn's `wsgi.create` and the same answer bytes as its `Response` (but the
Date); anything not plain is left to gunicorn (None)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from gunicorn.config import Config
from gunicorn.http import wsgi
from gunicorn.http.message import Request

from tiny_scheduler.server import fasthttp
from tiny_scheduler.server.gunicorn_private import HeadBytes

CFG = Config()
CLIENT = ("127.0.0.1", 40404)
SERVER = ("127.0.0.1", 9001)
LIMITS = (4094, 8190, 100)  # gunicorn's defaults: request line, header field, header count


def plain(data: bytes) -> fasthttp.Head | None:
    return fasthttp.parse_head(data, data.index(b"\r\n\r\n") + 4, *LIMITS)


def gunicorn_request(data: bytes) -> Request:
    return Request(CFG, HeadBytes(data), CLIENT, 1)


class Sink:
    def __init__(self) -> None:
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += bytes(data)

    def send(self, data: bytes) -> int:
        self.sendall(data)
        return len(data)


PLAIN_HEADS = [
    b"GET /jobs?node_id=node-07&status=pending HTTP/1.1\r\nHost: h:9001\r\nAccept: */*\r\n\r\n",
    b"GET /health HTTP/1.0\r\n\r\n",
    b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    b"GET /jobs HTTP/1.1\r\nConnection: close\r\n\r\n",
    b"POST /jobs HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
    b"Idempotency-Key: \xe6\x97\xa5 k \r\nX-A: 1\r\nX-A: 2\r\n\r\n",
    b"PATCH /jobs/job-1 HTTP/1.1\r\nAuthorization: Bearer k\r\nContent-Length: 0\r\n\r\n",
    b"GET /ui/jobs/%6Aob-1?x=%ff&y HTTP/1.1\r\nHost: h\r\nX-Tab: a\tb\r\n\r\n",
    b"DELETE /nowhere/ HTTP/1.1\r\n\r\n",
]


@pytest.mark.parametrize("data", PLAIN_HEADS)
def test_a_plain_head_gets_gunicorns_environ(data: bytes) -> None:
    head = plain(data)
    assert head is not None
    req = gunicorn_request(data)
    body = io.BytesIO()
    _, theirs = wsgi.create(req, Sink(), CLIENT, SERVER, CFG)
    ours = fasthttp.environ(head, wsgi.base_environ(CFG), body, CLIENT, SERVER, "")
    # Objects made per request differ by identity only; gunicorn's socket is the worker's.
    for key in ("wsgi.input", "wsgi.errors", "gunicorn.socket", "wsgi.early_hints"):
        theirs.pop(key, None)
        ours.pop(key, None)
    theirs["wsgi.multithread"] = True  # gthread's handle_request sets it after create
    assert ours == theirs
    assert head.keep_alive == (not req.should_close())
    assert head.content_length == int(theirs.get("CONTENT_LENGTH") or 0)


NOT_PLAIN = [
    b"POST /jobs HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST /jobs HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
    b"POST /jobs HTTP/1.1\r\nContent-Type: a/b\r\nContent-Type: c/d\r\n\r\n",
    b"POST /jobs HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    b"GET /jobs HTTP/1.1\r\nX_Under: 1\r\n\r\n",
    b"GET /jobs HTTP/1.1\r\nX-Forwarded-Proto: https\r\n\r\n",
    b"GET http://h/jobs HTTP/1.1\r\n\r\n",
    b"GET * HTTP/1.1\r\n\r\n",
    b"GET /a#b HTTP/1.1\r\n\r\n",
    b"FOO /jobs HTTP/1.1\r\n\r\n",
    b"GET /jobs HTTP/2.0\r\n\r\n",
    b"GET /jobs HTTP/1.1\r\nBad Name: x\r\n\r\n",
    b"GET /jobs HTTP/1.1\r\nX-Control: a\x01b\r\n\r\n",
    b"GET /jobs HTTP/1.1\r\nX-Fold: a\r\n b\r\n\r\n",
    b"GET /jobs HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
    b"GET /" + b"a" * 4100 + b" HTTP/1.1\r\n\r\n",
    b"GET /jobs HTTP/1.1\r\nX-Big: " + b"a" * 8200 + b"\r\n\r\n",
    b"GET /jobs HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n",
]


@pytest.mark.parametrize("data", NOT_PLAIN)
def test_anything_not_plain_is_left_to_gunicorn(data: bytes) -> None:
    assert plain(data) is None


ANSWERS: list[tuple[bytes, str, list[tuple[str, str]], list[bytes]]] = [
    (
        PLAIN_HEADS[0],
        "200 OK",
        [("Content-Type", "application/json"), ("Content-Length", "2")],
        [b"[]"],
    ),
    (PLAIN_HEADS[0], "200 OK", [("Content-Type", "text/plain")], [b"one", b"", b"two"]),
    (PLAIN_HEADS[1], "200 OK", [("Content-Type", "text/plain")], [b"one", b"two"]),
    (PLAIN_HEADS[2], "200 OK", [("Content-Length", "3")], [b"abcdef"]),
    (PLAIN_HEADS[3], "404 NOT FOUND", [("Content-Length", "10")], [b"not found\n"]),
    (PLAIN_HEADS[4], "204 NO CONTENT", [("Content-Length", "0")], []),
    (PLAIN_HEADS[5], "304 NOT MODIFIED", [("ETag", '"x"')], [b""]),
    (b"HEAD /health HTTP/1.1\r\n\r\n", "200 OK", [("Content-Length", "5")], [b"hello"]),
    (PLAIN_HEADS[0], "200 OK", [("Connection", "keep-alive"), ("Content-Length", "0")], []),
    (PLAIN_HEADS[0], "200 OK", [("Content-Type", "text/event-stream")], []),
]


@pytest.mark.parametrize(("data", "status", "headers", "chunks"), ANSWERS)
def test_an_answer_is_framed_as_gunicorn_frames_it(
    data: bytes, status: str, headers: list[tuple[str, str]], chunks: list[bytes]
) -> None:
    head = plain(data)
    assert head is not None
    ours = Sink()
    reply = fasthttp.Reply(head, ours.sendall)
    reply.start_response(status, headers)
    for chunk in chunks:
        reply.write(chunk)
    reply.close()

    theirs = Sink()
    response = wsgi.Response(gunicorn_request(data), theirs, CFG)
    response.start_response(status, headers)
    for chunk in chunks:
        response.write(chunk)
    response.close()
    assert without_date(ours.data) == without_date(theirs.data)
    assert reply.should_close() == response.should_close()


def without_date(answer: bytes) -> bytes:
    return b"\r\n".join(line for line in answer.split(b"\r\n") if not line.startswith(b"Date: "))


def test_the_worker_says_close_and_the_answer_closes() -> None:
    head = plain(PLAIN_HEADS[0])
    assert head is not None
    head.must_close = True  # the worker's say: stopping, or too many kept-alive connections
    out = Sink()
    reply = fasthttp.Reply(head, out.sendall)
    reply.start_response("200 OK", [("Content-Length", "0")])
    reply.close()
    assert b"\r\nConnection: close\r\n" in out.data and reply.should_close()


def test_a_second_start_response_without_exc_info_is_refused() -> None:
    head: Any = plain(PLAIN_HEADS[0])
    reply = fasthttp.Reply(head, Sink().sendall)
    reply.start_response("200 OK", [])
    with pytest.raises(AssertionError):
        reply.start_response("500 INTERNAL SERVER ERROR", [])
