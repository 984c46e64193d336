"""The bounds of a heartbeat, each at its edge, with the spec's exact messages: what an agent
may say about its node (cpu_count, memory_mb, gpus, labels, enforcement) and the node id it
says it for. A heartbeat with 100,000 CPUs, a 4,000-character node id or a 1 MB label was
once taken (or refused with a text that named the wrong problem)."""

from __future__ import annotations

import orjson
import pytest

from tiny_scheduler import errors
from tiny_scheduler.cluster.node_requests import (
    CPU_COUNT_MESSAGE,
    ENFORCEMENT_MESSAGE,
    GPUS_MESSAGE,
    LABELS_MESSAGE,
    MEMORY_MB_MESSAGE,
    NODE_ID_MESSAGE,
    Heartbeat,
    check_node_id,
    parse_heartbeat,
)


def parse(**fields: object) -> Heartbeat:
    return parse_heartbeat(orjson.dumps({"cpu_count": 2, "running": [], **fields}))


def refused(message: str, **fields: object) -> None:
    with pytest.raises(errors.BadRequest) as caught:
        parse(**fields)
    assert caught.value.message == message


def test_the_messages_are_the_specs() -> None:
    assert CPU_COUNT_MESSAGE == "cpu_count must be an integer between 1 and 1024"
    assert MEMORY_MB_MESSAGE == "memory_mb must be an integer between 0 and 16777216"
    assert GPUS_MESSAGE == "gpus must be an integer between 0 and 64"


@pytest.mark.parametrize("count", [1, 1024])
def test_cpu_count_within_its_bounds_is_taken(count: int) -> None:
    assert parse(cpu_count=count).cpu_count == count


@pytest.mark.parametrize("count", [0, -1, 1025, 100_000, "2", 2.5, True, None])
def test_cpu_count_out_of_its_bounds_is_refused(count: object) -> None:
    refused(CPU_COUNT_MESSAGE, cpu_count=count)


def test_a_cpu_count_beyond_64_bits_is_refused_too() -> None:
    with pytest.raises(errors.BadRequest) as caught:
        parse_heartbeat(b'{"cpu_count":1180591620717411303424,"running":[]}')
    assert caught.value.message == CPU_COUNT_MESSAGE


def test_memory_and_gpus_are_optional_and_bounded() -> None:
    beat = parse()
    assert (beat.memory_mb, beat.gpus, beat.enforcement) == (None, None, "")
    beat = parse(memory_mb=16_777_216, gpus=64, enforcement="cgroup-v2")
    assert (beat.memory_mb, beat.gpus, beat.enforcement) == (16_777_216, 64, "cgroup-v2")
    assert (parse(memory_mb=0, gpus=0).memory_mb, parse(gpus=0).gpus) == (0, 0)
    for value in (-1, 16_777_217, "8", 1.5, False):
        refused(MEMORY_MB_MESSAGE, memory_mb=value)
    for value in (-1, 65, "1", 0.5, True):
        refused(GPUS_MESSAGE, gpus=value)


@pytest.mark.parametrize("enforcement", ["cgroup-v2", "cgroup-v1", "none"])
def test_each_enforcement_is_taken(enforcement: str) -> None:
    assert parse(enforcement=enforcement).enforcement == enforcement


@pytest.mark.parametrize("enforcement", ["cgroup-v3", "NONE", 1, ["none"]])
def test_an_unknown_enforcement_is_refused(enforcement: object) -> None:
    refused(ENFORCEMENT_MESSAGE, enforcement=enforcement)


def test_labels_are_bounded_in_count_and_length() -> None:
    most = {f"k{i}": "v" for i in range(64)}
    assert len(parse(labels=most).labels) == 64
    edge = {"k" * 63: "v" * 63}
    assert parse(labels=edge).labels == (("k" * 63, "v" * 63),)
    refused(LABELS_MESSAGE, labels={**most, "one-more": "v"})
    refused(LABELS_MESSAGE, labels={"k" * 64: "v"})
    refused(LABELS_MESSAGE, labels={"": "v"})
    refused(LABELS_MESSAGE, labels={"zone": "v" * 64})
    # The 1 MB label: named as too long, not as "not a string".
    refused(LABELS_MESSAGE, labels={"zone": "x" * 1_000_000})
    refused("labels must map names to strings ('zone' does not)", labels={"zone": 1})


@pytest.mark.parametrize("node_id", ["n", "node-a.rack_1", "a" * 253])
def test_a_node_id_of_up_to_253_allowed_characters_is_taken(node_id: str) -> None:
    check_node_id(node_id)


@pytest.mark.parametrize("node_id", ["", "a" * 254, "a" * 4000, "node a", "node/a", "nöde"])
def test_any_other_node_id_is_refused(node_id: str) -> None:
    with pytest.raises(errors.BadRequest) as caught:
        check_node_id(node_id)
    assert caught.value.message == NODE_ID_MESSAGE
