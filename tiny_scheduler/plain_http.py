"""One HTTP/1.1 call over a plain socket: the transport of the command line's quick calls.

`requests` (with urllib3, and `http.client` with the `email` package under them) takes
longer to import than a `submit` may take in all (docs/cli.md, "Calling it in a loop"), so
`client.Client` sends a command's calls through `call` instead wherever it can: plain `http://`
and no proxy in the environment (anything else goes through `requests`, which knows TLS and
proxies). `call` sends one request on a fresh connection (`Connection: close`), reads the
whole reply, and hands back a `Reply` that answers the questions the client asks of a
`requests.Response`. Failing to get an answer is a `NoAnswer`, saying whether the request may
have arrived.

This module owns the bytes on the wire and nothing of the API: it knows no path and no status.

Tests: `tests/test_plain_http.py`.
"""

from __future__ import annotations

import json as jsonlib
import os
import socket
from typing import Any
from urllib.parse import urlencode, urlsplit

PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")
"""Environment variables that send a call through a proxy, which only `requests` follows."""

_MAX_HEAD_BYTES = 64 * 1024
"""A reply whose status line and headers are longer is not a scheduler's."""


class NoAnswer(Exception):
    """No reply came. `timed_out`: a deadline passed (else the connection failed or broke);
    `arrived`: the request was sent whole, so the server may have acted on it."""

    def __init__(self, text: str, timed_out: bool, arrived: bool) -> None:
        super().__init__(text)
        self.timed_out = timed_out
        self.arrived = arrived


class Reply:
    """A whole HTTP reply: what the client reads of one (`status_code`, `ok`, `headers`,
    `content`, `text`, `json()`, `url`)."""

    def __init__(self, url: str, status_code: int, headers: _Headers, content: bytes) -> None:
        self.url = url
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def ok(self) -> bool:
        return self.status_code < 400

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not JSON."""
        return jsonlib.loads(self.content)


class _Headers(dict):  # type: ignore[type-arg]
    """Reply headers by name, in any case (`Retry-After` and `retry-after` are one)."""

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)


def usable_for(url: str) -> bool:
    """Whether `call` can reach `url` as `requests` would: plain http, and no proxy asked
    for in the environment."""
    return urlsplit(url).scheme == "http" and not any(os.environ.get(n) for n in PROXY_VARIABLES)


def call(
    method: str,
    url: str,
    *,
    timeout: tuple[float, float],
    headers: dict[str, str] | None = None,
    json: Any = None,
    params: dict[str, str] | None = None,
) -> Reply:
    """Send one request to `url` and read its whole reply; `timeout` is (connect, read)
    seconds. A redirect is a reply like any other: following it is the caller's choice."""
    if params:
        url = f"{url}{'&' if '?' in url else '?'}{urlencode(params)}"
    parts = urlsplit(url)
    target = parts.path or "/"
    if parts.query:
        target += f"?{parts.query}"
    body = b"" if json is None else jsonlib.dumps(json).encode()
    lines = [
        f"{method} {target} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Connection: close",
        "Accept-Encoding: identity",
        "User-Agent: tiny-scheduler",
    ]
    if json is not None:
        lines.append("Content-Type: application/json")
    if json is not None or method not in ("GET", "HEAD"):
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    connect_secs, read_secs = timeout
    try:
        sock = socket.create_connection((parts.hostname, parts.port or 80), connect_secs)
    except TimeoutError:
        raise NoAnswer(f"connecting to {parts.netloc} timed out", True, False) from None
    except OSError as exc:
        raise NoAnswer(f"cannot connect to {parts.netloc}: {exc}", False, False) from None
    with sock:
        # The request in one packet: with Nagle on, a head and a body sent apart wait for the
        # server's delayed ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(read_secs)
        try:
            sock.sendall(request)
        except OSError as exc:
            raise NoAnswer(f"sending to {parts.netloc} failed: {exc}", False, False) from None
        try:
            status, reply_headers, content = _read_reply(sock, method == "HEAD")
        except TimeoutError:
            raise NoAnswer(f"{parts.netloc} did not answer in time", True, True) from None
        except (OSError, ValueError) as exc:
            raise NoAnswer(f"{parts.netloc} broke off its answer: {exc}", False, True) from None
    return Reply(url, status, reply_headers, content)


def _read_reply(sock: socket.socket, head_only: bool) -> tuple[int, _Headers, bytes]:
    """The status, headers and body of the reply arriving on `sock` (the server closes the
    connection after it: we asked for `Connection: close`)."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > _MAX_HEAD_BYTES:
            raise ValueError("a reply head too long")
        chunk = sock.recv(65536)
        if not chunk:
            raise ValueError("the connection closed before a reply")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    version, _, code = status_line.partition(" ")
    if not version.startswith("HTTP/") or not code[:3].isdigit():
        raise ValueError(f"not an HTTP reply: {status_line[:80]!r}")
    headers = _Headers()
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    status = int(code[:3])
    if head_only or status in (204, 304) or 100 <= status < 200:
        return status, headers, b""
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        return status, headers, _dechunk(sock, rest)
    length = headers.get("Content-Length")
    wanted = int(length) if length is not None else None
    while wanted is None or len(rest) < wanted:
        chunk = sock.recv(65536)
        if not chunk:
            if wanted is not None:
                raise ValueError("the connection closed inside the body")
            break
        rest += chunk
    return status, headers, rest if wanted is None else rest[:wanted]


def _dechunk(sock: socket.socket, data: bytes) -> bytes:
    """A chunked body read whole: each chunk is its size in hex, a line, the bytes, a line;
    a size of 0 ends it."""
    body = b""
    while True:
        while b"\r\n" not in data:
            data += _more(sock)
        size_line, data = data.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return body
        while len(data) < size + 2:
            data += _more(sock)
        body += data[:size]
        data = data[size + 2 :]


def _more(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise ValueError("the connection closed inside a chunked body")
    return chunk
