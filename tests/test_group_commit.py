"""Group commit (`tiny_scheduler/storage/writer.py`) over a real SQLite file: callers commit in
turns, whoever finds nobody committing commits for everyone queued; every save returns once
durable, groups form under concurrency, reads take turns too, and closing never strands one."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from pathlib import Path

from helpers import wait_for

from tiny_scheduler import errors, storage
from tiny_scheduler.domain.jobs import Job
from tiny_scheduler.storage import sqlite
from tiny_scheduler.storage.base import Batch, OutcomeUnknown

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
    reopened = sqlite.SqliteStore(path)
    try:
        stored = [j.seq for j in reopened.load().jobs]
    finally:
        reopened.close()
    assert sorted(stored) == list(range(1, THREADS * SAVES + 1))


class GatedCommits(sqlite.SqliteStore):
    """The real store, whose first commit waits until the test opens the gate, and which
    notes the thread of every commit."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.writing = threading.Event()
        self.threads: list[str] = []

    def write(self, batch: Batch) -> None:
        self.threads.append(threading.current_thread().name)
        if len(self.threads) == 1:
            self.writing.set()
            assert self.gate.wait(30), "the test never opened the gate"
        super().write(batch)


def test_callers_queued_during_a_commit_get_the_next_turn(tmp_path: Path) -> None:
    """The caller committing answers only its own group; the first caller that queued
    meanwhile is given the turn and commits the next group, everyone still queued in it."""
    backend = GatedCommits(str(tmp_path / "scheduler.db"))
    db = storage.Writer(backend)
    first = threading.Thread(target=db.save, args=(job(1),), name="first")
    first.start()
    assert backend.writing.wait(10), "the first save never reached the store"
    followers = [
        threading.Thread(target=db.save, args=(job(n),), name=f"follower-{n}") for n in range(2, 10)
    ]
    for thread in followers:
        thread.start()
    wait_for(lambda: len(db._queue) == len(followers), message="the followers to queue")
    backend.gate.set()
    for thread in [first, *followers]:
        thread.join(30)
        assert not thread.is_alive(), "a caller never got its answer"
    db.close()
    assert backend.threads[0] == "first"
    assert len(backend.threads) == 2, "the eight queued callers went in one group"
    assert backend.threads[1].startswith("follower-"), "a follower took the turn"


def test_reads_take_turns_between_commits(tmp_path: Path) -> None:
    """Reads queued among commits are answered, and each sees every change committed before
    it: a reader's counts never go down, and end at all of them."""
    db = storage.Writer(SlowCommits(str(tmp_path / "scheduler.db")))
    db.start()
    seen: dict[int, list[int]] = {n: [] for n in range(0, 8, 2)}
    try:

        def work(n: int) -> None:
            for i in range(10):
                if n % 2:
                    db.save(job(1 + n * 10 + i))
                else:
                    seen[n].append(len(db.reload().jobs))

        run_threads(8, work)
        assert len(db.reload().jobs) == 40
    finally:
        db.close()
    for counts in seen.values():
        assert len(counts) == 10 and counts == sorted(counts), counts


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
        # An idle store is probed at once (nothing written yet).
        wait_for(lambda: probes, message="the first probe")
        db.save(job(1))
    finally:
        db.close()
    assert groups == [1], "the probe carried no caller: only the save was counted"


def test_a_lone_caller_never_waits_for_company(tmp_path: Path) -> None:
    """Gathering (waiting briefly for more changes) happens only once commits have carried
    several callers: one client saving job after job is never held back."""
    db = storage.Writer(sqlite.SqliteStore(str(tmp_path / "scheduler.db")))
    db.start()
    try:
        for seq in range(1, 51):
            db.save(job(seq))
        assert db.gathered == 0
        run_threads(THREADS, lambda n: [db.save(job(100 + n * 10 + i)) for i in range(10)])
        assert db.gathered > 0, "concurrent callers: commits waited for the next changes"
    finally:
        db.close()


class LostAnswer(sqlite.SqliteStore):
    """The real store, whose commits go through but whose caller cannot tell (as when a
    connection dies after COMMIT was sent, or a flush fails)."""

    def write(self, batch: Batch) -> None:
        super().write(batch)
        raise OutcomeUnknown("the answer to COMMIT was lost")


def test_a_change_whose_commit_may_have_happened_is_never_answered_nothing_was_changed(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "scheduler.db")
    store = storage.Writer(LostAnswer(path))
    try:
        store.save(job(1))
    except errors.StoreError as exc:
        assert exc.message == errors.STORE_OUTCOME_UNKNOWN
    else:
        raise AssertionError("the save must not be acknowledged: its outcome is unknown")
    finally:
        store.close()
    reopened = sqlite.SqliteStore(path)
    try:
        assert [found.seq for found in reopened.load().jobs] == [1]  # it was stored after all
    finally:
        reopened.close()


def test_a_change_saved_soon_rides_with_the_next_commit_or_the_prober_s(tmp_path: Path) -> None:
    """`save_soon` (an audit record) costs no commit of its own: it goes with the next one,
    is never counted as a caller, and without one the prober commits it within RIDE_SECS;
    closing commits what still rides."""
    path = str(tmp_path / "scheduler.db")
    db = storage.Writer(sqlite.SqliteStore(path))
    groups: list[int] = []
    db.commit_observers.append(lambda seconds, callers: groups.append(callers))
    db.save_soon(Batch(upserts=(job(1),)))
    db.save(job(2))  # carries the rider along
    assert groups == [1]
    db.start()
    db.save_soon(Batch(upserts=(job(3),)))

    def committed() -> list[int]:
        # A plain second connection (the daemon's lock is the store's): committed rows only.
        with contextlib.closing(sqlite3.connect(path)) as conn:
            return [int(row[0]) for row in conn.execute("SELECT seq FROM jobs ORDER BY seq")]

    try:
        assert committed()[:2] == [1, 2]
        wait_for(lambda: committed() == [1, 2, 3], timeout=10, message="the prober to commit it")
        db.save_soon(Batch(upserts=(job(4),)))
    finally:
        db.close()
    assert committed() == [1, 2, 3, 4]


def test_a_rider_wakes_a_sleeping_prober_but_not_one_about_to_wake(tmp_path: Path) -> None:
    """The prober sleeps up to STORE_PROBE_INTERVAL_SECS (2 s) after a commit; a rider that
    comes meanwhile must still be committed within RIDE_SECS, so `save_soon` wakes it, but
    only when it would sleep past the rider's deadline."""
    path = str(tmp_path / "scheduler.db")
    db = storage.Writer(sqlite.SqliteStore(path))
    db.start()
    try:
        db.save(job(1))  # the prober now sleeps until ~2 s from here
        wait_for(lambda: db._prober_until > time.monotonic() + 1, timeout=5, message="a sleep")
        began = time.monotonic()
        db.save_soon(Batch(upserts=(job(2),)))
        with contextlib.closing(sqlite3.connect(path)) as conn:
            wait_for(
                lambda: conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 2,
                timeout=5,
                message="the rider committed",
            )
        assert time.monotonic() - began < 1.0  # RIDE_SECS (0.2 s), not the probe's 2 s
    finally:
        db.close()
