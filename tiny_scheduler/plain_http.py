"""HTTP/1.1 over plain sockets: the transport of the command line's quick calls and of the
agent's calls to the scheduler.

`requests` (with urllib3, and `http.client` with the `email` package under them) takes
longer to import than a `submit` may take in all (docs/cli.md, "Calling it in a loop"), and
costs the agent a large share of its CPU per job (a claim, a report, heartbeats). So
`client.Client` sends a command's calls through `call`, and the agent's `Wire` its calls
through a `Pool`, wherever they can: plain `http://` and no proxy in the environment
(anything else goes through `requests`, which knows TLS and proxies).

`call` sends one request on a fresh connection (`Connection: close`): a command makes a call
or two, and keeping a socket would only leave it for the server to close. A `Pool` keeps a few
idle connections per server for its next calls, from any thread: a connection carries one
request at a time, and goes back to the pool only once its whole reply has been read and
neither side asked to close it. Both hand back a `Reply` that answers the questions the
callers ask of a `requests.Response`; failing to get an answer is a `NoAnswer`, saying whether
the request may have arrived.

This module owns the bytes on the wire and nothing of the API: it knows no path and no status.

Tests: `tests/test_plain_http.py`.
"""

from __future__ import annotations

import _thread
import json as jsonlib
import os
import select
import socket
from typing import Any
from urllib.parse import SplitResult, urlencode, urlsplit

PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")
"""Environment variables that send a call through a proxy, which only `requests` follows."""

MAX_IDLE = 4
"""Idle connections a `Pool` keeps per server: the agent's threads rarely have more calls out
at once (a waiting heartbeat, a claim or a report, live output, the spool); a connection
beyond these is closed rather than left for the server to time out."""

_MAX_HEAD_BYTES = 64 * 1024
"""A reply whose status line and headers are longer is not a scheduler's."""


class NoAnswer(Exception):
    """No reply came. `timed_out`: a deadline passed (else the connection failed or broke);
    `arrived`: the request was sent whole, so the server may have acted on it."""

    def __init__(self, text: str, timed_out: bool, arrived: bool) -> None:
        super().__init__(text)
        self.timed_out = timed_out
        self.arrived = arrived


class _Dropped(NoAnswer):
    """The connection failed before the first byte of a reply (sending broke, or the server
    closed or reset it): a server that closes a connection without reading the request in it
    has not acted on it, so on a kept connection, which the server may have closed while it
    lay idle, the request may go again on a fresh one."""


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
    """Whether `call` and `Pool` can reach `url` as `requests` would: plain http, and no proxy
    asked for in the environment."""
    return urlsplit(url).scheme == "http" and not any(os.environ.get(n) for n in PROXY_VARIABLES)


class Pool:
    """Connections kept open between calls, up to `max_idle` idle ones per (host, port); with
    none kept, every call goes on a connection of its own and asks the server to close it."""

    def __init__(self, max_idle: int = MAX_IDLE) -> None:
        self.max_idle = max_idle
        self._idle: dict[tuple[str, int], list[socket.socket]] = {}
        # `_thread` rather than `threading`: a command that loads this module for one call
        # does not pay for importing `threading`.
        self._lock = _thread.allocate_lock()
        self._closed = False

    def request(
        self,
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
        address = (parts.hostname or "", parts.port or 80)
        request = _request_bytes(method, parts, headers, json, keep=self.max_idle > 0)
        connect_secs, read_secs = timeout
        kept = self._take(address)
        if kept is not None:
            try:
                return self._carry(kept, address, parts.netloc, url, request, method, read_secs)
            except _Dropped:
                pass  # closed by the server while it lay idle: once more, on a fresh one
        try:
            sock = socket.create_connection(address, connect_secs)
        except TimeoutError:
            raise NoAnswer(f"connecting to {parts.netloc} timed out", True, False) from None
        except OSError as exc:
            raise NoAnswer(f"cannot connect to {parts.netloc}: {exc}", False, False) from None
        # The request in one packet: with Nagle on, a head and a body sent apart wait for the
        # server's delayed ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self._carry(sock, address, parts.netloc, url, request, method, read_secs)

    def close(self) -> None:
        """Close the idle connections; those out on a call are closed when it ends."""
        with self._lock:
            self._closed = True
            idle = [sock for socks in self._idle.values() for sock in socks]
            self._idle.clear()
        for sock in idle:
            sock.close()

    def _carry(
        self,
        sock: socket.socket,
        address: tuple[str, int],
        where: str,
        url: str,
        request: bytes,
        method: str,
        read_secs: float,
    ) -> Reply:
        """The request sent on `sock` and its reply read; `sock` goes back to the pool when
        it may carry another request, else it is closed."""
        try:
            sock.settimeout(read_secs)
            status, headers, content, reusable = _exchange(sock, request, method == "HEAD", where)
        except BaseException:
            sock.close()
            raise
        if not (reusable and self._put(address, sock)):
            sock.close()
        return Reply(url, status, headers, content)

    def _take(self, address: tuple[str, int]) -> socket.socket | None:
        """An idle connection to `address` the server has not closed, the one used last first
        (the least likely to have reached the server's keep-alive timeout)."""
        while True:
            with self._lock:
                idle = self._idle.get(address)
                if not idle:
                    return None
                sock = idle.pop()
            if _quiet(sock):
                return sock
            sock.close()  # its end (or bytes nobody asked for) came while it lay idle

    def _put(self, address: tuple[str, int], sock: socket.socket) -> bool:
        with self._lock:
            idle = self._idle.setdefault(address, [])
            if self._closed or len(idle) >= self.max_idle:
                return False
            idle.append(sock)
            return True


_ONE_CALL = Pool(max_idle=0)


def call(
    method: str,
    url: str,
    *,
    timeout: tuple[float, float],
    headers: dict[str, str] | None = None,
    json: Any = None,
    params: dict[str, str] | None = None,
) -> Reply:
    """Send one request to `url` on a connection of its own and read its whole reply;
    `timeout` is (connect, read) seconds. A redirect is a reply like any other: following it
    is the caller's choice."""
    return _ONE_CALL.request(
        method, url, timeout=timeout, headers=headers, json=json, params=params
    )


def _request_bytes(
    method: str, parts: SplitResult, headers: dict[str, str] | None, json: Any, keep: bool
) -> bytes:
    """The request's head and body, to go out in one `sendall`; `keep`: the connection is to
    be kept (HTTP/1.1's default), else the server is asked to close it after its reply."""
    target = parts.path or "/"
    if parts.query:
        target += f"?{parts.query}"
    body = b"" if json is None else jsonlib.dumps(json).encode()
    lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}"]
    if not keep:
        lines.append("Connection: close")
    lines += ["Accept-Encoding: identity", "User-Agent: tiny-scheduler"]
    if json is not None:
        lines.append("Content-Type: application/json")
    if json is not None or method not in ("GET", "HEAD"):
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _exchange(
    sock: socket.socket, request: bytes, head_only: bool, where: str
) -> tuple[int, _Headers, bytes, bool]:
    """Send `request` and read its reply: the status, headers, body, and whether `sock` may
    carry another request. `_Dropped` when the connection failed before any byte of a reply,
    `NoAnswer` for every other failure."""
    try:
        sock.sendall(request)
    except TimeoutError as exc:  # the server is there, reading nothing: no use sending again
        raise NoAnswer(f"sending to {where} failed: {exc}", False, False) from None
    except OSError as exc:
        raise _Dropped(f"sending to {where} failed: {exc}", False, False) from None
    try:
        first = sock.recv(65536)
    except TimeoutError:
        raise NoAnswer(f"{where} did not answer in time", True, True) from None
    except OSError as exc:
        raise _Dropped(f"{where} broke off its answer: {exc}", False, True) from None
    if not first:
        raise _Dropped(f"{where} closed the connection before a reply", False, True)
    try:
        return _read_reply(sock, head_only, first)
    except TimeoutError:
        raise NoAnswer(f"{where} did not answer in time", True, True) from None
    except (OSError, ValueError) as exc:
        raise NoAnswer(f"{where} broke off its answer: {exc}", False, True) from None


def _read_reply(
    sock: socket.socket, head_only: bool, data: bytes
) -> tuple[int, _Headers, bytes, bool]:
    """The status, headers and body of the reply that starts with `data` on `sock`, and
    whether the connection may carry another request: the reply's own framing (a length, or
    chunks) ended it, neither the reply nor HTTP/1.0 asked to close, and no byte beyond it
    came (we send one request at a time, so such bytes are no reply of ours)."""
    while b"\r\n\r\n" not in data:
        if len(data) > _MAX_HEAD_BYTES:
            raise ValueError("a reply head too long")
        data += _more(sock, "before the end of a reply head")
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
    said = {token.strip().lower() for token in headers.get("Connection", "").split(",")}
    keep = "close" not in said and (version != "HTTP/1.0" or "keep-alive" in said)
    if head_only or status in (204, 304) or 100 <= status < 200:
        # A 1xx is followed by the real reply, which nobody reads: the connection ends here.
        return status, headers, b"", keep and not rest and status >= 200
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        body, rest = _dechunk(sock, rest)
        return status, headers, body, keep and not rest
    length = headers.get("Content-Length")
    if length is None:  # the body ends where the connection does
        while chunk := sock.recv(65536):
            rest += chunk
        return status, headers, rest, False
    wanted = int(length)
    while len(rest) < wanted:
        rest += _more(sock, "inside the body")
    return status, headers, rest[:wanted], keep and len(rest) == wanted


def _dechunk(sock: socket.socket, data: bytes) -> tuple[bytes, bytes]:
    """A chunked body read whole, and the bytes that came after it: each chunk is its size in
    hex, a line, the bytes, a line; a size of 0 ends it, then trailer lines up to an empty
    one (read too, so that a kept connection starts clean at the next reply)."""
    body = b""
    while True:
        while b"\r\n" not in data:
            data += _more(sock, "inside a chunked body")
        size_line, data = data.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        while len(data) < size + 2:
            data += _more(sock, "inside a chunked body")
        body += data[:size]
        data = data[size + 2 :]
    while True:
        while b"\r\n" not in data:
            data += _more(sock, "inside a chunked body's trailer")
        line, data = data.split(b"\r\n", 1)
        if not line:
            return body, data


def _more(sock: socket.socket, where: str) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise ValueError(f"the connection closed {where}")
    return chunk


def _quiet(sock: socket.socket) -> bool:
    """Whether nothing is to be read on an idle kept connection: readable means the server
    closed it (or sent bytes nobody asked for), and it must not carry a request."""
    # poll rather than select: an agent with many jobs may hold descriptors past select's 1024.
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return not poller.poll(0)
