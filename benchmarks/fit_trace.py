"""The fit scenario's workload (issue 34): four unequal nodes, a fixed seeded trace of mixed
1/2/4-CPU jobs, and the lower bound no schedule of it can beat.

- **Nodes**: `node-a` 2 CPUs, `node-b` 4, `node-c` 4 and `node-d` 8, the last two labelled
  `disk=ssd` (18 CPUs in all, 12 of them with the label).
- **Jobs**: 300, drawn from `random.Random(34)`: 1, 2 or 4 CPUs (weights 5:3:2; 141, 102 and
  57 of them), a run time uniform in 1-6 s (times the scale), odds of 1 in 4 of asking for
  `disk=ssd` with `node_selector` (58 do) and of 1 in 10 of priority 1 (20; the rest at the
  default), and a `timeout_secs` a bit above the run time (x1.25 and at least 0.5 s more,
  rounded up to whole seconds: backfill goes by timeouts, and a person sets one with some
  room). The first 200 are submitted at once, the last 100 in a second burst when 40 % of
  the first one's work could be done.
- **The bound**: no schedule's makespan can be below the largest of: the work (the sum of
  cpus x run time) over all the CPUs, the longest job, and for each `node_selector` the work
  of the jobs that ask for it over the CPUs of the nodes that have it; and, for the second
  burst, its submission time plus the same over the jobs submitted from then on.

Pure: no clock, no network.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

SEED = 34
JOBS = 300
FIRST_WAVE = 200
"""Jobs in the first burst; the rest come in the second."""
SECOND_WAVE_AT = 0.4
"""The second burst's submission, as a share of the first burst's work over all the CPUs."""
CPUS = (1, 2, 4)
CPU_WEIGHTS = (5, 3, 2)
RUN_SECS = (1.0, 6.0)
"""A job's run time is uniform in this range (at scale 1)."""
LABEL = {"disk": "ssd"}
LABELLED_SHARE = 0.25
URGENT_SHARE = 0.1
URGENT_PRIORITY = 1
TIMEOUT_FACTOR = 1.25
TIMEOUT_MARGIN_S = 0.5


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """A simulated node: its id, its CPUs and its labels."""

    node_id: str
    cpus: int
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def has(self, selector: Mapping[str, str]) -> bool:
        return all(self.labels.get(name) == value for name, value in selector.items())


NODES = (
    NodeSpec("node-a", 2),
    NodeSpec("node-b", 4),
    NodeSpec("node-c", 4, LABEL),
    NodeSpec("node-d", 8, LABEL),
)


@dataclasses.dataclass(frozen=True)
class TraceJob:
    """One job of the trace: `n` its place in it, `at` its submission (seconds after the
    first), `secs` how long it runs."""

    n: int
    at: float
    cpus: int
    secs: float
    timeout_secs: int
    selector: Mapping[str, str] | None = None
    priority: int = 0

    def body(self, one_slot: bool = False) -> dict[str, Any]:
        """Its POST /jobs body; `one_slot`: as before issue 34, without `cpus` (every job
        one slot) and without its timeout (see `benchmarks/fit.py` for why)."""
        env = {"BENCH_SECS": repr(self.secs), "BENCH_CPUS": str(self.cpus), "BENCH_N": str(self.n)}
        body: dict[str, Any] = {"command": f"sleep {self.secs}", "env_vars": env}
        if not one_slot:
            body["cpus"] = self.cpus
            body["timeout_secs"] = self.timeout_secs
        if self.selector:
            body["node_selector"] = dict(self.selector)
        if self.priority:
            body["priority"] = self.priority
        return body


def trace(scale: float = 1.0, seed: int = SEED) -> list[TraceJob]:
    """The jobs, in submission order (the same for the same seed and scale)."""
    rng = random.Random(seed)
    drawn = []
    for n in range(JOBS):
        cpus = rng.choices(CPUS, CPU_WEIGHTS)[0]
        secs = round(rng.uniform(*RUN_SECS) * scale, 3)
        labelled = rng.random() < LABELLED_SHARE
        urgent = rng.random() < URGENT_SHARE
        drawn.append((n, cpus, secs, labelled, urgent))
    capacity = sum(node.cpus for node in NODES)
    first_work = sum(cpus * secs for n, cpus, secs, _, _ in drawn if n < FIRST_WAVE)
    second_at = round(SECOND_WAVE_AT * first_work / capacity, 3)
    return [
        TraceJob(
            n,
            0.0 if n < FIRST_WAVE else second_at,
            cpus,
            secs,
            math.ceil(max(secs * TIMEOUT_FACTOR, secs + TIMEOUT_MARGIN_S)),
            LABEL if labelled else None,
            URGENT_PRIORITY if urgent else 0,
        )
        for n, cpus, secs, labelled, urgent in drawn
    ]


def work(jobs: Sequence[TraceJob]) -> float:
    """CPU-seconds of the jobs."""
    return sum(job.cpus * job.secs for job in jobs)


def bound(jobs: Sequence[TraceJob], nodes: Sequence[NodeSpec] = NODES) -> float:
    """The makespan no schedule can beat (see the module's notes), in seconds from the first
    submission."""
    return max(bound_parts(jobs, nodes).values())


def bound_parts(jobs: Sequence[TraceJob], nodes: Sequence[NodeSpec] = NODES) -> dict[str, float]:
    """Each of the bound's terms by name (`disk=ssd work / its CPUs from 30.2 s`)."""
    capacity = sum(node.cpus for node in nodes)
    selectors = sorted({tuple(sorted(job.selector.items())) for job in jobs if job.selector})
    parts = {}
    for release in sorted({job.at for job in jobs}):
        later = [job for job in jobs if job.at >= release]
        since = f" from {release:g} s" if release else ""
        parts[f"work / CPUs{since}"] = release + work(later) / capacity
        parts[f"longest job{since}"] = release + max(job.secs for job in later)
        for selector in selectors:
            wanted = dict(selector)
            asking = [job for job in later if job.selector and dict(job.selector) == wanted]
            having = sum(node.cpus for node in nodes if node.has(wanted))
            if asking and having:
                name = ",".join(f"{key}={value}" for key, value in selector)
                parts[f"{name} work / its CPUs{since}"] = release + work(asking) / having
    return parts
