"""Job histories for the poll and restart measurements, written with the store's own code.

`build(path, total, nodes)` writes `total` jobs spread round-robin over `nodes` into a fresh
database through `tiny_scheduler.storage.Writer.save` in big batches, so the file has exactly the
schema and row format the scheduler writes (nothing here knows a column name). The history
looks like a busy cluster's last hours: the oldest jobs finished (mostly `done`, some `failed`
after their one retry), the newest `PENDING_PER_NODE` jobs of each node still pending. Times
are recent, so the retention sweep (a week by default) leaves them alone.

Building is quick (about 6 s for a million jobs), so every benchmark run builds afresh and a
history always matches the current store code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tiny_scheduler.clock import SYSTEM
from tiny_scheduler.domain.jobs import DONE, FAILED, RUNNING, Attempt, Job, job_id_of
from tiny_scheduler.storage import Writer
from tiny_scheduler.storage.sqlite import SqliteStore

PENDING_PER_NODE = 20
"""Pending backlog per node at the end of the history (1,000 jobs over 50 nodes)."""

FAILED_EVERY = 25
"""One finished job in this many failed (after its one retry, so it carries one attempt)."""

SPAN_US = 6 * 3600 * 1_000_000
"""The history covers the last six hours."""

BATCH = 50_000
"""Jobs per `Store.save` call (one transaction each)."""

RUN_US = 1_500_000
"""How long each finished job ran, in microseconds."""


def node_names(count: int) -> list[str]:
    return [f"node-{i:02d}" for i in range(count)]


def _job(seq: int, total: int, nodes: list[str], now: int) -> Job:
    node = nodes[seq % len(nodes)]
    created = now - SPAN_US + (seq * SPAN_US) // (total + 1)
    command = f"python3 /opt/jobs/report.py --part {seq}"
    if seq > total - PENDING_PER_NODE * len(nodes):
        return Job(seq=seq, node_id=node, command=command, created_at=created)
    running_at = created + 2_000
    finished_at = running_at + RUN_US
    if seq % FAILED_EVERY:
        return Job(
            seq=seq,
            node_id=node,
            command=command,
            created_at=created,
            status=DONE,
            exit_code=0,
            stdout=f"part {seq}: 1843 rows written\n",
            running_at=running_at,
            finished_at=finished_at,
        )
    first = Attempt(nodes[(seq + 1) % len(nodes)], 1, "", "connection refused\n", created, created)
    return Job(
        seq=seq,
        node_id=node,
        command=command,
        created_at=created,
        status=FAILED,
        retry_count=1,
        exit_code=1,
        stderr="connection refused\n",
        running_at=running_at,
        finished_at=finished_at,
        attempts=(first,),
    )


def remove_database(path: Path) -> None:
    """Delete a database file with its WAL and shared-memory files, so a start is fresh."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def build(path: Path, total: int, nodes: list[str]) -> float:
    """Write a fresh history of `total` jobs into `path`; returns the seconds it took."""
    began = time.monotonic()
    _write(path, total, lambda seq, now: _job(seq, total, nodes, now))
    return time.monotonic() - began


def build_pending(path: Path, total: int, nodes: list[str]) -> list[str]:
    """Write `total` pending jobs (and nothing else) into a fresh `path`, spread over the
    nodes; returns their ids, oldest first."""
    _write(
        path,
        total,
        lambda seq, now: Job(
            seq=seq, node_id=nodes[seq % len(nodes)], command="true", created_at=now
        ),
    )
    return [job_id_of(seq) for seq in range(1, total + 1)]


def build_prioritised(
    path: Path, total: int, nodes: list[str], priorities: int, queues: int
) -> list[str]:
    """Like `build_pending`, but each job also names one of `priorities` priority levels
    (spread over 0-100) and one of `queues` queues (`q0`, `q1`, ...). Levels and queues change
    every len(nodes) and every 10 x len(nodes) jobs, so that each node holds every mix."""
    step = len(nodes)
    levels = [round(i * 100 / max(priorities - 1, 1)) for i in range(priorities)]

    def make(seq: int, now: int) -> Job:
        return Job(
            seq=seq,
            node_id=nodes[seq % step],
            command="true",
            created_at=now,
            priority=levels[(seq // step) % priorities],
            queue=f"q{(seq // (step * priorities)) % queues}",
        )

    _write(path, total, make)
    return [job_id_of(seq) for seq in range(1, total + 1)]


def build_pending_and_running(
    path: Path, pending: int, pending_nodes: list[str], running: int, running_nodes: list[str]
) -> list[str]:
    """`pending` pending jobs over `pending_nodes`, then `running` jobs claimed on
    `running_nodes` with no output yet; returns the running jobs' ids. Keep the two node lists
    apart: a poll from a node that should be running a job fails that job (lost by its agent)."""

    def make(seq: int, now: int) -> Job:
        if seq <= pending:
            node = pending_nodes[seq % len(pending_nodes)]
            return Job(seq=seq, node_id=node, command="true", created_at=now)
        node = running_nodes[seq % len(running_nodes)]
        return Job(
            seq=seq,
            node_id=node,
            command="sleep 600",
            created_at=now,
            status=RUNNING,
            running_at=now,
        )

    _write(path, pending + running, make)
    return [job_id_of(seq) for seq in range(pending + 1, pending + running + 1)]


def _write(path: Path, total: int, make: Callable[[int, int], Job]) -> None:
    """A fresh database at `path` holding `make(seq, now)` for seq 1..total, written with the
    store's own code, BATCH jobs a commit."""
    remove_database(path)
    store = Writer(SqliteStore(str(path)))
    store.start()
    now = SYSTEM.now_us()
    try:
        for first in range(1, total + 1, BATCH):
            last = min(first + BATCH, total + 1)
            store.save(*(make(seq, now) for seq in range(first, last)))
    finally:
        store.close()


def stored_jobs(path: Path) -> list[Job]:
    """Every job in a database, read by the store's own code. Called right after a SIGKILL:
    the killed worker may take a moment to be gone and let go of the file's lock."""
    store = SqliteStore(str(path), wait_secs=10.0)
    try:
        return store.load().jobs
    finally:
        store.close()
