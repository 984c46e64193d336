"""The agent poll's cost with priorities, in process (issue 25): one node with 100,000 due
pending jobs over 10 priorities, timed over 10,000 polls.

Two loops: `poll` asks for the node's 4 free slots again and again (the table unchanged: the
cost of finding the head), `churn` polls for one job, claims it and reports it done each time
(the head moves, the indexes are kept up). Run it on two checkouts in one sitting to compare,
e.g. `python -m benchmarks.poll_order` here and with PYTHONPATH set to an export of main:

    git archive main tiny_scheduler | tar -x -C /tmp/main-src
    PYTHONPATH=/tmp/main-src python benchmarks/poll_order.py

Only the job table is timed: no HTTP, no store.
"""

from __future__ import annotations

import time

from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.jobs import Job
from tiny_scheduler.state.table import JobTable

JOBS = 100_000
POLLS = 10_000
PRIORITIES = 10
NOW = 1_800_000_000_000_000


def _table() -> JobTable:
    extra = {}
    fields = {field for field in Job.__dataclass_fields__}
    loaded = []
    for seq in range(1, JOBS + 1):
        if "priority" in fields:  # on a checkout before issue 25 every job is FIFO
            extra = {"priority": (seq % PRIORITIES) * 10}
        loaded.append(Job(seq=seq, node_id="node-a", command="true", created_at=NOW, **extra))
    return JobTable(loaded, JOBS)


def main() -> None:
    table = _table()
    started = time.perf_counter()
    for _ in range(POLLS):
        table.poll("node-a", 4, NOW)
    poll_us = (time.perf_counter() - started) / POLLS * 1e6

    started = time.perf_counter()
    for _ in range(POLLS):
        (job,) = table.poll("node-a", 1, NOW)
        running = jobs.start(job, NOW)
        table.put(running)
        table.put(jobs.finish(running, jobs.DONE, 0, "", "", NOW))
    churn_us = (time.perf_counter() - started) / POLLS * 1e6
    print(f"poll (4 free slots): {poll_us:.1f} us/poll")
    print(f"churn (poll, claim, done): {churn_us:.1f} us/round")


if __name__ == "__main__":
    main()
