"""The job table: every job in memory behind one `threading.Lock`, with the indexes reads need.
Jobs are kept without their output (`Job.without_output`): that stays in the store.

Indexes, each kept in step by `put()` and `remove()`:
- all jobs by sequence number, sorted, so listings are oldest-first and `after=` is a seek;
- pending jobs per node, sorted, so the agent poll reads only its own node's queue (FIFO);
  a job whose dependencies are not met (`depends_on`) waits in an index of its own, with a
  reverse index (dependency -> its waiting dependents) that promotes it when its last
  dependency ends, and that retention reads so as never to remove a job one still waits for;
  a delayed job (`not_before` in the future) waits in a second per-node index instead, and a
  heap of due times promotes it into its node's queue once its time has come (`poll` does it
  first), so the poll never reads a job that is not due and never walks the delayed ones;
- running jobs per node, and per node the count of slots in use (running `run` jobs, and
  timed-out ones that keep their slot), so the free-slot check is one dict lookup;
- due pending jobs per node once more, in the order they are handed out: by priority (higher
  first), then age (`_order`), so the poll reads exactly the jobs it hands out, whatever
  the mix of priorities; the seq-ordered indexes above stay for listings;
- per node the count of due pending `run` jobs, so a node's load is two dict lookups
  (placement reads them for every healthy node: O(nodes), never O(jobs)); the jobs of a queue
  that is paused or at its limit are taken off it (a few lookups per such queue);
- queues: each due job also sits in its queue's cluster-wide index in the poll's order, and
  the node's ready index is split by queue, so a paused queue or one at its limit
  (`queues.QueueSettings`) is skipped whole, and a limited queue with room hands out only its
  head (its first `room` jobs, wherever they are: the next free slot of the queue goes to the
  oldest highest-priority job); per queue the running `run` jobs, and the claims under way
  (`starting`), so a claim past the limit is refused even when two nodes claim at once;
- due pending jobs per node that an idle node may take over (`jobs.can_move`), in the poll's
  order (priority, then age), so the poll of an idle node reads only the heads of the other
  nodes' queues;
- timed-out jobs that still hold a slot, per node, for the dashboard and the lost-node scan;
- finished job ids in the order they finished, so retention pops from the front;
- the dedupe key (Idempotency-Key / SQS message) of each job.

Changes are made in two steps by the service: `changing()` marks a job busy (a second change
to the same job waits), the store commits the new version, then `put()` swaps it in. So readers
only ever see committed state, and two agents can never both claim one job.

New jobs become visible in id order: `creating()` hands out the next id and keeps it "in
flight" until the job is put (or its commit failed), and listings stop below the lowest id in
flight. Commits finish in any order; without this a reader could page past job-8 while job-7
was still being committed, and never see job-7.

No disk or network I/O here, and no lock is held while a caller does any.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import itertools
import operator
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from sortedcontainers import SortedDict

from .. import errors
from ..config import OFFER_HOLD_SECS
from ..domain import jobs, queues
from ..domain.jobs import Job
from ..domain.queues import QueueSettings
from ..server import inline

_SCAN_CHUNK = 4096  # jobs examined per lock hold when a listing must scan history
_OFFER_HOLD_US = int(OFFER_HOLD_SECS * 1_000_000)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeJobs:
    """One node's active jobs, each list oldest first."""

    pending: list[Job]
    running: list[Job]
    held: list[Job]  # timed out, but their process may still run there: they keep a slot


class JobTable:
    """In-memory jobs and their indexes; safe to call from any thread."""

    def __init__(
        self,
        loaded: Iterable[Job] = (),
        last_seq: int = 0,
        queues: Iterable[QueueSettings] = (),
    ) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # a busy job or key was released
        self._jobs: SortedDict = SortedDict()
        self._pending: dict[str, SortedDict] = {}  # due pending jobs, by seq (listings)
        # The same, by _order (the poll), per node and queue: node -> queue -> index.
        self._ready: dict[str, dict[str, SortedDict]] = {}
        self._queue_ready: dict[str, SortedDict] = {}  # queue -> its due jobs, by _order
        self._queue_settings: dict[str, QueueSettings] = {q.name: q for q in queues}
        self._queue_running: collections.Counter[str] = collections.Counter()  # `run` jobs
        self._queue_starting: collections.Counter[str] = collections.Counter()  # claims
        self._queue_counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._queued_runs: collections.Counter[tuple[str, str]] = collections.Counter()
        self._waiting: dict[str, SortedDict] = {}  # pending jobs before their not_before
        self._blocked: dict[str, SortedDict] = {}  # pending jobs whose dependencies are unmet
        self._dependents: dict[int, set[int]] = {}  # dependency -> blocked jobs naming it
        self._due_heap: list[tuple[int, int]] = []  # (not_before, seq) of waiting jobs
        self._promoted_until = 0  # every job with not_before at or before this is due
        self._running: dict[str, SortedDict] = {}
        self._slots_used: collections.Counter[str] = collections.Counter()
        self._pending_runs: collections.Counter[str] = collections.Counter()
        self._movable: dict[str, dict[str, SortedDict]] = {}  # node -> queue -> by _order
        self._held: dict[str, SortedDict] = {}
        self._finished: collections.deque[int] = collections.deque()
        self._keys: dict[str, int] = {}
        self._counts: collections.Counter[str] = collections.Counter()
        self._busy: set[int] = set()
        # The agent polls' answers of the last few seconds: seq -> (node, when), and the same
        # in the order they were made, so that forgetting old ones pops from the front.
        self._offers: dict[int, tuple[str, int]] = {}
        self._offer_log: collections.deque[tuple[int, int]] = collections.deque()
        self._busy_keys: set[str] = set()
        self._in_flight: set[int] = set()  # ids handed out whose job is not committed yet
        self._load(loaded)
        self._last_seq = max(last_seq, self._jobs.keys()[-1] if self._jobs else 0)

    def _load(self, loaded: Iterable[Job]) -> None:
        """Index the stored jobs (start-up) as `put` would one by one, but in bulk: at a
        million jobs every Python call per job costs a tenth of a second, and nearly all of
        them are finished jobs that need no more than counting and their place in the
        finished order."""
        # Loaded jobs come without output already (the store does not read it).
        loaded = list(loaded)
        seqs = list(map(_seq_of, loaded))
        self._jobs.update(zip(seqs, loaded, strict=True))  # one bulk sort, not n inserts
        # The store hands them over in id order, each once: then they are the table's order.
        in_order = all(map(operator.lt, seqs, itertools.islice(seqs, 1, None)))
        ordered = loaded if in_order else [self._jobs[seq] for seq in self._jobs]
        for (queue, status), count in collections.Counter(map(_QUEUE_STATUS, ordered)).items():
            self._queue_counts[(queue, status)] += count
            self._counts[status] += count
        final = jobs.FINAL_STATUSES
        # In id order: a blocked job's dependencies are looked up, and each index is by id.
        for job in [
            job
            for job in ordered
            if job.status not in final or job.holds_slot or job.dedupe_key is not None
        ]:
            self._place(job, None)
        finished = [job for job in ordered if job.status in final]
        # One key for all: a C attribute getter when every job has its end time (a Python
        # call per job otherwise), the same order either way.
        ended = all(map(_FINISHED_AT, finished))
        finished.sort(key=_FINISHED_AT if ended else _finished_or_created)
        self._finished.extend(map(_seq_of, finished))

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

    def poll(self, node_id: str, max_running: int, now: int, remember: bool = False) -> list[Job]:
        """The node's pending jobs that are due at `now` (the caller's clock), highest
        priority first and oldest first within a priority, at most as many as it has free
        slots.

        With `remember` (the agent's poll, while jobs may move), the answer is remembered as
        offered to the node at `now` (see `movable`), in the same lock hold, and a job some
        change holds busy right now is left out: it may be on its way to another node.
        """
        with self._lock:
            self._promote(now)
            free = max_running - self._slots_used[node_id]
            if free <= 0:
                return []
            found = self._handed_out(node_id, self._ready.get(node_id), lambda job: True)
            if not remember:
                return list(itertools.islice(found, free))
            answer = list(itertools.islice((j for j in found if j.seq not in self._busy), free))
            self._remember_offers(node_id, answer, now)
            return answer

    def promote_due(self, now: int) -> None:
        """Move the delayed jobs whose time has come into their nodes' queues."""
        with self._lock:
            self._promote(now)

    def offered(self, node_id: str, jobs_offered: Iterable[Job], now: int) -> None:
        """Remember that these jobs were handed to `node_id`'s agent at `now`."""
        with self._lock:
            self._remember_offers(node_id, jobs_offered, now)

    def just_offered(self, job: Job, now: int) -> bool:
        """Whether the job appeared in its own node's poll answer in the OFFER_HOLD_SECS
        before `now`."""
        with self._lock:
            return self._offered_since(job, now - _OFFER_HOLD_US)

    def query(
        self,
        node_id: str | None,
        status: str | None,
        job_type: str | None,
        after: int,
        limit: int,
        reason: str | None = None,
        queue: str | None = None,
    ) -> tuple[list[Job], bool]:
        """Jobs matching every given filter with seq > after, oldest first, and whether more
        match beyond `limit`."""
        wanted = limit + 1
        if reason is not None and status in (jobs.PENDING, jobs.RUNNING):
            return [], False  # only a final failure has a reason
        with self._lock:
            # Every id below the lowest one in flight is settled (committed, or never will be),
            # so what a listing shows below it can no longer gain an earlier job.
            horizon = min(self._in_flight, default=None)
        if status in (jobs.PENDING, jobs.RUNNING):
            found = self._query_active(node_id, status, job_type, after, wanted, queue)
        else:
            found = self._scan(node_id, status, job_type, reason, after, wanted, horizon, queue)
        if horizon is not None:
            found = list(itertools.takewhile(lambda job: job.seq < horizon, found))
        return found[:limit], len(found) > limit

    def _query_active(
        self,
        node_id: str | None,
        status: str,
        job_type: str | None,
        after: int,
        wanted: int,
        queue: str | None,
    ) -> list[Job]:
        # A listing shows every pending job, due or not: only the poll waits for not_before.
        indexes = (
            (self._pending, self._waiting, self._blocked)
            if status == jobs.PENDING
            else (self._running,)
        )
        with self._lock:
            found = self._stream(indexes, node_id, after, job_type)
            if queue is not None:
                found = (job for job in found if job.queue == queue)
            return list(itertools.islice(found, wanted))

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
        reason: str | None,
        after: int,
        wanted: int,
        before: int | None,
        queue: str | None = None,
    ) -> list[Job]:
        """Walk history in chunks (ids above `after` and below `before`), letting go of the
        lock between chunks: a sparse filter over a million jobs must not stall the agents'
        polls."""
        found: list[Job] = []
        cursor = after
        while len(found) < wanted:
            with self._lock:
                chunk = list(
                    itertools.islice(
                        self._jobs.irange(cursor, before, inclusive=(False, False)), _SCAN_CHUNK
                    )
                )
                candidates = [self._jobs[seq] for seq in chunk]
            for job in candidates:
                if (
                    (node_id is None or job.node_id == node_id)
                    and (status is None or job.status == status)
                    and (job_type is None or job.job_type == job_type)
                    and (reason is None or job.reason == reason)
                    and (queue is None or job.queue == queue)
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

    def running_on(self, node_id: str) -> list[Job]:
        """The node's running jobs, oldest first (O(its running jobs): the poll asks)."""
        with self._lock:
            queue = self._running.get(node_id)
            return list(queue.values()) if queue else []

    def node_counts(self, node_id: str) -> tuple[int, int]:
        """(pending jobs, running jobs) of the node: three lookups."""
        with self._lock:
            pending = sum(
                len(index.get(node_id, ()))
                for index in (self._pending, self._waiting, self._blocked)
            )
            return pending, len(self._running.get(node_id, ()))

    def busy_nodes(self) -> set[str]:
        """Nodes that have pending or running jobs, or a timed-out job holding a slot."""
        with self._lock:
            return (
                set(self._pending)
                | set(self._waiting)
                | set(self._blocked)
                | set(self._running)
                | set(self._held)
            )

    def on_node(self, node_id: str) -> NodeJobs:
        """The node's pending (due or delayed), running and slot-holding timed-out jobs,
        oldest first."""
        with self._lock:
            return NodeJobs(
                pending=list(
                    self._stream((self._pending, self._waiting, self._blocked), node_id, 0, None)
                ),
                running=list(self._running.get(node_id, {}).values()),
                held=list(self._held.get(node_id, {}).values()),
            )

    def node_loads(self, node_ids: Sequence[str], now: int) -> dict[str, tuple[int, int]]:
        """For each node: (pending `run` jobs due at `now`, slots in use). Two lookups a
        node (after promoting what has come due)."""
        with self._lock:
            self._promote(now)
            # .get: a Counter's lookup of a missing node is a Python call (__missing__).
            pending, used = self._pending_runs, self._slots_used
            loads = {node: (pending.get(node, 0), used.get(node, 0)) for node in node_ids}
            # The jobs of a queue that hands nothing out now would wait whatever the node.
            held = [name for name in self._queue_settings if self._room(name) == 0]
            if held:
                runs = self._queued_runs
                loads = {
                    node: (queued - sum(runs.get((node, name), 0) for name in held), used)
                    for node, (queued, used) in loads.items()
                }
            return loads

    def queue_depths(self) -> dict[str, int]:
        """Due pending jobs of every node that has any."""
        with self._lock:
            return {node: len(queue) for node, queue in self._pending.items()}

    def movable_nodes(self) -> list[str]:
        """Nodes that have waiting jobs an idle node could take over."""
        with self._lock:
            return list(self._movable)

    def movable(self, node_ids: Iterable[str], now: int, limit: int) -> list[Job]:
        """The first jobs due at `now` (by priority, then age) over the given nodes' queues
        that an idle node could take over, at most `limit`: never one offered to its own node
        in the OFFER_HOLD_SECS before `now` (its agent may be about to claim it), nor one a
        change holds busy. Reads only the heads of those queues: offered and busy jobs are
        few, and at the front."""
        found: list[Job] = []
        offered_since = now - _OFFER_HOLD_US
        with self._lock:
            self._promote(now)
            streams = [
                self._handed_out(node, self._movable[node], jobs.can_move)
                for node in node_ids
                if node in self._movable
            ]
            for job in heapq.merge(*streams, key=_order):
                if len(found) == limit:
                    break
                if job.seq not in self._busy and not self._offered_since(job, offered_since):
                    found.append(job)
        return found

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
        """Ids of up to `limit` jobs that finished before `cutoff`, oldest first; never one
        that a pending job still waits for (its outcome decides whether that one runs)."""
        found: list[int] = []
        with self._lock:
            for seq in self._finished:
                job = self._jobs.get(seq)
                if job is not None and (job.finished_at or job.created_at) >= cutoff:
                    break
                if seq in self._dependents:
                    continue
                found.append(seq)
                if len(found) == limit:
                    break
        return found

    # --- queues -----------------------------------------------------------------------------

    def queue_settings(self) -> dict[str, QueueSettings]:
        """Every queue's stored settings, by name."""
        with self._lock:
            return dict(self._queue_settings)

    def set_queue(self, settings: QueueSettings) -> None:
        """Apply a queue's committed settings (the next poll goes by them)."""
        with self._lock:
            self._queue_settings[settings.name] = settings

    def queue_counts(self) -> dict[str, tuple[int, int]]:
        """(pending, running) jobs of every queue that has jobs of any status, by name."""
        with self._lock:
            counts = dict(self._queue_counts)
        found: dict[str, tuple[int, int]] = {}
        for (name, status), count in counts.items():
            if count:
                pending, running = found.get(name, (0, 0))
                if status == jobs.PENDING:
                    pending += count
                elif status == jobs.RUNNING:
                    running += count
                found[name] = (pending, running)
        return found

    def queue_state(self, name: str) -> tuple[QueueSettings | None, int]:
        """A queue's settings (None when never set) and its running `run` jobs."""
        with self._lock:
            return self._queue_settings.get(name), self._queue_running[name]

    @contextlib.contextmanager
    def starting(self, job: Job) -> Iterator[None]:
        """Around a claim's commit (the job held busy): refuse it (Conflict, naming the
        queue) when its queue is paused or already runs its limit, counting the claims under
        way, so that two nodes claiming at once can never both pass the last free place; and
        refuse a job whose dependencies have not ended."""
        reserved = False
        with self._lock:
            blocked = self._blocked.get(job.node_id)
            if blocked is not None and job.seq in blocked:
                # Never handed out, but a PATCH can name any job: it must not jump its wait.
                raise errors.Conflict(
                    f"job {job.job_id} cannot start: its dependencies have not ended"
                )
            settings = self._queue_settings.get(job.queue)
            if settings is not None and settings.holds_back:
                taken = self._queue_running[job.queue] + self._queue_starting[job.queue]
                room = queues.room(settings, taken)
                if settings.paused or (job.takes_slot and room == 0):
                    why = queues.refusal(settings, self._queue_running[job.queue])
                    raise errors.Conflict(f"job {job.job_id} cannot start: {why}")
                if job.takes_slot:
                    self._queue_starting[job.queue] += 1
                    reserved = True
        try:
            yield
        finally:
            if reserved:
                with self._lock:
                    _decrement(self._queue_starting, job.queue)

    def dependents(self, seq: int) -> list[Job]:
        """The pending jobs that wait for job `seq` among their unmet dependencies, by id."""
        with self._lock:
            return [self._jobs[dependent] for dependent in sorted(self._dependents.get(seq, ()))]

    # --- writes -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def creating(self) -> Iterator[int]:
        """The next job number (never handed out twice), in flight until the block ends: put
        the committed job inside it. While it is in flight, listings show no job above it."""
        with self._lock:
            self._last_seq += 1
            seq = self._last_seq
            self._in_flight.add(seq)
        try:
            yield seq
        finally:
            with self._lock:
                self._in_flight.discard(seq)

    @contextlib.contextmanager
    def changing(self, seq: int) -> Iterator[Job]:
        """Hold the job busy while its next version is computed and committed; another
        change to the same job waits until this one is done (and then sees its result)."""
        inline.may_wait()  # a change waits for others, and then commits
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
        """Insert a committed job, or swap in the committed next version of one. Kept without
        its output, which can be megabytes: the store has it."""
        job = job.without_output()
        with self._lock:
            old = self._jobs.get(job.seq)
            if old is not None:
                self._unindex(old)
            self._jobs[job.seq] = job
            self._index(job, old)

    def remove(self, seqs: Iterable[int]) -> None:
        """Forget committed deletions (retention). Ids stay used: `creating` never goes back."""
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

    # --- offers (lock held) ----------------------------------------------------------------

    def _remember_offers(self, node_id: str, answer: Iterable[Job], now: int) -> None:
        self._forget_offers(now - _OFFER_HOLD_US)
        for job in answer:
            self._offers[job.seq] = (node_id, now)
            self._offer_log.append((now, job.seq))

    def _offered_since(self, job: Job, since: int) -> bool:
        offer = self._offers.get(job.seq)
        # An offer to another node (before a move or a retry) does not protect it here.
        return offer is not None and offer[0] == job.node_id and offer[1] > since

    def _forget_offers(self, since: int) -> None:
        """Drop offers made at or before `since`: the memory holds only the last seconds'."""
        log = self._offer_log
        while log and log[0][0] <= since:
            at, seq = log.popleft()
            offer = self._offers.get(seq)
            if offer is not None and offer[1] == at:
                del self._offers[seq]

    # --- index upkeep (lock held) -------------------------------------------------------------

    def _index(self, job: Job, old: Job | None) -> None:
        self._counts[job.status] += 1
        self._queue_counts[(job.queue, job.status)] += 1
        self._place(job, old)

    def _place(self, job: Job, old: Job | None) -> None:
        """Every index of `_index` but the status counts."""
        node = job.node_id
        if job.status == jobs.RUNNING and job.takes_slot:
            self._queue_running[job.queue] += 1
        if job.status == jobs.PENDING and job.depends_on and not self._dependencies_met(job):
            _queue(self._blocked, node)[job.seq] = job
            for dependency in job.depends_on:
                self._dependents.setdefault(dependency, set()).add(job.seq)
        elif job.status == jobs.PENDING and not job.is_due(self._promoted_until):
            _queue(self._waiting, node)[job.seq] = job
            heapq.heappush(self._due_heap, (job.not_before, job.seq))
        elif job.status == jobs.PENDING:
            self._add_due(job)
        elif job.status == jobs.RUNNING:
            _queue(self._running, node)[job.seq] = job
        elif old is not None and not old.is_final:
            self._finished.append(job.seq)
            self._release_dependents(job.seq)
        if job.holds_slot:
            _queue(self._held, node)[job.seq] = job
        if job.uses_slot:
            self._slots_used[node] += 1
        if job.dedupe_key is not None:
            self._keys[job.dedupe_key] = job.seq

    def _unindex(self, job: Job) -> None:
        node = job.node_id
        self._counts[job.status] -= 1
        _decrement(self._queue_counts, (job.queue, job.status))
        if job.status == jobs.RUNNING and job.takes_slot:
            _decrement(self._queue_running, job.queue)
        if job.status == jobs.PENDING:
            queue = self._waiting.get(node)
            blocked = self._blocked.get(node)
            if blocked and job.seq in blocked:
                _discard(self._blocked, node, job.seq)
                for dependency in job.depends_on:
                    waiting = self._dependents.get(dependency)
                    if waiting is not None:
                        waiting.discard(job.seq)
                        if not waiting:
                            del self._dependents[dependency]
            elif queue and job.seq in queue:
                # The heap entry of a waiting job stays; _promote skips it once it is stale.
                _discard(self._waiting, node, job.seq)
            else:
                self._remove_due(job)
        elif job.status == jobs.RUNNING:
            _discard(self._running, node, job.seq)
        if job.holds_slot:
            _discard(self._held, node, job.seq)
        if job.uses_slot:
            _decrement(self._slots_used, node)
        if job.dedupe_key is not None and self._keys.get(job.dedupe_key) == job.seq:
            del self._keys[job.dedupe_key]

    def _room(self, name: str) -> int | None:
        """How many more of the queue's jobs may start now; None: no limit."""
        settings = self._queue_settings.get(name)
        if settings is None:
            return None
        return queues.room(settings, self._queue_running[name] + self._queue_starting[name])

    def _handed_out(
        self,
        node_id: str,
        by_queue: dict[str, SortedDict] | None,
        eligible: Callable[[Job], bool],
    ) -> Iterator[Job]:
        """A node's due jobs in the order they are handed out (priority, then age), over its
        queues (`by_queue`: queue -> index): every job of a queue nothing holds back; of a
        limited queue with room only those of its head (its first `room` jobs cluster-wide)
        that are on this node and `eligible`; of a paused or full queue none. Reads only what
        it yields, plus a limited queue's head."""
        if not by_queue:
            return iter(())
        streams: list[Iterator[Job]] = []
        for name, index in by_queue.items():
            room = self._room(name)
            if room is None:
                streams.append(iter(index.values()))
            elif room > 0:
                head = itertools.islice(self._queue_ready[name].values(), room)
                streams.append(job for job in head if job.node_id == node_id and eligible(job))
        if len(streams) == 1:
            return streams[0]
        return heapq.merge(*streams, key=_order)

    def _dependencies_met(self, job: Job) -> bool:
        """Whether every job it depends on ended as its `dependency` asks: all `done` (`ok`)
        or all final (`any`). A dependency no longer in the table counts as met: only final
        jobs are removed, and never one a blocked job waits for (`finished_before`)."""
        need_done = job.dependency == jobs.Dependency.OK
        for seq in job.depends_on:
            dependency = self._jobs.get(seq)
            if dependency is None:
                continue
            if dependency.status != jobs.DONE if need_done else not dependency.is_final:
                return False
        return True

    def _release_dependents(self, seq: int) -> None:
        """Job `seq` just ended: its dependents whose dependencies are now all met become
        pending jobs like any other (due, or delayed until their not_before). An `ok`
        dependent of a failure stays: the service fails it in the same commit."""
        for dependent_seq in sorted(self._dependents.get(seq, ())):
            dependent = self._jobs[dependent_seq]
            if self._dependencies_met(dependent):
                self._unindex(dependent)
                self._index(dependent, dependent)

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
            self._add_due(job)
        self._promoted_until = now

    def _add_due(self, job: Job) -> None:
        """A pending job that is due: in its node's queue, its load, and movable if it may."""
        node = job.node_id
        _queue(self._pending, node)[job.seq] = job
        order = _order(job)
        _queue(_queues_of(self._ready, node), job.queue)[order] = job
        _queue(self._queue_ready, job.queue)[order] = job
        if job.takes_slot:
            self._pending_runs[node] += 1
            self._queued_runs[(node, job.queue)] += 1
        if jobs.can_move(job):
            _queue(_queues_of(self._movable, node), job.queue)[order] = job

    def _remove_due(self, job: Job) -> None:
        node = job.node_id
        _discard(self._pending, node, job.seq)
        order = _order(job)
        _discard_nested(self._ready, node, job.queue, order)
        _discard(self._queue_ready, job.queue, order)
        if job.takes_slot:
            _decrement(self._pending_runs, node)
            _decrement(self._queued_runs, (node, job.queue))
        if jobs.can_move(job):
            _discard_nested(self._movable, node, job.queue, order)


def _values_after(queue: SortedDict, after: int) -> Iterator[Job]:
    if not after:
        return iter(queue.values())  # the agent's poll: no seek needed
    return (queue[seq] for seq in queue.irange(minimum=after, inclusive=(False, True)))


_seq_of: Callable[[Job], int] = operator.attrgetter("seq")
_QUEUE_STATUS = operator.attrgetter("queue", "status")
_FINISHED_AT = operator.attrgetter("finished_at")


def _finished_or_created(job: Job) -> int:
    """When a finished job ended: the order of `_finished` (older files may lack the time)."""
    return job.finished_at or job.created_at


def _order(job: Job) -> tuple[int, int]:
    """The order due jobs are handed out in: higher priority first, then oldest first."""
    return (-job.priority, job.seq)


def _decrement(counter: collections.Counter[Any], node_id: Any) -> None:
    counter[node_id] -= 1
    if not counter[node_id]:
        del counter[node_id]  # nodes come and go: don't keep a zero for each forever


def _queue(index: dict[str, SortedDict], node_id: str) -> SortedDict:
    """The node's queue in this index, made when it has none (not made on every call, as
    `setdefault`'s argument would be: a SortedDict costs microseconds to build)."""
    queue = index.get(node_id)
    if queue is None:
        queue = index[node_id] = SortedDict()
    return queue


def _queues_of(index: dict[str, dict[str, SortedDict]], node_id: str) -> dict[str, SortedDict]:
    """The node's per-queue indexes in a nested index, made when it has none."""
    found = index.get(node_id)
    if found is None:
        found = index[node_id] = {}
    return found


def _discard_nested(
    index: dict[str, dict[str, SortedDict]], node_id: str, queue: str, key: object
) -> None:
    by_queue = index[node_id]
    _discard(by_queue, queue, key)
    if not by_queue:
        del index[node_id]


def _discard(index: dict[str, SortedDict], node_id: str, key: object) -> None:
    queue = index[node_id]
    del queue[key]
    if not queue:
        del index[node_id]  # nodes come and go: don't keep an empty queue for each forever
