"""How the dashboard writes times, durations and endings for people: "3 min ago", "2.4 s",
"exit 3".

Pure functions over the job model's integer microseconds; registered as Jinja filters by the
ui blueprint. The browser script (`static/ui.js`) writes relative times the same way when it
refreshes them between page loads, so the two must agree on the wording.
"""

from __future__ import annotations

import datetime

from ..domain import jobs
from ..service.moves import LOST_BY_AGENT

_UNITS = ((86400, "d"), (3600, "h"), (60, "min"), (1, "s"))

# How a final reason reads in a sentence; `exit` is written with its code instead.
_REASONS = {
    "timeout": "timed out",
    "node_lost": "node lost",
    "cancelled": "cancelled",
    "dependency_failed": "dependency failed",
}


def exact_time(us: int) -> str:
    """A job time in full, in UTC: `2026-11-30 10:20:30.123 UTC`."""
    moment = datetime.datetime.fromtimestamp(us / 1e6, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d} UTC"


def relative_time(us: int, now_us: int) -> str:
    """How long ago `us` was, in its largest unit: `just now`, `42 s ago`, `3 min ago`."""
    seconds = (now_us - us) / 1e6
    if abs(seconds) < 1:
        return "just now"
    text = _largest_unit(abs(seconds))
    return f"{text} ago" if seconds > 0 else f"in {text}"


def duration(start_us: int | None, end_us: int | None) -> str:
    """The time between two stamps: `850 ms`, `12.4 s`, `3 min 20 s`, `2 h 5 min`; `` when
    either is missing."""
    if start_us is None or end_us is None:
        return ""
    seconds = max(0, end_us - start_us) / 1e6
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def _largest_unit(seconds: float) -> str:
    for size, name in _UNITS:
        if seconds >= size:
            return f"{int(seconds // size)} {name}"
    return "0 s"


def ending(reason: str, exit_code: int | None, stderr: str = "") -> str:
    """Why an attempt failed, in words: `exit 3`, `timed out`, `node lost`, `cancelled`.

    A job failed for good carries its `reason`; an earlier attempt that was retried has none,
    and the scheduler's own endings are then known by the stderr it wrote (exit -1)."""
    if not reason and exit_code == -1:
        if stderr == jobs.NODE_LOST_STDERR:
            return "node lost"
        if stderr == LOST_BY_AGENT:
            return "lost by its agent"
        if stderr == jobs.TIMED_OUT_STDERR:
            return "timed out"
    if reason in _REASONS:
        return _REASONS[reason]
    return f"exit {exit_code}" if exit_code is not None else "agent error"


def job_state(job: jobs.Job) -> str:
    """The state people read (`jobs.state_of`): `cancelled` and `timed out` apart from
    `failed`."""
    return jobs.state_of(job.status, job.reason)


def job_ending(job: jobs.Job) -> str:
    """`ending` of a failed job as a whole (its reason is set once it failed for good)."""
    return ending(job.reason.value if job.reason else "", job.exit_code, job.stderr.strip())
