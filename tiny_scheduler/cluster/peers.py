"""Calling a peer (registry, SQS, SNS): one HTTP call with a total deadline, and its outcome.

Every call has one deadline for all of it: connecting, sending, and the whole answer, head and
body. Clients that bound each read separately (requests, urllib3) let a peer that trickles its
answer a byte a second hold a thread for as long as it likes; here every socket operation may
only wait for what is left of the call's deadline, so a trickling, hung or silent peer costs
one call its deadline and nothing more. Each call's outcome (`ok`, `error`, `unreachable`,
`garbage`) is told to the observers (the metrics) and every failure is logged once, here.

One connection per call, closed after it: peers are called a few times a second at most, and
a connection that outlives its call is a connection nobody bounds.
"""

from __future__ import annotations

import functools
import http.client
import json
import logging
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from ..redaction import redacted

log = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""A peer's answer larger than this is garbage (a node list of a small cloud is kilobytes)."""


class Outcome(str, Enum):
    """How one call to a peer ended."""

    __str__ = str.__str__

    OK = "ok"  # an answer the caller accepts
    ERROR = "error"  # an answer with a status the caller does not accept
    UNREACHABLE = "unreachable"  # no answer within the deadline
    GARBAGE = "garbage"  # an answer that cannot be read


CallObserver = Callable[[str, str, Outcome], None]
"""Told (peer, endpoint, outcome) after every call."""


class CallFailed(Exception):
    """A call to a peer did not give an answer the caller accepts."""

    def __init__(self, outcome: Outcome, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome


class Peer:
    """Calls to one peer's base URL, each bounded by `deadline_secs` in all."""

    def __init__(
        self,
        name: str,
        base_url: str,
        deadline_secs: float,
        observers: list[CallObserver] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        self.name = name
        self.base_url = base_url
        self.shown_url = redacted(base_url)
        """The base URL as the log shows it: without the credentials it may carry."""
        self.deadline_secs = deadline_secs
        self.observers = observers if observers is not None else []
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        # Host is host[:port]: user info in the URL is not part of it (RFC 9110), and a
        # peer or a proxy logs the header as it came.
        host = parts.netloc.rpartition("@")[2]
        self._headers = {"Host": host, "Connection": "close", **(headers or {})}

    def call(
        self,
        method: str,
        path: str,
        endpoint: str,
        body: bytes | None = None,
        accept: Sequence[int] = (200,),
    ) -> tuple[int, bytes]:
        """(status, body) of an answer whose status is in `accept`; CallFailed otherwise."""
        answer = self._answer(method, path, endpoint, body, accept)
        self._tell(endpoint, Outcome.OK)
        return answer

    def call_json(
        self,
        method: str,
        path: str,
        endpoint: str,
        body: bytes | None = None,
        accept: Sequence[int] = (200,),
    ) -> tuple[int, Any]:
        """Like `call`, with a 200 answer decoded as JSON (CallFailed `garbage` when it is not
        JSON; None for the other accepted statuses)."""
        status, data = self._answer(method, path, endpoint, body, accept)
        if status != 200:
            self._tell(endpoint, Outcome.OK)
            return status, None
        try:
            # The standard library's parser, not orjson: a peer's answer may carry a lone
            # surrogate (an SQS body), which must reach the caller to be refused there.
            decoded = json.loads(data)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            detail = f"{method} {self.shown_url + path} answered non-JSON: {data[:200]!r}"
            self._failed(endpoint, Outcome.GARBAGE, detail)
            raise CallFailed(Outcome.GARBAGE, "answer is not JSON") from None
        self._tell(endpoint, Outcome.OK)
        return status, decoded

    def _answer(
        self, method: str, path: str, endpoint: str, body: bytes | None, accept: Sequence[int]
    ) -> tuple[int, bytes]:
        url = self.shown_url + path  # for the log only
        try:
            status, data = self._exchange(method, self._prefix + path, body)
        except CallFailed as exc:
            self._failed(endpoint, exc.outcome, f"{method} {url}: {exc}")
            raise
        except (OSError, http.client.HTTPException) as exc:
            detail = str(exc) or type(exc).__name__
            self._failed(endpoint, Outcome.UNREACHABLE, f"{method} {url}: {detail}")
            raise CallFailed(Outcome.UNREACHABLE, detail) from None
        if status not in accept:
            text = data[:200].decode("utf-8", "replace")
            self._failed(endpoint, Outcome.ERROR, f"{method} {url} answered {status}: {text}")
            raise CallFailed(Outcome.ERROR, f"answered {status}")
        return status, data

    def _exchange(self, method: str, target: str, body: bytes | None) -> tuple[int, bytes]:
        deadline = time.monotonic() + self.deadline_secs
        conn = BoundedConnection(self._host, self._port, deadline, self._tls)
        try:
            conn.request(method, target, body=body, headers=self._headers)
            response = conn.getresponse()
            data = response.read(MAX_ANSWER_BYTES + 1)
            if len(data) > MAX_ANSWER_BYTES:
                raise CallFailed(Outcome.GARBAGE, f"answer over {MAX_ANSWER_BYTES} bytes")
            return response.status, data
        finally:
            conn.close()

    def _failed(self, endpoint: str, outcome: Outcome, detail: str) -> None:
        log.warning("%s %s (%s)", self.name, detail, outcome)
        self._tell(endpoint, outcome)

    def _tell(self, endpoint: str, outcome: Outcome) -> None:
        for observe in self.observers:
            observe(self.name, endpoint, outcome)


# --- sockets that wait no longer than their call's deadline ------------------------------------


class _Bounded:
    """Mixed into a socket class: before each blocking operation, the socket's timeout is set
    to what is left of the call's deadline (set as `self.deadline` after creation)."""

    deadline: float

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.settimeout(left)  # type: ignore[attr-defined]

    def recv_into(self, *args: Any) -> int:
        self._arm()
        return super().recv_into(*args)  # type: ignore[misc]

    def recv(self, *args: Any) -> bytes:
        self._arm()
        return super().recv(*args)  # type: ignore[misc]

    def sendall(self, *args: Any) -> None:
        self._arm()
        return super().sendall(*args)  # type: ignore[misc]

    def send(self, *args: Any) -> int:
        self._arm()
        return super().send(*args)  # type: ignore[misc]


class _BoundedSocket(_Bounded, socket.socket):
    pass


class _BoundedTLSSocket(_Bounded, ssl.SSLSocket):
    pass


@functools.cache
def _tls() -> ssl.SSLContext:
    """The TLS context of calls to https peers, made on the first such call: loading the
    system's CA certificates cost every start-up 50 ms, and most daemons never call one."""
    context = ssl.create_default_context()
    context.sslsocket_class = _BoundedTLSSocket
    return context


class BoundedConnection(http.client.HTTPConnection):
    """An HTTP/1.1 connection whose every socket operation honours one deadline (monotonic).

    Also used by the standbys' forwarding (`api/forward.py`), which moves the deadline on
    once the leader's answer has begun (`extend`)."""

    def __init__(self, host: str, port: int, deadline: float, tls: bool = False) -> None:
        super().__init__(host, port)
        self._deadline = deadline
        self._tls = tls

    def extend(self, deadline: float) -> None:
        """Let the rest of the exchange run until `deadline` instead."""
        self._deadline = deadline
        if self.sock is not None:
            self.sock.deadline = deadline

    def connect(self) -> None:
        sock = _open(self.host, self.port, self._deadline)
        if self._tls:
            sock.settimeout(max(0.001, self._deadline - time.monotonic()))
            sock = _tls().wrap_socket(sock, server_hostname=self.host)
            sock.deadline = self._deadline
        self.sock = sock


def _open(host: str, port: int, deadline: float) -> _BoundedSocket:
    error: OSError = TimeoutError("deadline passed")
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock = _BoundedSocket(family, kind, proto)
        sock.deadline = deadline
        try:
            sock.settimeout(left)
            sock.connect(address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error
