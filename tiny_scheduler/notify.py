"""Waking whoever waits for something to happen, without a thread per waiter.

A `Signal` is a set of callbacks, each called once, from the thread that fires it, the next
time it fires. A waiter that holds no thread (a request parked in the worker's event loop)
subscribes a callback that wakes its loop; one that holds a thread (under a plain server)
subscribes a `threading.Event`'s `set`. Callbacks must be quick: they run on the path of the
change that fired them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Wake = Callable[[], None]


class Signal:
    """One-shot subscriptions to the next firing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[Wake] = []
        self.count = 0
        """How many times it fired: a waiter that looked at `count` before it looked at the
        world, and finds it changed once subscribed, has missed a firing."""

    def subscribe(self, wake: Wake) -> None:
        with self._lock:
            self._waiting.append(wake)

    def unsubscribe(self, wake: Wake) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._waiting.remove(wake)

    def fire(self) -> None:
        with self._lock:
            self.count += 1
            waiting, self._waiting = self._waiting, []
        for wake in waiting:
            try:
                wake()
            except Exception:
                log.exception("a waiter's wake-up failed")
