"""`tiny-scheduler logs -f`: a job's output as it is written, until the job ends.

Each stream (stdout, stderr) is followed on a thread of its own with
`GET /jobs/{id}/output?stream=…&offset=N&wait=S`: the scheduler answers at once with what is
new, or holds the request up to S seconds until something is. stdout goes to stdout and
stderr to stderr, byte for byte. When the scheduler's cap dropped bytes this reader never
got (its `X-Output-Offset` runs ahead of what was read), a marker line on stderr says how many.
A stream is done once `X-Job-Status` is final and nothing more is left to read.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, BinaryIO
from urllib.parse import quote

from ..client import Client, ClientError
from ..jobs import FINAL_STATUSES, PENDING

WAIT_SECS = 25
"""Seconds the scheduler may hold one read open (it allows 30)."""

PENDING_LOOK_SECS = 1.0
"""Seconds between two looks while the job has not started: the scheduler does not hold a
read for a job that is not running."""


def follow_output(client: Client, job_id: str) -> dict[str, Any]:
    """Copy the job's stdout and stderr to ours until it has ended; return the ended job.

    A failure to read (the scheduler gone for good, the job unknown) is raised as the
    ClientError it is, after both streams have stopped.
    """
    client.job(job_id)  # an unknown job is an error now, not a silent wait
    failures: list[ClientError] = []
    threads = [
        threading.Thread(
            target=_follow_one,
            args=(client, job_id, name, sink, failures),
            name=f"follow-{name}",
            daemon=True,
        )
        for name, sink in (("stdout", sys.stdout.buffer), ("stderr", sys.stderr.buffer))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)  # in slices: Ctrl-C reaches the main thread
    if failures:
        raise failures[0]
    return client.job(job_id)


def _follow_one(
    shared: Client, job_id: str, stream: str, sink: BinaryIO, failures: list[ClientError]
) -> None:
    # A client of its own: a requests session is not meant to be shared between threads.
    client = Client(",".join(shared.base_urls), shared.key)
    path = f"/jobs/{quote(job_id, safe='')}/output"
    offset = 0
    try:
        while True:
            reply = client.request(
                "GET",
                path,
                params={"stream": stream, "offset": str(offset), "wait": str(WAIT_SECS)},
                timeout=(3.0, WAIT_SECS + 10.0),
            )
            data = reply.content
            following = int(reply.headers.get("X-Output-Offset", offset + len(data)))
            skipped = following - len(data) - offset
            if skipped > 0:
                sys.stderr.buffer.write(b"[tiny-scheduler: %d bytes skipped]\n" % skipped)
                sys.stderr.buffer.flush()
            if data:
                sink.write(data)
                sink.flush()
            offset = following
            status = reply.headers.get("X-Job-Status", "")
            if status in FINAL_STATUSES and not data:
                return
            if status == PENDING and not data:
                time.sleep(PENDING_LOOK_SECS)
    except ClientError as exc:
        failures.append(exc)
