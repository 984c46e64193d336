"""`state/held_jobs.py` in the job table: a held pending job is not due (not handed out, not
moved, not counted as load) but is still listed as pending; its release puts it back where a
pending job belongs; a held job that waits for dependencies still ends with a failed one."""

from __future__ import annotations

from harness import table_movable, table_poll
from test_table import T0, make, seqs, table_of

from tiny_scheduler.domain import jobs
from tiny_scheduler.state.held_jobs import HeldJobs
from tiny_scheduler.state.table import JobTable


def test_the_structure_keeps_held_jobs_per_node() -> None:
    held = HeldJobs()
    one, other = make(1, held=True), make(2, "node-b", held=True)
    assert held.belongs(one) and not held.belongs(make(3))
    held.add(one)
    held.add(other)
    assert one in held and len(held) == 2 and set(held.by_node) == {"node-a", "node-b"}
    assert held.discard(one) and not held.discard(one)
    assert one not in held and list(held.by_node) == ["node-b"]


def test_a_held_job_is_not_handed_out_nor_counted_nor_moved_but_is_listed() -> None:
    table = table_of(make(1, held=True), make(2))
    assert seqs(table_poll(table, "node-a", 5, T0)) == [2]
    assert table.node_loads(["node-a"], T0) == {"node-a": (1, 0)}
    assert seqs(table_movable(table, ["node-a"], T0, 10)) == [2]
    assert seqs(table.query(None, jobs.PENDING, None, 0, 10)[0]) == [1, 2]
    assert seqs(table.on_node("node-a").pending) == [1, 2]
    assert table.node_counts("node-a") == (2, 0)
    assert table.counts()["pending"] == 2


def test_a_released_job_waits_in_its_place_again() -> None:
    table = table_of(make(1, held=True), make(2))
    table.put(make(1))  # released
    assert seqs(table_poll(table, "node-a", 5, T0)) == [1, 2]  # by age, as before the hold
    assert table.node_loads(["node-a"], T0) == {"node-a": (2, 0)}


def test_a_held_job_that_is_claimed_cancelled_or_moved_leaves_the_hold() -> None:
    table = table_of(make(1, held=True), make(2, held=True))
    table.put(make(1, status=jobs.FAILED, reason=jobs.Reason.CANCELLED, finished_at=T0))
    table.put(make(2, "node-b", held=True))  # moved off a lost node, still held
    assert seqs(table.on_node("node-a").pending) == []
    assert seqs(table.on_node("node-b").pending) == [2]
    assert table_poll(table, "node-b", 5, T0) == []


def test_a_held_delayed_job_is_delayed_again_once_released() -> None:
    table = table_of(make(1, not_before=T0 + 10, held=True))
    assert table_poll(table, "node-a", 5, T0 + 20) == []  # its time came while it was held
    table.put(make(1, not_before=T0 + 30))  # released, with a later time (a test's liberty)
    assert table_poll(table, "node-a", 5, T0 + 20) == []
    assert seqs(table_poll(table, "node-a", 5, T0 + 30)) == [1]


def test_a_held_job_waiting_for_dependencies_stays_their_dependent() -> None:
    table = table_of(make(1), make(2, depends_on=(1,), held=True))
    assert seqs(table.dependents(1)) == [2]  # a failure of job 1 still ends it
    table.put(make(1, status=jobs.DONE, exit_code=0, finished_at=T0))
    assert table.dependents(1) == []
    assert table_poll(table, "node-a", 5, T0) == []  # met, but still held
    assert seqs(table.query(None, jobs.PENDING, None, 0, 10)[0]) == [2]
    table.put(make(2, depends_on=(1,)))
    assert seqs(table_poll(table, "node-a", 5, T0)) == [2]


def test_loaded_held_jobs_are_held() -> None:
    table = JobTable([make(1, held=True), make(2)], 2)
    assert seqs(table_poll(table, "node-a", 5, T0)) == [2]
    assert seqs(table.query(None, jobs.PENDING, None, 0, 10)[0]) == [1, 2]
