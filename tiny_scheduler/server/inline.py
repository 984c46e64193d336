"""Requests answered in the worker's event loop, and the one rule they keep: never wait.

A request thread costs a hand-off to it and one back (two context switches, the GIL changing
hands) on every request, more CPU than an agent's poll itself. So the worker (worker.py) first
runs a plain request (its body, if any, received in memory) in its event loop, marked here
as *inline* (`answering`). A request answered
there must not wait for anything — a commit, a lock another thread holds for long, a peer, the
disk — or every connection waits with it. Two guards keep that:

- Only views marked `@answers_inline` (the poll, `/health`, `/leader`, a node's heartbeat)
  run inline at all; any other endpoint asks for a thread before its first hook
  (`api.init_inline`).
- Every place that can wait calls `may_wait()` first: holding a job busy to change it
  (`JobTable.changing`), anything that waits on the store's writer (every commit) or reads
  the disk (`storage/writer.py`), a registry call, forwarding to the leader, waiting for a
  signal. A view whose reply reads the disk as it is written calls it before its reply.
  Inline, it raises `NeedsThread` before anything has changed; the app answers with
  `NEEDS_THREAD` instead of a reply, and the worker runs the same request again on a thread,
  from the start. So a poll that has work to move, or a lost claim to fail, costs one wasted
  look, and every other poll no hand-off at all; likewise a heartbeat that changes what is
  stored about its node.

What that asks of a view marked inline: nothing it does before a `may_wait()` may change
state that a second run would see differently (a count taken, an order consumed). Memory
caches and "last seen" stamps a second run overwrites are fine; a counter is not (the
heartbeat's missed-job count calls `may_wait()` before it counts).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

_state = threading.local()


class NeedsThread(Exception):
    """An inline request reached a place that may wait: run it again on a thread."""


class _NeedsThreadBody:
    """The body the app answers an inline request with when it needs a thread (never sent)."""

    def __iter__(self) -> Iterator[bytes]:
        return iter(())

    def close(self) -> None:
        pass


NEEDS_THREAD = _NeedsThreadBody()


def active() -> bool:
    """Whether this thread is answering a request inline (the worker's loop, then)."""
    return getattr(_state, "active", False)


def may_wait() -> None:
    """Call before anything that can wait: inline, it raises NeedsThread instead."""
    if getattr(_state, "active", False):
        raise NeedsThread


class answering:
    """`with answering():` marks the requests this thread runs meanwhile as inline."""

    def __enter__(self) -> None:
        _state.active = True

    def __exit__(self, *exc: object) -> None:
        _state.active = False


F = TypeVar("F", bound=Callable[..., Any])


def answers_inline(view: F) -> F:
    """Mark a view as one that may run inline (it still calls `may_wait` where it waits)."""
    view.answers_inline = True  # type: ignore[attr-defined]
    return view


def may_answer_inline(view: Callable[..., Any] | None) -> bool:
    return getattr(view, "answers_inline", False)
