"""The in-memory job table: the agent poll, listings, ids, and the per-job and per-key
serialization that makes a claim happen once."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pytest
from harness import table_movable as movable
from harness import table_poll as poll

from tiny_scheduler import errors
from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.fit import Resources
from tiny_scheduler.domain.jobs import Job
from tiny_scheduler.state.table import JobTable

T0 = 1_764_498_030_000_000


def make(seq: int, node_id: str = "node-a", **fields: object) -> Job:
    base: dict[str, object] = {
        "seq": seq,
        "node_id": node_id,
        "command": f"cmd {seq}",
        "created_at": T0 + seq,
    }
    base.update(fields)
    return Job(**base)  # type: ignore[arg-type]


def table_of(*items: Job | Iterable[Job]) -> JobTable:
    table = JobTable()
    for item in items:
        for job in [item] if isinstance(item, Job) else item:
            table.put(job)
    return table


def seqs(found: Iterable[Job]) -> list[int]:
    return [job.seq for job in found]


# --- the agent poll -------------------------------------------------------------------------


def test_poll_is_fifo_per_node_and_capped_at_free_slots() -> None:
    table = table_of(make(s, "node-a" if s % 2 else "node-b") for s in range(1, 11))
    assert seqs(poll(table, "node-a", 10, T0)) == [1, 3, 5, 7, 9]
    assert seqs(poll(table, "node-b", 10, T0)) == [2, 4, 6, 8, 10]
    assert seqs(poll(table, "node-a", 1, T0)) == [1]
    assert seqs(poll(table, "node-a", 2, T0)) == [1, 3]
    assert poll(table, "node-z", 10, T0) == []


def test_running_run_jobs_take_slots_and_services_do_not() -> None:
    table = table_of(make(s) for s in range(1, 6))
    table.put(make(1, status=jobs.RUNNING, running_at=T0))
    assert seqs(poll(table, "node-a", 1, T0)) == []
    assert seqs(poll(table, "node-a", 2, T0)) == [2]

    table.put(make(2, job_type=jobs.SERVICE, status=jobs.RUNNING, running_at=T0))
    assert seqs(poll(table, "node-a", 2, T0)) == [3]

    table.put(make(1, status=jobs.DONE, running_at=T0, finished_at=T0 + 1, exit_code=0))
    assert seqs(poll(table, "node-a", 2, T0)) == [3, 4]


def test_a_claimed_or_moved_job_leaves_its_nodes_queue() -> None:
    table = table_of(make(1), make(2), make(3))
    table.put(make(1, status=jobs.RUNNING, running_at=T0, job_type=jobs.SERVICE))
    table.put(make(2, "node-b"))
    assert seqs(poll(table, "node-a", 5, T0)) == [3]
    assert seqs(poll(table, "node-b", 5, T0)) == [2]


# --- listings -------------------------------------------------------------------------------


@pytest.fixture
def mixed() -> JobTable:
    """Twelve jobs over two nodes in every status, failures with two reasons, some services."""
    states = [
        (jobs.PENDING, None),
        (jobs.RUNNING, None),
        (jobs.DONE, None),
        (jobs.FAILED, jobs.Reason.EXIT),
        (jobs.FAILED, jobs.Reason.CANCELLED),
        (jobs.PENDING, None),
    ]
    return table_of(
        make(
            s,
            "node-a" if s <= 6 else "node-b",
            status=states[(s - 1) % 6][0],
            reason=states[(s - 1) % 6][1],
            job_type=jobs.SERVICE if s % 3 == 0 else jobs.RUN,
        )
        for s in range(1, 13)
    )


@pytest.mark.parametrize(
    ("node_id", "status", "job_type", "reason", "expected"),
    [
        (None, None, None, None, list(range(1, 13))),
        ("node-a", None, None, None, [1, 2, 3, 4, 5, 6]),
        (None, jobs.PENDING, None, None, [1, 6, 7, 12]),
        (None, jobs.RUNNING, None, None, [2, 8]),
        (None, jobs.DONE, None, None, [3, 9]),
        (None, jobs.FAILED, None, None, [4, 5, 10, 11]),
        (None, jobs.FAILED, None, "cancelled", [5, 11]),
        (None, None, None, "exit", [4, 10]),
        ("node-b", None, None, "cancelled", [11]),
        (None, jobs.PENDING, None, "cancelled", []),
        (None, None, None, "bogus", []),
        ("node-b", jobs.PENDING, None, None, [7, 12]),
        (None, None, jobs.SERVICE, None, [3, 6, 9, 12]),
        (None, jobs.PENDING, jobs.SERVICE, None, [6, 12]),
        ("node-a", jobs.DONE, jobs.SERVICE, None, [3]),
        (None, "bogus", None, None, []),
        ("node-z", None, None, None, []),
    ],
)
def test_query_filters_oldest_first(
    mixed: JobTable,
    node_id: str | None,
    status: str | None,
    job_type: str | None,
    reason: str | None,
    expected: list,
) -> None:
    found, more = mixed.query(node_id, status, job_type, 0, 1000, reason)
    assert (seqs(found), more) == (expected, False)


@pytest.mark.parametrize("status", [None, jobs.PENDING, jobs.DONE])
def test_query_pages_with_after_limit_and_has_more(mixed: JobTable, status: str | None) -> None:
    everything = seqs(mixed.query(None, status, None, 0, 1000)[0])
    collected: list[int] = []
    after = 0
    while True:
        found, more = mixed.query(None, status, None, after, 1)
        collected += seqs(found)
        if not more:
            break
        after = found[-1].seq
    assert collected == everything
    found, more = mixed.query(None, status, None, everything[0], len(everything) - 1)
    assert (seqs(found), more) == (everything[1:], False)


def test_query_scans_history_beyond_one_chunk() -> None:
    # The scan lets go of its lock every few thousand jobs; matches must survive the seams.
    table = table_of(
        make(s, status=jobs.DONE if s % 1000 == 0 else jobs.FAILED) for s in range(1, 10_001)
    )
    found, more = table.query(None, jobs.DONE, None, 0, 5)
    assert (seqs(found), more) == ([1000, 2000, 3000, 4000, 5000], True)
    found, more = table.query(None, jobs.DONE, None, 5000, 100)
    assert (seqs(found), more) == ([6000, 7000, 8000, 9000, 10000], False)
    assert len(table.query(None, None, None, 0, 10_000)[0]) == 10_000


def test_counts(mixed: JobTable) -> None:
    assert mixed.counts() == {"pending": 4, "running": 2, "done": 2, "failed": 4}


# --- ids ------------------------------------------------------------------------------------


def create(table: JobTable, **fields: object) -> Job:
    """Put a new job with the table's next id, as the service does."""
    with table.creating() as seq:
        job = make(seq, **fields)
        table.put(job)
    return job


def next_seq(table: JobTable) -> int:
    with table.creating() as seq:
        return seq


def test_ids_continue_after_loaded_jobs_and_the_high_water_mark() -> None:
    assert next_seq(JobTable()) == 1
    assert next_seq(JobTable([make(3), make(5)], last_seq=0)) == 6
    assert next_seq(JobTable([make(3)], last_seq=9)) == 10


def test_removed_ids_are_never_handed_out_again() -> None:
    table = JobTable()
    for _ in range(3):
        create(table, status=jobs.DONE, finished_at=T0)
    table.remove([2, 3])
    assert table.get(3) is None
    assert next_seq(table) == 4


def test_listings_stop_below_the_lowest_id_in_flight() -> None:
    table = JobTable([make(1), make(2)])
    with table.creating() as slow:  # job-3: its commit is taking long
        fast = create(table)  # job-4, committed first
        assert seqs(table.query(None, None, None, 0, 10)[0]) == [1, 2]
        assert seqs(table.query(None, jobs.PENDING, None, 0, 10)[0]) == [1, 2]
        # No Link to a next page either: what lies beyond is not settled yet.
        assert table.query(None, None, None, 0, 2) == ([make(1), make(2)], False)
        assert table.get(fast.seq) == fast  # one job by its id is not a listing
        table.put(make(slow))
    assert seqs(table.query(None, None, None, 0, 10)[0]) == [1, 2, 3, 4]
    assert seqs(table.query(None, jobs.PENDING, None, 2, 10)[0]) == [3, 4]


def test_an_id_whose_commit_failed_stops_holding_listings_back() -> None:
    table = JobTable([make(1)])
    with pytest.raises(RuntimeError), table.creating():
        create(table)  # job-3 is committed while job-2 fails
        raise RuntimeError("the store refused job-2")
    assert seqs(table.query(None, None, None, 0, 10)[0]) == [1, 3]


def test_finished_before_and_remove() -> None:
    table = table_of(make(s) for s in range(1, 5))
    for seq, finished in ((3, T0 + 10), (1, T0 + 20), (4, T0 + 30)):
        table.put(make(seq, status=jobs.DONE, finished_at=finished))
    assert table.finished_before(T0 + 25, 100) == [3, 1]
    assert table.finished_before(T0 + 100, 2) == [3, 1]
    table.remove([3, 1])
    assert table.finished_before(T0 + 100, 100) == [4]
    assert seqs(table.query(None, None, None, 0, 100)[0]) == [2, 4]
    assert table.counts()["done"] == 1


# --- changing(): one change of a job at a time ----------------------------------------------


def test_changing_an_unknown_job_is_not_found() -> None:
    with pytest.raises(errors.NotFound) as caught, JobTable().changing(1):
        pass
    assert caught.value.message == "job not found"


def test_a_second_change_waits_and_sees_the_first_ones_result() -> None:
    table = table_of(make(1))
    seen: list[Job] = []
    entered = threading.Event()

    def second() -> None:
        with table.changing(1) as job:
            entered.set()
            seen.append(job)

    with table.changing(1) as job:
        assert job.status == jobs.PENDING
        thread = threading.Thread(target=second)
        thread.start()
        # The second change must not get in while the first holds the job. Waiting is the
        # check here: no event marks "blocked", so it gets a bounded window to barge in.
        assert not entered.wait(0.2)
        table.put(jobs.start(job, T0 + 1))
    thread.join(10)
    assert [job.status for job in seen] == [jobs.RUNNING]


def test_a_failed_change_releases_the_job() -> None:
    table = table_of(make(1))
    with pytest.raises(RuntimeError), table.changing(1):
        raise RuntimeError("commit failed")
    with table.changing(1) as job:  # would wait forever if still busy
        assert job.status == jobs.PENDING


def test_changes_of_different_jobs_do_not_wait_for_each_other() -> None:
    table = table_of(make(1), make(2))
    with table.changing(1), table.changing(2) as other:
        assert other.seq == 2


# --- deduplicating(): one job per key -------------------------------------------------------


def test_deduplicating_without_a_key_never_finds_anything() -> None:
    table = table_of(make(1, dedupe_key="k"))
    with table.deduplicating(None) as existing:
        assert existing is None


def test_deduplicating_returns_the_job_created_under_the_key() -> None:
    table = JobTable()
    with table.deduplicating("k") as existing:
        assert existing is None
        create(table, dedupe_key="k")
    with table.deduplicating("k") as existing:
        assert existing is not None and existing.seq == 1
    with table.deduplicating("other") as existing:
        assert existing is None


def test_a_concurrent_request_with_the_same_key_waits_for_the_first() -> None:
    table = JobTable()
    results: list[Job | None] = []
    entered = threading.Event()

    def second() -> None:
        with table.deduplicating("k") as existing:
            entered.set()
            results.append(existing)

    with table.deduplicating("k"):
        thread = threading.Thread(target=second)
        thread.start()
        # A bounded window for the second request to get in, which it must not.
        assert not entered.wait(0.2)
        create(table, dedupe_key="k")
    thread.join(10)
    assert [job and job.seq for job in results] == [1]


def test_a_key_whose_first_request_failed_can_be_used_again() -> None:
    table = JobTable()
    results: list[Job | None] = []
    thread = threading.Thread(target=lambda: results.append(_first_free(table, "k")))
    with pytest.raises(RuntimeError), table.deduplicating("k"):
        thread.start()
        raise RuntimeError("placement failed")
    thread.join(10)
    assert results == [None]


def _first_free(table: JobTable, key: str) -> Job | None:
    with table.deduplicating(key) as existing:
        return existing


def test_the_key_stays_with_the_job_through_updates() -> None:
    table = table_of(make(1, dedupe_key="k"))
    table.put(make(1, dedupe_key="k", status=jobs.RUNNING, running_at=T0))
    with table.deduplicating("k") as existing:
        assert existing is not None and existing.status == jobs.RUNNING


# --- loads, held slots and the jobs an idle node may take -------------------------------------

HOLD_US = 10_000_000  # OFFER_HOLD_SECS, written out: the spec's 10 s


def test_node_loads_count_waiting_run_jobs_and_slots_in_use() -> None:
    table = table_of(
        make(1),  # waiting run job
        make(2, instance_id="i-1"),  # pinned: still waiting work of the node
        make(3, job_type=jobs.SERVICE),  # a waiting service will take no slot
        make(4, status=jobs.RUNNING, running_at=T0),
        make(5, status=jobs.RUNNING, running_at=T0, job_type=jobs.SERVICE),
        make(6, status=jobs.FAILED, reason=jobs.Reason.TIMEOUT, holds_slot=True),
        make(7, status=jobs.FAILED, reason=jobs.Reason.TIMEOUT),  # its late report came
        make(8, "node-b", status=jobs.DONE),
    )
    assert table.node_loads(["node-a", "node-b", "node-z"], T0) == {
        "node-a": (2, 2),
        "node-b": (0, 0),
        "node-z": (0, 0),
    }
    # The held slot keeps the poll from handing out more work...
    assert seqs(poll(table, "node-a", 2, T0)) == []
    assert seqs(poll(table, "node-a", 3, T0)) == [1]
    on_a = table.on_node("node-a")
    assert (seqs(on_a.pending), seqs(on_a.running), seqs(on_a.held)) == ([1, 2, 3], [4, 5], [6])
    assert table.busy_nodes() == {"node-a"}
    # ... until it is released.
    table.put(make(6, status=jobs.FAILED, reason=jobs.Reason.TIMEOUT))
    assert table.node_loads(["node-a"], T0) == {"node-a": (2, 1)}
    assert table.on_node("node-a").held == []
    table.put(make(1, status=jobs.RUNNING, running_at=T0))
    assert table.node_loads(["node-a"], T0) == {"node-a": (1, 2)}


def test_a_held_slot_is_forgotten_with_its_job() -> None:
    table = table_of(make(1, status=jobs.FAILED, reason=jobs.Reason.TIMEOUT, holds_slot=True))
    table.remove([1])
    assert table.node_loads(["node-a"], T0) == {"node-a": (0, 0)}
    assert table.busy_nodes() == set()


def test_movable_jobs_are_the_oldest_unpinned_waiting_run_jobs_of_the_nodes_asked() -> None:
    table = table_of(
        make(1, "node-b"),
        make(2, "node-a", instance_id="i-1"),
        make(3, "node-a", job_type=jobs.SERVICE),
        make(4, "node-a"),
        make(5, "node-c"),
        make(6, "node-b"),
        make(7, "node-a", status=jobs.RUNNING, running_at=T0),
    )
    assert sorted(table.movable_nodes()) == ["node-a", "node-b", "node-c"]
    assert seqs(movable(table, ["node-a", "node-b"], T0, 10)) == [1, 4, 6]
    assert seqs(movable(table, ["node-a", "node-b", "node-c"], T0, 2)) == [1, 4]
    assert movable(table, ["node-z"], T0, 10) == []


def test_a_job_offered_to_its_own_node_stays_put_for_ten_seconds() -> None:
    table = table_of(make(1), make(2), make(3, "node-b"))
    assert seqs(poll(table, "node-a", 1, T0, remember=True)) == [1]  # the agent poll
    assert seqs(movable(table, ["node-a"], T0 + HOLD_US - 1, 10)) == [2]
    assert table.just_offered(table.get(1), T0 + HOLD_US - 1)  # type: ignore[arg-type]
    assert seqs(movable(table, ["node-a"], T0 + HOLD_US, 10)) == [1, 2]
    assert not table.just_offered(table.get(1), T0 + HOLD_US)  # type: ignore[arg-type]
    # Only a poll that remembers its answer (the agent's, with stealing on) is an offer.
    poll(table, "node-b", 1, T0)
    assert seqs(movable(table, ["node-b"], T0, 10)) == [3]


def test_an_offer_protects_a_job_only_on_the_node_it_was_offered_to() -> None:
    table = table_of(make(1))
    poll(table, "node-a", 1, T0, remember=True)
    table.put(make(1, "node-b"))  # re-placed since (its node was lost, say)
    assert seqs(movable(table, ["node-b"], T0 + 1, 10)) == [1]
    table.offered("node-b", [table.get(1)], T0 + 2)  # type: ignore[list-item]
    assert seqs(movable(table, ["node-b"], T0 + 3, 10)) == []


def test_the_agent_poll_and_the_movable_jobs_leave_out_a_job_being_changed() -> None:
    table = table_of(make(1), make(2))
    with table.changing(1):
        assert seqs(poll(table, "node-a", 2, T0, remember=True)) == [2]
        assert seqs(movable(table, ["node-a"], T0 + HOLD_US, 10)) == [2]
        assert seqs(poll(table, "node-a", 2, T0)) == [1, 2], "without stealing it is shown"


def test_old_offers_are_forgotten() -> None:
    table = table_of(make(s) for s in range(1, 101))
    for n in range(100):
        poll(table, "node-a", 1, T0 + n * HOLD_US, remember=True)
    assert len(table._offers) <= 2  # the memory's bound is the point here


def test_a_delayed_job_counts_and_moves_only_once_it_is_due() -> None:
    table = table_of(make(1, not_before=T0 + 100), make(2, "node-b", not_before=T0 + 100))
    assert table.node_loads(["node-a"], T0) == {"node-a": (0, 0)}
    assert movable(table, ["node-b"], T0, 10) == []
    assert table.node_loads(["node-a"], T0 + 100) == {"node-a": (1, 0)}
    assert seqs(movable(table, ["node-b"], T0 + 100, 10)) == [2]


def indexed_one_by_one(loaded: Iterable[Job]) -> JobTable:
    """A table of stored jobs made the way the start-up used to make one: every job through
    `_index` in id order, the finished ones ordered by their end."""
    table = JobTable()
    for job in sorted(loaded, key=lambda job: job.seq):
        table._jobs[job.seq] = job
    for job in table._jobs.values():
        table._index(job, None)
    ended = sorted(
        (job for job in table._jobs.values() if job.is_final),
        key=lambda job: job.finished_at or job.created_at,
    )
    for job in ended:
        table._finished.add(job.seq)
    table._last_seq = table._jobs.keys()[-1]
    return table


def state_of(table: JobTable) -> dict[str, object]:
    """Every field of the table, each of its own structures as the fields it holds (the jobs
    by id, a mapping, as what it maps)."""

    def own(value: object) -> bool:
        module = type(value).__module__
        return module.startswith("tiny_scheduler.state") and not isinstance(value, dict)

    return {name: vars(value) if own(value) else value for name, value in vars(table).items()}


def stored_mix() -> list[Job]:
    """One job of every kind a start-up finds, on two nodes and two queues."""
    done = make(1, status=jobs.DONE, exit_code=0, running_at=T0, finished_at=T0 + 50)
    return [
        done,
        make(2, "node-b", status=jobs.DONE, exit_code=0, finished_at=T0 + 20, dedupe_key="k"),
        make(3, status=jobs.FAILED, reason=jobs.Reason.EXIT, finished_at=None),  # older file
        make(
            4,
            "node-b",
            status=jobs.FAILED,
            reason=jobs.Reason.TIMEOUT,
            finished_at=T0 + 30,
            running_at=T0,
            holds_slot=True,
        ),
        make(5, status=jobs.RUNNING, running_at=T0, queue="q"),
        make(6, "node-b", status=jobs.RUNNING, job_type=jobs.SERVICE, running_at=T0),
        make(7, priority=90, queue="q"),
        make(8, "node-b", not_before=T0 + 10**12),
        make(9, depends_on=(5,)),  # blocked: job 5 is running
        make(10, depends_on=(1,)),  # its dependency is done: due
        make(11, "node-b", dedupe_key="k2"),
    ]


@pytest.mark.parametrize("order", ["by id", "shuffled", "every end known"])
def test_a_loaded_table_is_indexed_as_one_job_after_another(order: str) -> None:
    """The start-up indexes in bulk; every index must come out as indexing each job did."""
    mix = stored_mix()
    if order == "every end known":
        mix = [job for job in mix if job.seq != 3]
    given = mix[5:] + mix[:5] if order == "shuffled" else mix
    loaded = JobTable(given, last_seq=3)
    reference = indexed_one_by_one(mix)
    mine, theirs = state_of(loaded), state_of(reference)
    for name in ("_lock", "_idle"):
        del mine[name], theirs[name]
    # What ended attempts used is charged from their stored times at a load only (a put of a
    # finished job that was never seen running has nothing to charge): test_fair_share.py.
    mine["_usage"].pop("_charged"), theirs["_usage"].pop("_charged")
    assert mine == theirs
    assert [seq for seq in loaded._finished if seq != 3] == [2, 4, 1]


def test_services_that_ask_for_nothing_come_and_go_without_a_trace() -> None:
    """A service needs no CPU: two of them waiting on one node, then starting and ending,
    leave nothing counted (the sums drop what reaches nothing, and must not trip over it)."""
    table = table_of(make(s, job_type=jobs.SERVICE) for s in (1, 2))
    assert table.node_resources(["node-a"], T0)["node-a"][0].cpus == 0
    for seq in (1, 2):
        table.put(make(seq, job_type=jobs.SERVICE, status=jobs.RUNNING, running_at=T0))
    for seq in (1, 2):
        table.put(make(seq, job_type=jobs.SERVICE, status=jobs.DONE, finished_at=T0 + 1))
    waiting, allocated = table.node_resources(["node-a"], T0)["node-a"]
    assert waiting == allocated == Resources()
