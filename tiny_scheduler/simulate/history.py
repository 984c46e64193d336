"""A history to replay: the finished `run` jobs of a window, the nodes and the limits.

Owns what a replay takes from the past and the one rule for each part of it:

- **A past job** (`PastJob`) is one finished `run` job that ran: when it became due (its
  `arrival`: created, or later its `not_before`, or the end of its last failed attempt when
  it was retried), when and where its last attempt ran, what it asked for (resources,
  selector, node list, priority, queue, owner, dependencies, timeout) and how it ended. A job
  that never ran (cancelled while pending, failed by a dependency) has nothing to replay and
  is left out; so are services, which hold no slot.
- **Dependencies** name jobs of the same history; one on a job outside the window was met
  before it began and is dropped. A job never arrives before the jobs it depends on (it could
  not have started earlier anyway), so replaying in arrival order submits them first.
- **The nodes** are those the store knows from heartbeats (`nodes` table, `GET /nodes`);
  a node that ran jobs but has no facts (a registry's node) gets the most CPUs it was seen
  running at once, and no memory or GPU limit.
- **The limits** are the queues' and users' `max_running` as stored now.

Read from three places, all read-only: a SQLite file (`file:…?mode=ro`, without the daemon's
lock file, so a running daemon is not disturbed), a PostgreSQL database, or the job dicts a
running scheduler's API gave (`from_wire`; the command line fetches them). A history that
cannot be read raises `HistoryError` naming what is wrong.

Tests: `tests/test_simulate.py`.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..domain import jobs
from ..domain.jobs import Job
from ..domain.nodes import NodeRecord
from ..storage import rows, sql

US = 1_000_000


class HistoryError(Exception):
    """The history cannot be read; the message says which and why."""


@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    """A node to replay on: its id, what it has, and its labels."""

    node_id: str
    cpus: int
    memory_mb: int = 0  # 0: no memory reported (jobs' memory is not checked)
    gpus: int = 0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class PastJob:
    """One job of the history (times are microseconds since the epoch)."""

    seq: int
    arrival: int
    start: int
    end: int
    node_id: str
    failed: bool = False
    cpus: int = 0
    memory_mb: int = 0
    gpus: int = 0
    node_selector: Mapping[str, str] | None = None
    node_ids: tuple[str, ...] = ()
    priority: int = jobs.DEFAULT_PRIORITY
    queue: str = "default"
    owner: str = ""
    depends_on: tuple[int, ...] = ()
    dependency: str = "ok"
    timeout_secs: int = 0

    @property
    def job_id(self) -> str:
        return jobs.job_id_of(self.seq)

    @property
    def run_us(self) -> int:
        return self.end - self.start

    def request(self, depends_on: Sequence[int] = ()) -> dict[str, Any]:
        """Its POST /jobs body, depending on the replay's jobs `depends_on`."""
        body: dict[str, Any] = {"command": "true"}
        for name in ("cpus", "memory_mb", "gpus", "timeout_secs"):
            if getattr(self, name):
                body[name] = getattr(self, name)
        if self.node_selector:
            body["node_selector"] = dict(self.node_selector)
        if self.node_ids:
            body["node_ids"] = list(self.node_ids)
        if self.priority != jobs.DEFAULT_PRIORITY:
            body["priority"] = self.priority
        if self.queue != "default":
            body["queue"] = self.queue
        if depends_on:
            body["depends_on"] = [jobs.job_id_of(seq) for seq in depends_on]
            body["dependency"] = self.dependency
        return body


@dataclasses.dataclass(frozen=True)
class History:
    """The jobs in arrival order, the nodes, and the queues' and users' limits."""

    jobs: Sequence[PastJob]
    nodes: Sequence[Node]
    queue_limits: Mapping[str, int] = dataclasses.field(default_factory=dict)
    user_limits: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def queues(self) -> set[str]:
        return {job.queue for job in self.jobs} | set(self.queue_limits)

    @property
    def users(self) -> set[str]:
        return {job.owner for job in self.jobs if job.owner} | set(self.user_limits)


def build(
    past: Iterable[PastJob],
    known_nodes: Iterable[Node] = (),
    queue_limits: Mapping[str, int] | None = None,
    user_limits: Mapping[str, int] | None = None,
) -> History:
    """A history from its jobs (any order): dependencies kept within it, arrivals after the
    jobs depended on, the nodes that ran jobs without facts sized from what they ran."""
    by_seq = {job.seq: job for job in past}
    ordered: dict[int, PastJob] = {}
    for seq in sorted(by_seq):  # a job depends only on older ones (lower seq)
        job = by_seq[seq]
        kept = tuple(dep for dep in job.depends_on if dep in ordered)
        arrival = max([job.arrival, *(ordered[dep].arrival for dep in kept)])
        if kept != job.depends_on or arrival != job.arrival:
            job = dataclasses.replace(job, depends_on=kept, arrival=arrival)
        ordered[seq] = job
    in_order = sorted(ordered.values(), key=lambda job: (job.arrival, job.seq))
    nodes = {node.node_id: node for node in known_nodes}
    for node_id, cpus in _peak_cpus(in_order).items():
        if node_id not in nodes:
            nodes[node_id] = Node(node_id, cpus)
    return History(
        in_order,
        [nodes[node_id] for node_id in sorted(nodes)],
        dict(queue_limits or {}),
        dict(user_limits or {}),
    )


def _peak_cpus(past: Sequence[PastJob]) -> dict[str, int]:
    """The most CPUs each node was running at once (a job without a node, drawn rather than
    run, names none: it must not make a node called "" of everything at once)."""
    changes = sorted(
        (moment, delta, job.node_id)
        for job in past
        if job.node_id
        for moment, delta in ((job.start, max(job.cpus, 1)), (job.end, -max(job.cpus, 1)))
    )
    now: dict[str, int] = {}
    peak: dict[str, int] = {}
    for _, delta, node_id in changes:
        now[node_id] = now.get(node_id, 0) + delta
        peak[node_id] = max(peak.get(node_id, 0), now[node_id])
    return peak


def past_job(job: Job) -> PastJob | None:
    """The stored job as one to replay; None when it has nothing to replay."""
    if job.job_type != jobs.RUN or job.running_at is None or job.finished_at is None:
        return None
    arrival = max(job.created_at, job.not_before or 0)
    if job.attempts and job.attempts[-1].finished_at is not None:
        arrival = max(arrival, job.attempts[-1].finished_at)
    return PastJob(
        job.seq,
        min(arrival, job.running_at),
        job.running_at,
        max(job.finished_at, job.running_at),
        job.node_id,
        job.status == jobs.FAILED,
        job.cpus,
        job.memory_mb,
        job.gpus,
        job.node_selector,
        tuple(job.node_ids),
        job.priority,
        job.queue,
        job.owner,
        tuple(job.depends_on),
        str(job.dependency),
        job.timeout_secs,
    )


def node_of(record: NodeRecord) -> Node:
    return Node(
        record.node_id, record.cpu_count, record.memory_mb or 0, record.gpus, dict(record.labels)
    )


# --- where it is read from --------------------------------------------------------------------


def read_database(db: str, since_us: int) -> History:
    """The history of the jobs that finished at `since_us` or later in the database `db`: a
    SQLite file's path, or a `postgresql://` URL."""
    if db.startswith(("postgresql://", "postgres://")):
        return _read_postgres(db, since_us)
    return _read_sqlite(db, since_us)


_SELECT_JOBS = f"SELECT {', '.join(rows.COLUMNS)} FROM jobs WHERE finished_at >= {{mark}}"
_SELECT_NODES = f"SELECT {', '.join(sql.NODE_COLUMNS)} FROM nodes"
_SELECT_LIMITS = "SELECT name, max_running FROM {table} WHERE max_running IS NOT NULL"


def _read_sqlite(path: str, since_us: int) -> History:
    file = Path(path)
    if not file.is_file():
        raise HistoryError(f"--db {path}: no such file")
    try:
        # Read-only through the URI: no write, no lock file; a running daemon goes on.
        conn = sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)
        try:
            return _read(conn, "?", since_us)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise HistoryError(f"--db {path}: not a readable tiny-scheduler database ({exc})") from None


def _read_postgres(url: str, since_us: int) -> History:
    import psycopg  # only for a PostgreSQL history

    shown = url.split("@")[-1]  # never the password
    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            conn.read_only = True
            return _read(conn, "%s", since_us)
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HistoryError(
            f"--db {shown}: not a readable tiny-scheduler database ({first})"
        ) from None


def _read(conn: Any, mark: str, since_us: int) -> History:
    found = conn.execute(_SELECT_JOBS.format(mark=mark), (since_us,)).fetchall()
    past = [made for made in (past_job(rows.from_row(row)) for row in found) if made]
    nodes = [node_of(sql.node_from_row(row)) for row in conn.execute(_SELECT_NODES).fetchall()]
    queues = dict(conn.execute(_SELECT_LIMITS.format(table="queues")).fetchall())
    users = dict(conn.execute(_SELECT_LIMITS.format(table="users")).fetchall())
    return build(past, nodes, queues, users)


def from_wire(
    listed: Iterable[Mapping[str, Any]],
    nodes: Iterable[Mapping[str, Any]] = (),
    queues: Iterable[Mapping[str, Any]] = (),
    users: Iterable[Mapping[str, Any]] = (),
) -> History:
    """The history of jobs as `GET /jobs` lists them, with `GET /nodes`, `/queues` and
    `/users` (a listing has no earlier attempts: a retried job arrives when it was created)."""
    past = []
    for job in listed:
        made = _from_wire_job(job)
        if made is not None:
            past.append(made)
    known = [
        Node(
            str(node["node_id"]),
            int(node.get("capacity", {}).get("cpus", 1)),
            int(node.get("capacity", {}).get("memory_mb", 0)),
            int(node.get("capacity", {}).get("gpus", 0)),
            dict(node.get("labels") or {}),
        )
        for node in nodes
    ]
    return build(past, known, _limits(queues), _limits(users))


def _limits(listed: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    return {
        str(item["name"]): int(item["max_running"])
        for item in listed
        if item.get("max_running") is not None
    }


def _from_wire_job(job: Mapping[str, Any]) -> PastJob | None:
    if job.get("job_type", "run") != "run" or not job.get("running_at"):
        return None
    if not job.get("finished_at"):
        return None
    seq = jobs.parse_job_id(str(job["job_id"]))
    if seq is None:
        raise HistoryError(f"a listed job has no job id such as job-7: {job['job_id']!r}")
    start, end = jobs.parse_time(job["running_at"]), jobs.parse_time(job["finished_at"])
    arrival = jobs.parse_time(job["created_at"])
    if job.get("not_before"):
        arrival = max(arrival, jobs.parse_time(job["not_before"]))
    depends_on = tuple(
        seq for seq in (jobs.parse_job_id(str(item)) for item in job.get("depends_on", ())) if seq
    )
    return PastJob(
        seq,
        min(arrival, start),
        start,
        max(end, start),
        str(job["node_id"]),
        job["status"] == "failed",
        int(job.get("cpus", 0)),
        int(job.get("memory_mb", 0)),
        int(job.get("gpus", 0)),
        job.get("node_selector"),
        tuple(job.get("node_ids", ())),
        int(job.get("priority", jobs.DEFAULT_PRIORITY)),
        str(job.get("queue", "default")),
        str(job.get("owner", "")),
        depends_on,
        str(job.get("dependency", "ok")),
        int(job.get("timeout_secs", 0)),
    )
