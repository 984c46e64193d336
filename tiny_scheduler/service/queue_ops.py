"""Queues as operators see them: the listing (`GET /queues`) and changing a queue's settings
(`PUT /queues/{name}`), stored durably and then applied by the job table, which owns handing
work out by them (`table.JobTable.starting`, the poll)."""

from __future__ import annotations

import dataclasses
import logging
import threading

from ..domain.queues import QueueSettings
from .core import Core

log = logging.getLogger("tiny_scheduler.service")


@dataclasses.dataclass(frozen=True, slots=True)
class QueueView:
    """One queue: its jobs waiting and running, and its settings."""

    queue: str
    pending: int
    running: int
    max_running: int | None
    paused: bool

    def to_wire(self) -> dict[str, object]:
        return dataclasses.asdict(self)


class QueueOps:
    """Listing queues and changing their settings."""

    def __init__(self, core: Core) -> None:
        self._core = core
        # Two changes of settings at once: the table must end with what the store has.
        self._changing = threading.Lock()

    def listing(self) -> list[QueueView]:
        """Every queue that has jobs (of any status) or settings, by name."""
        with self._core.table.queue_limits() as limits:
            settings = limits.settings()
            counts = limits.counts()
        return [
            _view(name, counts.get(name, (0, 0)), settings.get(name))
            for name in sorted(set(settings) | set(counts))
        ]

    def update(self, settings: QueueSettings) -> QueueView:
        """Store a queue's settings, then apply them; the queue as it stands after."""
        core = self._core
        with self._changing:
            core.store.save_queue(settings)
            with core.table.queue_limits() as limits:
                limits.set(settings)
        log.info(
            "queue %s: max_running %s, %s",
            settings.name,
            settings.max_running,
            "paused" if settings.paused else "not paused",
        )
        with core.table.queue_limits() as limits:
            counts = limits.counts().get(settings.name, (0, 0))
        return _view(settings.name, counts, settings)


def _view(name: str, counts: tuple[int, int], settings: QueueSettings | None) -> QueueView:
    settings = settings or QueueSettings(name)
    return QueueView(name, *counts, settings.max_running, settings.paused)
