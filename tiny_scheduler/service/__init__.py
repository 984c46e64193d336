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
- `reads`: every read (with why a pending job waits, `why_waiting`), and the outbox of
  final-state events.

`Scheduler` below only wires them together and names their operations; it also keeps the
event log of job changes (`GET /events`) and the count of waiting requests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..clock import SYSTEM, Clock
from ..cluster.node_book import NodeBook
from ..config import Settings
from ..domain.jobs import Job
from ..domain.nodes import NodeRecord
from ..domain.placement import NodeLoad, Placement
from ..server.waiting import Waiters
from ..state.event_log import EventLog
from ..state.schedule_table import ScheduleTable
from ..state.table import JobTable, NodeJobs
from ..storage import OutboxEvent, Writer
from .core import Core, Event, Listener, Move
from .dispatch import Dispatch
from .lifecycle import Lifecycle
from .node_ops import NodeOps, NodeView, Orders
from .output_ops import OutputOps, OutputRead
from .queue_ops import QueueOps, QueueView
from .reads import Page, Reads
from .schedule_ops import ScheduleOps
from .terms import Terms

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
]


class Scheduler:
    """The facade: every change and every read of the jobs goes through one of its methods."""

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

        lifecycle = Lifecycle(core)
        self.submit = lifecycle.submit
        self.update = lifecycle.update
        self.cancel = lifecycle.cancel
        self.fail_running = lifecycle.fail_running
        self.release_slot = lifecycle.release_slot
        self.expire = lifecycle.expire

        book = book or NodeBook(clock, settings.node_heartbeat_secs, settings.node_lost_secs)
        dispatch = Dispatch(core, lifecycle, book)
        self.poll = dispatch.poll
        self.poll_in_memory = dispatch.poll_in_memory
        self.move_pending = dispatch.move_pending

        schedule_ops = ScheduleOps(core, lifecycle)
        self.list_schedules = schedule_ops.list_schedules
        self.get_schedule = schedule_ops.get_schedule
        self.create_schedule = schedule_ops.create_schedule
        self.update_schedule = schedule_ops.update_schedule
        self.delete_schedule = schedule_ops.delete_schedule
        self.due_schedules = schedule_ops.due_schedules
        self.fire_schedule = schedule_ops.fire_schedule
        self.run_schedule = schedule_ops.run_schedule

        node_ops = NodeOps(core, lifecycle, dispatch, book, settings.builtin_registry)
        node_ops.load(nodes or [])
        self.heartbeat = node_ops.heartbeat
        self.heartbeat_in_memory = node_ops.heartbeat_in_memory
        self.set_drain = node_ops.set_drain
        self.nodes = node_ops.nodes
        self.node = node_ops.node
        self.fence_holds = node_ops.fence_holds

        queue_ops = QueueOps(core)
        self.list_queues = queue_ops.list_queues
        self.set_queue = queue_ops.set_queue

        output_ops = OutputOps(core)
        self.append_output = output_ops.append
        self.read_output = output_ops.read
        self.output_signal = output_ops.signal

        self.events = EventLog(clock)
        self.listeners.append(self._log_event)
        self.waiters = Waiters(settings.max_waiters)

        terms = Terms(core, node_ops, leadership)
        self.is_serving = terms.is_serving
        self.leader = terms.leader
        self.cluster = terms.cluster
        self.leader_changes = terms.leader_changes
        self.take_over = terms.take_over
        self.hand_over = terms.hand_over
        self.health = terms.health

        reads = Reads(core)
        self.get = reads.get
        self.waiting_for = reads.waiting_for
        self.list_jobs = reads.list_jobs
        self.with_output = reads.with_output
        self.counts = reads.counts
        self.running = reads.running
        self.busy_nodes = reads.busy_nodes
        self.jobs_on = reads.jobs_on
        self.queue_depths = reads.queue_depths
        self.recent_jobs = reads.recent_jobs
        self.node_health = reads.node_health
        self.node_loads = reads.node_loads
        self.cached_nodes = reads.cached_nodes
        self.schedule = reads.schedule
        self.store_health = reads.store_health
        self.watch_commits = reads.watch_commits
        self.keep_final_events = reads.keep_final_events
        self.waiting_events = reads.waiting_events
        self.events_delivered = reads.events_delivered
        self.events_waiting = reads.events_waiting

    def _log_event(self, event: Event, job: Job | None, detail: str) -> None:
        if job is not None:
            self.events.add(job)
