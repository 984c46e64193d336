"""PostgreSQL for the tests: find the server, make a database of our own, drop it afterwards.

The server is the one at `TEST_POSTGRES_URL`, else `postgresql://postgres@127.0.0.1:5432/postgres`
when it answers. Without one, tests that need it are skipped with one line saying so; with
`TEST_REQUIRE_POSTGRES=1` (CI) that skip is a failure instead.

Every database made here is named `tiny_scheduler_test_<pid>_<n>` and dropped when the test
run ends; one left behind by a run that was killed (its pid gone) is dropped by the next run.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import os
import socket
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
"""The server tests use when TEST_POSTGRES_URL is unset."""

PREFIX = "tiny_scheduler_test_"

_created: list[str] = []
_numbers = itertools.count(1)


def server_url() -> str:
    return os.environ.get("TEST_POSTGRES_URL") or DEFAULT_URL


@functools.cache
def _unreachable() -> str | None:
    """Why the server cannot be used, or None when it answers."""
    try:
        with psycopg.connect(server_url(), connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL not reachable at {server_url()} ({str(exc).strip()})"
    _drop_leftovers()
    return None


def require_server() -> None:
    """Skip the test (fail it under TEST_REQUIRE_POSTGRES=1) when there is no server."""
    reason = _unreachable()
    if reason is None:
        return
    if os.environ.get("TEST_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"{reason}; TEST_REQUIRE_POSTGRES=1 forbids skipping", pytrace=False)
    pytest.skip(reason)


def fresh_database() -> str:
    """The URL of a new, empty database of this test run's own (the test is skipped when
    there is no server)."""
    require_server()
    name = f"{PREFIX}{os.getpid()}_{next(_numbers)}"
    with psycopg.connect(server_url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    _created.append(name)
    return database_url(name)


def database_url(name: str) -> str:
    parts = urlsplit(server_url())
    return urlunsplit(parts._replace(path=f"/{name}"))


def drop_database(name: str) -> None:
    with psycopg.connect(server_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@atexit.register
def _drop_created() -> None:
    for name in _created:
        try:
            drop_database(name)
        except psycopg.Error as exc:
            print(f"could not drop test database {name}: {exc}")


def _drop_leftovers() -> None:
    with psycopg.connect(server_url(), autocommit=True) as conn:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", (PREFIX + "%",)
            )
        ]
    for name in names:
        pid = name[len(PREFIX) :].partition("_")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            drop_database(name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SilentProxy:
    """A TCP proxy on loopback to the PostgreSQL server whose path can go silent.

    `cut()` stops forwarding in both directions while every connection stays open: no reset,
    no answer, and the proxy's own kernel still acknowledges what is sent to it, so TCP
    keepalives on the client see nothing wrong. That is the hardest kind of network failure
    for a client to notice; `heal()` lets the bytes flow again.
    """

    def __init__(self) -> None:
        target = urlsplit(server_url())
        self._target = (target.hostname or "127.0.0.1", target.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept)

    def url(self, database_url: str) -> str:
        """`database_url` with its host and port pointing at this proxy."""
        parts = urlsplit(database_url)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def cut(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked on it; close does not
            sock.close()
        for thread in self._threads:
            thread.join(5)

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                return
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            self._spawn(self._pump, client, upstream)
            self._spawn(self._pump, upstream, client)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            self._flowing.wait()  # cut: hold the bytes, and read no more
            if not data or self._closed:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            try:
                sink.sendall(data)
            except OSError:
                return
