"""What a job needs, what a node has, and whether the one fits the other: the filters of
placement (resources, `node_selector`, `node_ids`) and the rule of backfill.

- **Needs** (`need_of`): a `run` job takes `cpus` of its node's CPUs (unset counts as 1), a
  `service` none (as it takes no slot); both take their `memory_mb` and `gpus`.
- **A node's capacity** (`Capacity`): its CPUs are its slots (`MAX_JOBS_PER_NODE`, or its
  `cpu_count` under `auto`); memory and GPUs come from this project's agent's heartbeat. A node
  whose memory nobody reported (a registry node) fits any `memory_mb`, and has no GPUs.
- **Could it ever run there** (`could_run`, `never_fits`): the node has the labels the job
  selects, is among its `node_ids` when it names any, and is big enough when empty. A job no
  known node could ever run is refused at submission with the reason `never_fits` gives.
- **Fits now** (`Resources.covers`): what the node has free covers what the job needs.
- **Backfill** (`Picker`): the jobs a node hands out are taken in its order; when the first
  that does not fit yet (the *head*) is found, a later job may start ahead of it only if it
  ends, by its timeout, before the head's resources are expected to be free (the *shadow*
  time: running jobs, and those this poll starts before the head, counted as ending at their
  deadlines), or if it takes only what will be spare beyond the head's needs even then. So a
  big job is never passed forever by a stream of small ones, and what is started ahead never
  delays it past that time (Slurm's EASY backfill). `Picker.explain` says which jobs it held
  back behind the head, for `waiting_for`.

Pure: given jobs, capacities and times, never the table, a node source or a clock.

Tests: `tests/test_fit.py`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

from .jobs import SERVICE, Job

UNREPORTED_MEMORY = 1 << 62
"""The memory of a node whose agent reported none (a registry node): it fits any request."""

BACKFILL_DEPTH = 200
"""How many jobs past a blocked head one poll looks at for one that may start ahead of it
(Slurm's bf_max_job_test): a node's queue of thousands costs a poll no more than this."""


class Resources(NamedTuple):
    """An amount of CPUs, memory (MiB) and GPUs: what a job needs, a node has, or is free.

    A named tuple, not a frozen dataclass: placement, polls and the table's counts make
    millions of these, and a frozen dataclass's constructor (an `object.__setattr__` per
    field) was a tenth of a busy replay's time. `+` and `-` are the amounts', not a tuple's.
    """

    cpus: int = 0
    memory_mb: int = 0
    gpus: int = 0

    def __add__(self, other: Resources) -> Resources:  # type: ignore[override]
        return Resources(
            self.cpus + other.cpus, self.memory_mb + other.memory_mb, self.gpus + other.gpus
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.cpus - other.cpus, self.memory_mb - other.memory_mb, self.gpus - other.gpus
        )

    def covers(self, need: Resources) -> bool:
        """Whether this much is enough for `need`."""
        return (
            self.cpus >= need.cpus and self.memory_mb >= need.memory_mb and self.gpus >= need.gpus
        )

    def to_wire(self) -> dict[str, int]:
        out = {"cpus": self.cpus, "memory_mb": self.memory_mb, "gpus": self.gpus}
        if self.memory_mb >= UNREPORTED_MEMORY // 2:
            del out["memory_mb"]  # nobody reported it: no number to show
        return out


NOTHING = Resources()


class Wants(Protocol):
    """What placement reads of a job, or of a request before its job exists."""

    @property
    def job_type(self) -> str: ...
    @property
    def cpus(self) -> int: ...
    @property
    def memory_mb(self) -> int: ...
    @property
    def gpus(self) -> int: ...
    @property
    def node_selector(self) -> Mapping[str, str] | None: ...
    @property
    def node_ids(self) -> Sequence[str]: ...


def need_of(job: Wants) -> Resources:
    """What the job takes of its node while it runs."""
    cpus = 0 if job.job_type == SERVICE else max(1, job.cpus)
    return _amount(cpus, job.memory_mb, job.gpus)


@functools.lru_cache(maxsize=4096)
def _amount(cpus: int, memory_mb: int, gpus: int) -> Resources:
    """One shared value per amount: jobs ask for a few amounts, millions of times."""
    return Resources(cpus, memory_mb, gpus)


Shape = tuple[Resources, tuple[tuple[str, str], ...], tuple[str, ...]]


def shape_of(job: Wants) -> Shape:
    """What decides where a job could run (what it needs, its `node_selector`, its
    `node_ids`): jobs of one shape fit the same nodes."""
    selector = tuple(sorted((job.node_selector or {}).items()))
    return (need_of(job), selector, tuple(job.node_ids))


def is_particular(job: Wants) -> bool:
    """Whether the job asks for more than one plain CPU anywhere (every node fits the rest)."""
    return bool(job.cpus > 1 or job.memory_mb or job.gpus or job.node_selector or job.node_ids)


@dataclasses.dataclass(frozen=True, slots=True)
class Capacity:
    """What a node has, and its labels."""

    node_id: str
    total: Resources
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)


def selects(job: Wants, node_id: str, labels: Mapping[str, str]) -> bool:
    """Whether the job may run on this node at all: among its `node_ids` (when it names
    any), with every label of its `node_selector`."""
    if job.node_ids and node_id not in job.node_ids:
        return False
    selector = job.node_selector
    return not selector or all(labels.get(name) == value for name, value in selector.items())


def could_run(job: Wants, capacity: Capacity) -> bool:
    """Whether the job could run on the node when it is empty."""
    return selects(job, capacity.node_id, capacity.labels) and capacity.total.covers(need_of(job))


def never_fits(job: Wants, known: Sequence[Capacity]) -> str | None:
    """Why no known node could ever run the job (the text after `no node can run this job: `),
    or None when one could, or when no node is known at all (placement then says so). The
    filters are tried in turn, each on the nodes the earlier ones left, so the reason names the
    first a person has to change."""
    if not known:
        return None
    nodes = list(known)
    where = ""
    if job.node_ids:
        nodes = [node for node in nodes if node.node_id in job.node_ids]
        if not nodes:
            return f"node_ids {', '.join(job.node_ids)}: no such node"
        where = " among its node_ids"
    if job.node_selector:
        wanted = ",".join(f"{name}={value}" for name, value in job.node_selector.items())
        nodes = [node for node in nodes if selects(job, node.node_id, node.labels)]
        if not nodes:
            return f"no node{where} has {wanted}"
        where = f" with {wanted}"
    need = need_of(job)
    for name, unit in (("cpus", "cpus"), ("memory_mb", "MiB of memory"), ("gpus", "gpus")):
        wanted_amount = getattr(need, name)
        largest = max(getattr(node.total, name) for node in nodes)
        if wanted_amount > largest:
            return f"needs {wanted_amount} {unit}, the largest node{where} has {largest}"
        nodes = [node for node in nodes if getattr(node.total, name) >= wanted_amount]
    return None


def shortfall(need: Resources, free: Resources) -> str:
    """What a job that does not fit waits for, as people read it (`4 free cpus`)."""
    parts = []
    if need.cpus > free.cpus:
        parts.append(f"{need.cpus} free cpus")
    if need.memory_mb > free.memory_mb:
        parts.append(f"{need.memory_mb} MiB of free memory")
    if need.gpus > free.gpus:
        parts.append(f"{need.gpus} free gpus")
    return " and ".join(parts)


# --- backfill ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Ending:
    """A running job as backfill sees it: when it is expected to end (its deadline; None for
    one that never ends by itself, a service) and what it frees then."""

    at: int | None
    frees: Resources


@dataclasses.dataclass(frozen=True, slots=True)
class HeldBack:
    """What backfill keeps waiting on one node now (`Picker.explain`), for `waiting_for`."""

    head: Job | None  # the first job that does not fit yet (None: none is blocked)
    refused: frozenset[int]  # seqs that fit what is free but would outlast the head's start
    looked_at: frozenset[int]  # seqs the picker was offered
    too_deep: bool  # it stopped BACKFILL_DEPTH jobs past the head, before the order ended


NOT_HELD = HeldBack(None, frozenset(), frozenset(), False)


class Picker:
    """Chooses, in a node's order, the jobs that start now on it (see the module's notes).

    Offer it the node's candidates in order (`offer`); it takes those that fit, until it
    meets the first that does not (the head), then only those that backfill allows. The same
    picker goes on over jobs taken from other nodes (moving work follows the same rule).
    """

    def __init__(
        self,
        capacity: Capacity,
        free: Resources,
        endings: Callable[[], Sequence[Ending]],
        now: int,
        deadline: Callable[[Job, int], int | None],
    ) -> None:
        """`free`: what the node has free now; `endings`: its running jobs' (read only once
        a head is blocked); `deadline(job, now)`: when a job started now would end by its
        timeout (None: never)."""
        self.capacity = capacity
        self.free = free
        self._endings = endings
        self._now = now
        self._deadline = deadline
        self.head: Job | None = None
        self._shadow: int | None = None  # when the head can start (None: nothing we do delays it)
        self._spare = NOTHING  # what is free beyond the head's needs at the shadow time
        self._passed = 0  # jobs looked at past the head
        # The jobs taken before the head: they start now, so they end (and make room for
        # it) by their timeouts from now, as the running ones do by theirs.
        self._taken: list[Ending] = []

    @property
    def exhausted(self) -> bool:
        """Whether looking further is pointless: no CPU is free (a node hands out at most as
        many jobs as it has free slots, services included, as the poll always did), or
        backfill looked deep enough."""
        return self.free.cpus <= 0 or self._passed >= BACKFILL_DEPTH

    def offer(self, job: Job) -> bool:
        """Whether the job starts now (what it needs is then taken from what is free)."""
        if not could_run(job, self.capacity):
            return False  # it waits for another node (or a change of this one's labels)
        need = need_of(job)
        if self.head is not None:
            self._passed += 1
        if not self.free.covers(need):
            if self.head is None:
                self._block(job, need)
            return False
        if self.head is not None:
            if not self._backfills(job, need):
                return False
        else:
            self._taken.append(Ending(self._deadline(job, self._now), need))
        self.free = self.free - need
        return True

    def _block(self, head: Job, need: Resources) -> None:
        """The first job that does not fit: when will it, and what is spare beyond it then."""
        self.head = head
        available = self.free
        for ending in sorted(
            (e for e in [*self._endings(), *self._taken] if e.at is not None),
            key=lambda e: e.at,  # type: ignore[arg-type, return-value]
        ):
            available = available + ending.frees
            if available.covers(need):
                self._shadow = ending.at
                self._spare = available - need
                return
        self._shadow = None  # never within what is known to end: nothing started delays it

    def _backfills(self, job: Job, need: Resources) -> bool:
        if self._shadow is None:
            return True
        ends = self._deadline(job, self._now)
        if ends is not None and ends <= self._shadow:
            return True
        if self._spare.covers(need):
            # It outlasts the shadow, but only in what the head will not need even then.
            self._spare = self._spare - need
            return True
        return False

    def take(self, candidates: Iterable[Job], limit: int | None = None) -> list[Job]:
        """The candidates (in order) that start now, at most `limit`."""
        taken: list[Job] = []
        for job in candidates:
            if (limit is not None and len(taken) >= limit) or self.exhausted:
                break
            if self.offer(job):
                taken.append(job)
        return taken

    def explain(self, candidates: Iterable[Job], limit: int | None = None) -> HeldBack:
        """`take` (the same candidates and `limit` as the poll's), saying which jobs backfill
        held back: those that fit in what was free when offered but were refused once a head
        was blocked. A read: what it takes is only counted, nothing starts."""
        refused: set[int] = set()
        looked_at: set[int] = set()
        taken = 0
        for job in candidates:
            if (limit is not None and taken >= limit) or self.exhausted:
                too_deep = self.head is not None and self._passed >= BACKFILL_DEPTH
                return HeldBack(self.head, frozenset(refused), frozenset(looked_at), too_deep)
            looked_at.add(job.seq)
            fitted = self.free.covers(need_of(job))
            if self.offer(job):
                taken += 1
            elif fitted and self.head not in (None, job) and could_run(job, self.capacity):
                # It fitted and could run here (`offer` passes over one that cannot at all
                # before it looks at what is free): only backfill's rule kept it back.
                refused.add(job.seq)
        return HeldBack(self.head, frozenset(refused), frozenset(looked_at), False)
