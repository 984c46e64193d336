"""Users as the scheduler limits them: the settings an admin gives a user (`PUT /users/{name}`:
how many of its `run` jobs may run at once, `max_running`) and the rules that apply them.

A user is the `owner` of the jobs its tokens submit; jobs submitted with the shared key have no
owner (""), and count as one more user for fair share but can have no limit. The settings are
stored durably (`UserSettings`, one record per user that has ever been set) and kept in memory
by the job table (`state.user_limits`), which applies them when it hands work out.

Pure: a user name's form, and how many more of a user's jobs may start (`room`).

Tests: `tests/test_user_limits.py`.
"""

from __future__ import annotations

import dataclasses
import re

MAX_NAME = 64
_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")
NAME_MESSAGE = f"user must be 1 to {MAX_NAME} characters of A-Za-z0-9._@-"
MAX_RUNNING_MESSAGE = "max_running must be an integer of at least 1, or null"


@dataclasses.dataclass(frozen=True, slots=True)
class UserSettings:
    """What is stored of a user: how many of its `run` jobs may run at once (None: any)."""

    name: str
    max_running: int | None = None


def is_valid_name(name: object) -> bool:
    """1 to 64 characters of `A-Za-z0-9._@-`, and not `.` or `..` (a path segment)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None and name not in (".", "..")


def room(settings: UserSettings | None, running: int) -> int | None:
    """How many more of the user's `run` jobs may start now, cluster-wide, with `running` of
    them running; None when nothing limits the user."""
    if settings is None or settings.max_running is None:
        return None
    return max(0, settings.max_running - running)


def refusal(settings: UserSettings, running: int) -> str:
    """Why a job of the user may not start now (a claim's 409, and why a job waits)."""
    return f"user {settings.name} at its limit ({running} running)"
