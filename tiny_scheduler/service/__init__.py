"""The service: the one way in to the jobs, for the API, the loops, the dashboard and metrics.

It knows nothing of HTTP. Its parts each own one concern and decide apart from committing:

- `core`: the shared state (settings, clock, store, placement, the term's tables) and the one
  place a change is committed and announced;
- `lifecycle`: submit, the agent's reports, cancel, failures seen by the scheduler, retries,
  retention;
- `dispatch` with `moves`: the agent poll and moving waiting work (`moves` decides, purely,
  which jobs go where);
- `schedule_ops`: schedule changes and fires (`schedules.plan` decides);
- `node_ops`: heartbeats (with the nodes' stop orders), drains, the node listing;
- `output_ops`: live output, appended by agents and read from any offset;
- `terms`: leadership terms and `/health`;
- `queue_ops`: the queues' listing and settings (the table applies them);
- `user_ops`: the users' listing and limits (the table applies them, and keeps their
  fair-share usage);
- `token_ops`: tokens (create, list, revoke) and who presents one; `audit_ops`: the audit
  trail;
- `reads`: every read (with why a pending job waits, `why_waiting`), and the outbox of
  final-state events.

`Scheduler` below only wires them together and hands them out as its public attributes,
named for their concern (`scheduler.jobs.submit`, `scheduler.dispatch.poll`,
`scheduler.schedules.create`, `scheduler.nodes.heartbeat`, `scheduler.queues.listing`,
`scheduler.output.read`, `scheduler.terms.health`, `scheduler.reads.get`), so a caller's "go to
definition" lands on the method that does the work; it also keeps the event log of job changes
(`GET /events`) and the count of waiting requests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..clock import SYSTEM, Clock
from ..cluster.node_book import NodeBook
from ..config import Settings
from ..domain.audit import AuditRecord
from ..domain.jobs import Job
from ..domain.nodes import NodeRecord
from ..domain.placement import NodeLoad, Placement
from ..domain.tokens import Token
from ..server.waiting import Waiters
from ..state.audit_log import AuditLog
from ..state.event_log import EventLog
from ..state.schedule_table import ScheduleTable
from ..state.table import JobTable, NodeJobs
from ..state.token_book import TokenBook
from ..storage import OutboxEvent, Writer
from . import moves
from .audit_ops import AuditOps
from .core import Core, Event, Listener, Move
from .dispatch import Dispatch
from .lifecycle import Lifecycle
from .node_ops import NodeOps, NodeView, Orders
from .node_waits import NodeWaits
from .output_ops import OutputOps, OutputRead
from .queue_ops import QueueOps, QueueView
from .reads import Page, Reads
from .schedule_ops import ScheduleOps
from .terms import Terms
from .token_ops import TokenOps
from .user_ops import UserOps, UserView

if TYPE_CHECKING:  # psycopg is imported only by a daemon on PostgreSQL
    from ..cluster.leadership import Leadership

__all__ = [
    "Event",
    "Listener",
    "Move",
    "NodeJobs",
    "NodeLoad",
    "NodeView",
    "Orders",
    "OutboxEvent",
    "OutputRead",
    "Page",
    "QueueView",
    "Scheduler",
    "UserView",
]


class Scheduler:
    """The facade: every change and every read of the jobs goes through one of its concern
    objects, each a public attribute named for what it owns, so `scheduler.jobs.submit` is
    the method itself (no alias in between):

    - `jobs` (`Lifecycle`): submit, the agent's reports, cancel, retries, retention;
    - `dispatch` (`Dispatch`): the agent poll and moving waiting work;
    - `schedules` (`ScheduleOps`): schedule changes and fires;
    - `nodes` (`NodeOps`): heartbeats, drains, the node listing;
    - `queues` (`QueueOps`): the queues' listing and settings;
    - `users` (`UserOps`): the users' listing (jobs, fair-share usage) and limits;
    - `tokens` (`TokenOps`): tokens, and who a request's credential is;
    - `audit` (`AuditOps`): the audit trail;
    - `output` (`OutputOps`): live output;
    - `terms` (`Terms`): leadership terms and `/health`;
    - `reads` (`Reads`): every other read, and the outbox of final-state events.

    Its own are the settings, the clock, the listeners of committed changes, the event log
    (`events`) and the waiting requests (`waiters`, and the heartbeats waiting for work:
    `waits`).
    """

    def __init__(
        self,
        settings: Settings,
        store: Writer,
        table: JobTable,
        placement: Placement,
        schedule_table: ScheduleTable | None = None,
        leadership: Leadership | None = None,
        clock: Clock = SYSTEM,
        book: NodeBook | None = None,
        nodes: list[NodeRecord] | None = None,
    ) -> None:
        """`book` is the node book the node source reads (made here when none is given);
        `nodes` the stored nodes (SQLite: loaded with the jobs)."""
        core = Core(settings, clock, store, table, placement, schedule_table or ScheduleTable())
        self._core = core
        self.settings = settings
        self.clock = clock
        self.listeners = core.listeners

        book = book or NodeBook(clock, settings.node_heartbeat_secs, settings.node_lost_secs)
        self.jobs = Lifecycle(core)
        self.dispatch = Dispatch(core, self.jobs, book)
        self.schedules = ScheduleOps(core, self.jobs)
        self.waits = NodeWaits(self._gives_work, core.table.take_released_nodes)
        self.listeners.append(self.waits.on_change)
        self.nodes = NodeOps(
            core, self.jobs, self.dispatch, book, settings.builtin_registry, self.waits
        )
        self.nodes.load(nodes or [])
        self.queues = QueueOps(core)
        self.users = UserOps(core)
        self.output = OutputOps(core)
        self.terms = Terms(core, self.nodes, leadership)
        self.tokens = TokenOps(core, self.terms.is_serving if leadership is not None else None)
        self.audit = AuditOps(core)
        self.reads = Reads(core)

        self.events = EventLog(clock)
        self.listeners.append(self._log_event)
        self.waiters = Waiters(settings.max_waiters)

    def load_credentials(
        self,
        tokens: list[Token],
        last_token_seq: int,
        audit: list[AuditRecord],
        last_audit_id: int,
    ) -> None:
        """The stored tokens and audit trail (SQLite: loaded with the jobs; a PostgreSQL
        leader loads them with each term)."""
        self._core.tokens = TokenBook(tokens, last_token_seq)
        self._core.audit = AuditLog(audit, last_audit_id)

    def _gives_work(self, node_id: str) -> bool:
        """Whether an idle node may take the node's waiting jobs (it cannot start them)."""
        placement = self._core.placement
        nodes = placement.source.cached_nodes()
        if nodes is None or not self.settings.job_stealing:
            return False
        return bool(moves.donors(placement.loads([node_id], nodes), nodes))

    def _log_event(self, event: Event, job: Job | None, detail: str) -> None:
        if job is not None:
            self.events.add(job)
