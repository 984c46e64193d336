"""Live output: what a running job has printed so far, appended by its agent about once a
second (`POST /jobs/{id}/output`) and read from any byte offset (`GET /jobs/{id}/output`).

The text itself lives where the final report's does, in the store, as the running attempt's
output (its tail of MAX_OUTPUT_BYTES per stream): a reader reads it from disk, a restart keeps
it, and the final report replaces it. Memory holds only how many bytes each stream has had in
all (`_totals`, a bounded map), which is what turns the kept tail into offsets counted from the
attempt's start: the tail starts at `total - len(tail)`. A reader asking for an offset the
cap has dropped gets the stream from its first kept byte (its next offset says so).

After the job ends, the stream is the final report's text; when that is shorter than what the
agent had sent live (the final report was capped), it is counted as a tail too.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

from .. import errors
from ..domain import fencing, jobs
from ..domain.jobs import Job
from ..notify import Signal
from .core import Core, Event, job_seq

STREAMS = ("stdout", "stderr")

ATTEMPT_NOT_FOUND = "attempt not found"

TOTALS_KEPT = 10_000
"""Jobs whose stream totals are remembered (the most recently written)."""


@dataclasses.dataclass(frozen=True, slots=True)
class OutputRead:
    """Bytes of one stream from an offset, and where the next read starts."""

    data: bytes
    next_offset: int
    status: str  # the status of the attempt read: the job's for its current attempt
    attempt: int  # the attempt read (its retry_count, from 0)
    current: bool  # whether that is the job's current attempt (the only one that can grow)


class OutputOps:
    """Appending to and reading from the running attempt's output."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self._lock = threading.Lock()
        self._totals: collections.OrderedDict[tuple[int, int], list[int]] = (
            collections.OrderedDict()
        )
        self.signal = Signal()
        """Fires when output arrives, or a job starts, retries or ends: output waiters look."""
        core.listeners.append(self._on_change)

    def _on_change(self, event: Event, job: Job | None, detail: str) -> None:
        if event in (Event.STARTED, Event.RETRIED, Event.FINISHED):
            self.signal.fire()

    def append(
        self,
        job_id: str,
        stdout: str,
        stderr: str,
        node_id: str | None = None,
        attempt: int | None = None,
    ) -> None:
        """Add to the running attempt's output; Conflict when the job is not running, or the
        output names another attempt than the current one (`fencing.stale_report`)."""
        core = self._core
        cap = core.settings.max_output_bytes
        seq = job_seq(job_id)
        with core.table.changing(seq) as job:
            stale = fencing.stale_report(job, node_id, attempt, claim=False)
            if stale is not None:
                raise errors.Conflict(stale)
            if job.status != jobs.RUNNING:
                raise errors.Conflict(f"job {job_id} is {job.status}, not running: no output")
            stored = core.store.read_outputs(seq) or {}
            current = stored.get(job.retry_count) or jobs.Output("", "")
            added = (stdout.encode("utf-8"), stderr.encode("utf-8"))
            texts = [
                _tail(old, new, cap) if new else old
                for old, new in zip((current.stdout, current.stderr), added, strict=True)
            ]
            if any(added):
                core.commit(job.evolve(stdout=texts[0], stderr=texts[1]), becomes_final=False)
            with self._lock:
                totals = self._totals_of(seq, job.retry_count, current)
                totals[0] += len(added[0])
                totals[1] += len(added[1])
        self.signal.fire()

    def read(self, job_id: str, stream: str, offset: int, attempt: int | None = None) -> OutputRead:
        """The bytes of `stream` of one attempt of the job (its current one by default) from
        `offset`. An earlier attempt (one that failed and was retried) is read whole as it
        ended, with its own status, `failed`."""
        core = self._core
        seq = job_seq(job_id)
        job = core.table.get(seq)
        if job is None:
            raise errors.NotFound(errors.JOB_NOT_FOUND)
        if attempt is not None and attempt > job.retry_count:
            raise errors.NotFound(ATTEMPT_NOT_FOUND)
        stored = core.store.read_outputs(seq)
        if stored is None:
            raise errors.NotFound(errors.JOB_NOT_FOUND)
        if attempt is not None and attempt < job.retry_count:
            ended = getattr(stored.get(attempt) or jobs.Output("", ""), stream).encode("utf-8")
            chunk = ended[offset:] if offset < len(ended) else b""
            return OutputRead(chunk, max(offset, len(ended)), str(jobs.FAILED), attempt, False)
        output = stored.get(job.retry_count) or jobs.Output("", "")
        if job.status == jobs.PENDING:
            output = jobs.Output("", "")  # a retried job's new attempt has printed nothing
        data = getattr(output, stream).encode("utf-8")
        with self._lock:
            known = self._totals.get((seq, job.retry_count))
            total = known[STREAMS.index(stream)] if known else 0
        total = max(total, len(data))
        start = total - len(data)
        chunk = data[max(0, offset - start) :] if offset < total else b""
        return OutputRead(chunk, total, str(job.status), job.retry_count, True)

    def _totals_of(self, seq: int, attempt: int, current: jobs.Output) -> list[int]:
        """(Lock held.) The stream totals of an attempt, remembered from its kept output
        when this process has not seen it grow (a restart)."""
        key = (seq, attempt)
        totals = self._totals.get(key)
        if totals is None:
            totals = [len(current.stdout.encode()), len(current.stderr.encode())]
            self._totals[key] = totals
            if len(self._totals) > TOTALS_KEPT:
                self._totals.popitem(last=False)
        else:
            self._totals.move_to_end(key)
        return totals


def _tail(old: str, added: bytes, cap: int) -> str:
    """The last `cap` bytes of old + added, cut at a character boundary (no marker: readers
    see where the kept part starts from its offset)."""
    data = old.encode("utf-8") + added
    if len(data) <= cap:
        return data.decode("utf-8", "replace")
    return data[len(data) - cap :].decode("utf-8", "ignore")
