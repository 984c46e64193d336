"""A TCP proxy to PostgreSQL whose path can go silent, for the cut-network tests."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit


class SilentProxy:
    """A TCP proxy on loopback to the PostgreSQL server whose path can go silent.

    `cut()` stops forwarding in both directions while every connection stays open: no reset,
    no answer, and the proxy's own kernel still acknowledges what is sent to it, so TCP
    keepalives on the client see nothing wrong. That is the hardest kind of network failure
    for a client to notice; `heal()` lets the bytes flow again.
    """

    def __init__(self, database_url: str) -> None:
        target = urlsplit(database_url)
        self._target = (target.hostname or "127.0.0.1", target.port or 5432)
        self._database_url = database_url
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept)

    @property
    def url(self) -> str:
        """The database's URL with its host and port pointing at this proxy."""
        parts = urlsplit(self._database_url)
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
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                return
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            if self._closed:
                # close() ran while this connection was being made: it may not have seen it.
                client.close()
                upstream.close()
                return
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
