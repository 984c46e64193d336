"""`state/queue_limits.py`: the counts a queue's limit is judged by, and the claim that
reserves a place (two claims at once never both pass the last one)."""

from __future__ import annotations

import pytest
from test_table import T0, make

from tiny_scheduler import errors
from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.queues import QueueSettings
from tiny_scheduler.state.queue_limits import QueueLimits


def running(seq: int, queue: str = "nightly", **fields: object) -> jobs.Job:
    return make(seq, status=jobs.RUNNING, running_at=T0, queue=queue, **fields)


def test_running_run_jobs_fill_a_limited_queue_and_services_do_not() -> None:
    limits = QueueLimits([QueueSettings("nightly", max_running=2)])
    assert limits.room("nightly") == 2 and limits.room("default") is None
    limits.add(running(1))
    limits.add(running(2, job_type=jobs.SERVICE))
    assert limits.room("nightly") == 1
    limits.add(running(3))
    assert limits.room("nightly") == 0 and limits.held_back() == ["nightly"]
    limits.discard(running(1))
    assert limits.room("nightly") == 1 and limits.held_back() == []
    assert limits.counts() == {"nightly": (0, 2)}


def test_a_claim_reserves_the_last_place_until_it_is_released() -> None:
    limits = QueueLimits([QueueSettings("nightly", max_running=1)])
    first, second = make(1, queue="nightly"), make(2, queue="nightly")
    assert limits.reserve(first)
    with pytest.raises(errors.Conflict) as refused:
        limits.reserve(second)
    assert str(refused.value) == "job job-2 cannot start: queue nightly at its limit (0 running)"
    limits.release(first)
    assert limits.reserve(second)


def test_a_paused_queue_refuses_every_claim_and_an_unlimited_one_reserves_nothing() -> None:
    limits = QueueLimits([QueueSettings("nightly", paused=True)])
    with pytest.raises(errors.Conflict, match="queue nightly paused"):
        limits.reserve(make(1, queue="nightly", job_type=jobs.SERVICE))
    assert not limits.reserve(make(2))  # the default queue: nothing to count
    limits.set(QueueSettings("nightly"))
    assert not limits.reserve(make(3, queue="nightly")) and limits.room("nightly") is None


def test_counts_of_many_jobs_at_once_add_to_the_one_by_one_counts() -> None:
    limits = QueueLimits()
    limits.add_counts([(("nightly", jobs.DONE), 5), (("nightly", jobs.PENDING), 1)])
    limits.add(make(9, queue="nightly"))
    assert limits.counts() == {"nightly": (2, 0)}
    assert limits.state("nightly") == (None, 0)
