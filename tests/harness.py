"""The decision tests' harness: one scheduler, all in memory, at an instant the test sets.

Nomad's scheduler harness is the model: it holds the state, records every plan committed, and
runs the real scheduler against them. Here that is the real service (placement, the job table,
the state machine, the schedules) on a `MemoryStore` that records every batch it commits, with
a `ManualClock` that moves only when the test moves it and a `StaticNodes` node source the
test sets. The real scan and schedules loop objects run on the same clock, one tick at a
time. No port, no thread of its own, no sleep: a rule can be checked exactly at its boundary.

What crosses processes (HTTP, crashes, failover, agents) is tested on real daemons instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flask import Flask

from tiny_scheduler import api, metrics, ui
from tiny_scheduler.clock import ManualClock
from tiny_scheduler.cluster.node_book import BuiltinNodes, Drains, NodeBook
from tiny_scheduler.cluster.node_requests import Heartbeat
from tiny_scheduler.config import BUILTIN_REGISTRY, Settings
from tiny_scheduler.domain import jobs, validation
from tiny_scheduler.domain.fit import UNREPORTED_MEMORY, Capacity, Picker, Resources
from tiny_scheduler.domain.jobs import Job
from tiny_scheduler.domain.nodes import NodeSource, StaticNodes
from tiny_scheduler.domain.placement import Placement
from tiny_scheduler.domain.validation import JobRequest, JobUpdate
from tiny_scheduler.loops.scan import Scan
from tiny_scheduler.loops.schedules import ScheduleFiring
from tiny_scheduler.service import Event, Orders, Scheduler
from tiny_scheduler.state.schedule_table import ScheduleTable
from tiny_scheduler.state.table import JobTable
from tiny_scheduler.storage import Batch, Writer
from tiny_scheduler.storage.memory import MemoryDatabase, MemoryStore

NODES = ("node-a", "node-b", "node-c")

T0 = 1_800_000_000_000_000  # 2027-01-15T08:00:00Z: the harness's clock starts here


class Harness:
    """A scheduler in memory. `settings` are Settings fields (max_jobs_per_node=2, ...)."""

    def __init__(
        self,
        nodes: Iterable[str] | StaticNodes = NODES,
        database: MemoryDatabase | None = None,
        clock: ManualClock | None = None,
        builtin: bool = False,
        **settings: Any,
    ) -> None:
        """`builtin`: the scheduler is its own node registry (the nodes are the agents that
        heartbeat, `h.heartbeat`), as with REGISTRY_URL=builtin; else `nodes` is the list."""
        self.clock = clock or ManualClock(T0)
        if isinstance(nodes, StaticNodes):
            self.nodes = nodes
        else:
            self.nodes = StaticNodes({node: "healthy" for node in nodes})
        self.database = database or MemoryDatabase()
        self.store = MemoryStore(self.database)
        registry_url = BUILTIN_REGISTRY if builtin else "http://registry.invalid"
        self.settings = Settings(registry_url=registry_url, **settings)
        writer = Writer(self.store)
        self.writer = writer
        loaded = writer.load()
        table = JobTable(
            loaded.jobs,
            loaded.last_seq,
            loaded.queues,
            loaded.users,
            self.settings.fairshare_half_life_secs,
        )
        schedule_table = ScheduleTable(loaded.schedules, loaded.last_schedule_seq)
        book = NodeBook(self.clock, self.settings.node_heartbeat_secs, self.settings.node_lost_secs)
        source: NodeSource = BuiltinNodes(book) if builtin else self.nodes
        placement = Placement(Drains(source, book), self.settings, table, self.clock)
        self.service = Scheduler(
            self.settings,
            writer,
            table,
            placement,
            schedule_table,
            clock=self.clock,
            book=book,
            nodes=loaded.nodes,
        )
        self.service.load_credentials(
            loaded.tokens, loaded.last_token_seq, loaded.audit, loaded.last_audit_id
        )
        self.scan = Scan(self.service)
        self.firing = ScheduleFiring(self.service)
        self.events: list[tuple[Event, str, str]] = []  # (event, job id or "", detail)
        self.service.listeners.append(
            lambda event, job, detail: self.events.append(
                (event, job.job_id if job else "", detail)
            )
        )

    # --- the world -----------------------------------------------------------------------

    def settle(self) -> None:
        """Commit what rides with the next commit (`Writer.save_soon`: audit records), as the
        daemon's prober does within `writer.RIDE_SECS`; the harness runs no prober."""
        self.writer.probe()

    def advance(self, secs: float) -> None:
        self.clock.advance(secs)

    def set_nodes(self, healthy: Iterable[str] = (), unhealthy: Iterable[str] = ()) -> None:
        status = {node: "healthy" for node in healthy}
        status.update({node: "unhealthy" for node in unhealthy})
        self.nodes.set(status)

    def restart(self) -> Harness:
        """A new scheduler on the same database and clock, as after a crash or a failover."""
        fields = {
            name: getattr(self.settings, name)
            for name in (
                "max_jobs_per_node",
                "max_job_retries",
                "node_lost_secs",
                "job_stealing",
                "node_heartbeat_secs",
                "api_key",
                "auth_agent_exempt",
                "job_retention_secs",
            )
        }
        builtin = self.settings.builtin_registry
        return Harness(self.nodes, self.database, self.clock, builtin, **fields)

    # --- what clients and agents do ------------------------------------------------------

    def submit(
        self, command: str = "true", key: str | None = None, owner: str = "", **fields: Any
    ) -> Job:
        """A submission as POST /jobs would make it; `owner`: the user whose token sent it."""
        body = validation.orjson.dumps({"command": command, **fields})
        job, _ = self.service.jobs.submit(validation.parse_job_request(body), key, owner=owner)
        return job

    def submit_on(self, node: str, command: str = "true", **fields: Any) -> Job:
        """Submit while only `node` is healthy, so placement must choose it; the node list
        is as it was afterwards."""
        before = self.nodes.cached_nodes()
        self.nodes.set({node: "healthy"})
        try:
            job = self.submit(command, **fields)
        finally:
            if before is not None:
                self.nodes.set(before.status, before.cpus)
        assert job.node_id == node
        return job

    def submit_request(self, request: JobRequest, key: str | None = None) -> tuple[Job, bool]:
        return self.service.jobs.submit(request, key)

    def poll(self, node: str, from_agent: bool = False) -> list[str]:
        return [job.job_id for job in self.service.dispatch.poll(node, from_agent)]

    def claim(self, job_id: str, node: str | None = None, attempt: int | None = None) -> Job:
        """The claim; with `node`/`attempt`, one that names its attempt (our agent's)."""
        update = JobUpdate(status=jobs.RUNNING, node_id=node, attempt=attempt)
        return self.service.jobs.update(job_id, update)

    def report(
        self,
        job_id: str,
        exit_code: int = 0,
        stdout: str = "",
        stderr: str = "",
        node: str | None = None,
        attempt: int | None = None,
        timed_out: bool = False,
    ) -> Job:
        """A final report; with `node`/`attempt`, one that names its attempt; `timed_out`:
        the agent stopped the job at its timeout."""
        status = jobs.DONE if exit_code == 0 and not timed_out else jobs.FAILED
        update = JobUpdate(
            status=status,
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            node_id=node,
            attempt=attempt,
            timed_out=timed_out,
        )
        return self.service.jobs.update(job_id, update)

    def heartbeat(
        self,
        node: str,
        running: Iterable[str] = (),
        cpu_count: int = 2,
        version: str = "t",
        **fields: Any,
    ) -> Orders:
        """One heartbeat; `fields` are the other Heartbeat fields (fence_secs=30, ...)."""
        beat = Heartbeat(cpu_count, frozenset(running), version, **fields)
        return self.service.nodes.heartbeat(node, beat)

    def cancel(self, job_id: str) -> Job:
        return self.service.jobs.cancel(job_id)

    def job(self, job_id: str) -> Job:
        return self.service.reads.get(job_id)

    # --- what others see -----------------------------------------------------------------

    def app(self) -> Flask:
        """The HTTP API, the metrics and the dashboard on this scheduler, wired as a daemon's
        are, for Flask's test client (no server, no port); its metrics count from now on.
        Once per harness."""
        app = Flask(__name__)
        api.replies.attach(app, self.service)
        api.init_app(app)
        counted = metrics.init_app(app, self.service)
        self.firing.observers.append(counted.observe_fire)
        ui.init_app(app, self.service)
        return app

    # --- what was committed --------------------------------------------------------------

    @property
    def commits(self) -> list[Batch]:
        """Every batch committed, in order."""
        return self.store.batches

    def stored(self, job_id: str) -> Job:
        """The job as the store holds it (without output)."""
        seq = jobs.parse_job_id(job_id)
        assert seq is not None
        return self.database.jobs[seq]


# --- the job table alone --------------------------------------------------------------


def no_timeout(job: Job, start: int) -> int | None:
    return None


def table_poll(
    table: JobTable, node_id: str, slots: int, now: int, remember: bool = False
) -> list[Job]:
    """The table's poll for a node of `slots` CPUs (nothing else asked of it)."""
    capacity = Capacity(node_id, Resources(slots, UNREPORTED_MEMORY))
    return table.poll(capacity, now, no_timeout, remember=remember)[0]


def table_movable(table: JobTable, node_ids: list[str], now: int, limit: int) -> list[Job]:
    """What an idle node with room for `limit` plain jobs could take from `node_ids`."""
    taker = Capacity("taker", Resources(limit, UNREPORTED_MEMORY))
    picker = Picker(taker, taker.total, list, now, no_timeout)
    return table.movable(node_ids, now, picker, lambda job: False, limit)
