"""The simulate case (issue 38): a week of 100k jobs replayed by `tiny-scheduler simulate`'s
own code, in under 30 s on this machine.

- **The week**: `random.Random(38)` draws 100,000 jobs over 7 days on 10 nodes (two of 16
  CPUs, four of 8, four of 4 with `disk=ssd`; 88 CPUs): arrivals a Poisson stream whose rate
  follows the day (twice as busy from 08:00 to 20:00), 1, 2 or 4 CPUs (weights 5:3:2), run
  times exponential with a 3-minute mean (at most 2 h), a timeout of twice the run time
  rounded up to a minute, one in eight asking for `disk=ssd`, one in ten at priority 80, a
  quarter in queue `nightly` (capped at 16 running: about twice what it needs on average),
  owners among 12 users, and one in twenty depending on the job just before it. Where and
  when each ran is the replay of it with no changes (a history the scheduler would have
  made), so the no-change what-if repeats it.
- **Measured**: the seconds of the what-if with two more nodes (`--nodes +2`): the history's
  summary, the replay and the comparison, as the command runs them. The ratio to the week it
  replays, and jobs per second, are printed too; `--profile` is cProfile's top functions.

Run alone: `python -m benchmarks --only simulate` (part of `make bench`).
"""

from __future__ import annotations

import cProfile
import io
import math
import pstats
import random
import time
from typing import Any

from tiny_scheduler.simulate import changes, history, replay, report
from tiny_scheduler.simulate.history import History, Node, PastJob

SEED = 38
JOBS = 100_000
WEEK_S = 7 * 24 * 3600
TARGET_S = 30.0
NIGHTLY_LIMIT = 16
NODES = (
    *(Node(f"big-{n}", 16, 65536) for n in range(2)),
    *(Node(f"mid-{n}", 8, 32768) for n in range(4)),
    *(Node(f"ssd-{n}", 4, 16384, labels={"disk": "ssd"}) for n in range(4)),
)
US = 1_000_000
T0 = 1_800_000_000_000_000


def week(jobs: int = JOBS, seed: int = SEED) -> History:
    """The drawn week (see the module's notes), with where and when each job ran."""
    rng = random.Random(seed)
    busy = [2.0 if 8 <= hour < 20 else 1.0 for hour in range(24)]
    weight = sum(busy) / 24
    past = []
    at = 0.0
    for seq in range(1, jobs + 1):
        # A Poisson stream thinned by the hour's weight: the mean stays JOBS per week.
        while True:
            at += rng.expovariate(jobs / WEEK_S * max(busy) / weight)
            if rng.random() < busy[int(at // 3600) % 24] / max(busy):
                break
        secs = min(rng.expovariate(1 / 180), 7200.0)
        arrival = T0 + round(at * US)
        past.append(
            PastJob(
                seq,
                arrival,
                arrival,
                arrival + max(1, round(secs * US)),
                "",
                cpus=rng.choices((1, 2, 4), (5, 3, 2))[0],
                node_selector={"disk": "ssd"} if rng.random() < 1 / 8 else None,
                priority=80 if rng.random() < 0.1 else 50,
                queue="nightly" if rng.random() < 0.25 else "default",
                owner=f"user-{rng.randrange(12)}",
                depends_on=(seq - 1,) if seq > 1 and rng.random() < 0.05 else (),
                timeout_secs=60 * math.ceil(2 * secs / 60),
            )
        )
    drawn = history.build(past, NODES, {"nightly": NIGHTLY_LIMIT})
    ran = replay.replay(drawn.jobs, changes.as_it_was(drawn, 0)).runs
    return history.build(
        [_as_run(job, ran[job.seq]) for job in drawn.jobs if job.seq in ran],
        NODES,
        {"nightly": NIGHTLY_LIMIT},
    )


def _as_run(job: PastJob, run: replay.Run) -> PastJob:
    fields = {name: getattr(job, name) for name in PastJob.__slots__}
    return PastJob(**{**fields, "start": run.start, "end": run.end, "node_id": run.node_id})


def what_if(past: History) -> dict[str, Any]:
    """`simulate --nodes +2 --claim-latency 0`, as the command runs it."""
    asked = changes.Changes(nodes="+2", claim_latency_secs=0)
    setup = changes.setup_of(past, asked)
    outcome = replay.replay(past.jobs, setup)
    return report.compare(past, setup.nodes, outcome, asked.to_wire())


def run(jobs: int = JOBS, profile: bool = False) -> dict[str, Any]:
    began = time.perf_counter()
    past = week(jobs)
    drawn_s = time.perf_counter() - began
    profiler = cProfile.Profile() if profile else None
    began = time.perf_counter()
    if profiler:
        profiler.enable()
    compared = what_if(past)
    if profiler:
        profiler.disable()
    secs = time.perf_counter() - began
    case: dict[str, Any] = {
        "jobs": len(past.jobs),
        "week_s": WEEK_S,
        "replay_s": round(secs, 2),
        "jobs_per_s": round(len(past.jobs) / secs),
        "draw_s": round(drawn_s, 2),
        "target_s": TARGET_S,
        "met": secs < TARGET_S,
        "history": compared["history"]["wait"]
        | {"makespan_s": compared["history"]["makespan_secs"]},
        "what_if": compared["what_if"]["wait"]
        | {"makespan_s": compared["what_if"]["makespan_secs"]},
    }
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        case["profile"] = out.getvalue()
    return {"simulate": case}


if __name__ == "__main__":
    import json
    import sys

    found = run(int(sys.argv[1]) if len(sys.argv) > 1 else JOBS, profile=True)["simulate"]
    print(found.pop("profile"))
    print(json.dumps(found, indent=1))
