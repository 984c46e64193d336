"""The registry client (`registry.Registry`) against a real loopback registry: what it makes
of the registry's node list (order, roles, `cpu_count`), instance lookups and their error
texts, faults, the bearer key, the node list's cache, and a list nested too deep to parse.

Placement's own rules (least-loaded, round robin, retries, slots) are checked on a
`StaticNodes` source in `test_placement.py`; here placement is only the way in to the client,
as a submission would use it.
"""

from __future__ import annotations

import pytest
from helpers import set_nodes

from tiny_scheduler.clock import ManualClock
from tiny_scheduler.cluster.registry import Registry
from tiny_scheduler.config import Settings
from tiny_scheduler.dev.http import PeerServer, Reply, Request
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.domain.placement import Placement
from tiny_scheduler.errors import PlacementError
from tiny_scheduler.state.table import JobTable


def placement_for(
    registry_url: str, cache_secs: float = 0, key: str | None = None, **options: object
) -> Placement:
    settings = Settings(
        registry_url=registry_url,
        registry_cache_secs=cache_secs,
        api_key=key,
        **options,  # type: ignore[arg-type]
    )
    return Placement(Registry(settings, clock=ManualClock()), settings, JobTable())


def placement_error(placement: Placement, instance_id: str = "") -> str:
    with pytest.raises(PlacementError) as caught:
        placement.place(instance_id)
    assert caught.value.status == 503
    return caught.value.message


@pytest.fixture
def placement(registry: FakeRegistry) -> Placement:
    return placement_for(registry.url)


# --- the node list -------------------------------------------------------------------------


def test_nodes_the_registry_lists_out_of_order_are_sorted_for_the_rotation(
    registry: FakeRegistry, placement: Placement
) -> None:
    """The registry's JSON object has no order we may rely on: the rotation must sort."""
    set_nodes(registry, healthy=[])
    for node_id in ("node-z", "node-m", "node-a"):
        registry.set_node(node_id)
    assert list(registry.nodes_listing()) == ["node-z", "node-m", "node-a"]  # served unsorted
    assert [placement.place() for _ in range(4)] == ["node-a", "node-m", "node-z", "node-a"]


def test_only_compute_nodes_are_used(registry: FakeRegistry, placement: Placement) -> None:
    set_nodes(registry, healthy=["gpu-1"])
    registry.set_node("storage-1", role="storage")
    assert {placement.place() for _ in range(4)} == {"gpu-1"}


def test_cpu_count_is_read_and_nonsense_counts_as_one(registry: FakeRegistry) -> None:
    registry.set_node("node-a", cpu_count=4)
    registry.set_node("node-b", cpu_count=1)
    registry.set_node("node-c", cpu_count=0)  # nonsense from a peer: at least one slot
    placement = placement_for(registry.url, max_jobs_per_node="auto")
    nodes = placement.source.nodes()
    assert [placement.slots(node, nodes) for node in ("node-a", "node-b", "node-c")] == [4, 1, 1]


# --- instances -----------------------------------------------------------------------------


def test_a_pinned_job_goes_to_its_instances_node_whatever_its_id(
    registry: FakeRegistry, placement: Placement
) -> None:
    registry.set_instance("i-1", "node-b")
    assert placement.place("i-1") == "node-b"
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


# --- faults, the key, the cache ------------------------------------------------------------


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
