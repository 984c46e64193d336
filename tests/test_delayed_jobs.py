"""`state/delayed_jobs.py`: a job before its `not_before` comes out exactly once, at its time,
and one that left meanwhile never does."""

from __future__ import annotations

from test_table import T0, make

from tiny_scheduler.domain.jobs import Job
from tiny_scheduler.state.delayed_jobs import DelayedJobs


def test_jobs_come_due_at_their_time_once_and_in_time_order() -> None:
    delayed = DelayedJobs()
    late, early = make(1, not_before=T0 + 20), make(2, "node-b", not_before=T0 + 10)
    table: dict[int, Job] = {1: late, 2: early}
    delayed.add(late)
    delayed.add(early)
    assert delayed.is_delayed(late) and late in delayed
    assert delayed.due(T0 + 9, table.get) == []
    assert delayed.due(T0 + 10, table.get) == [early]
    assert delayed.due(T0 + 10, table.get) == []  # nothing twice
    assert delayed.due(T0 + 30, table.get) == [late]
    assert delayed.by_node == {} and not delayed.is_delayed(make(3, not_before=T0 + 30))


def test_a_job_that_left_or_moved_comes_due_only_where_it_waits_now() -> None:
    delayed = DelayedJobs()
    gone, moving = make(1, not_before=T0 + 10), make(2, not_before=T0 + 10)
    delayed.add(gone)
    delayed.add(moving)
    assert delayed.discard(gone) and delayed.discard(moving)
    moved = make(2, "node-b", not_before=T0 + 10)
    delayed.add(moved)
    assert delayed.due(T0 + 10, {1: gone, 2: moved}.get) == [moved]
