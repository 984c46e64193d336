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
- A view marked inline asks the service's memory-only entry point for its answer
  (`from_memory`: `poll_in_memory`, `heartbeat_in_memory`; `/health` and `/leader` read
  memory only). The entry point decides, before it changes anything, whether the answer
  needs more than memory (a commit, a job held busy, the disk): then it gives None, the view
  raises `NeedsThread`, the app answers with `NEEDS_THREAD` instead of a reply, and the
  worker runs the same request again on a thread, from the start. So a poll that has work to
  move, or a lost claim to fail, costs one wasted look, and every other poll no hand-off at
  all; likewise a heartbeat that changes what is stored about its node or misses a job.
  A view that waits in plain code (the listing's disk reads, forwarding to the leader)
  calls `may_wait()` first, which raises `NeedsThread` in the loop.

Nothing below the service knows of any of this: the table, the store, the registry client
and the node book never ask where they run. What that asks of an entry point: nothing it
does before it gives None may change state that a second run would see differently (a count
taken, an order consumed). Memory caches and "last seen" stamps a second run overwrites are
fine (the poll's remembered offer, the heartbeat's last beat); a counter is not (the
heartbeat's missed-job count is never taken in the loop).
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


T = TypeVar("T")


def from_memory(in_memory: Callable[[], T | None], on_thread: Callable[[], T]) -> T:
    """The answer of a view marked inline: in the loop, what the service's memory-only entry
    point gives, or NeedsThread when it gives None (it changed nothing then); on a thread,
    the full operation, which may wait."""
    if not active():
        return on_thread()
    answer = in_memory()
    if answer is None:
        raise NeedsThread
    return answer


def may_answer_inline(view: Callable[..., Any] | None) -> bool:
    return getattr(view, "answers_inline", False)
