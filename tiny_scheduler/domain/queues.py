"""Queues: the named lines jobs wait in, and the settings an operator gives each one.

A job names its queue (`default` unless it says otherwise). A queue's settings are a limit on
how many of its `run` jobs run at once across the cluster (`max_running`, None: no limit) and
whether it is `paused` (hands nothing out; what runs goes on). They are stored durably
(`QueueSettings`, one record per queue that has ever been set) and kept in memory by the job
table, which applies them when it hands work out.

The rules here are pure: what a queue name may be, and how many more of a queue's jobs may
start given how many run (`room`).

Tests: `tests/test_queue_limits.py`, `tests/test_workflow_queues.py`.
"""

from __future__ import annotations

import dataclasses
import re

DEFAULT_QUEUE = "default"
MAX_NAME = 64
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclasses.dataclass(frozen=True, slots=True)
class QueueSettings:
    """What is stored of a queue: its limit and whether it is paused."""

    name: str
    max_running: int | None = None  # running `run` jobs of the queue at most; None: no limit
    paused: bool = False

    @property
    def holds_back(self) -> bool:
        """Whether these settings can keep a due job of the queue from being handed out."""
        return self.paused or self.max_running is not None


DOT_SEGMENTS = (".", "..")
"""Names that fit the characters but not a path: clients normalise `/queues/..` away (RFC
3986's dot segments), so a queue of that name could never be addressed."""


def is_valid_name(name: object) -> bool:
    """1 to 64 characters of `A-Za-z0-9._-`, and not `.` or `..` (safe in a URL path, a metric
    label and a shell)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None and name not in DOT_SEGMENTS


def room(settings: QueueSettings | None, running: int) -> int | None:
    """How many more of the queue's jobs may start now, cluster-wide, with `running` of its
    `run` jobs running; None when nothing holds the queue back."""
    if settings is None or not settings.holds_back:
        return None
    if settings.paused:
        return 0
    assert settings.max_running is not None
    return max(0, settings.max_running - running)


def refusal(settings: QueueSettings, running: int) -> str:
    """Why a job of the queue may not start now (a claim's 409, and why a job waits)."""
    if settings.paused:
        return f"queue {settings.name} paused"
    return f"queue {settings.name} at its limit ({running} running)"
