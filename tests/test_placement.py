"""Node choice on a node list the test sets (`StaticNodes`) and a real job table:
least-loaded with its round-robin tie rule (plain round robin on an idle cluster), the
round-robin setting, slots from `cpu_count`, a look that changes nothing, retries avoiding
the failed node, instance pinning, and no healthy node.

What the registry client makes of the registry's answers (order, roles, `cpu_count`, instance
lookups, error texts, the key, the cache) is `test_registry_client.py`, on a loopback
registry.
"""

from __future__ import annotations

import pytest
from harness import NODES, Harness

from tiny_scheduler.clock import ManualClock
from tiny_scheduler.config import Settings
from tiny_scheduler.domain import jobs, validation
from tiny_scheduler.domain.jobs import Job
from tiny_scheduler.domain.nodes import StaticNodes
from tiny_scheduler.domain.placement import Placement
from tiny_scheduler.errors import PlacementError
from tiny_scheduler.state.table import JobTable


def healthy(*nodes: str, unhealthy: tuple[str, ...] = ()) -> dict[str, str]:
    return {**{n: "healthy" for n in nodes}, **{n: "unhealthy" for n in unhealthy}}


def placement_for(
    source: StaticNodes | None = None, table: JobTable | None = None, **options: object
) -> Placement:
    settings = Settings(registry_url="http://registry.invalid", **options)  # type: ignore[arg-type]
    return Placement(
        source if source is not None else StaticNodes(healthy(*NODES)),
        settings,
        table if table is not None else JobTable(),
        ManualClock(),
    )


def placement_error(placement: Placement, instance_id: str = "") -> str:
    with pytest.raises(PlacementError) as caught:
        placement.place(instance_id)
    assert caught.value.status == 503
    return caught.value.message


def test_round_robin_over_healthy_nodes_sorted_by_id() -> None:
    nodes = StaticNodes(healthy("node-c", "node-a", "node-b", unhealthy=("node-0",)))
    placement = placement_for(nodes)
    assert [placement.place() for _ in range(7)] == [
        "node-a",
        "node-b",
        "node-c",
        "node-a",
        "node-b",
        "node-c",
        "node-a",
    ]


def test_consecutive_placements_spread_evenly_as_nodes_change() -> None:
    nodes = StaticNodes(healthy("n1", "n2"))
    placement = placement_for(nodes)
    first = [placement.place() for _ in range(4)]
    assert sorted(first) == ["n1", "n1", "n2", "n2"]
    nodes.set(healthy("n1", "n2", "n3"))
    assert sorted(placement.place() for _ in range(3)) == ["n1", "n2", "n3"]


def test_a_retry_avoids_the_node_it_failed_on() -> None:
    nodes = StaticNodes(healthy(*NODES))
    placement = placement_for(nodes)
    assert {placement.place(avoid="node-a") for _ in range(6)} == {"node-b", "node-c"}
    nodes.set(healthy("node-a"))
    assert placement.place(avoid="node-a") == "node-a"  # the only node: back to it
    nodes.set(healthy("node-b", unhealthy=("node-a",)))
    assert placement.place(avoid="node-a") == "node-b"


def test_rather_not_is_left_out_only_while_a_third_node_remains() -> None:
    """A re-placed retry (its node went down) leaves out the down node and, while it can,
    the node it failed on as well."""
    nodes = StaticNodes(healthy(*NODES))
    placement = placement_for(nodes)
    picks = {placement.place(avoid="node-a", rather_not="node-b") for _ in range(6)}
    assert picks == {"node-c"}
    nodes.set(healthy("node-a", "node-b"))
    assert placement.place(avoid="node-a", rather_not="node-b") == "node-b"


def test_no_healthy_nodes() -> None:
    nodes = StaticNodes({})
    placement = placement_for(nodes)
    assert placement_error(placement) == "no healthy compute nodes"
    nodes.set(healthy(unhealthy=("node-a", "node-b")))
    assert placement_error(placement) == "no healthy compute nodes"


def test_a_pinned_job_goes_to_its_instances_node_also_when_a_retry_would_avoid_it() -> None:
    placement = placement_for(StaticNodes(healthy(*NODES), instances={"i-1": "node-b"}))
    assert [placement.place("i-1") for _ in range(3)] == ["node-b"] * 3
    assert placement.place("i-1", avoid="node-b") == "node-b"


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


def test_least_loaded_is_the_default_and_prefers_the_node_that_can_start_soonest() -> None:
    table = JobTable()
    placement = placement_for(table=table)
    add(table, "node-a", 2)  # two waiting
    add(table, "node-b", 1, status=jobs.RUNNING, running_at=1)  # one running
    assert placement.place() == "node-c"  # idle
    add(table, "node-c", 1)
    # b and c now both have load 1; the tie goes to the first after c, wrapping: b.
    assert placement.place() == "node-b"
    add(table, "node-b", 1)
    assert placement.place() == "node-c"


def test_an_idle_cluster_sees_the_plain_round_robin_also_while_it_fills() -> None:
    """Every placement adds a waiting job, so the loads stay equal round after round."""
    table = JobTable()
    placement = placement_for(table=table)
    chosen = []
    for _ in range(7):
        chosen.append(placement.place())
        add(table, chosen[-1])
    assert chosen == ["node-a", "node-b", "node-c", "node-a", "node-b", "node-c", "node-a"]


def test_the_load_counts_waiting_run_jobs_pinned_ones_and_slots_in_use() -> None:
    table = JobTable()
    placement = placement_for(table=table)
    add(table, "node-a", 1, instance_id="i-1")  # pinned: counts
    add(table, "node-b", 1, status=jobs.FAILED, reason=jobs.Reason.TIMEOUT, holds_slot=True)
    add(table, "node-c", 3, job_type=jobs.SERVICE)  # waiting services: no slot, no load
    add(table, "node-c", 2, status=jobs.RUNNING, running_at=1, job_type=jobs.SERVICE)
    add(table, "node-c", 4, status=jobs.DONE)  # history: no load
    assert [placement.place() for _ in range(3)] == ["node-c", "node-c", "node-c"]


def test_slots_from_cpu_count_with_auto() -> None:
    nodes = StaticNodes(healthy(*NODES), cpus={"node-a": 4, "node-b": 1})
    table = JobTable()
    placement = placement_for(nodes, table=table, max_jobs_per_node="auto")
    listed = nodes.nodes()
    assert [placement.slots(node, listed) for node in NODES] == [4, 1, 1]
    assert placement.slots("node-gone", listed) == 1
    assert placement.slots("node-a", None) == 1, "no node list yet: one slot"
    add(table, "node-a", 3)  # 3/4 busy
    add(table, "node-b", 1)  # 1/1
    add(table, "node-c", 1)  # 1/1
    assert placement.place() == "node-a"
    add(table, "node-a", 1)  # 4/4: now every node is full, a tie
    assert placement.place() == "node-b"
    fixed = placement_for(nodes, table=table, max_jobs_per_node=2)
    assert fixed.slots("node-a", listed) == 2


def test_round_robin_setting_ignores_the_load() -> None:
    table = JobTable()
    add(table, "node-a", 5)
    placement = placement_for(table=table, placement="round-robin")
    assert [placement.place() for _ in range(4)] == ["node-a", "node-b", "node-c", "node-a"]


@pytest.mark.parametrize("rule", ["least-loaded", "round-robin"])
def test_a_look_names_the_next_choice_and_moves_nothing(rule: str) -> None:
    placement = placement_for(placement=rule)
    for expected in ("node-a", "node-b", "node-c", "node-a"):
        assert [placement.peek() for _ in range(3)] == [expected] * 3
        assert placement.place() == expected


def test_pinned_jobs_do_not_move_the_rotation() -> None:
    placement = placement_for(StaticNodes(healthy(*NODES), instances={"i-1": "node-c"}))
    assert placement.place() == "node-a"
    assert placement.place("i-1") == "node-c"
    assert placement.place() == "node-b"


def test_a_retry_counts_as_a_choice_of_the_rule() -> None:
    placement = placement_for()
    assert placement.place(avoid="node-a") == "node-b"
    assert placement.place() == "node-c"


def test_a_new_terms_table_is_where_the_loads_come_from() -> None:
    """A new leader builds a new job table: placement must count the jobs in that one, and
    its rotation starts afresh."""
    old, new = JobTable(), JobTable()
    add(old, "node-c", 5)
    placement = placement_for(table=old)
    assert [placement.place(), placement.place()] == ["node-a", "node-b"]
    placement.count_loads_in(new)
    assert placement.place() == "node-a", "a fresh rotation starts at the first node"
    add(new, "node-b", 1)
    assert placement.place() == "node-c", "the new table's loads: c is idle there"


def test_the_copies_of_an_array_see_each_other_in_the_loads() -> None:
    """Placed one after another, each copy counts the ones before it (they are not in the
    table yet): an array fills the least-loaded node only up to the others' loads."""
    h = Harness(nodes=("node-a", "node-b", "node-c"), max_jobs_per_node=4)
    for node in ("node-a", "node-b"):
        for _ in range(3):
            h.submit_on(node)
    placed = h.service._core.placement.place_many(6)
    assert sorted(placed) == ["node-a", "node-b", "node-c", "node-c", "node-c", "node-c"]
    array = h.submit(array=6)
    query = validation.parse_query({"array_id": array.job_id})
    copies = h.service.reads.list_jobs(query).jobs
    assert {job.node_id for job in copies} == {"node-a", "node-b", "node-c"}
