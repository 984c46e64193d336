"""Plain-text views of jobs for people: a job's state in a few words, aligned tables, short
times. The command line and the demo both print with these.

Pure functions of a job's wire shape (`api.md`): no I/O here, and no rule of the scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .domain.states import DONE, FAILED, PENDING, RUNNING, state_of

HELD = "held"
"""What a held job waits for (the scheduler's `waiting_for` says the same)."""

_PLAIN_EXIT = "exit"
"""The `reason` of a job that failed by its own exit code: the code says it better."""


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Rows as left-aligned columns two spaces apart, under a header line."""
    widths = [len(header) for header in headers]
    for row in rows:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def status_text(job: dict[str, Any]) -> str:
    """The state people read (`jobs.state_of`): `cancelled` and `timed out` as states of their
    own (the wire says `failed`, for old clients), other failures with the `reason` when it
    says more than an exit code (`failed (node lost)`)."""
    reason = job.get("reason")
    state = state_of(job["status"], reason)
    if state == FAILED and reason and reason != _PLAIN_EXIT:
        return f"{state} ({reason.replace('_', ' ')})"
    return state


def describe(job: dict[str, Any]) -> str:
    """`failed (exit 3)`, `done (exit 0)`, `timed out`, `cancelled`, `running on node-2`,
    a job's state in a few words."""
    status = job["status"]
    if status in (PENDING, RUNNING):
        return f"{status} on {job['node_id']}"
    text = status_text(job)
    if text == status and status in (DONE, FAILED) and "exit_code" in job:
        return f"{status} (exit {job['exit_code']})"
    return text


def short_time(stamp: str | None) -> str:
    """`2026-11-30T10:20:30.123456Z` -> `2026-11-30 10:20:30` (still UTC: say so nearby)."""
    if not stamp:
        return "-"
    return stamp[:19].replace("T", " ")


def one_line(text: str, width: int) -> str:
    """`text` with its whitespace runs as single spaces, cut to `width` characters with `…`."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def waiting_for(job: dict[str, Any], now: str | None = None) -> str:
    """What a pending job waits for beyond a free slot: `not before <time>` (a delayed job),
    or the scheduler's own `waiting_for` (dependencies, a queue) when the job carries it;
    '' for any other job. `now` (RFC 3339, as the API writes times) leaves out a time that
    has passed."""
    if job.get("status") != PENDING:
        return ""
    if job.get("held"):
        return HELD
    if job.get("waiting_for"):
        return str(job["waiting_for"])
    not_before = job.get("not_before")
    if not_before and (now is None or not_before > now):
        return f"not before {not_before}"
    return ""


def waiting_text(job: dict[str, Any], now: str | None = None) -> str:
    """`waiting_for` as a clause to put after `describe`: `, not before <time>`,
    `, waiting for <what the scheduler says>`, or ''."""
    what = waiting_for(job, now)
    if not what or what.startswith("not before ") or what == HELD:
        return f", {what}" if what else ""
    return f", waiting for {what}"


def ago(seconds: float) -> str:
    """A short age: `0.4s ago`, `12s ago`, `5m ago`, `3h ago`, `2d ago`."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f}s ago"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def job_line(job: dict[str, Any]) -> str:
    """A job in one line, as a command that made or changed it says: `job-7 pending on
    node-1, held`."""
    return f"{job['job_id']} {describe(job)}{waiting_text(job)}"
