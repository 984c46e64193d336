"""What a replay is told as: the figures of one schedule, and two set side by side.

A schedule is where and when each job ran (`Run`s by the job's seq in the history): what
happened (`as_happened`) or what the replay found. Its `Summary` holds the jobs that ran, the
makespan (first arrival to last end), the waits (start minus arrival) at p50, p95 and p99
overall, per queue and per user, and each node's utilization (the CPU-seconds its jobs held
over its CPUs times the makespan). Percentiles are nearest-rank: a figure some job really
waited. `compare` puts two summaries together with the jobs whose wait changed most, as JSON
for scripts (`--json`) and as text for people (`text`).

Tests: `tests/test_simulate.py`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .history import History, Node, PastJob
from .replay import Outcome, Run

US = 1_000_000
PERCENTILES = (50, 95, 99)
MOST_CHANGED = 10
"""How many jobs `compare` lists whose wait changed most."""


def as_happened(history: History) -> dict[int, Run]:
    """The history's own schedule."""
    return {job.seq: Run(job.node_id, job.start, job.end) for job in history.jobs}


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """`p50`, `p95` and `p99` of `values` (nearest rank); zeros when there are none."""
    ordered = sorted(values)
    found = {}
    for p in PERCENTILES:
        rank = max(1, math.ceil(p / 100 * len(ordered)))
        found[f"p{p}"] = round(ordered[rank - 1], 3) if ordered else 0.0
    return found


@dataclasses.dataclass(frozen=True)
class Summary:
    jobs: int
    makespan_secs: float
    wait: dict[str, float]
    queues: dict[str, dict[str, float]]
    users: dict[str, dict[str, float]]
    utilization: dict[str, float]
    not_run: int = 0

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize(past: Sequence[PastJob], runs: Mapping[int, Run], nodes: Sequence[Node]) -> Summary:
    """The figures of the schedule `runs` of the jobs `past` on `nodes`."""
    ran = [job for job in past if job.seq in runs]
    if not ran:
        return Summary(0, 0.0, percentiles([]), {}, {}, {}, len(past))
    first = min(job.arrival for job in ran)
    makespan = (max(runs[job.seq].end for job in ran) - first) / US
    waits = {job.seq: (runs[job.seq].start - job.arrival) / US for job in ran}
    held: dict[str, float] = {}
    for job in ran:
        run = runs[job.seq]
        held[run.node_id] = held.get(run.node_id, 0.0) + max(job.cpus, 1) * (run.end - run.start)
    utilization = {
        node.node_id: round(held.get(node.node_id, 0.0) / US / (node.cpus * makespan), 3)
        if makespan
        else 0.0
        for node in nodes
    }
    return Summary(
        len(ran),
        round(makespan, 3),
        percentiles(list(waits.values())),
        _grouped(ran, waits, "queue"),
        _grouped(ran, waits, "owner"),
        utilization,
        len(past) - len(ran),
    )


def _grouped(ran: Sequence[PastJob], waits: Mapping[int, float], by: str) -> dict[str, Any]:
    groups: dict[str, list[float]] = {}
    for job in ran:
        groups.setdefault(getattr(job, by) or "-", []).append(waits[job.seq])
    return {
        name: {"jobs": len(values), **percentiles(values)}
        for name, values in sorted(groups.items())
    }


def compare(
    history: History, nodes: Sequence[Node], outcome: Outcome, changes: Mapping[str, Any]
) -> dict[str, Any]:
    """What happened and the what-if side by side, with the jobs whose wait changed most and
    the jobs the what-if could not run."""
    before = as_happened(history)
    after = outcome.runs
    changed = sorted(
        (
            ((after[job.seq].start - before[job.seq].start) / US, job.seq)
            for job in history.jobs
            if job.seq in after and after[job.seq].start != before[job.seq].start
        ),
        key=lambda item: (-abs(item[0]), item[1]),
    )[:MOST_CHANGED]
    by_seq = {job.seq: job for job in history.jobs}
    return {
        "changes": dict(changes),
        "history": summarize(history.jobs, before, history.nodes).to_wire(),
        "what_if": summarize(history.jobs, after, nodes).to_wire(),
        "most_changed": [
            {
                "job_id": by_seq[seq].job_id,
                "wait_before": round((before[seq].start - by_seq[seq].arrival) / US, 3),
                "wait_after": round((after[seq].start - by_seq[seq].arrival) / US, 3),
                "change": round(delta, 3),
            }
            for delta, seq in changed
        ],
        "not_run": {by_seq[seq].job_id: why for seq, why in sorted(outcome.refused.items())},
    }


# --- as text -----------------------------------------------------------------------------------


def text(compared: Mapping[str, Any]) -> str:
    """The comparison as aligned lines: a figure, what happened, the what-if."""
    before, after = compared["history"], compared["what_if"]
    lines: list[tuple[str, str, str]] = [("", "history", "what if")]
    if "claim_latency_secs" in compared:
        latency = _secs(compared["claim_latency_secs"])
        lines.append(("claim latency", "", latency))
    lines.append(("jobs", str(before["jobs"]), str(after["jobs"])))
    if after["not_run"]:
        lines.append(("  not run", str(before["not_run"]), str(after["not_run"])))
    lines.append(("makespan", _secs(before["makespan_secs"]), _secs(after["makespan_secs"])))
    lines.extend(_waits("wait", before["wait"], after["wait"]))
    for group, title in (("queues", "queue"), ("users", "user")):
        for name in sorted(set(before[group]) | set(after[group])):
            lines.extend(
                _waits(f"{title} {name} wait", before[group].get(name), after[group].get(name))
            )
    for node in sorted(set(before["utilization"]) | set(after["utilization"])):
        lines.append(
            (
                f"node {node} utilization",
                _share(before["utilization"].get(node)),
                _share(after["utilization"].get(node)),
            )
        )
    width = [max(len(line[column]) for line in lines) for column in range(3)]
    out = [
        f"{first:<{width[0]}}  {second:>{width[1]}}  {third:>{width[2]}}".rstrip()
        for first, second, third in lines
    ]
    if compared["most_changed"]:
        out += ["", "waits that changed most:"]
        for item in compared["most_changed"]:
            out.append(
                f"  {item['job_id']}  {_secs(item['wait_before'])} -> {_secs(item['wait_after'])}"
                f" ({item['change']:+.1f} s)"
            )
    for job_id, why in compared["not_run"].items():
        out.append(f"not run: {job_id}: {why}")
    return "\n".join(out)


def _waits(
    title: str, before: Mapping[str, float] | None, after: Mapping[str, float] | None
) -> list[tuple[str, str, str]]:
    return [
        (f"{title} {name}", _secs((before or {}).get(name)), _secs((after or {}).get(name)))
        for name in ("p50", "p95", "p99")
    ]


def _secs(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f} s" if abs(value) >= 1 or value == 0 else f"{value:.2f} s"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"
