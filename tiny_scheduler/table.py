"""The job table: every job in memory behind one `threading.Lock`, with the indexes reads need.

Indexes, each kept in step by `put()` and `remove()`:
- all jobs by sequence number, sorted, so listings are oldest-first and `after=` is a seek;
- pending jobs per node, sorted, so the agent poll reads only its own node's queue (FIFO);
  a delayed job (`not_before` in the future) waits in a second per-node index instead, and a
  heap of due times promotes it into its node's queue once its time has come (`poll` does it
  first), so the poll never reads a job that is not due and never walks the delayed ones;
- running jobs per node, and the count of slot-taking (`run`) jobs among them, so the free-slot
  check is one dict lookup;
- finished job ids in the order they finished, so retention pops from the front;
- the dedupe key (Idempotency-Key / SQS message) of each job.

Changes are made in two steps by the service: `changing()` marks a job busy (a second change
to the same job waits), the store commits the new version, then `put()` swaps it in. So readers
only ever see committed state, and two agents can never both claim one job.

No disk or network I/O here, and no lock is held while a caller does any.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import threading
from collections.abc import Iterable, Iterator

from sortedcontainers import SortedDict

from . import errors, jobs
from .jobs import Job

_SCAN_CHUNK = 4096  # jobs examined per lock hold when a listing must scan history


class JobTable:
    """In-memory jobs and their indexes; safe to call from any thread."""

    def __init__(self, loaded: Iterable[Job] = (), last_seq: int = 0) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # a busy job or key was released
        self._jobs: SortedDict = SortedDict()
        self._pending: dict[str, SortedDict] = {}  # due pending jobs
        self._waiting: dict[str, SortedDict] = {}  # pending jobs before their not_before
        self._due_heap: list[tuple[int, int]] = []  # (not_before, seq) of waiting jobs
        self._promoted_until = 0  # every job with not_before at or before this is due
        self._running: dict[str, SortedDict] = {}
        self._slots_used: collections.Counter[str] = collections.Counter()
        self._finished: collections.deque[int] = collections.deque()
        self._keys: dict[str, int] = {}
        self._counts: collections.Counter[str] = collections.Counter()
        self._busy: set[int] = set()
        self._busy_keys: set[str] = set()
        finished = []
        self._jobs.update((job.seq, job) for job in loaded)  # one bulk sort, not n inserts
        for job in self._jobs.values():
            self._index(job, None)
            if job.is_final:
                finished.append(job)
        finished.sort(key=lambda job: job.finished_at or job.created_at)
        self._finished.extend(job.seq for job in finished)
        self._last_seq = max(last_seq, self._jobs.keys()[-1] if self._jobs else 0)

    # --- reads ------------------------------------------------------------------------------

    def get(self, seq: int) -> Job | None:
        with self._lock:
            return self._jobs.get(seq)

    def __len__(self) -> int:
        return len(self._jobs)

    def counts(self) -> dict[str, int]:
        """Number of jobs in each status."""
        with self._lock:
            return {status: self._counts[status] for status in jobs.STATUSES}

    def poll(self, node_id: str, max_running: int, now: int | None = None) -> list[Job]:
        """The node's oldest pending jobs that are due at `now` (default: the clock), at most
        as many as it has free slots."""
        now = jobs.now_us() if now is None else now
        with self._lock:
            self._promote(now)
            free = max_running - self._slots_used[node_id]
            if free <= 0:
                return []
            return list(itertools.islice(self._stream((self._pending,), node_id, 0, None), free))

    def promote_due(self, now: int) -> None:
        """Move the delayed jobs whose time has come into their nodes' queues."""
        with self._lock:
            self._promote(now)

    def query(
        self,
        node_id: str | None,
        status: str | None,
        job_type: str | None,
        after: int,
        limit: int,
    ) -> tuple[list[Job], bool]:
        """Jobs matching every given filter with seq > after, oldest first, and whether more
        match beyond `limit`."""
        wanted = limit + 1
        if status in (jobs.PENDING, jobs.RUNNING):
            found = self._query_active(node_id, status, job_type, after, wanted)
        else:
            found = self._scan(node_id, status, job_type, after, wanted)
        return found[:limit], len(found) > limit

    def _query_active(
        self, node_id: str | None, status: str, job_type: str | None, after: int, wanted: int
    ) -> list[Job]:
        # A listing shows every pending job, due or not: only the poll waits for not_before.
        indexes = (self._pending, self._waiting) if status == jobs.PENDING else (self._running,)
        with self._lock:
            return list(itertools.islice(self._stream(indexes, node_id, after, job_type), wanted))

    def _stream(
        self,
        indexes: tuple[dict[str, SortedDict], ...],
        node_id: str | None,
        after: int,
        job_type: str | None,
    ) -> Iterator[Job]:
        """Jobs of active indexes (one node's, or every node's merged), oldest first.
        Consume it while holding the lock."""
        if node_id is None:
            queues = [queue for index in indexes for queue in index.values()]
        else:
            queues = [index[node_id] for index in indexes if node_id in index]
        if not queues:
            return iter(())
        streams = [_values_after(queue, after) for queue in queues]
        found = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=_seq_of)
        if job_type is not None:
            found = (job for job in found if job.job_type == job_type)
        return found

    def _scan(
        self,
        node_id: str | None,
        status: str | None,
        job_type: str | None,
        after: int,
        wanted: int,
    ) -> list[Job]:
        """Walk history in chunks, letting go of the lock between chunks: a sparse filter
        over a million jobs must not stall the agents' polls."""
        found: list[Job] = []
        cursor = after
        while len(found) < wanted:
            with self._lock:
                chunk = list(
                    itertools.islice(
                        self._jobs.irange(minimum=cursor, inclusive=(False, True)), _SCAN_CHUNK
                    )
                )
                candidates = [self._jobs[seq] for seq in chunk]
            for job in candidates:
                if (
                    (node_id is None or job.node_id == node_id)
                    and (status is None or job.status == status)
                    and (job_type is None or job.job_type == job_type)
                ):
                    found.append(job)
                    if len(found) == wanted:
                        break
            if len(chunk) < _SCAN_CHUNK:
                break
            cursor = chunk[-1]
        return found

    def running(self) -> list[Job]:
        """Every running job (the timeout scan's input: O(running), not O(history))."""
        with self._lock:
            return [job for queue in self._running.values() for job in queue.values()]

    def busy_nodes(self) -> set[str]:
        """Nodes that have pending or running jobs."""
        with self._lock:
            return set(self._pending) | set(self._waiting) | set(self._running)

    def on_node(self, node_id: str) -> tuple[list[Job], list[Job]]:
        """The node's pending (due or delayed) and running jobs, oldest first."""
        with self._lock:
            pending = list(self._stream((self._pending, self._waiting), node_id, 0, None))
            running = list(self._running.get(node_id, {}).values())
        return pending, running

    def recent(self, since: int) -> list[Job]:
        """Pending and running jobs, and jobs that finished at or after `since`, oldest
        first. Reads the active indexes and the newest end of the finished order only."""
        with self._lock:
            found = [
                job
                for index in (self._pending, self._running)
                for queue in index.values()
                for job in queue.values()
            ]
            for seq in reversed(self._finished):
                job = self._jobs.get(seq)
                if job is None:
                    continue
                if (job.finished_at or job.created_at) < since:
                    break
                found.append(job)
        found.sort(key=_seq_of)
        return found

    def finished_before(self, cutoff: int, limit: int) -> list[int]:
        """Ids of up to `limit` jobs that finished before `cutoff`, oldest first."""
        found: list[int] = []
        with self._lock:
            for seq in self._finished:
                job = self._jobs.get(seq)
                if job is not None and (job.finished_at or job.created_at) >= cutoff:
                    break
                found.append(seq)
                if len(found) == limit:
                    break
        return found

    # --- writes -----------------------------------------------------------------------------

    def new_seq(self) -> int:
        """The next job number; numbers are never handed out twice."""
        with self._lock:
            self._last_seq += 1
            return self._last_seq

    @contextlib.contextmanager
    def changing(self, seq: int) -> Iterator[Job]:
        """Hold the job busy while its next version is computed and committed; another
        change to the same job waits until this one is done (and then sees its result)."""
        with self._lock:
            while seq in self._busy:
                self._idle.wait()
            job = self._jobs.get(seq)
            if job is None:
                raise errors.NotFound(errors.JOB_NOT_FOUND)
            self._busy.add(seq)
        try:
            yield job
        finally:
            with self._lock:
                self._busy.discard(seq)
                self._idle.notify_all()

    @contextlib.contextmanager
    def deduplicating(self, key: str | None) -> Iterator[Job | None]:
        """Yield the job already created under `key`, or None while holding `key` reserved
        so that a concurrent request with the same key waits for this one's outcome."""
        if key is None:
            yield None
            return
        with self._lock:
            while key in self._busy_keys:
                self._idle.wait()
            seq = self._keys.get(key)
            existing = self._jobs.get(seq) if seq is not None else None
            if existing is None:
                self._busy_keys.add(key)
        if existing is not None:
            yield existing
            return
        try:
            yield None
        finally:
            with self._lock:
                self._busy_keys.discard(key)
                self._idle.notify_all()

    def put(self, job: Job) -> None:
        """Insert a committed job, or swap in the committed next version of one."""
        with self._lock:
            old = self._jobs.get(job.seq)
            if old is not None:
                self._unindex(old)
            self._jobs[job.seq] = job
            self._index(job, old)

    def remove(self, seqs: Iterable[int]) -> None:
        """Forget committed deletions (retention). Ids stay used: `new_seq` never goes back."""
        gone = set()
        with self._lock:
            for seq in seqs:
                job = self._jobs.pop(seq, None)
                if job is not None:
                    self._unindex(job)
                    gone.add(seq)
            while self._finished and self._finished[0] in gone:
                self._finished.popleft()
            if any(seq in gone for seq in self._finished):
                self._finished = collections.deque(s for s in self._finished if s not in gone)

    # --- index upkeep (lock held) -------------------------------------------------------------

    def _index(self, job: Job, old: Job | None) -> None:
        self._counts[job.status] += 1
        if job.status == jobs.PENDING and not job.is_due(self._promoted_until):
            self._waiting.setdefault(job.node_id, SortedDict())[job.seq] = job
            heapq.heappush(self._due_heap, (job.not_before, job.seq))
        elif job.status == jobs.PENDING:
            self._pending.setdefault(job.node_id, SortedDict())[job.seq] = job
        elif job.status == jobs.RUNNING:
            self._running.setdefault(job.node_id, SortedDict())[job.seq] = job
            if job.takes_slot:
                self._slots_used[job.node_id] += 1
        elif old is not None and not old.is_final:
            self._finished.append(job.seq)
        if job.dedupe_key is not None:
            self._keys[job.dedupe_key] = job.seq

    def _unindex(self, job: Job) -> None:
        self._counts[job.status] -= 1
        if job.status == jobs.PENDING:
            queue = self._waiting.get(job.node_id)
            # The heap entry of a waiting job stays; _promote skips it once it is stale.
            _discard(
                self._waiting if queue and job.seq in queue else self._pending, job.node_id, job.seq
            )
        elif job.status == jobs.RUNNING:
            _discard(self._running, job.node_id, job.seq)
            if job.takes_slot:
                self._slots_used[job.node_id] -= 1
                if not self._slots_used[job.node_id]:
                    del self._slots_used[job.node_id]
        if job.dedupe_key is not None and self._keys.get(job.dedupe_key) == job.seq:
            del self._keys[job.dedupe_key]

    def _promote(self, now: int) -> None:
        """Move waiting jobs that are due at `now` into their nodes' queues: O(promoted),
        nothing at all when none is due."""
        if now <= self._promoted_until:
            return
        heap = self._due_heap
        while heap and heap[0][0] <= now:
            _, seq = heapq.heappop(heap)
            job = self._jobs.get(seq)
            queue = self._waiting.get(job.node_id) if job is not None else None
            if job is None or queue is None or seq not in queue:
                continue  # claimed, cancelled, moved or removed since it was pushed
            _discard(self._waiting, job.node_id, seq)
            self._pending.setdefault(job.node_id, SortedDict())[seq] = job
        self._promoted_until = now


def _values_after(queue: SortedDict, after: int) -> Iterator[Job]:
    if not after:
        return iter(queue.values())  # the agent's poll: no seek needed
    return (queue[seq] for seq in queue.irange(minimum=after, inclusive=(False, True)))


def _seq_of(job: Job) -> int:
    return job.seq


def _discard(index: dict[str, SortedDict], node_id: str, seq: int) -> None:
    queue = index[node_id]
    del queue[seq]
    if not queue:
        del index[node_id]  # nodes come and go: don't keep an empty queue for each forever
