"""Group commit (`tiny_scheduler/storage/writer.py`) over a real SQLite file: callers commit in
turns, whoever finds nobody committing commits for everyone queued; every save returns once
durable, groups form under concurrency, reads take turns too, and closing never strands one."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tiny_scheduler import errors, storage
from tiny_scheduler.jobs import Job
from tiny_scheduler.storage import sqlite
from tiny_scheduler.storage.base import Batch

THREADS = 16
SAVES = 40


class SlowCommits(sqlite.SqliteStore):
    """The real store, each commit held a few milliseconds longer (a slow disk), so that
    callers arriving during one commit must queue for the next."""

    def write(self, batch: Batch) -> None:
        time.sleep(0.005)
        super().write(batch)


def job(seq: int) -> Job:
    return Job(seq=seq, node_id="node-a", command=f"echo {seq}", created_at=seq)


def run_threads(count: int, work) -> None:
    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive(), "a caller never got its answer"


def test_concurrent_saves_are_grouped_and_every_one_is_durable(tmp_path: Path) -> None:
    path = str(tmp_path / "scheduler.db")
    db = storage.Writer(SlowCommits(path))
    groups: list[int] = []
    db.commit_observers.append(lambda seconds, callers: groups.append(callers))
    db.start()
    who_committed: set[str] = set()
    original = db._backend.write

    def noting(batch: Batch) -> None:
        who_committed.add(threading.current_thread().name)
        original(batch)

    db._backend.write = noting  # type: ignore[method-assign]
    try:
        run_threads(
            THREADS,
            lambda n: [db.save(job(1 + n * SAVES + i)) for i in range(SAVES)],
        )
    finally:
        db.close()
    assert sum(groups) == THREADS * SAVES, "each caller counted once, probes not at all"
    assert max(groups) > 1, "callers that arrived during a commit went in one group"
    assert len(groups) < THREADS * SAVES
    assert len(who_committed) > 1, "the turn to commit passes between the callers' threads"
    reopened = sqlite.SqliteStore(path)
    try:
        stored = [j.seq for j in reopened.load().jobs]
    finally:
        reopened.close()
    assert sorted(stored) == list(range(1, THREADS * SAVES + 1))


def test_reads_take_turns_between_commits(tmp_path: Path) -> None:
    db = storage.Writer(SlowCommits(str(tmp_path / "scheduler.db")))
    db.start()
    seen: list[int] = []
    try:

        def work(n: int) -> None:
            for i in range(10):
                if n % 2:
                    db.save(job(1 + n * 10 + i))
                else:
                    seen.append(len(db.reload().jobs))

        run_threads(8, work)
        assert len(db.reload().jobs) == 40
    finally:
        db.close()
    assert len(seen) == 40 and all(0 <= count <= 40 for count in seen)


def test_closing_answers_every_queued_caller(tmp_path: Path) -> None:
    """Callers queued when the store closes are committed or refused, never left waiting."""
    db = storage.Writer(SlowCommits(str(tmp_path / "scheduler.db")))
    db.start()
    outcomes: list[str] = []
    started = threading.Barrier(THREADS + 1)

    def work(n: int) -> None:
        started.wait()
        try:
            db.save(job(n + 1))
            outcomes.append("saved")
        except errors.StoreError:
            outcomes.append("refused")

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    started.wait()
    db.close()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive(), "a caller was stranded by close()"
    assert len(outcomes) == THREADS
    reopened = sqlite.SqliteStore(str(tmp_path / "scheduler.db"))
    try:
        stored = len(reopened.load().jobs)
    finally:
        reopened.close()
    assert stored == outcomes.count("saved"), "every save that returned is in the file"


def test_idle_store_is_probed_and_probes_are_not_counted_as_commits(tmp_path: Path) -> None:
    db = storage.Writer(sqlite.SqliteStore(str(tmp_path / "scheduler.db")))
    groups: list[int] = []
    db.commit_observers.append(lambda seconds, callers: groups.append(callers))
    probes: list[float] = []
    original = db._backend.write

    def noting(batch: Batch) -> None:
        if batch.probe:
            probes.append(time.monotonic())
        original(batch)

    db._backend.write = noting  # type: ignore[method-assign]
    db.start()
    try:
        deadline = time.monotonic() + 10
        while not probes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert probes, "an idle store is probed at once (nothing written yet)"
        db.save(job(1))
    finally:
        db.close()
    assert groups == [1], "the probe carried no caller: only the save was counted"
