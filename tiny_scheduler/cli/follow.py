"""`tiny-scheduler logs -f`: a job's output as it is written, until the job ends.

Each stream (stdout, stderr) is followed on a thread of its own with
`GET /jobs/{id}/output?stream=…&offset=N&wait=S`: the scheduler answers at once with what is
new, or holds the request up to S seconds until something is. stdout goes to stdout and
stderr to stderr, byte for byte. When the scheduler's cap dropped bytes this reader never
got (its `X-Output-Offset` runs ahead of what was read), a marker line on stderr says how many.
A stream is done once `X-Job-Status` is final and nothing more is left to read.

Reads name their attempt (`attempt=K`, the `X-Attempt` of the first read). When the job is
retried, the attempt being read ends (`failed`): the reader then moves on to the next attempt
from its start, and the stderr reader prints a header line for it first, such as
`=== attempt 2/2 on node-b (retry after exit 3) ===`, so two attempts' output never runs
together (nor does the new one's start repeat the old one's offsets).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, BinaryIO
from urllib.parse import quote

from ..client import Client, ClientError
from ..domain.jobs import FINAL_STATUSES, PENDING, SCHEDULER_NOTES

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
    # An unknown job is an error now, not a silent wait; and the attempt to start from.
    first = client.job(job_id).get("retry_count")
    failures: list[ClientError] = []
    threads = [
        threading.Thread(
            target=_follow_one,
            args=(client, job_id, first if isinstance(first, int) else None, name, sink, failures),
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
    shared: Client,
    job_id: str,
    attempt: int | None,
    stream: str,
    sink: BinaryIO,
    failures: list[ClientError],
) -> None:
    # A client of its own: a requests session is not meant to be shared between threads.
    client = Client(",".join(shared.base_urls), shared.key)
    path = f"/jobs/{quote(job_id, safe='')}/output"
    offset = 0
    try:
        while True:
            params = {"stream": stream, "offset": str(offset), "wait": str(WAIT_SECS)}
            if attempt is not None:
                params["attempt"] = str(attempt)
            reply = client.request("GET", path, params=params, timeout=(3.0, WAIT_SECS + 10.0))
            if "X-Attempt" not in reply.headers:
                attempt = None  # a scheduler that reads the current attempt only
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
                job = client.job(job_id)
                if attempt is None or job.get("retry_count", 0) <= attempt:
                    return  # the job itself has ended
                # That attempt failed and the job was retried: on to the next one.
                attempt, offset = attempt + 1, 0
                if stream == "stderr":
                    sys.stderr.buffer.write(retry_header(job, attempt).encode() + b"\n")
                    sys.stderr.buffer.flush()
                continue
            if status == PENDING and not data:
                time.sleep(PENDING_LOOK_SECS)
    except ClientError as exc:
        failures.append(exc)


def retry_header(job: dict[str, Any], attempt: int) -> str:
    """The line that starts attempt `attempt` (from 0) of a retried job's output, saying
    where it runs and why the one before it ended."""
    earlier = job.get("attempts") or []
    before = earlier[attempt - 1] if 0 < attempt <= len(earlier) else {}
    last_line = (before.get("stderr") or "").rstrip("\n").rpartition("\n")[2]
    if before.get("exit_code") == -1 and last_line in SCHEDULER_NOTES:
        why = last_line
    else:
        why = f"exit {before.get('exit_code', '?')}"
    total = max(job.get("retry_count", 0), attempt) + 1
    return f"=== attempt {attempt + 1}/{total} on {job.get('node_id', '?')} (retry after {why}) ==="


def live_output(client: Client, job_id: str) -> dict[str, str]:
    """What the job's current attempt has printed so far, by stream (empty ones left out)."""
    found = {}
    for stream in ("stdout", "stderr"):
        reply = client.request(
            "GET", f"/jobs/{quote(job_id, safe='')}/output", params={"stream": stream}
        )
        if reply.content:
            found[stream] = reply.content.decode("utf-8", "replace")
    return found
