"""The words a job's state is told in on the wire, and the state people read of them: plain
strings and one function, for the clients (`client.py`, `display.py`, the command line's quick
`submit`) that must start in milliseconds.

`jobs.py` defines the job itself, its enums taking their values from here; importing it costs
a command line tens of milliseconds (dataclasses, a 40-field class), which a `submit` in a
shell loop pays on every call.

Tests: `tests/test_jobs_model.py` (the state people read).
"""

from __future__ import annotations

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
FINAL_STATUSES = frozenset((DONE, FAILED))
RUN, SERVICE = "run", "service"
TIMEOUT, CANCELLED = "timeout", "cancelled"  # two of the reasons of a final failure
JOB_ID_PREFIX = "job-"

CANCEL = "cancelled"
"""The state of a cancelled job (and what a cancel asks a job to become, as 409s name it)."""
TIMED_OUT = "timed out"
"""The state of a job that failed by its timeout."""

STATE_OF_REASON = {CANCELLED: CANCEL, TIMEOUT: TIMED_OUT}
"""The failures people read as states of their own (Slurm's CANCELLED and TIMEOUT), by reason."""


def state_of(status: str, reason: str | None) -> str:
    """The state people read for a job's status and reason: `cancelled` and `timed out` for
    the failures they name, the status otherwise (a lost node or a failed dependency is still
    a failure, shown with its reason beside it)."""
    if status == FAILED and reason:
        return STATE_OF_REASON.get(str(reason), FAILED)
    return str(status)
