"""A small pool of read connections beside a backend's one writer, shared by the backends.

Request threads read output (and nothing else) from disk; each borrows a connection here, so
a read never waits for the writer's commit and the writer never waits behind a listing. At
most one connection per thread reading at once; connections are opened when none is idle and
kept for the next reader until the pool is closed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar


class _Closable(Protocol):
    def close(self) -> Any: ...


C = TypeVar("C", bound=_Closable)


class ReaderPool(Generic[C]):
    """Read connections made by `opener`; one that `usable` refuses is dropped, not lent."""

    def __init__(self, opener: Callable[[], C], usable: Callable[[C], bool] = lambda _: True):
        self._open = opener
        self._usable = usable
        self._lock = threading.Lock()
        self._idle: list[C] = []
        self._closed = False

    @contextlib.contextmanager
    def connection(self) -> Iterator[C]:
        conn = None
        with self._lock:
            while self._idle and conn is None:
                conn = self._idle.pop()
                if not self._usable(conn):
                    conn = None
        if conn is None:
            conn = self._open()
        try:
            yield conn
        finally:
            with self._lock:
                keep = not self._closed and self._usable(conn)
                if keep:
                    self._idle.append(conn)
            if not keep:
                conn.close()

    def close(self) -> None:
        """Close the idle connections; one in use is closed when it is given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
