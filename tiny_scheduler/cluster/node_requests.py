"""The checks of what agents and operators send about nodes: a heartbeat (`PUT /nodes/{id}`)
and a drain (`PATCH /nodes/{id}`). Each refusal is a 400 whose text starts with the field.

Tests: `tests/test_node_requests.py` (each bound at its edge), `tests/test_nodes_api.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import errors
from ..domain import jobs
from ..domain.validation import MAX_NODE_ID, decode_object, is_node_id

DECODE_HEARTBEAT = "failed to decode heartbeat"
DECODE_NODE_CHANGE = "failed to decode node change"
NODE_NOT_FOUND = "node not found"
MAX_CPU_COUNT = 1024
MAX_MEMORY_MB = 16_777_216
MAX_GPUS = 64
CPU_COUNT_MESSAGE = f"cpu_count must be an integer between 1 and {MAX_CPU_COUNT}"
MEMORY_MB_MESSAGE = f"memory_mb must be an integer between 0 and {MAX_MEMORY_MB}"
GPUS_MESSAGE = f"gpus must be an integer between 0 and {MAX_GPUS}"
NODE_ID_MESSAGE = f"node id must be 1 to {MAX_NODE_ID} characters of A-Za-z0-9._-"
ENFORCEMENTS = ("cgroup-v2", "cgroup-v1", "none")
ENFORCEMENT_MESSAGE = f"enforcement must be one of {', '.join(ENFORCEMENTS)}"
DRAIN_MESSAGE = "drain must be true or false"

MAX_RUNNING_LISTED = 10_000
MAX_LABELS = 64
MAX_LABEL_TEXT = 63
MAX_TEXT = 256
RUNNING_MESSAGE = f"running must be a list of at most {MAX_RUNNING_LISTED} job ids"
VERSION_MESSAGE = f"version must be a string of at most {MAX_TEXT} characters"
LABELS_MESSAGE = (
    f"labels must be an object of at most {MAX_LABELS} names of 1 to {MAX_LABEL_TEXT} "
    f"characters, each with a string value of at most {MAX_LABEL_TEXT} characters"
)
FENCE_MESSAGE = "fence_secs must be a number of seconds above 0"
AGENT_ID_MESSAGE = f"agent_id must be a string of at most {MAX_TEXT} characters"
REFUSING_MESSAGE = f"refusing_work must be a string of at most {4 * MAX_TEXT} characters"
ATTEMPTS_MESSAGE = "attempts must map job ids (job-N) to attempt numbers (0 or more)"
WANT_MESSAGE = f"want must be an integer between 0 and {MAX_CPU_COUNT}"


def wait_secs_message(max_wait_secs: float) -> str:
    return f"wait_secs must be a number of seconds from 0 to {max_wait_secs:g} (heartbeat_secs)"


@dataclasses.dataclass(frozen=True, slots=True)
class Heartbeat:
    """A valid heartbeat."""

    cpu_count: int
    running: frozenset[str]
    version: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    # Round four (issue 31), each optional: the agent's fence (None: it does not fence), its
    # id (one agent per node), why it takes no new work, and the attempt of each job it runs.
    fence_secs: float | None = None
    agent_id: str = ""
    refusing_work: str = ""
    attempts: tuple[tuple[str, int], ...] = ()
    # Round four (resources and fit), each optional: the node's memory (MiB) and GPUs, and
    # how the agent enforces each job's limits there. Parsed here; what uses them is placement's.
    memory_mb: int | None = None
    gpus: int | None = None
    enforcement: str = ""
    # Round four (waiting for work), each optional: how long the answer may wait for work
    # (None: answered at once, as before, with no `jobs`), and how many free slots it has.
    wait_secs: float | None = None
    want: int | None = None


def check_node_id(node_id: str) -> None:
    """A node id as a heartbeat names it: 1-253 characters of A-Za-z0-9._- (400 otherwise)."""
    if not is_node_id(node_id):
        raise errors.BadRequest(NODE_ID_MESSAGE)


def parse_heartbeat(body: bytes, max_wait_secs: float = 0.0) -> Heartbeat:
    """A heartbeat's body checked; `max_wait_secs` bounds its `wait_secs` (the scheduler's
    NODE_HEARTBEAT_SECS: a longer wait would outlast the node's health)."""
    data = decode_object(body, DECODE_HEARTBEAT)
    cpu_count = data.get("cpu_count")
    if not _in_range(cpu_count, 1, MAX_CPU_COUNT):
        raise errors.BadRequest(CPU_COUNT_MESSAGE)
    running = data.get("running")
    if not isinstance(running, list) or len(running) > MAX_RUNNING_LISTED:
        raise errors.BadRequest(RUNNING_MESSAGE)
    for job_id in running:
        if not isinstance(job_id, str) or jobs.parse_job_id(job_id) is None:
            raise errors.BadRequest(f"running must list job ids (job-N), not {job_id!r:.60}")
    version = data.get("version", "")
    if version is None:
        version = ""
    if not isinstance(version, str) or len(version) > MAX_TEXT:
        raise errors.BadRequest(VERSION_MESSAGE)
    labels = data.get("labels") or {}
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        raise errors.BadRequest(LABELS_MESSAGE)
    for key, value in labels.items():
        if not 1 <= len(key) <= MAX_LABEL_TEXT:
            raise errors.BadRequest(LABELS_MESSAGE)
        if not isinstance(value, str):
            raise errors.BadRequest(f"labels must map names to strings ({key!r:.60} does not)")
        if len(value) > MAX_LABEL_TEXT:
            raise errors.BadRequest(LABELS_MESSAGE)
    memory_mb = data.get("memory_mb")
    if memory_mb is not None and not _in_range(memory_mb, 0, MAX_MEMORY_MB):
        raise errors.BadRequest(MEMORY_MB_MESSAGE)
    gpus = data.get("gpus")
    if gpus is not None and not _in_range(gpus, 0, MAX_GPUS):
        raise errors.BadRequest(GPUS_MESSAGE)
    enforcement = data.get("enforcement") or ""
    if enforcement and enforcement not in ENFORCEMENTS:
        raise errors.BadRequest(ENFORCEMENT_MESSAGE)
    fence_secs = data.get("fence_secs")
    if fence_secs is not None and (
        isinstance(fence_secs, bool) or not isinstance(fence_secs, int | float) or fence_secs <= 0
    ):
        raise errors.BadRequest(FENCE_MESSAGE)
    agent_id = data.get("agent_id") or ""
    if not isinstance(agent_id, str) or len(agent_id) > MAX_TEXT:
        raise errors.BadRequest(AGENT_ID_MESSAGE)
    refusing = data.get("refusing_work") or ""
    if not isinstance(refusing, str) or len(refusing) > 4 * MAX_TEXT:
        raise errors.BadRequest(REFUSING_MESSAGE)
    attempts = data.get("attempts") or {}
    if not isinstance(attempts, dict) or len(attempts) > MAX_RUNNING_LISTED:
        raise errors.BadRequest(ATTEMPTS_MESSAGE)
    for job_id, attempt in attempts.items():
        if jobs.parse_job_id(job_id) is None or not _is_int(attempt) or attempt < 0:
            raise errors.BadRequest(ATTEMPTS_MESSAGE)
    wait_secs = data.get("wait_secs")
    if wait_secs is not None and (
        isinstance(wait_secs, bool)
        or not isinstance(wait_secs, int | float)
        or not 0 <= wait_secs <= max_wait_secs
    ):
        raise errors.BadRequest(wait_secs_message(max_wait_secs))
    want = data.get("want")
    if want is not None and not _in_range(want, 0, MAX_CPU_COUNT):
        raise errors.BadRequest(WANT_MESSAGE)
    return Heartbeat(
        cpu_count,
        frozenset(running),
        version,
        tuple(sorted(labels.items())),
        None if fence_secs is None else float(fence_secs),
        agent_id,
        refusing,
        tuple(sorted(attempts.items())),
        memory_mb,
        gpus,
        enforcement,
        None if wait_secs is None else float(wait_secs),
        want,
    )


def parse_drain(body: bytes) -> bool:
    data = decode_object(body, DECODE_NODE_CHANGE)
    drain = data.get("drain")
    if not isinstance(drain, bool):
        raise errors.BadRequest(DRAIN_MESSAGE)
    return drain


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _in_range(value: Any, low: int, high: int) -> bool:
    return _is_int(value) and low <= value <= high
