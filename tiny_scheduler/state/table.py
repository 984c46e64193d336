"""The job table: every job in memory behind one `threading.Lock`, and the structures that
index them for the hot paths. Jobs are kept without their output (`Job.without_output`):
that stays in the store.

The table itself keeps the jobs by sequence number (listings are oldest-first and `after=`
is a seek), the finished ones in the order they finished (retention pops from the front),
the dedupe keys (Idempotency-Key / SQS message), the count per status (and of the final
failures per reason), and which jobs a change holds busy. Everything else is a structure of
its own, kept in step by `put()` and `remove()` under the one lock (each says what it owns,
each has its own tests):

- `NodeQueues`: per node the due jobs in the order they are handed out, the running jobs,
  the slots in use and the load, and the jobs an idle node may take over;
- `DelayedJobs`: pending jobs before their `not_before`, promoted into their node's queue once
  due (`poll` does it first), so the poll never reads a job that is not due;
- `DependencyWaits`: pending jobs whose dependencies have not ended, released when their last
  one ends (and kept from retention while awaited);
- `HeldJobs`: pending jobs a person holds: in no queue until released (not handed out, not
  moved, not counted as load), still listed among the pending;
- `QueueLimits`: each queue's settings and counts; a paused queue or one at its limit hands
  nothing out, and a claim past the limit is refused even when two nodes claim at once;
- `UserLimits`: the same per user (a job's owner), with the limit an admin gave it;
- `UserUsage`: each user's fair-share usage (decayed CPU time), by which due jobs of equal
  priority are handed out (`fair_share.order_key`);
- `Offers`: what the agent polls offered in the last seconds (moving work leaves those);
- `ArrayCounts`: how each array's jobs stand, by state (the dashboard's array rows).

A new concern (resources, fair share) is a new structure beside these, not new fields here.

Changes are made in two steps by the service: `changing()` marks a job busy (a second change
to the same job waits), the store commits the new version, then `put()` swaps it in. So readers
only ever see committed state, and two agents can never both claim one job.

New jobs become visible in id order: `creating()` hands out the next id (or the next N, one
after the other, for an array) and keeps it "in flight" until the job is put (or its commit
failed), and listings stop below the lowest id in flight. So an array's jobs have consecutive
ids and no other job's id falls among them: a listing by `array_id` seeks to its first id and
stops at the first job past it that is not one of them. Commits finish in any order; without
this a reader could page past job-8 while job-7 was still being committed, and never see job-7.

No disk or network I/O here, and no lock is held while a caller does any. Nothing here
waits but for another change of the same job: the service decides where that may happen.

Tests: `tests/test_table.py`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import itertools
import operator
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from sortedcontainers import SortedDict

from .. import errors
from ..config import DEFAULT_FAIRSHARE_HALF_LIFE_SECS, OFFER_HOLD_SECS
from ..domain import fair_share, jobs
from ..domain.fit import NOTHING, Capacity, Ending, HeldBack, Picker, Resources, need_of
from ..domain.jobs import Job
from ..domain.queues import QueueSettings
from ..domain.users import UserSettings
from .array_counts import ArrayCounts
from .delayed_jobs import DelayedJobs
from .dependency_waits import DependencyWaits, dependencies_met
from .finished_jobs import FinishedJobs
from .held_jobs import HeldJobs
from .job_map import JobMap
from .node_queues import Key, NodeQueues
from .offers import Offers
from .queue_limits import QueueLimits
from .user_limits import UserLimits
from .user_usage import UserUsage

_SCAN_CHUNK = 4096  # jobs examined per lock hold when a listing must scan history


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
        users: Iterable[UserSettings] = (),
        half_life_secs: float = DEFAULT_FAIRSHARE_HALF_LIFE_SECS,
    ) -> None:
        """`users`: the users' stored limits; `half_life_secs`: FAIRSHARE_HALF_LIFE_SECS."""
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # a busy job or key was released
        self._jobs = JobMap()
        self._nodes = NodeQueues()
        self._delayed = DelayedJobs()
        self._waits = DependencyWaits()
        self._on_hold = HeldJobs()
        self._arrays = ArrayCounts()
        self._limits = QueueLimits(queues)
        self._user_limits = UserLimits(users)
        self._usage = UserUsage(half_life_secs)
        self._offers = Offers(int(OFFER_HOLD_SECS * 1_000_000))
        self._finished = FinishedJobs()
        self._keys: dict[str, int] = {}
        self._counts: collections.Counter[str] = collections.Counter()
        self._reasons: collections.Counter[str] = collections.Counter()  # final failures
        self._busy: set[int] = set()
        self._busy_keys: set[str] = set()
        self._in_flight: set[int] = set()  # ids handed out whose job is not committed yet
        # Nodes of dependents that an ended job made due, until `take_released_nodes`: a
        # waiting heartbeat of theirs has work now, though nothing changed in the jobs.
        self._released_nodes: set[str] = set()
        self._load(loaded)
        self._last_seq = max(last_seq, self._jobs.keys()[-1] if self._jobs else 0)

    def _load(self, loaded: Iterable[Job]) -> None:
        """Index the stored jobs (start-up) as `put` would one by one, but in bulk: at a
        million jobs every Python call per job costs a tenth of a second, and nearly all of
        them are finished jobs that need no more than counting and their place in the
        finished order."""
        loaded = list(loaded)  # without output already: the store does not read it
        seqs = list(map(_seq_of, loaded))
        self._jobs.update(zip(seqs, loaded, strict=True))  # one bulk sort, not n inserts
        # The store hands them over in id order, each once: then they are the table's order.
        in_order = all(map(operator.lt, seqs, itertools.islice(seqs, 1, None)))
        ordered = loaded if in_order else [self._jobs[seq] for seq in self._jobs]
        final = jobs.FINAL_STATUSES
        # In id order: a waiting job's dependencies are looked up, and each index is by id.
        placed = [
            job
            for job in ordered
            if job.status not in final or job.holds_slot or job.dedupe_key is not None
        ]
        for job in placed:
            self._index(job, None)
        placed_seqs = set(map(_seq_of, placed))
        counted = collections.Counter(
            _QUEUE_STATUS(job) for job in ordered if job.seq not in placed_seqs
        )
        self._limits.add_counts(counted.items())
        for (_, status), count in counted.items():
            self._counts[status] += count
        self._reasons.update(
            str(job.reason)
            for job in ordered
            if job.reason is not None and job.seq not in placed_seqs
        )
        self._arrays.load(job for job in ordered if job.array_id and job.seq not in placed_seqs)
        self._finished.load(job for job in ordered if job.status in final)
        # What the stored jobs used still counts for fair share, decayed (those with an ended
        # attempt: finished ones, and retried ones).
        self._usage.load(job for job in ordered if job.status in final or job.attempts)

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

    def array_counts(self, array_id: int) -> dict[str, int]:
        """How many of the array's jobs are in each state people read (`jobs.STATES`)."""
        with self._lock:
            return self._arrays.of(array_id)

    def reason_counts(self) -> dict[str, int]:
        """Number of jobs failed for good by each reason (every reason, 0 when none)."""
        with self._lock:
            return {reason: self._reasons[reason] for reason in jobs.REASONS}

    def poll(
        self,
        capacity: Capacity,
        now: int,
        deadline: Callable[[Job, int], int | None],
        remember: bool = False,
    ) -> tuple[list[Job], Picker]:
        """The node's pending jobs that are due at `now` and start there now, in its order
        (highest priority first, oldest first within a priority): those that fit in what it
        has free, and past the first that does not (the head) only those backfill allows
        (`fit.Picker`); at most as many as it has free CPUs. Also the picker, which goes on
        over jobs moved from other nodes (`movable`). `deadline(job, now)`: when a job started
        at `now` would end by its timeout.

        With `remember` (the agent's poll, while jobs may move), the answer is remembered as
        offered to the node at `now` (see `movable`), in the same lock hold, and a job some
        change holds busy right now is left out: it may be on its way to another node.
        """
        node_id = capacity.node_id
        with self._lock:
            picker = self._picker(capacity, now, deadline)
            if picker.exhausted:
                return [], picker
            found = self._handed_out(node_id, now, skip_busy=remember)
            answer = picker.take(found, limit=picker.free.cpus)
            if remember:
                self._offers.remember(node_id, answer, now)
            return answer, picker

    def held_back(
        self, capacity: Capacity, now: int, deadline: Callable[[Job, int], int | None]
    ) -> HeldBack:
        """What backfill keeps waiting on the node at `now` (`fit.Picker.explain`): the same
        candidates, order and cap as `poll`, nothing remembered or handed out."""
        with self._lock:
            picker = self._picker(capacity, now, deadline)
            found = self._handed_out(capacity.node_id, now)
            return picker.explain(found, limit=picker.free.cpus)

    def _picker(
        self, capacity: Capacity, now: int, deadline: Callable[[Job, int], int | None]
    ) -> Picker:
        """(Lock held.) The node's picker at `now`, over what it has free then (the jobs that
        came due by `now` promoted first, so they are in its order)."""
        node_id = capacity.node_id
        self._promote(now)
        free = capacity.total - self._nodes.allocated.get(node_id, NOTHING)
        return Picker(capacity, free, lambda: self._endings(node_id, now, deadline), now, deadline)

    def _handed_out(self, node_id: str, now: int, skip_busy: bool = False) -> Iterator[Job]:
        """(Lock held.) The node's due jobs in the order they are handed out at `now`, within
        the queues' and users' limits; with `skip_busy`, none a change holds busy (left out
        before the users' limits count them)."""
        found = self._nodes.handed_out(
            node_id, self._limits.room, self._user_limits.room, self._key(now)
        )
        if skip_busy:
            found = (job for job in found if job.seq not in self._busy)
        return self._within_user_limits(found)

    def _key(self, now: int) -> Key:
        """(Lock held.) The order due jobs are handed out in at `now`: priority, then the
        owner's fair-share usage (read once per owner), then age."""
        usage = self._usage
        seen: dict[str, float] = {}

        def look(owner: str) -> float:
            found = seen.get(owner)
            if found is None:
                found = seen[owner] = usage.usage(owner, now)
            return found

        return fair_share.order_key(look)

    def ordering(self, now: int) -> Key:
        """The key due jobs are handed out by at `now` (to sort jobs gathered elsewhere)."""
        with self._lock:
            return self._key(now)

    def _within_user_limits(self, found: Iterable[Job]) -> Iterator[Job]:
        """(Lock held.) `found` without the jobs of a user beyond its room: one answer never
        hands a limited user more jobs than it may start (a claim past it is refused too)."""
        limits = self._user_limits
        if not limits.limited():
            yield from found
            return
        given: collections.Counter[str] = collections.Counter()
        for job in found:
            room = limits.room(job.owner)
            if room is not None and job.takes_slot:
                if given[job.owner] >= room:
                    continue
                given[job.owner] += 1
            yield job

    def _endings(
        self, node_id: str, now: int, deadline: Callable[[Job, int], int | None]
    ) -> list[Ending]:
        """(Lock held.) When the node's running jobs are expected to end (by their timeouts,
        from when they started) and what each frees: a timed-out one whose process still
        runs is being stopped now."""
        running = self._nodes.running.get(node_id, {}).values()
        held = self._nodes.held.get(node_id, {}).values()
        return [Ending(deadline(job, job.running_at or now), need_of(job)) for job in running] + [
            Ending(now, need_of(job)) for job in held
        ]

    def offered(self, node_id: str, jobs_offered: Iterable[Job], now: int) -> None:
        """Remember that these jobs were handed to `node_id`'s agent at `now`."""
        with self._lock:
            self._offers.remember(node_id, jobs_offered, now)

    def just_offered(self, job: Job, now: int) -> bool:
        """Whether the job appeared in its own node's poll answer in the OFFER_HOLD_SECS
        before `now`."""
        with self._lock:
            return self._offers.held(job, now)

    def query(
        self,
        node_id: str | None,
        status: str | None,
        job_type: str | None,
        after: int,
        limit: int,
        reason: str | None = None,
        queue: str | None = None,
        *,
        exact: Mapping[str, object] | None = None,
        array_id: int | None = None,
        also: Callable[[Job], bool] | None = None,
        newest: bool = False,
        before: int | None = None,
        finished: tuple[int | None, int | None] = (None, None),
    ) -> tuple[list[Job], bool]:
        """Jobs matching every given filter with after < seq (< before), oldest first (newest
        first with `newest`), and whether more match beyond `limit`.

        `exact`: job fields and the value each must have (`name`, `owner`); `array_id`: the
        jobs of the array whose first job has that seq (a seek: its ids are consecutive);
        `also`: one more test, called in the listing's order (the dashboard's search);
        `finished`: (since, until), the jobs that finished at or after `since` and before
        `until` (history), either None for no bound."""
        wanted = limit + 1
        since, finished_until = finished
        history = since is not None or finished_until is not None
        if (reason is not None or history) and status in (jobs.PENDING, jobs.RUNNING):
            return [], False  # only a final failure has a reason, only a final job an end
        if history:
            also = _and(also, lambda job: _finished_within(job, since, finished_until))
        with self._lock:
            # Every id below the lowest one in flight is settled (committed, or never will be),
            # so what a listing shows below it can no longer gain an earlier job.
            horizon = min(self._in_flight, default=None)
        if horizon is not None and newest:
            before = horizon if before is None else min(before, horizon)
        if array_id is not None:
            after = max(after, array_id - 1)
            exact = {**(exact or {}), "array_id": array_id}
        checks = _checks(node_id, status, job_type, reason, queue, exact, also)
        if status in (jobs.PENDING, jobs.RUNNING):
            indexes = self._pending_indexes() if status == jobs.PENDING else (self._nodes.running,)
            with self._lock:
                found_iter = _stream(indexes, node_id, after, before, newest)
                if array_id is not None and not newest:
                    found_iter = _within_array(found_iter, array_id)
                found_iter = (job for job in found_iter if checks(job))
                found = list(itertools.islice(found_iter, wanted))
        else:
            until = None
            if array_id is not None and not newest:
                until = _past_array(array_id)
            found = _scan(self._lock, self._jobs, checks, after, before, wanted, newest, until)
        if horizon is not None and not newest:
            found = list(itertools.takewhile(lambda job: job.seq < horizon, found))
        return found[:limit], len(found) > limit

    def _pending_indexes(self) -> tuple[dict[str, SortedDict], ...]:
        # A listing shows every pending job, due or not (held too): only the poll waits.
        return (self._nodes.due, self._delayed.by_node, self._waits.by_node, self._on_hold.by_node)

    def running(self) -> list[Job]:
        """Every running job (the timeout scan's input: O(running), not O(history))."""
        with self._lock:
            return [job for queue in self._nodes.running.values() for job in queue.values()]

    def running_on(self, node_id: str) -> list[Job]:
        """The node's running jobs, oldest first (O(its running jobs): the poll asks)."""
        with self._lock:
            queue = self._nodes.running.get(node_id)
            return list(queue.values()) if queue else []

    def node_counts(self, node_id: str) -> tuple[int, int]:
        """(pending jobs, running jobs) of the node: a few lookups."""
        with self._lock:
            pending = sum(len(index.get(node_id, ())) for index in self._pending_indexes())
            return pending, len(self._nodes.running.get(node_id, ()))

    def busy_nodes(self) -> set[str]:
        """Nodes that have pending or running jobs, or a timed-out job holding a slot."""
        with self._lock:
            found = set(self._nodes.running) | set(self._nodes.held)
            for index in self._pending_indexes():
                found |= set(index)
            return found

    def on_node(self, node_id: str) -> NodeJobs:
        """The node's pending (due or not), running and slot-holding timed-out jobs, oldest
        first."""
        with self._lock:
            return NodeJobs(
                pending=list(_stream(self._pending_indexes(), node_id, 0)),
                running=list(self._nodes.running.get(node_id, {}).values()),
                held=list(self._nodes.held.get(node_id, {}).values()),
            )

    def node_loads(self, node_ids: Sequence[str], now: int) -> dict[str, tuple[int, int]]:
        """For each node: (CPUs its pending `run` jobs due at `now` that could start need,
        CPUs in use). Two lookups a node (after promoting what has come due)."""
        return {
            node: (waiting.cpus, allocated.cpus)
            for node, (waiting, allocated) in self.node_resources(node_ids, now).items()
        }

    def node_resources(
        self, node_ids: Sequence[str], now: int
    ) -> dict[str, tuple[Resources, Resources]]:
        """For each node: (what its pending jobs due at `now` that could start need, what it
        has allocated)."""
        with self._lock:
            self._promote(now)
            return self._nodes.loads(node_ids, self._limits.held_back())

    def queue_depths(self) -> dict[str, int]:
        """Due pending jobs of every node that has any."""
        with self._lock:
            return {node: len(queue) for node, queue in self._nodes.due.items()}

    def movable_nodes(self) -> list[str]:
        """Nodes that have waiting jobs an idle node could take over."""
        with self._lock:
            return self._nodes.movable_nodes()

    def movable(
        self,
        node_ids: Iterable[str],
        now: int,
        picker: Picker,
        stays: Callable[[Job], bool],
        limit: int,
    ) -> list[Job]:
        """The jobs due at `now` over the given nodes' queues (by priority, then age) that an
        idle node could take over and that `picker` (the idle node's, after its own jobs)
        takes, at most `limit`: never one `stays(job)` keeps where it is (its own node will
        start it), nor one offered to its own node in the OFFER_HOLD_SECS before `now` (its
        agent may be about to claim it), nor one a change holds busy. Reads the heads of
        those queues, as deep as the picker looks."""
        found: list[Job] = []
        with self._lock:
            self._promote(now)
            room, user_room, key = self._limits.room, self._user_limits.room, self._key(now)
            streams = [
                self._nodes.handed_out(node, room, user_room, key, jobs.can_move, movable=True)
                for node in node_ids
            ]
            for job in self._within_user_limits(heapq.merge(*streams, key=key)):
                if len(found) == limit or picker.exhausted:
                    break
                if job.seq in self._busy or self._offers.held(job, now) or stays(job):
                    continue
                if picker.offer(job):
                    found.append(job)
        return found

    def recent(self, since: int) -> list[Job]:
        """Pending and running jobs, and jobs that finished at or after `since`, oldest
        first. Reads the active indexes and the newest end of the finished order only."""
        with self._lock:
            found = [
                job
                for index in (self._nodes.due, self._nodes.running)
                for queue in index.values()
                for job in queue.values()
            ]
            found.extend(self._finished.since(since, self._jobs.get))
        found.sort(key=_seq_of)
        return found

    def finished_before(self, cutoff: int, limit: int) -> list[int]:
        """Ids of up to `limit` jobs that finished before `cutoff`, oldest first; never one
        that a pending job still waits for (its outcome decides whether that one runs)."""
        with self._lock:
            return self._finished.before(cutoff, limit, self._jobs.get, self._waits.is_awaited)

    def next_due_on(self, node_id: str, now: int) -> int | None:
        """When (µs) the node's first delayed job comes due after `now`, or None."""
        with self._lock:
            return self._delayed.next_after(node_id, now)

    def take_released_nodes(self) -> set[str]:
        """The nodes of the dependents made due (their dependencies met) since the last call:
        their waiting agents have work that no change of the dependents' own announced."""
        with self._lock:
            found, self._released_nodes = self._released_nodes, set()
            return found

    def dependents(self, seq: int) -> list[Job]:
        """The pending jobs that wait for job `seq` among their unmet dependencies, by id."""
        with self._lock:
            return [self._jobs[dependent] for dependent in self._waits.waiting_for(seq)]

    # --- queues -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def queue_limits(self) -> Iterator[QueueLimits]:
        """The queues' settings and counts, under the table's lock for the block: read them
        or apply committed settings there, and do nothing else (no I/O, no waiting)."""
        with self._lock:
            yield self._limits

    @contextlib.contextmanager
    def user_limits(self) -> Iterator[tuple[UserLimits, UserUsage]]:
        """The users' limits and counts, and their fair-share usage, under the table's lock
        for the block: read them or apply committed settings, and do nothing else (no I/O,
        no waiting)."""
        with self._lock:
            yield self._user_limits, self._usage

    @contextlib.contextmanager
    def starting(self, job: Job) -> Iterator[None]:
        """Around a claim's commit (the job held busy): refuse a job whose dependencies have
        not ended, and one whose queue may not start it (`QueueLimits.reserve`)."""
        with self._lock:
            if job in self._waits:
                # Never handed out, but a PATCH can name any job: it must not jump its wait.
                raise errors.Conflict(
                    f"job {job.job_id} cannot start: its dependencies have not ended"
                )
            reserved = self._limits.reserve(job)
            try:
                user_reserved = self._user_limits.reserve(job)
            except errors.Conflict:
                if reserved:
                    self._limits.release(job)
                raise
        try:
            yield
        finally:
            if reserved or user_reserved:
                with self._lock:
                    if reserved:
                        self._limits.release(job)
                    if user_reserved:
                        self._user_limits.release(job)

    # --- writes -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def creating(self, count: int = 1) -> Iterator[int]:
        """The next job number (never handed out twice), in flight until the block ends: put
        the committed job inside it. While it is in flight, listings show no job above it.
        With `count`, that many consecutive numbers, from the one yielded (an array)."""
        with self._lock:
            seq = self._last_seq + 1
            self._last_seq += count
            numbers = range(seq, seq + count)
            self._in_flight.update(numbers)
        try:
            yield seq
        finally:
            with self._lock:
                self._in_flight.difference_update(numbers)

    def changing(self, seq: int) -> _Changing:
        """Hold the job busy while its next version is computed and committed; another
        change to the same job waits until this one is done (and then sees its result)."""
        return _Changing(self, seq)

    def _hold(self, seq: int) -> Job:
        with self._lock:
            while seq in self._busy:
                self._idle.wait()
            job = self._jobs.get(seq)
            if job is None:
                raise errors.NotFound(errors.JOB_NOT_FOUND)
            self._busy.add(seq)
        return job

    def _let_go(self, seq: int) -> None:
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

    def keyed(self, key: str) -> Job | None:
        """The job created under dedupe key `key`, if it is still here."""
        with self._lock:
            seq = self._keys.get(key)
            return self._jobs.get(seq) if seq is not None else None

    def put(self, job: Job) -> None:
        """Insert a committed job, or swap in the committed next version of one. Kept without
        its output, which can be megabytes: the store has it."""
        job = job.without_output()
        with self._lock:
            old = self._jobs.get(job.seq)
            if old is not None:
                self._unindex(old)
                self._charge(old, job)
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
            self._finished.discard(gone)

    # --- index upkeep (lock held) -------------------------------------------------------------

    def _index(self, job: Job, old: Job | None) -> None:
        """Enter one version of a job into every structure (`old`: the version it replaces)."""
        self._counts[job.status] += 1
        if job.reason is not None:
            self._reasons[job.reason] += 1
        self._arrays.add(job)
        self._limits.add(job)
        self._user_limits.add(job)
        if job.status == jobs.PENDING and job.depends_on and not self._met(job):
            self._waits.add(job)
        elif job.status == jobs.PENDING and self._on_hold.belongs(job):
            self._on_hold.add(job)
        elif job.status == jobs.PENDING and self._delayed.is_delayed(job):
            self._delayed.add(job)
        elif job.status == jobs.PENDING:
            self._nodes.add_due(job)
        elif job.status == jobs.RUNNING:
            self._nodes.add_running(job)
            self._usage.running(job)
        elif old is not None and not old.is_final:
            self._finished.add(job.seq)
            self._release_dependents(job.seq)
        self._nodes.add_slot_facts(job)
        if job.dedupe_key is not None:
            self._keys[job.dedupe_key] = job.seq

    def _unindex(self, job: Job) -> None:
        self._counts[job.status] -= 1
        if job.reason is not None:
            self._reasons[job.reason] -= 1
        self._arrays.discard(job)
        self._limits.discard(job)
        self._user_limits.discard(job)
        if job.status == jobs.PENDING:
            if not (
                self._waits.discard(job) or self._on_hold.discard(job) or self._delayed.discard(job)
            ):
                self._nodes.remove_due(job)
        elif job.status == jobs.RUNNING:
            self._nodes.remove_running(job)
            self._usage.not_running(job)
        self._nodes.remove_slot_facts(job)
        if job.dedupe_key is not None and self._keys.get(job.dedupe_key) == job.seq:
            del self._keys[job.dedupe_key]

    def _charge(self, old: Job, new: Job) -> None:
        """(Lock held.) An attempt that ran in `old` and is over in `new` is charged to its
        owner's fair-share usage, from its start to its end."""
        if old.status != jobs.RUNNING or old.running_at is None:
            return
        if new.status == jobs.RUNNING and new.retry_count == old.retry_count:
            return  # still the same attempt, running
        ended = new.finished_at
        if new.retry_count > old.retry_count and new.attempts:
            ended = new.attempts[-1].finished_at
        if ended is not None:
            self._usage.ended(old.owner, need_of(old).cpus, old.running_at, ended)

    def _met(self, job: Job) -> bool:
        return dependencies_met(job, self._jobs.get)

    def _release_dependents(self, seq: int) -> None:
        """Job `seq` just ended: its dependents whose dependencies are now all met become
        pending jobs like any other (due, or delayed until their not_before). An `ok`
        dependent of a failure stays: the service fails it in the same commit."""
        for dependent_seq in self._waits.waiting_for(seq):
            dependent = self._jobs[dependent_seq]
            if self._met(dependent):
                self._unindex(dependent)
                self._index(dependent, dependent)
                if dependent.node_id:
                    self._released_nodes.add(dependent.node_id)

    def _promote(self, now: int) -> None:
        """Move the delayed jobs that are due at `now` into their nodes' queues."""
        for job in self._delayed.due(now, self._jobs.get):
            self._nodes.add_due(job)


class _Changing:
    """`JobTable.changing`'s hold on one job: a class rather than a generator's context
    manager, since every claim, report and cancel takes one (the generator's machinery was a
    few per cent of a busy cluster's changes)."""

    __slots__ = ("_seq", "_table")

    def __init__(self, table: JobTable, seq: int) -> None:
        self._table = table
        self._seq = seq

    def __enter__(self) -> Job:
        return self._table._hold(self._seq)

    def __exit__(self, *exc: object) -> None:
        self._table._let_go(self._seq)


def _checks(
    node_id: str | None,
    status: str | None,
    job_type: str | None,
    reason: str | None,
    queue: str | None,
    exact: Mapping[str, object] | None,
    also: Callable[[Job], bool] | None,
) -> Callable[[Job], bool]:
    """One test of a job against every filter given (those left None test nothing). Written
    out rather than looped over: a sparse filter runs it on every job of the history."""
    extra = tuple((operator.attrgetter(name), value) for name, value in (exact or {}).items())
    if not extra and also is None and (node_id, status, job_type, reason, queue) == (None,) * 5:
        return _any_job

    def matches(job: Job) -> bool:
        return (
            (node_id is None or job.node_id == node_id)
            and (status is None or job.status == status)
            and (job_type is None or job.job_type == job_type)
            and (reason is None or job.reason == reason)
            and (queue is None or job.queue == queue)
            and (not extra or all(get(job) == value for get, value in extra))
            and (also is None or also(job))
        )

    return matches


def _any_job(job: Job) -> bool:
    return True


def _within_array(found: Iterator[Job], array_id: int) -> Iterator[Job]:
    """The jobs of a stream (in id order, from the array's first id) up to the array's end."""
    return itertools.takewhile(lambda job: job.array_id == array_id, found)


def _past_array(array_id: int) -> Callable[[Job], bool]:
    """Whether a job (seen in id order from the array's first id) is past the array's end."""
    return lambda job: job.array_id != array_id


def _scan(
    lock: threading.Lock,
    table: SortedDict,
    matches: Callable[[Job], bool],
    after: int,
    before: int | None,
    wanted: int,
    newest: bool = False,
    until: Callable[[Job], bool] | None = None,
) -> list[Job]:
    """The first `wanted` jobs of `table` that match, with ids above `after` and below
    `before` (from the highest down with `newest`), walked in chunks letting go of the lock
    between chunks: a sparse filter over a million jobs must not stall the agents' polls.
    The walk ends at the first job for which `until` holds."""
    found: list[Job] = []
    low, high = after, before
    while len(found) < wanted:
        with lock:
            chunk = list(
                itertools.islice(
                    table.irange(low, high, inclusive=(False, False), reverse=newest),
                    _SCAN_CHUNK,
                )
            )
            candidates = [table[seq] for seq in chunk]
        for job in candidates:
            if until is not None and until(job):
                return found
            if matches(job):
                found.append(job)
                if len(found) == wanted:
                    break
        if len(chunk) < _SCAN_CHUNK:
            break
        if newest:
            high = chunk[-1]
        else:
            low = chunk[-1]
    return found


def _stream(
    indexes: Iterable[dict[str, SortedDict]],
    node_id: str | None,
    after: int,
    before: int | None = None,
    newest: bool = False,
) -> Iterator[Job]:
    """Jobs of active indexes (one node's, or every node's merged) with after < seq (<
    before), oldest first (newest first with `newest`). Consume it while holding the
    table's lock."""
    if node_id is None:
        queues = [queue for index in indexes for queue in index.values()]
    else:
        queues = [index[node_id] for index in indexes if node_id in index]
    if not queues:
        return iter(())
    streams = [_values_between(queue, after, before, newest) for queue in queues]
    if len(streams) == 1:
        return streams[0]
    return heapq.merge(*streams, key=_seq_of, reverse=newest)


def _values_between(
    queue: SortedDict, after: int, before: int | None, newest: bool
) -> Iterator[Job]:
    if not after and before is None and not newest:
        return iter(queue.values())  # the agent's poll: no seek needed
    seqs = queue.irange(after, before, inclusive=(False, False), reverse=newest)
    return (queue[seq] for seq in seqs)


def _and(
    first: Callable[[Job], bool] | None, second: Callable[[Job], bool]
) -> Callable[[Job], bool]:
    if first is None:
        return second
    return lambda job: first(job) and second(job)


def _finished_within(job: Job, since: int | None, until: int | None) -> bool:
    """Whether a job is final and ended at or after `since` and before `until`."""
    end = job.finished_at
    if not job.is_final or end is None:
        return False
    return (since is None or end >= since) and (until is None or end < until)


_seq_of: Callable[[Job], int] = operator.attrgetter("seq")
_QUEUE_STATUS = operator.attrgetter("queue", "status")
