"""The what-if: the operator's changes to a history's setup, each checked against it.

- `--nodes +N`: N more copies of the largest node (most CPUs, then memory, then GPUs),
  named `<its id>-copy-1`…; `--nodes FILE`: a JSON list of `{"node_id", "cpus",
  "memory_mb", "gpus", "labels"}` in place of the history's nodes (`cpus` required, the rest
  optional; an unknown or mistyped field is an error naming it and the node).
- `--placement`: one of the daemon's placements.
- `--queue NAME=N` / `--user NAME=N`: that queue's or user's `max_running` (`none`: no
  limit); a name the history does not know is an error (a typo would change nothing).
- `--claim-latency SECS`: the time from an event to the polls it sets off; by default what
  the history shows (`observed_latency`).

A change that cannot apply raises `ChangeError` naming the option and what is wrong.

Tests: `tests/test_simulate.py`.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import LEAST_LOADED, PLACEMENTS
from ..domain import validation
from .history import History, Node
from .replay import Setup

US = 1_000_000

NODE_FIELDS = {"node_id": str, "cpus": int, "memory_mb": int, "gpus": int, "labels": dict}


class ChangeError(ValueError):
    """A change that cannot apply to the history; the message names the option."""


@dataclasses.dataclass(frozen=True)
class Changes:
    """What the operator asked to change (None or empty: as in the history)."""

    nodes: str | None = None
    placement: str | None = None
    queues: Mapping[str, int | None] = dataclasses.field(default_factory=dict)
    users: Mapping[str, int | None] = dataclasses.field(default_factory=dict)
    claim_latency_secs: float | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.nodes is not None:
            out["nodes"] = self.nodes
        if self.placement is not None:
            out["placement"] = self.placement
        if self.queues:
            out["queues"] = dict(self.queues)
        if self.users:
            out["users"] = dict(self.users)
        if self.claim_latency_secs is not None:
            out["claim_latency_secs"] = self.claim_latency_secs
        return out


def limit_pairs(option: str, given: Sequence[str]) -> dict[str, int | None]:
    """`NAME=N` (or `NAME=none`) pairs of `option`, by name."""
    found: dict[str, int | None] = {}
    for pair in given:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ChangeError(f"{option} {pair!r}: give NAME=N (or NAME=none)")
        if value == "none":
            found[name] = None
        elif value.isdigit() and int(value) >= 1:
            found[name] = int(value)
        else:
            raise ChangeError(f"{option} {pair!r}: N must be a whole number of at least 1, or none")
    return found


def observed_latency(history: History) -> float:
    """Seconds from the moment a job could have started on the node it ran on (its arrival,
    or the end of that node's job that ended last before it started) to its start: the median
    over the jobs, which is the time the agents' polls and claims took."""
    ends: dict[str, list[int]] = {}
    for job in history.jobs:
        ends.setdefault(job.node_id, []).append(job.end)
    for listed in ends.values():
        listed.sort()
    gaps = []
    for job in history.jobs:
        on_node = ends[job.node_id]
        before = bisect.bisect_right(on_node, job.start)
        ready = max(job.arrival, on_node[before - 1] if before else job.arrival)
        gaps.append(max(0, job.start - ready) / US)
    return round(statistics.median(gaps), 3) if gaps else 0.0


def setup_of(history: History, changes: Changes) -> Setup:
    """The setup the what-if replays on: the history's, changed."""
    placement = changes.placement or LEAST_LOADED
    if placement not in PLACEMENTS:
        raise ChangeError(f"--placement {placement}: use one of {', '.join(PLACEMENTS)}")
    queues = _limits("--queue", "queue", history.queue_limits, changes.queues, history.queues)
    users = _limits("--user", "user", history.user_limits, changes.users, history.users)
    latency = changes.claim_latency_secs
    if latency is None:
        latency = observed_latency(history)
    elif latency < 0:
        raise ChangeError(f"--claim-latency {latency:g}: must be 0 or more seconds")
    nodes = _nodes(history.nodes, changes.nodes)
    return Setup(nodes, placement, queues, users, round(latency * US))


def as_it_was(history: History, claim_latency_secs: float | None = None) -> Setup:
    """The history's own setup (the replay with no changes)."""
    return setup_of(history, Changes(claim_latency_secs=claim_latency_secs))


def _limits(
    option: str,
    what: str,
    stored: Mapping[str, int],
    wanted: Mapping[str, int | None],
    known: set[str],
) -> dict[str, int]:
    limits = dict(stored)
    for name, limit in wanted.items():
        if name not in known:
            shown = ", ".join(sorted(known)) or "none"
            raise ChangeError(f"{option} {name}: no {what} of that name in the history ({shown})")
        if limit is None:
            limits.pop(name, None)
        else:
            limits[name] = limit
    return limits


def _nodes(nodes: Sequence[Node], given: str | None) -> list[Node]:
    if given is None:
        return list(nodes)
    if given.startswith("+"):
        count = given[1:]
        if not count.isdigit() or int(count) < 1:
            raise ChangeError(f"--nodes {given}: give +N (a number of copies) or a FILE")
        if not nodes:
            raise ChangeError(f"--nodes {given}: the history has no node to copy")
        largest = max(nodes, key=lambda node: (node.cpus, node.memory_mb, node.gpus))
        copies = [
            dataclasses.replace(largest, node_id=f"{largest.node_id}-copy-{n}")
            for n in range(1, int(count) + 1)
        ]
        return [*nodes, *copies]
    return read_nodes(given)


def read_nodes(path: str) -> list[Node]:
    """The nodes of a JSON node file (see the module's notes)."""
    try:
        listed = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ChangeError(f"--nodes {path}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise ChangeError(f"--nodes {path}: not JSON ({exc})") from None
    if not isinstance(listed, list) or not listed:
        raise ChangeError(f"--nodes {path}: must be a non-empty JSON list of nodes")
    nodes = []
    for number, item in enumerate(listed, 1):
        where = f"--nodes {path}: node {number}"
        if not isinstance(item, dict):
            raise ChangeError(f'{where}: must be an object such as {{"node_id": …, "cpus": 4}}')
        for name, value in item.items():
            kind = NODE_FIELDS.get(name)
            if kind is None:
                raise ChangeError(
                    f"{where}: unknown field {name!r} (fields: {', '.join(NODE_FIELDS)})"
                )
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ChangeError(f"{where}: {name} must be {kind.__name__}, not {value!r}")
        node_id = item.get("node_id")
        if not isinstance(node_id, str) or not validation.is_node_id(node_id):
            raise ChangeError(f"{where}: node_id must be 1-253 characters of A-Za-z0-9._-")
        if "cpus" not in item or item["cpus"] < 1:
            raise ChangeError(f"{where} ({node_id}): cpus must be at least 1")
        for name in ("memory_mb", "gpus"):
            if item.get(name, 0) < 0:
                raise ChangeError(f"{where} ({node_id}): {name} must be 0 or more")
        labels = item.get("labels", {})
        if not all(isinstance(v, str) for v in labels.values()):
            raise ChangeError(f"{where} ({node_id}): labels must map names to strings")
        nodes.append(
            Node(node_id, item["cpus"], item.get("memory_mb", 0), item.get("gpus", 0), labels)
        )
    if len({node.node_id for node in nodes}) < len(nodes):
        raise ChangeError(f"--nodes {path}: a node_id is listed twice")
    return nodes
