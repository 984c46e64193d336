"""Node choice against a real (loopback) registry and a real job table: least-loaded with its
round-robin tie rule (plain round robin on an idle cluster), the round-robin setting, slots
from `cpu_count`, a look that changes nothing, retries avoiding the failed node, instance
pinning, and each placement error text."""

from __future__ import annotations

import pytest
from helpers import set_nodes

from tiny_scheduler import jobs
from tiny_scheduler.config import Settings
from tiny_scheduler.dev.http import PeerServer, Reply, Request
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.errors import PlacementError
from tiny_scheduler.jobs import Job
from tiny_scheduler.placement import Placement
from tiny_scheduler.registry import Registry
from tiny_scheduler.table import JobTable


def placement_for(
    registry_url: str,
    cache_secs: float = 0,
    key: str | None = None,
    table: JobTable | None = None,
    **options: object,
) -> Placement:
    settings = Settings(
        registry_url=registry_url,
        registry_cache_secs=cache_secs,
        api_key=key,
        **options,  # type: ignore[arg-type]
    )
    return Placement(Registry(settings), settings, table if table is not None else JobTable())


def placement_error(placement: Placement, instance_id: str = "") -> str:
    with pytest.raises(PlacementError) as caught:
        placement.place(instance_id)
    assert caught.value.status == 503
    return caught.value.message


@pytest.fixture
def placement(registry: FakeRegistry) -> Placement:
    return placement_for(registry.url)


def test_round_robin_over_healthy_nodes_sorted_by_id(
    registry: FakeRegistry, placement: Placement
) -> None:
    set_nodes(registry, healthy=["node-c", "node-a", "node-b"], unhealthy=["node-0"])
    assert [placement.place() for _ in range(7)] == [
        "node-a",
        "node-b",
        "node-c",
        "node-a",
        "node-b",
        "node-c",
        "node-a",
    ]


def test_round_robin_sorts_nodes_the_registry_lists_out_of_order(
    registry: FakeRegistry, placement: Placement
) -> None:
    """The registry's JSON object has no order we may rely on: the rotation must sort."""
    set_nodes(registry, healthy=[])
    for node_id in ("node-z", "node-m", "node-a"):
        registry.set_node(node_id)
    assert list(registry.nodes_listing()) == ["node-z", "node-m", "node-a"]  # served unsorted
    assert [placement.place() for _ in range(4)] == ["node-a", "node-m", "node-z", "node-a"]


def test_consecutive_placements_spread_evenly_as_nodes_change(
    registry: FakeRegistry, placement: Placement
) -> None:
    set_nodes(registry, healthy=["n1", "n2"])
    first = [placement.place() for _ in range(4)]
    assert sorted(first) == ["n1", "n1", "n2", "n2"]
    set_nodes(registry, healthy=["n1", "n2", "n3"])
    assert sorted(placement.place() for _ in range(3)) == ["n1", "n2", "n3"]


def test_only_compute_nodes_are_used(registry: FakeRegistry, placement: Placement) -> None:
    set_nodes(registry, healthy=["gpu-1"])
    registry.set_node("storage-1", role="storage")
    assert {placement.place() for _ in range(4)} == {"gpu-1"}


def test_a_retry_avoids_the_node_it_failed_on(registry: FakeRegistry, placement: Placement) -> None:
    assert {placement.place(avoid="node-a") for _ in range(6)} == {"node-b", "node-c"}
    set_nodes(registry, healthy=["node-a"])
    assert placement.place(avoid="node-a") == "node-a"  # the only node: back to it
    set_nodes(registry, healthy=["node-b"], unhealthy=["node-a"])
    assert placement.place(avoid="node-a") == "node-b"


def test_no_healthy_nodes(registry: FakeRegistry, placement: Placement) -> None:
    set_nodes(registry, healthy=[])
    assert placement_error(placement) == "no healthy compute nodes"
    set_nodes(registry, healthy=[], unhealthy=["node-a", "node-b"])
    assert placement_error(placement) == "no healthy compute nodes"


def test_a_pinned_job_goes_to_its_instances_node(
    registry: FakeRegistry, placement: Placement
) -> None:
    registry.set_instance("i-1", "node-b")
    assert [placement.place("i-1") for _ in range(3)] == ["node-b"] * 3
    assert placement.place("i-1", avoid="node-b") == "node-b"
    registry.set_instance("i/2 x", "node-c")  # the id is quoted in the registry URL
    assert placement.place("i/2 x") == "node-c"


@pytest.mark.parametrize("status", ["provisioning", "failed", "terminated"])
def test_a_pinned_job_needs_a_running_instance(
    registry: FakeRegistry, placement: Placement, status: str
) -> None:
    registry.set_instance("i-1", "node-a", status=status)
    assert placement_error(placement, "i-1") == f"instance i-1 not running (status={status})"


def test_a_pinned_job_needs_a_known_instance(placement: Placement) -> None:
    assert placement_error(placement, "i-404") == "instance not found"


def test_a_pinned_job_needs_its_node_healthy(registry: FakeRegistry, placement: Placement) -> None:
    registry.set_instance("i-1", "node-x")
    assert placement_error(placement, "i-1") == "node node-x for instance i-1 is not healthy"
    registry.set_node("node-x", status="unhealthy")
    assert placement_error(placement, "i-1") == "node node-x for instance i-1 is not healthy"


def test_registry_errors(registry: FakeRegistry, placement: Placement) -> None:
    registry.fault = "error"
    assert placement_error(placement) == "failed to reach registry"
    assert placement_error(placement, "i-1") == "failed to reach registry"
    registry.fault = "garbage"
    assert placement_error(placement) == "failed to decode registry response"
    assert placement_error(placement, "i-1") == "failed to decode registry response"
    registry.fault = None
    assert placement.place() in ("node-a", "node-b", "node-c")


def test_registry_down(unused_port: int) -> None:
    down = placement_for(f"http://127.0.0.1:{unused_port}")
    assert placement_error(down) == "failed to reach registry"
    assert placement_error(down, "i-1") == "failed to reach registry"


def test_the_bearer_key_is_sent_to_the_registry() -> None:
    locked = FakeRegistry(key="s3cret").start()
    try:
        locked.set_node("node-k")
        assert placement_for(locked.url, key="s3cret").place() == "node-k"
        assert placement_error(placement_for(locked.url)) == "failed to reach registry"
        assert placement_error(placement_for(locked.url, key="wrong")) == (
            "failed to reach registry"
        )
    finally:
        locked.stop()


def test_the_node_list_is_cached_for_registry_cache_secs(registry: FakeRegistry) -> None:
    cached = placement_for(registry.url, cache_secs=3600)
    assert cached.place() == "node-a"
    before = registry.requests
    set_nodes(registry, healthy=["node-z"])
    assert [cached.place(), cached.place()] == ["node-b", "node-c"]
    assert registry.requests == before

    fresh = placement_for(registry.url, cache_secs=0)
    assert fresh.place() == "node-z"
    assert registry.requests > before


class _DeepRegistry(PeerServer):
    """A registry whose node list nests deeper than any JSON parser recurses."""

    def handle(self, request: Request) -> Reply:
        return Reply(200, b"[" * 100_000 + b"]" * 100_000)


def test_an_unexpected_parse_failure_answers_and_does_not_wedge_later_calls() -> None:
    server = _DeepRegistry().start()
    try:
        placement = placement_for(server.url)
        # Twice: a fetch that failed oddly must not leave later callers waiting on it forever.
        assert placement_error(placement) == "failed to decode registry response"
        assert placement_error(placement) == "failed to decode registry response"
    finally:
        server.stop()


# --- least-loaded ---------------------------------------------------------------------------

_seqs = iter(range(1, 1_000_000))


def add(table: JobTable, node_id: str, count: int = 1, **fields: object) -> list[Job]:
    """`count` jobs on the node (pending `run` jobs unless `fields` say otherwise)."""
    made = [
        Job(seq=next(_seqs), node_id=node_id, command="x", created_at=1, **fields)  # type: ignore[arg-type]
        for _ in range(count)
    ]
    for job in made:
        table.put(job)
    return made


def test_least_loaded_is_the_default_and_prefers_the_node_that_can_start_soonest(
    registry: FakeRegistry,
) -> None:
    table = JobTable()
    placement = placement_for(registry.url, table=table)
    add(table, "node-a", 2)  # two waiting
    add(table, "node-b", 1, status=jobs.RUNNING, running_at=1)  # one running
    assert placement.place() == "node-c"  # idle
    add(table, "node-c", 1)
    # b and c now both have load 1; the tie goes to the first after c, wrapping: b.
    assert placement.place() == "node-b"
    add(table, "node-b", 1)
    assert placement.place() == "node-c"


def test_an_idle_cluster_sees_the_plain_round_robin_also_while_it_fills(
    registry: FakeRegistry,
) -> None:
    """Every placement adds a waiting job, so the loads stay equal round after round."""
    table = JobTable()
    placement = placement_for(registry.url, table=table)
    chosen = []
    for _ in range(7):
        chosen.append(placement.place())
        add(table, chosen[-1])
    assert chosen == ["node-a", "node-b", "node-c", "node-a", "node-b", "node-c", "node-a"]


def test_the_load_counts_waiting_run_jobs_pinned_ones_and_slots_in_use(
    registry: FakeRegistry,
) -> None:
    table = JobTable()
    placement = placement_for(registry.url, table=table)
    add(table, "node-a", 1, instance_id="i-1")  # pinned: counts
    add(table, "node-b", 1, status=jobs.FAILED, reason=jobs.Reason.TIMEOUT, holds_slot=True)
    add(table, "node-c", 3, job_type=jobs.SERVICE)  # waiting services: no slot, no load
    add(table, "node-c", 2, status=jobs.RUNNING, running_at=1, job_type=jobs.SERVICE)
    add(table, "node-c", 4, status=jobs.DONE)  # history: no load
    assert [placement.place() for _ in range(3)] == ["node-c", "node-c", "node-c"]


def test_slots_from_cpu_count_with_auto(registry: FakeRegistry) -> None:
    registry.set_node("node-a", cpu_count=4)
    registry.set_node("node-b", cpu_count=1)
    registry.set_node("node-c", cpu_count=0)  # nonsense from a peer: at least one slot
    table = JobTable()
    placement = placement_for(registry.url, table=table, max_jobs_per_node="auto")
    nodes = placement.registry.nodes()
    assert [placement.slots(node, nodes) for node in ("node-a", "node-b", "node-c")] == [4, 1, 1]
    assert placement.slots("node-gone", nodes) == 1
    assert placement.slots("node-a", None) == 1, "no node list yet: one slot"
    add(table, "node-a", 3)  # 3/4 busy
    add(table, "node-b", 1)  # 1/1
    add(table, "node-c", 1)  # 1/1
    assert placement.place() == "node-a"
    add(table, "node-a", 1)  # 4/4: now every node is full, a tie
    assert placement.place() == "node-b"
    fixed = placement_for(registry.url, table=table, max_jobs_per_node=2)
    assert fixed.slots("node-a", nodes) == 2


def test_round_robin_setting_ignores_the_load(registry: FakeRegistry) -> None:
    table = JobTable()
    add(table, "node-a", 5)
    placement = placement_for(registry.url, table=table, placement="round-robin")
    assert [placement.place() for _ in range(4)] == ["node-a", "node-b", "node-c", "node-a"]


@pytest.mark.parametrize("rule", ["least-loaded", "round-robin"])
def test_a_look_names_the_next_choice_and_moves_nothing(registry: FakeRegistry, rule: str) -> None:
    placement = placement_for(registry.url, placement=rule)
    for expected in ("node-a", "node-b", "node-c", "node-a"):
        assert [placement.peek() for _ in range(3)] == [expected] * 3
        assert placement.place() == expected


def test_pinned_jobs_do_not_move_the_rotation(registry: FakeRegistry) -> None:
    registry.set_instance("i-1", "node-c")
    placement = placement_for(registry.url)
    assert placement.place() == "node-a"
    assert placement.place("i-1") == "node-c"
    assert placement.place() == "node-b"


def test_a_retry_counts_as_a_choice_of_the_rule(registry: FakeRegistry) -> None:
    placement = placement_for(registry.url)
    assert placement.place(avoid="node-a") == "node-b"
    assert placement.place() == "node-c"


def test_a_new_terms_table_is_where_the_loads_come_from(registry: FakeRegistry) -> None:
    """A new leader builds a new job table: placement must count the jobs in that one, and
    its rotation starts afresh."""
    old, new = JobTable(), JobTable()
    add(old, "node-c", 5)
    placement = placement_for(registry.url, table=old)
    assert [placement.place(), placement.place()] == ["node-a", "node-b"]
    placement.count_loads_in(new)
    assert placement.place() == "node-a", "a fresh rotation starts at the first node"
    add(new, "node-b", 1)
    assert placement.place() == "node-c", "the new table's loads: c is idle there"
