"""Terms of leadership (PostgreSQL): who serves, beginning and ending a term, and `/health`.

With SQLite there are no terms: the one daemon always serves. With PostgreSQL a daemon serves
only while it leads; a term begins by loading every job and schedule into fresh tables and
ends by forgetting them (a standby holds none).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import TYPE_CHECKING

from ..state.audit_log import AuditLog
from ..state.schedule_table import ScheduleTable
from ..state.table import JobTable
from ..state.token_book import TokenBook
from ..version import version
from .core import Core
from .node_ops import NodeOps

if TYPE_CHECKING:  # psycopg is imported only by a daemon on PostgreSQL
    from ..cluster.leadership import Leadership, LeaderView

log = logging.getLogger("tiny_scheduler.service")

_SQLITE_ID = uuid.uuid4().hex[:12]


@dataclasses.dataclass(frozen=True, slots=True)
class DaemonView:
    """One daemon of the cluster, as `GET /cluster` and the dashboard show it."""

    id: str
    url: str
    role: str
    version: str
    started_at: int  # microseconds since the epoch
    last_seen_at: int
    seen_secs_ago: float  # by the database's clock, as of now
    alive: bool = True  # False: not seen for longer than a live daemon ever goes (killed)


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterView:
    """Who leads, in which epoch, and every daemon that recorded itself."""

    leader: str | None
    epoch: int
    daemons: tuple[DaemonView, ...]
    this: str  # the id of the daemon answering


class Terms:
    """This daemon's part in leadership, as the service sees it."""

    def __init__(self, core: Core, node_ops: NodeOps, leadership: Leadership | None) -> None:
        self._core = core
        self._node_ops = node_ops
        self._leadership = leadership  # None with SQLite: the one daemon always serves
        self._started_us = core.clock.now_us()  # this daemon's start, as `/cluster` shows it

    def is_serving(self) -> bool:
        """Whether this daemon answers the API itself: always with SQLite; with PostgreSQL
        only while it leads (a standby sends clients to the leader)."""
        return self._leadership is None or self._leadership.is_serving()

    def is_peer(self, url: str) -> bool:
        """Whether `url` is the advertised URL of a daemon sharing the database (from the
        last lease round's read); never with SQLite."""
        leadership = self._leadership
        return leadership is not None and any(row.url == url for row in leadership.roster.daemons)

    def leader(self) -> LeaderView | None:
        """Who leads; None with SQLite, where this daemon is the only one."""
        return None if self._leadership is None else self._leadership.view()

    def leader_changes(self) -> int:
        """How often this daemon saw the leadership change hands (0 with SQLite)."""
        return 0 if self._leadership is None else self._leadership.leader_changes

    def cluster(self, own_url: str) -> ClusterView:
        """The daemons sharing the database (from the last lease round's read: no database call
        here); with SQLite just this one, leading. `own_url` names this daemon when it
        advertises no URL."""
        leadership = self._leadership
        if leadership is None:
            now = self._core.clock.now_us()
            url = self._core.settings.advertise_url or own_url
            me = DaemonView(_SQLITE_ID, url, "leader", version(), self._started_us, now, 0.0)
            return ClusterView(url, 0, (me,), _SQLITE_ID)
        view = leadership.view()
        roster = leadership.roster
        # The rows' ages by the database's clock when read, plus the time since: no
        # comparison of this machine's clock with the database's.
        since = max(0.0, self._core.clock.monotonic() - leadership.roster_read_monotonic)
        # The lease, not a row, says who leads: a leader killed before it could write its row
        # again still says "leader" there; it is listed as what it is now, not leading, and
        # its "last seen" stops.
        daemons = tuple(
            DaemonView(
                row.id,
                row.url,
                "leader" if row.url == view.leader_url else "standby",
                row.version,
                row.started_at,
                row.last_seen_at,
                seen,
                seen <= leadership.gone_after_secs,
            )
            for row in roster.daemons
            for seen in (max(0.0, (roster.read_at - row.last_seen_at) / 1e6) + since,)
        )
        daemons = tuple(sorted(daemons, key=lambda daemon: (daemon.role != "leader", daemon.url)))
        return ClusterView(view.leader_url, view.epoch, daemons, leadership.daemon_id)

    def take_over(self) -> int:
        """Begin a term as leader: every job and schedule from the store in fresh tables, so
        nothing of an earlier term survives; ids go on after the store's high-water marks.
        Returns the number of jobs."""
        core = self._core
        loaded = core.store.reload()
        core.table = JobTable(
            loaded.jobs,
            loaded.last_seq,
            loaded.queues,
            loaded.users,
            core.settings.fairshare_half_life_secs,
        )
        core.placement.count_loads_in(core.table)
        core.schedules = ScheduleTable(loaded.schedules, loaded.last_schedule_seq)
        core.tokens = TokenBook(loaded.tokens, loaded.last_token_seq)
        core.audit = AuditLog(loaded.audit, loaded.last_audit_id)
        self._node_ops.load(loaded.nodes)
        log.info(
            "loaded %d jobs (last id job-%d), %d schedules, %d SNS events waiting",
            len(loaded.jobs),
            loaded.last_seq,
            len(loaded.schedules),
            loaded.events,
        )
        return len(loaded.jobs)

    def hand_over(self) -> None:
        """End a term: forget the jobs and schedules (a standby holds none)."""
        core = self._core
        core.table = JobTable()
        core.placement.count_loads_in(core.table)
        core.schedules = ScheduleTable()
        core.tokens = TokenBook()  # a standby checks tokens against the database
        core.audit = AuditLog()
        self._node_ops.forget()

    def health(self) -> dict[str, object]:
        core = self._core
        body: dict[str, object] = {"service": "scheduler"}
        if self._leadership is not None and not self._leadership.is_serving():
            # A standby writes nothing: it is healthy while it can reach the database.
            reachable, error = self._leadership.health()
            body.update(status="healthy" if reachable else "unhealthy", role="standby")
            if error is not None:
                body["error"] = f"job database cannot be reached: {error}"
            return body
        # The store's own probe keeps its verdict fresh: nothing here touches the disk, so
        # load balancers may poll as often as they like.
        healthy, error = core.store.health()
        body["status"] = "healthy" if healthy else "unhealthy"
        if self._leadership is not None:
            body["role"] = "leader"
        body["jobs"] = core.table.counts()
        if not healthy:
            body["error"] = f"job store cannot be written: {error}"
        # The node source's state as last seen (never a call from here: a health check must
        # not wait on a peer). It does not make the scheduler unhealthy: agents still poll
        # and report while it is away.
        registry = core.placement.source.last_outcome()
        body["registry"] = "unknown" if registry is None else "unreachable" if registry else "ok"
        if registry:
            body["registry_error"] = registry
        return body
