"""`rq-venv/bin/python rq_driver.py URL QUEUE N COMMAND`: RQ's side of `e2e.py`'s client.

Waits until two workers listen on QUEUE, prints `ready`, waits for a line on stdin (the
benchmark reads the processes' CPU meanwhile), enqueues N jobs of `rq_job.run(COMMAND)` in one
pipeline, waits until all N have finished (or failed), and prints one JSON line: the
seconds from the first enqueue to the last end, and the counts. Runs in the benchmark's RQ
virtualenv: RQ is never a dependency of tiny-scheduler.
"""

from __future__ import annotations

import json
import sys
import time

from redis import Redis
from rq import Queue, Worker

POLL_SECS = 0.05
"""How often the registries are counted while waiting: as often as `e2e.py` reads
/health on our side."""


def main() -> None:
    url, name, count, command = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    redis = Redis.from_url(url)
    queue = Queue(name, connection=redis)
    deadline = time.monotonic() + 60
    while len(Worker.all(queue=queue)) < 2:
        if time.monotonic() > deadline:
            sys.exit("the two RQ workers did not register within 60 s")
        time.sleep(0.1)
    print("ready", flush=True)
    sys.stdin.readline()
    began = time.monotonic()
    with redis.pipeline() as pipe:
        queue.enqueue_many(
            [Queue.prepare_data("rq_job.run", args=(command,)) for _ in range(count)],
            pipeline=pipe,
        )
        pipe.execute()
    finished = failed = 0
    while finished + failed < count:
        time.sleep(POLL_SECS)
        finished = queue.finished_job_registry.count
        failed = queue.failed_job_registry.count
    print(
        json.dumps({"seconds": time.monotonic() - began, "finished": finished, "failed": failed}),
        flush=True,
    )


if __name__ == "__main__":
    main()
