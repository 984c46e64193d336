"""What a job needs and where it fits (`domain/fit.py`): the pure rules first (needs, never
fits, backfill's picker), then the same rules as the scheduler applies them, on the harness
with nodes of different sizes and labels: placement, the poll, moving work, waiting_for."""

from __future__ import annotations

from typing import Any

import pytest
from harness import Harness

from tiny_scheduler import errors
from tiny_scheduler.domain import fit, jobs
from tiny_scheduler.domain.fit import Capacity, Ending, Picker, Resources
from tiny_scheduler.domain.jobs import Job

T = 1_800_000_000_000_000
SEC = 1_000_000


def job(seq: int, **fields: Any) -> Job:
    return Job(seq=seq, node_id="node-a", command="x", **fields)


def capacity(cpus: int, memory_mb: int = 1 << 40, gpus: int = 0, **labels: str) -> Capacity:
    return Capacity("node-a", Resources(cpus, memory_mb, gpus), labels)


def timeout_deadline(candidate: Job, start: int) -> int | None:
    if candidate.job_type == jobs.SERVICE:
        return None
    return start + (candidate.timeout_secs or 3600) * SEC


# --- needs and never-fits ---------------------------------------------------------------------


def test_a_run_job_takes_its_cpus_and_a_service_none_but_its_memory_and_gpus() -> None:
    assert fit.need_of(job(1)) == Resources(1, 0, 0)  # cpus unset counts as one
    assert fit.need_of(job(1, cpus=4, memory_mb=512, gpus=1)) == Resources(4, 512, 1)
    service = job(1, job_type=jobs.SERVICE, cpus=4, memory_mb=256, gpus=1)
    assert fit.need_of(service) == Resources(0, 256, 1)


def test_never_fits_names_the_first_thing_to_change() -> None:
    small = Capacity("node-a", Resources(4, 8192, 0), {"zone": "a"})
    big = Capacity("node-b", Resources(16, 65536, 2), {"gpu": "a100", "zone": "b"})
    known = [small, big]
    assert fit.never_fits(job(1, cpus=16), known) is None
    assert fit.never_fits(job(1, cpus=32), known) == "needs 32 cpus, the largest node has 16"
    assert fit.never_fits(job(1, memory_mb=100_000), known) == (
        "needs 100000 MiB of memory, the largest node has 65536"
    )
    assert fit.never_fits(job(1, gpus=4), known) == "needs 4 gpus, the largest node has 2"
    assert fit.never_fits(job(1, node_selector={"gpu": "h100"}), known) == ("no node has gpu=h100")
    assert fit.never_fits(job(1, node_selector={"zone": "a"}, gpus=1), known) == (
        "needs 1 gpus, the largest node with zone=a has 0"
    )
    assert fit.never_fits(job(1, node_ids=("node-x",)), known) == "node_ids node-x: no such node"
    assert fit.never_fits(job(1, node_ids=("node-a",), cpus=8), known) == (
        "needs 8 cpus, the largest node among its node_ids has 4"
    )
    # Memory and GPUs are checked on the nodes big enough in CPUs, not on any node.
    assert fit.never_fits(job(1, cpus=8, gpus=1), [small, Capacity("c", Resources(8))]) == (
        "needs 1 gpus, the largest node has 0"
    )
    assert fit.never_fits(job(1, cpus=64), []) is None  # no node known: placement says so


# --- the picker: fit and backfill ---------------------------------------------------------------


def picker(free: Resources, total: int = 4, endings: list[Ending] | None = None) -> Picker:
    return Picker(capacity(total), free, lambda: endings or [], T, timeout_deadline)


def test_jobs_are_taken_in_order_while_they_fit_and_a_head_that_does_not_blocks_the_rest() -> None:
    # 4 CPUs, 3 free; one 1-CPU job runs until T + 100 s.
    ends = [Ending(T + 100 * SEC, Resources(1))]
    chosen = picker(Resources(3, 1 << 40), endings=ends)
    queue = [
        job(1, cpus=2),
        job(2, cpus=4),  # the head: it needs the whole node, free at T + 100 s
        job(3, timeout_secs=60),  # ends before the head could start: backfills
        job(4, timeout_secs=600),  # would delay the head: waits
    ]
    assert [j.seq for j in chosen.take(queue)] == [1, 3]
    assert chosen.head is not None and chosen.head.seq == 2


def test_explain_says_which_jobs_backfill_held_back_behind_the_head() -> None:
    """`explain` (for waiting_for) takes as `take` does, and names the jobs that fitted what
    was free but were refused behind the head; not the head, nor a job that did not fit."""
    # 4 CPUs, 3 free; one job runs until T + 100 s, and so does the first one taken.
    ends = [Ending(T + 100 * SEC, Resources(1))]
    queue = [
        job(1, timeout_secs=100),
        job(2, cpus=4),  # the head: all four are free at T + 100 s
        job(3, timeout_secs=600),  # fits in what is free, but would delay the head: held back
        job(4, cpus=3, timeout_secs=60),  # does not fit in the two CPUs free: not backfill's doing
        job(5, timeout_secs=60),  # ends before the head can start: backfills
    ]
    held = picker(Resources(3, 1 << 40), endings=ends).explain(queue)
    assert held.head is not None and held.head.seq == 2
    assert (held.refused, held.too_deep) == ({3}, False)
    assert held.looked_at == {1, 2, 3, 4, 5}
    assert fit.NOT_HELD.head is None  # what a node with nothing blocked says


def test_a_job_taken_before_the_head_counts_as_making_room_for_it() -> None:
    # An empty 4-CPU node: the first job starts now and ends by T + 100 s, when the head can
    # start; nothing running makes room for it before, but that job will.
    chosen = picker(Resources(4, 1 << 40))
    queue = [
        job(1, timeout_secs=100),
        job(2, cpus=4),  # the head
        job(3, timeout_secs=600),  # would hold the head back past T + 100 s: waits
        job(4, timeout_secs=60),  # ends before: backfills
    ]
    assert [j.seq for j in chosen.take(queue)] == [1, 4]


def test_what_is_spare_beyond_the_head_may_be_used_by_a_long_job() -> None:
    # 8 CPUs, 6 free; the head needs 7, and 8 are free once the 2-CPU job ends: 1 spare.
    ends = [Ending(T + 100 * SEC, Resources(2))]
    chosen = Picker(capacity(8), Resources(6, 1 << 40), lambda: ends, T, timeout_deadline)
    queue = [job(1, cpus=7), job(2, timeout_secs=600), job(3, timeout_secs=600)]
    assert [j.seq for j in chosen.take(queue)] == [2]  # the second would delay the head


def test_a_head_that_nothing_running_will_make_room_for_delays_nothing() -> None:
    # A service holds the GPU for good: whatever starts now cannot delay the head.
    ends = [Ending(None, Resources(0, 0, 1))]
    chosen = Picker(
        capacity(4, gpus=1), Resources(4, 1 << 40, 0), lambda: ends, T, timeout_deadline
    )
    assert [j.seq for j in chosen.take([job(1, gpus=1), job(2, timeout_secs=9999)])] == [2]


def test_no_free_cpu_hands_out_nothing_and_a_job_for_another_node_is_passed_over() -> None:
    assert picker(Resources(0, 1 << 40)).take([job(1, job_type=jobs.SERVICE)]) == []
    chosen = picker(Resources(4, 1 << 40))
    labelled = job(1, node_selector={"gpu": "a100"})
    assert [j.seq for j in chosen.take([labelled, job(2)])] == [2]
    assert chosen.head is None  # a job that cannot run here at all is no head here


def test_the_answer_is_capped_and_backfill_looks_only_so_deep() -> None:
    assert len(picker(Resources(4, 1 << 40)).take([job(s) for s in range(1, 9)], limit=2)) == 2
    head = job(1, cpus=8)
    never = [job(s, timeout_secs=999_999) for s in range(2, fit.BACKFILL_DEPTH + 2)]
    late = job(fit.BACKFILL_DEPTH + 2, timeout_secs=1)
    ends = [Ending(T + 1000 * SEC, Resources(4))]
    chosen = Picker(capacity(8), Resources(4, 1 << 40), lambda: ends, T, timeout_deadline)
    assert chosen.take([head, *never, late]) == []


# --- on the harness: nodes that differ ---------------------------------------------------------


def cluster(**settings: Any) -> Harness:
    """Three nodes of our agents (builtin registry, CPUs as slots): small (2 CPUs, 4 GiB),
    big (8 CPUs, 32 GiB, zone=b) and gpu (4 CPUs, 16 GiB, 2 GPUs, gpu=a100)."""
    h = Harness(builtin=True, max_jobs_per_node="auto", **settings)
    beat(h)
    return h


def beat(h: Harness, running: dict[str, list[str]] | None = None) -> None:
    running = running or {}
    h.heartbeat("small", running.get("small", ()), cpu_count=2, memory_mb=4096)
    h.heartbeat(
        "big", running.get("big", ()), cpu_count=8, memory_mb=32768, labels=(("zone", "b"),)
    )
    h.heartbeat(
        "gpu",
        running.get("gpu", ()),
        cpu_count=4,
        memory_mb=16384,
        gpus=2,
        labels=(("gpu", "a100"),),
    )


def test_jobs_are_placed_only_where_they_fit() -> None:
    h = cluster()
    assert h.submit(cpus=8).node_id == "big"
    assert h.submit(memory_mb=20_000).node_id == "big"
    assert h.submit(gpus=1).node_id == "gpu"
    assert h.submit(node_selector={"zone": "b"}).node_id == "big"
    assert h.submit(node_ids=["small"]).node_id == "small"
    assert {h.submit(cpus=3).node_id for _ in range(6)} == {"big", "gpu"}


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"cpus": 16}, "needs 16 cpus, the largest node has 8"),
        ({"gpus": 3}, "needs 3 gpus, the largest node has 2"),
        ({"node_selector": {"gpu": "h100"}}, "no node has gpu=h100"),
        ({"node_ids": ["node-q"]}, "node_ids node-q: no such node"),
    ],
)
def test_a_job_no_node_could_ever_run_is_refused_at_submission(
    fields: dict[str, Any], why: str
) -> None:
    h = cluster()
    with pytest.raises(errors.BadRequest) as refused:
        h.submit(**fields)
    assert refused.value.message == f"no node can run this job: {why}"
    assert h.service.reads.counts()["pending"] == 0  # nothing was created


def test_a_draining_node_still_counts_as_one_that_could_run_it() -> None:
    h = cluster()
    h.service.nodes.set_drain("gpu", True)
    with pytest.raises(errors.PlacementError) as waiting:
        h.submit(gpus=1)  # the only GPU node drains: 503, not "never"
    assert "no healthy compute nodes" in waiting.value.message


def test_the_poll_hands_out_what_fits_and_a_job_that_does_not_fit_waits_saying_why() -> None:
    h = cluster()
    first = h.submit(cpus=3, node_ids=["gpu"])
    second = h.submit(cpus=2, node_ids=["gpu"])
    assert h.poll("gpu") == [first.job_id]  # 3 of 4 CPUs: the second does not fit beside it
    h.claim(first.job_id)
    assert h.poll("gpu") == []
    assert h.service.reads.waiting_for(h.job(second.job_id)) == "2 free cpus on gpu"
    h.report(first.job_id)
    assert h.poll("gpu") == [second.job_id]


def test_a_service_takes_memory_and_gpus_but_no_cpu() -> None:
    h = cluster()
    service = h.submit(job_type="service", gpus=2, memory_mb=1024)
    assert service.node_id == "gpu"
    assert h.poll("gpu") == [service.job_id]
    h.claim(service.job_id)
    gpu_job = h.submit(gpus=1, timeout_secs=10)
    plain = h.submit(node_ids=["gpu"], cpus=4, timeout_secs=10)
    assert h.poll("gpu") == [plain.job_id]  # all 4 CPUs are free; no GPU is
    assert h.service.reads.waiting_for(h.job(gpu_job.job_id)) == "1 free gpus on gpu"


def test_a_big_job_is_not_starved_by_a_stream_of_small_ones() -> None:
    """Backfill: a 4-CPU job behind a stream of 1-CPU jobs starts once its blockers' timeouts
    allow, while a 1-CPU job whose timeout would delay it waits."""
    h = cluster()
    running: list[str] = []
    # The gpu node's 4 CPUs are busy with 1-CPU jobs of 60 s that started 10 s apart.
    for _ in range(4):
        blocker = h.submit(node_ids=["gpu"], timeout_secs=60)
        assert h.poll("gpu") == [blocker.job_id]
        h.claim(blocker.job_id)
        running.append(blocker.job_id)
        h.advance(10)
        beat(h, {"gpu": running})
    big = h.submit(node_ids=["gpu"], cpus=4, timeout_secs=60)
    h.report(running.pop(0))  # one CPU frees; the big job needs all four, at T+90 s
    short = h.submit(node_ids=["gpu"], timeout_secs=5)  # ends before the last blocker would
    long = h.submit(node_ids=["gpu"], timeout_secs=3600)  # would hold the big job back
    assert h.poll("gpu") == [short.job_id]
    h.claim(short.job_id)
    h.report(short.job_id)
    assert h.poll("gpu") == []  # the long one may not take the free CPU
    assert h.service.reads.waiting_for(h.job(big.job_id)) == "4 free cpus on gpu"
    for blocker in running:
        h.report(blocker)
    assert h.poll("gpu") == [big.job_id]  # the head first; the long one after it
    h.claim(big.job_id)
    assert h.job(long.job_id).status == jobs.PENDING


def test_an_idle_node_takes_over_only_the_work_that_fits_it() -> None:
    h = cluster()
    # With the others draining, the big node gets every job: 8 that fill it, then a job that
    # only zone=b can run and a plain one, which wait there.
    h.service.nodes.set_drain("small", True)
    h.service.nodes.set_drain("gpu", True)
    fillers = [h.submit() for _ in range(8)]
    assert h.poll("big") == [filler.job_id for filler in fillers]
    for filler in fillers:
        h.claim(filler.job_id)
    zoned = h.submit(node_selector={"zone": "b"})
    plain = h.submit()
    assert (zoned.node_id, plain.node_id) == ("big", "big")
    h.service.nodes.set_drain("small", False)
    h.service.nodes.set_drain("gpu", False)
    # The idle small node's poll takes the plain job over, never the zone=b one.
    assert h.poll("small") == [plain.job_id]
    assert h.job(plain.job_id).node_id == "small"
    assert h.poll("gpu") == []
    assert h.job(zoned.job_id).node_id == "big"


def test_binpack_fills_the_busiest_node_that_fits_and_least_loaded_spreads() -> None:
    packed = cluster(placement="binpack")
    spread = cluster()
    for h, expected in ((packed, ["small", "small", "gpu"]), (spread, ["big", "gpu", "small"])):
        placed = [h.submit(timeout_secs=10).node_id for _ in range(3)]
        assert placed == expected, h.settings.placement
