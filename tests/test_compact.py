"""Finished jobs held compact (`domain/compact.py`, `state/job_map.py`): a start-up on a real
SQLite file keeps the plain finished ones as `Ended` tuples, and the job table hands out
exactly the jobs a full load makes, in every read."""

from __future__ import annotations

from pathlib import Path

from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.compact import Ended
from tiny_scheduler.domain.jobs import Attempt, Job
from tiny_scheduler.state.table import JobTable
from tiny_scheduler.storage import Batch
from tiny_scheduler.storage.sqlite import SqliteStore

T = 1_796_000_000_000_000


def _history() -> list[Job]:
    plain = Job(
        seq=1,
        node_id="node-a",
        command="echo one",
        status=jobs.DONE,
        exit_code=0,
        stdout="one\n",
        created_at=T,
        running_at=T + 10,
        finished_at=T + 20,
    )
    retried = plain.evolve(
        seq=2,
        status=jobs.FAILED,
        retry_count=1,
        exit_code=1,
        stdout="",
        attempts=(Attempt("node-b", 1, "", "no\n", T, T + 5),),
    )
    owned = plain.evolve(seq=3, owner="alice", cpus=2, queue="batch")
    failed_by_scheduler = plain.evolve(seq=4, status=jobs.FAILED, reason=jobs.Reason.TIMEOUT)
    pending = Job(seq=5, node_id="node-a", command="echo five", created_at=T + 30)
    return [plain, retried, owned, failed_by_scheduler, pending]


def _stored(tmp_path: Path) -> SqliteStore:
    store = SqliteStore(str(tmp_path / "jobs.db"))
    store.write(Batch(upserts=tuple(_history())))
    return store


def test_only_plain_finished_jobs_load_compact_and_each_is_its_job(tmp_path: Path) -> None:
    store = _stored(tmp_path)
    try:
        full = store.load().jobs
        compact = store.load(compact=True).jobs
    finally:
        store.close()
    assert [type(job).__name__ for job in compact] == ["Ended", "Job", "Job", "Job", "Job"]
    assert [job.job() if isinstance(job, Ended) else job for job in compact] == full
    assert full == [job.without_output() for job in _history()]


def test_an_ended_job_reads_every_other_field_as_its_default() -> None:
    job = _history()[0].without_output()
    ended = Ended(*(getattr(job, name) for name in Ended._fields))
    assert ended.job() == job
    for name in ("owner", "queue", "priority", "cpus", "attempts", "reason", "holds_slot"):
        assert getattr(ended, name) == getattr(job, name)
    assert ended.is_final


def test_the_table_from_a_compact_load_answers_as_from_a_full_one(tmp_path: Path) -> None:
    store = _stored(tmp_path)
    try:
        full, compact = store.load(), store.load(compact=True)
    finally:
        store.close()
    tables = [JobTable(loaded.jobs, loaded.last_seq) for loaded in (full, compact)]
    for table in tables:
        assert type(table.get(1)) is Job
    first, second = tables
    assert [first.get(seq) for seq in range(1, 6)] == [second.get(seq) for seq in range(1, 6)]
    assert first.counts() == second.counts()
    assert first.reason_counts() == second.reason_counts()
    for status, newest in ((None, False), ("done", False), (None, True)):
        assert first.query(None, status, None, 0, 10, newest=newest) == second.query(
            None, status, None, 0, 10, newest=newest
        )
    assert first.recent(T) == second.recent(T)
    assert first.finished_before(T + 100, 10) == second.finished_before(T + 100, 10)
    # A compact job changed or removed is a Job again, or gone.
    done = second.get(1)
    assert done is not None
    second.put(done.evolve(moved_from="node-b"))
    assert second.get(1) == done.evolve(moved_from="node-b")
    second.remove([1])
    assert second.get(1) is None
