"""`state/dependency_waits.py`: when a job's wait for its dependencies is over (`ok`: all
done; `any`: all ended), and which jobs a dependency's end concerns."""

from __future__ import annotations

from test_table import T0, make

from tiny_scheduler.domain import jobs
from tiny_scheduler.state.dependency_waits import DependencyWaits, dependencies_met


def ended(seq: int, status: str) -> jobs.Job:
    return make(seq, status=status, exit_code=0 if status == jobs.DONE else 1, finished_at=T0)


def test_ok_waits_for_every_dependency_done_and_any_for_every_one_ended() -> None:
    table = {1: ended(1, jobs.DONE), 2: ended(2, jobs.FAILED), 3: make(3)}
    lookup = table.get
    assert dependencies_met(make(9, depends_on=(1,)), lookup)
    assert not dependencies_met(make(9, depends_on=(1, 2)), lookup)
    assert dependencies_met(make(9, depends_on=(1, 2), dependency=jobs.Dependency.ANY), lookup)
    assert not dependencies_met(make(9, depends_on=(1, 3), dependency=jobs.Dependency.ANY), lookup)
    # Removed by retention (only final jobs are): met.
    assert dependencies_met(make(9, depends_on=(1, 404)), lookup)


def test_a_wait_is_found_from_its_dependencies_until_it_is_discarded() -> None:
    waits = DependencyWaits()
    first, second = make(5, depends_on=(1, 2)), make(6, "node-b", depends_on=(2,))
    waits.add(first)
    waits.add(second)
    assert first in waits and second in waits
    assert waits.waiting_for(2) == [5, 6] and waits.waiting_for(1) == [5]
    assert waits.is_awaited(1) and not waits.is_awaited(5)
    assert waits.discard(first) and not waits.discard(first)
    assert waits.waiting_for(2) == [6] and not waits.is_awaited(1)
    assert list(waits.by_node) == ["node-b"]
