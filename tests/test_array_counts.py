"""`state/array_counts.py` in the job table: each array's jobs counted by the state people read,
kept in step at every change (claim, end, cancel, retention) and at start-up, never by a walk
over the array."""

from __future__ import annotations

from test_table import T0, make, table_of

from tiny_scheduler.domain import jobs
from tiny_scheduler.state.array_counts import ArrayCounts
from tiny_scheduler.state.table import JobTable


def member(seq: int, **fields: object) -> jobs.Job:
    return make(seq, array_id=1, array_index=seq - 1, **fields)


def test_the_structure_counts_by_state_and_forgets_an_array_that_is_gone() -> None:
    counts = ArrayCounts()
    first, second = member(1), member(2)
    counts.add(first)
    counts.add(second)
    counts.add(make(9))  # not of an array: not counted
    assert counts.of(1) == {"pending": 2}
    ended = member(2, status=jobs.FAILED, reason=jobs.Reason.TIMEOUT, finished_at=T0)
    counts.discard(second)
    counts.add(ended)
    assert counts.of(1) == {"pending": 1, "timed out": 1}
    counts.discard(first)
    counts.discard(ended)
    assert counts.of(1) == {} and counts.of(9) == {}


def test_the_table_keeps_them_at_each_change() -> None:
    table = table_of(member(seq) for seq in range(1, 5))
    assert table.array_counts(1) == {"pending": 4}
    table.put(member(1, status=jobs.RUNNING, running_at=T0))
    table.put(member(2, status=jobs.DONE, exit_code=0, finished_at=T0))
    table.put(member(3, status=jobs.FAILED, reason=jobs.Reason.CANCELLED, finished_at=T0))
    assert table.array_counts(1) == {"pending": 1, "running": 1, "done": 1, "cancelled": 1}
    table.remove([2, 3])  # retention
    assert table.array_counts(1) == {"pending": 1, "running": 1}


def test_a_loaded_table_counts_its_arrays() -> None:
    stored = [
        member(1, status=jobs.DONE, exit_code=0, finished_at=T0),
        member(2, status=jobs.FAILED, reason=jobs.Reason.EXIT, finished_at=T0),
        member(3),
    ]
    table = JobTable(stored, 3)
    assert table.array_counts(1) == {"pending": 1, "done": 1, "failed": 1}
    table.remove([1])
    assert table.array_counts(1) == {"pending": 1, "failed": 1}
