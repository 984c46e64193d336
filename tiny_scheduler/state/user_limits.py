"""User limits: per user (a job's `owner`), how many of its `run` jobs run and are being
claimed, and whether one more may start (`users.room`, the rule).

The job table tells it of every job version it adds or drops (`add`, `discard`) and asks it how
much room a user has when it hands jobs out; the claim of a job reserves its place (`reserve`)
for as long as its commit takes, so two nodes claiming at once can never both pass the last
free place. Not thread-safe by itself: the table calls it under its lock.

Tests: `tests/test_user_limits.py`.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from .. import errors
from ..domain import jobs, users
from ..domain.jobs import Job
from ..domain.users import UserSettings
from .node_queues import decrement


class UserLimits:
    """Every limited user's settings, and every user's running and pending counts."""

    def __init__(self, settings: Iterable[UserSettings] = ()) -> None:
        self._settings: dict[str, UserSettings] = {u.name: u for u in settings}
        self._running: collections.Counter[str] = collections.Counter()  # `run` jobs
        self._starting: collections.Counter[str] = collections.Counter()  # claims under way
        self._pending: collections.Counter[str] = collections.Counter()

    # --- kept in step with the table ---------------------------------------------------------

    def add(self, job: Job) -> None:
        if job.status == jobs.RUNNING and job.takes_slot:
            self._running[job.owner] += 1
        elif job.status == jobs.PENDING:
            self._pending[job.owner] += 1

    def discard(self, job: Job) -> None:
        if job.status == jobs.RUNNING and job.takes_slot:
            decrement(self._running, job.owner)
        elif job.status == jobs.PENDING:
            decrement(self._pending, job.owner)

    # --- the rule, applied ---------------------------------------------------------------------

    def room(self, owner: str) -> int | None:
        """How many more of the user's jobs may start now; None: no limit."""
        settings = self._settings.get(owner)
        if settings is None or settings.max_running is None:
            return None
        return users.room(settings, self._running[owner] + self._starting[owner])

    def limited(self) -> bool:
        """Whether any user has a limit (else `room` is None for everyone)."""
        return bool(self._settings)

    def reserve(self, job: Job) -> bool:
        """A claim of `job` begins: raise Conflict (naming the user) when its owner runs its
        limit; otherwise count the claim under way. True when a place was reserved (`release`
        it when the claim's commit is over)."""
        settings = self._settings.get(job.owner)
        if settings is None or settings.max_running is None or not job.takes_slot:
            return False
        running = self._running[job.owner]
        if users.room(settings, running + self._starting[job.owner]) == 0:
            raise errors.Conflict(
                f"job {job.job_id} cannot start: {users.refusal(settings, running)}"
            )
        self._starting[job.owner] += 1
        return True

    def release(self, job: Job) -> None:
        """The claim `reserve` counted is over (committed or not)."""
        decrement(self._starting, job.owner)

    # --- reads and settings -------------------------------------------------------------------

    def settings(self) -> dict[str, UserSettings]:
        return dict(self._settings)

    def counts(self) -> dict[str, tuple[int, int]]:
        """(running `run` jobs, pending jobs) of every user that has any."""
        names = set(self._running) | set(self._pending)
        return {name: (self._running[name], self._pending[name]) for name in names}

    def state(self, owner: str) -> tuple[UserSettings | None, int]:
        """The user's settings (None: never set) and its running `run` jobs."""
        return self._settings.get(owner), self._running[owner]

    def set(self, settings: UserSettings) -> None:
        """Apply a user's committed settings (the next poll goes by them)."""
        if settings.max_running is None:
            self._settings.pop(settings.name, None)
        else:
            self._settings[settings.name] = settings
