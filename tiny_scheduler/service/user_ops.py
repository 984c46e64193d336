"""Users as admins see them: the listing (`GET /users`, with each user's jobs and fair-share
usage) and changing a user's limit (`PUT /users/{name}`), stored durably and then applied by
the job table, which owns handing work out by it (`state.user_limits`, the poll).

Tests: `tests/test_user_limits.py`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from ..domain.users import UserSettings
from .core import Core

log = logging.getLogger("tiny_scheduler.service")


@dataclasses.dataclass(frozen=True, slots=True)
class UserView:
    """One user: its jobs running and waiting, its fair-share usage and its limit."""

    user: str
    running: int
    pending: int
    usage_cpu_secs: float
    max_running: int | None

    def to_wire(self) -> dict[str, object]:
        out = dataclasses.asdict(self)
        out["usage_cpu_secs"] = round(self.usage_cpu_secs, 3)
        return out


class UserOps:
    """Listing users and changing their limits."""

    def __init__(self, core: Core) -> None:
        self._core = core
        # Two changes at once: the table must end with what the store has.
        self._changing = threading.Lock()

    def listing(self) -> list[UserView]:
        """Every user that has pending or running jobs, a limit, or usage that still counts,
        by name; the jobs of the shared key (no owner) as the user "" when there are any."""
        now = self._core.now()
        with self._core.table.user_limits() as (limits, usage):
            settings = limits.settings()
            counts = limits.counts()
            names = set(settings) | set(counts) | usage.owners()
            return [
                UserView(
                    name,
                    *counts.get(name, (0, 0)),
                    usage.usage(name, now),
                    settings[name].max_running if name in settings else None,
                )
                for name in sorted(names)
            ]

    def update(self, settings: UserSettings) -> UserView:
        """Store a user's limit, then apply it; the user as it stands after."""
        core = self._core
        with self._changing:
            core.store.save_user(settings)
            with core.table.user_limits() as (limits, _):
                limits.set(settings)
        log.info("user %s: max_running %s", settings.name, settings.max_running)
        for view in self.listing():
            if view.user == settings.name:
                return view
        return UserView(settings.name, 0, 0, 0.0, settings.max_running)  # nothing, no limit
