"""What each dashboard page shows, gathered from the service and shaped for its template.

The views stay one line each: they call one function here and render its result. Everything
is read through the service's read API (counts, jobs per node, node health, store health,
listings, recent jobs), which serves it from memory and the registry client's cached node list:
a dashboard left open never touches the database, and a registry that is down only takes the
node health column away, never the page.

The jobs page lists newest first (as the command line does), a page at a time with `before=`,
one row per array (its jobs a click away, by index, with a summary of how they stand); it is
searched by id, name or command (`q`) and filtered by the state people read (`cancelled` and
`timed out` apart from `failed`). The overview counts jobs by that state too. Its recent
failures come from a small ring fed by the service's events, so they cover the time since
start-up; its chart of the last hour is computed from the jobs themselves (`activity`), so it
survives a restart.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import errors
from ..clock import Clock
from ..domain import jobs, queues, validation
from ..domain.jobs import Attempt, Job
from ..service import QueueView, Scheduler
from . import actions, activity, formatting
from .activity import Activity

REFRESH_SECS = 5
"""Seconds between two automatic refreshes of an open page."""

PAGE_SIZE = 25
"""Rows per page of the jobs list, unless the URL asks for another `limit` (a page of 42 jobs
was one long scroll)."""

MAX_PAGE_SIZE = 200
"""Largest `limit` the jobs list accepts: a page must stay quick to render and to read."""

NODE_JOBS_SHOWN = 5
"""Running and pending jobs listed per node on the overview; the rest are a link away."""

ACTIVITY_BUDGET = 0.05
"""Share of one core the overview's chart may cost: after a computation that took t seconds,
the next one waits t / budget seconds (a table of a million jobs takes ~0.5 s to walk)."""

RECENT_FAILURES = 10
"""Failed attempts remembered for the overview."""

GONE = "gone"
"""Health shown for a node that has jobs but is not in the registry's list."""

UNKNOWN = "unknown"
"""Health shown for every node while the registry cannot be asked."""


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt, as it was when it failed (the job may have been retried since)."""

    job_id: str
    node_id: str
    exit_code: int | None
    reason: str  # why, in words: "exit 3", "timed out", "node lost"
    last_line: str  # the last line of its stderr, for a first idea of what went wrong
    finished_at: int
    retried: bool
    # The state people read of a job that failed for good (`failed`, `timed out`: the jobs
    # list's `formatting.job_state`), so its badge never says `failed` of a timeout; "" when
    # the attempt was retried (the job is not over).
    state: str


class RecentFailures:
    """The last failed attempts since start-up, newest first; a service listener feeds it."""

    def __init__(self, clock: Clock, size: int = RECENT_FAILURES) -> None:
        self._clock = clock  # the service's: an attempt that ended without a time ends now
        self._lock = threading.Lock()
        self._ring: collections.deque[Failure] = collections.deque(maxlen=size)

    def listener(self, event: str, job: Job | None, detail: str) -> None:
        if job is None:
            return
        ended: Job | Attempt
        if job.reason == jobs.Reason.CANCELLED:
            return  # someone's decision, not a failure of the job or its node
        if event == "finished" and job.status == jobs.FAILED:
            ended, retried = job, False
        elif event == "retried" and job.attempts:
            ended, retried = job.attempts[-1], True
        else:
            return
        lines = ended.stderr.strip().splitlines()
        reason = job.reason.value if ended is job and job.reason else ""
        failure = Failure(
            job_id=job.job_id,
            node_id=ended.node_id,
            exit_code=ended.exit_code,
            reason=formatting.ending(reason, ended.exit_code, ended.stderr.strip()),
            last_line=lines[-1][:200] if lines else "",
            finished_at=ended.finished_at or self._clock.now_us(),
            retried=retried,
            state="" if retried else formatting.job_state(job),
        )
        with self._lock:
            self._ring.append(failure)

    def newest(self) -> list[Failure]:
        with self._lock:
            return list(reversed(self._ring))


# --- the overview -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: str
    health: str  # healthy, unhealthy (or whatever the registry says), GONE or UNKNOWN
    running: list[Job]
    running_more: int
    held: list[Job]  # timed out, still running on the node: each keeps a slot
    pending: list[Job]
    pending_more: int


@dataclasses.dataclass(frozen=True, slots=True)
class Overview:
    now: int
    counts: dict[str, int]  # by the state people read (jobs.STATES), in that order
    total: int
    store_error: str | None
    registry_error: str | None
    nodes: list[NodeRow]
    failures: list[Failure]
    chart: Chart


def overview(service: Scheduler, failures: RecentFailures, charts: ActivityCache) -> Overview:
    """Counts by status, the last hour's chart, every node with its health and jobs, and the
    recent failures."""
    counts = state_counts(service.reads.counts(), service.reads.reason_counts())
    health, registry_error = node_health(service)
    rows = []
    for node_id in sorted(set(health) | service.reads.busy_nodes()):
        on_node = service.reads.jobs_on(node_id)
        running, pending = on_node.running, on_node.pending
        rows.append(
            NodeRow(
                node_id=node_id,
                health=health.get(node_id, UNKNOWN if registry_error else GONE),
                running=running[:NODE_JOBS_SHOWN],
                running_more=max(0, len(running) - NODE_JOBS_SHOWN),
                held=on_node.held,
                pending=pending[:NODE_JOBS_SHOWN],
                pending_more=max(0, len(pending) - NODE_JOBS_SHOWN),
            )
        )
    healthy, store_error = service.reads.store_health()
    now = service.clock.now_us()
    return Overview(
        now=now,
        counts=counts,
        total=sum(counts.values()),
        store_error=None if healthy else store_error,
        registry_error=registry_error,
        nodes=rows,
        failures=failures.newest(),
        chart=Chart.of(charts.get(service, now)),
    )


def state_counts(by_status: Mapping[str, int], by_reason: Mapping[str, int]) -> dict[str, int]:
    """Jobs by the state people read: the statuses, with the failures of each reason that is
    a state of its own (cancelled, timed out) counted apart from `failed`."""
    counts = {state: by_status.get(state, 0) for state in jobs.STATUSES}
    for state, reason in jobs.STATE_REASONS.items():
        counts[state] = by_reason.get(reason, 0)
        counts[jobs.FAILED] -= counts[state]
    return {state: counts[state] for state in jobs.STATES}


def node_health(service: Scheduler) -> tuple[dict[str, str], str | None]:
    """Each node the registry lists with its status, or no nodes and the registry's error."""
    try:
        return dict(service.reads.node_health().status), None
    except errors.PlacementError as exc:
        return {}, exc.message


# --- the overview's chart ---------------------------------------------------------------------


class ActivityCache:
    """The last hour's activity, computed again only once its cost is paid off: walking the
    jobs grows with history, and every open dashboard asks every few seconds."""

    def __init__(self, budget: float = ACTIVITY_BUDGET) -> None:
        self._budget = budget
        self._lock = threading.Lock()
        self._last: Activity | None = None
        self._fresh_until = 0.0

    def get(self, service: Scheduler, now_us: int) -> Activity:
        with self._lock:  # one computation at a time; the others wait and take its result
            # The real time the walk took, not the service's clock: what is paid off is the
            # machine's work, which a test's clock that stands still would not measure.
            started = time.monotonic()
            if self._last is None or started >= self._fresh_until:
                found = service.reads.recent_jobs(activity.window_start(now_us))
                self._last = activity.activity(found, now_us)
                cost = time.monotonic() - started
                self._fresh_until = started + cost / self._budget
            return self._last


CHART_WIDTH = 600
"""Width of the charts' drawing space (SVG user units; the SVG stretches to its box)."""

CHART_HEIGHT = 100
"""Height of the charts' drawing space; the top tenth stays empty above the highest point."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChartMinute:
    x: float
    label: str  # the tooltip: the minute and its numbers


@dataclasses.dataclass(frozen=True, slots=True)
class Chart:
    """The activity as SVG geometry: one polyline per rate, a filled area for the queue."""

    data: Activity
    submitted: str  # polyline points
    done: str
    failed: str  # jobs failed for good, neither cancelled nor timed out: the card's `failed`
    waiting: str  # path of the filled area
    minutes: list[ChartMinute]
    slot: float  # width of one minute
    first_minute: str  # HH:MM of the oldest minute, UTC
    last_minute: str
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT

    @classmethod
    def of(cls, data: Activity) -> Chart:
        slot = CHART_WIDTH / data.buckets

        def points(values: list[int], scale: int) -> list[tuple[float, float]]:
            top = CHART_HEIGHT * 0.9
            return [
                (round((i + 0.5) * slot, 1), round(CHART_HEIGHT - value / scale * top, 1))
                for i, value in enumerate(values)
            ]

        def line(values: list[int]) -> str:
            return " ".join(f"{x},{y}" for x, y in points(values, data.busiest))

        area = points(data.waiting, data.deepest)
        waiting = " ".join(
            [f"M{area[0][0]},{CHART_HEIGHT}"]
            + [f"L{x},{y}" for x, y in area]
            + [f"L{area[-1][0]},{CHART_HEIGHT} Z"]
        )
        minutes = [
            ChartMinute(
                x=round(i * slot, 1),
                label=(
                    f"{_clock(data.bucket_start(i))} UTC: {data.submitted[i]} submitted, "
                    f"{data.done[i]} done, {data.failed[i]} failed, "
                    f"{data.cancelled[i]} cancelled, {data.timed_out[i]} timed out, "
                    f"{data.retried[i]} retried, {data.waiting[i]} waiting"
                ),
            )
            for i in range(data.buckets)
        ]
        return cls(
            data=data,
            submitted=line(data.submitted),
            done=line(data.done),
            failed=line(data.failed),
            waiting=waiting,
            minutes=minutes,
            slot=slot,
            first_minute=_clock(data.start_us),
            last_minute=_clock(data.bucket_start(data.buckets - 1)),
        )


def _clock(us: int) -> str:
    return time.strftime("%H:%M", time.gmtime(us // 1_000_000))


# --- the jobs list ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ArraySummary:
    """How an array's jobs stand: how many, and how many in each state."""

    array_id: str
    name: str
    size: int
    states: list[tuple[str, int]]  # (state, how many), in jobs.STATES' order, zeros left out

    @classmethod
    def of(cls, service: Scheduler, job: Job) -> ArraySummary | None:
        """The summary of `job`'s array (None for a job of no array, or when retention took
        every job of it meanwhile)."""
        counted = service.reads.array_counts(job.array_id) if job.array_id else {}
        if not counted:
            return None
        return cls(
            array_id=jobs.job_id_of(job.array_id),
            name=job.name,
            size=sum(counted.values()),
            states=list(counted.items()),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class JobRow:
    job: Job
    array: ArraySummary | None = None  # set: the row stands for its whole array


@dataclasses.dataclass(frozen=True, slots=True)
class JobList:
    now: int
    rows: list[JobRow]
    node_id: str
    status: str  # a state (jobs.STATES): `cancelled` and `timed out` apart from `failed`
    job_type: str
    limit: int
    error: str | None
    nodes: list[str]  # known node ids, offered in the node filter
    reason: str = ""
    queue: str = ""  # a queue filter, from the queues page's links
    name: str = ""  # exactly this name (a job page's link)
    owner: str = ""  # an owner filter ("My jobs")
    q: str = ""  # the search: a job id, or words of a name or command
    array: ArraySummary | None = None  # listing one array's jobs, by index
    before: str = ""  # newest first: the job id this page continues below, or ""
    next_before: str | None = None
    after: str = ""  # an array's jobs: the job id this page continues after, or ""
    next_after: str | None = None
    statuses: tuple[str, ...] = jobs.STATES
    job_types: tuple[str, ...] = jobs.JOB_TYPES
    reasons: tuple[str, ...] = jobs.REASONS

    @property
    def jobs(self) -> list[Job]:
        return [row.job for row in self.rows]

    @property
    def page_args(self) -> dict[str, str]:
        """The query of this listing without its paging: filters set, and a non-default
        limit."""
        args = {
            "q": self.q,
            "status": self.status,
            "reason": self.reason,
            "node_id": self.node_id,
            "job_type": self.job_type,
            "queue": self.queue,
            "name": self.name,
            "array_id": self.array.array_id if self.array else "",
            "owner": self.owner,
        }
        if self.limit != PAGE_SIZE:
            args["limit"] = str(self.limit)
        return {name: value for name, value in args.items() if value}


_FILTERS = ("node_id", "reason", "job_type", "queue", "name", "array_id", "owner")


def job_list(service: Scheduler, args: Mapping[str, str]) -> JobList:
    """One page of jobs matching the filters in `args`: newest first with one row per array,
    or one array's jobs by index (`array_id`)."""
    limit = _page_size(args.get("limit", ""))
    wanted = {name: args.get(name, "").strip() for name in _FILTERS}
    state = args.get("status", "")
    state = state if state in jobs.STATES else ""
    q = " ".join(args.get("q", "").split())
    error = None
    try:
        query = validation.parse_query(
            {**wanted, "limit": str(limit), "after": args.get("after", "")}
        )
        before = _job_seq(args.get("before", ""), "before")
    except errors.BadRequest as exc:
        error = exc.message
        wanted["array_id"] = ""
        query = validation.parse_query({**wanted, "limit": str(limit)})
        before = None
    query, also = _by_state(query, state)
    tests = [test for test in (also, _search(q)) if test is not None]
    array = None
    if query.array_id is not None:
        # One array: its jobs in the order they were made, by index, paged forward.
        page = service.reads.list_jobs(query, also=_all(tests))
        first = service.reads.array_jobs(query.array_id, limit=1)
        array = ArraySummary.of(service, first[0]) if first else None
        rows = [JobRow(job) for job in page.jobs]
        next_after = jobs.job_id_of(page.next_after) if page.next_after else None
        next_before = None
    else:
        page = service.reads.list_jobs(
            dataclasses.replace(query, after=0),
            newest=True,
            before=before,
            also=_all([*tests, _one_row_per_array()]),
        )
        rows = [JobRow(job, ArraySummary.of(service, job)) for job in page.jobs]
        next_before = None
        if page.next_after is not None:
            last = rows[-1].job
            # Below an array's row come the rest of its jobs: the next page starts under them.
            next_before = jobs.job_id_of(last.array_id if rows[-1].array else last.seq)
        next_after = None
    health, _ = node_health(service)
    return JobList(
        now=service.clock.now_us(),
        rows=rows,
        node_id=wanted["node_id"],
        status=state,
        job_type=wanted["job_type"],
        reason=wanted["reason"],
        queue=wanted["queue"],
        name=wanted["name"],
        q=q,
        array=array,
        owner=wanted["owner"],
        limit=limit,
        before=jobs.job_id_of(before) if before else "",
        next_before=next_before,
        after=args.get("after", "") if array else "",
        next_after=next_after,
        error=error,
        nodes=sorted(set(health) | service.reads.busy_nodes()),
    )


def _job_seq(text: str, name: str) -> int | None:
    if not text:
        return None
    seq = jobs.parse_job_id(text)
    if seq is None:
        raise errors.BadRequest(f"{name} must be a job id such as job-7")
    return seq


def _by_state(
    query: validation.JobQuery, state: str
) -> tuple[validation.JobQuery, Callable[[Job], bool] | None]:
    """The query for a state: cancelled and timed out are failures of their reason; `failed`
    is every other failure (unless a reason is asked for)."""
    if state in jobs.STATE_REASONS:
        return dataclasses.replace(
            query, status=jobs.FAILED, reason=jobs.STATE_REASONS[state]
        ), None
    if state == jobs.FAILED and query.reason is None:
        apart = frozenset(jobs.STATE_REASONS.values())
        return dataclasses.replace(query, status=jobs.FAILED), lambda job: job.reason not in apart
    return dataclasses.replace(query, status=state or None), None


def _search(q: str) -> Callable[[Job], bool] | None:
    """The search box: a job id (or its number) finds that job; other words, the jobs whose
    name or command holds them (case aside)."""
    if not q:
        return None
    seq = jobs.parse_job_id(q) or (int(q) if q.isascii() and q.isdigit() and q[0] != "0" else None)
    if seq is not None:
        return lambda job: job.seq == seq
    words = q.lower()
    return lambda job: words in job.name.lower() or words in job.command.lower()


def _one_row_per_array() -> Callable[[Job], bool]:
    """A listing's test that lets the first job it meets of each array through and no other
    of that array: one row stands for the array (newest first: its newest matching job)."""
    seen: set[int] = set()

    def first_of_its_array(job: Job) -> bool:
        if not job.array_id:
            return True
        if job.array_id in seen:
            return False
        seen.add(job.array_id)
        return True

    return first_of_its_array


def _all(tests: list[Callable[[Job], bool]]) -> Callable[[Job], bool] | None:
    if not tests:
        return None
    if len(tests) == 1:
        return tests[0]
    return lambda job: all(test(job) for test in tests)


def _page_size(text: str) -> int:
    if text.isascii() and text.isdigit() and len(text) <= 4:
        return min(max(int(text), 1), MAX_PAGE_SIZE)
    return PAGE_SIZE


# --- one job ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class AttemptRow:
    number: int
    node_id: str
    status: str  # the state people read (`cancelled`, `timed out` apart from `failed`)
    exit_code: int | None
    stdout: str
    stderr: str
    running_at: int | None
    finished_at: int | None
    current: bool


@dataclasses.dataclass(frozen=True, slots=True)
class JobDetail:
    now: int
    job: Job
    attempts: list[AttemptRow]  # every attempt, the current one last
    env: list[tuple[str, str | None]]  # (name, value); value None while values are hidden
    show_env: bool
    cancellable: bool  # pending (Cancel) or running (Stop)
    retryable: bool  # ended: its request may be submitted again as a new job
    notice: str | None
    waiting_for: str | None  # while pending: what it waits for
    notice_key: str = ""
    notice_from: str = ""  # the job a notice names (the one this job retried), when valid
    holdable: bool = False  # pending: Hold, or Release when it is held
    array: ArraySummary | None = None  # the array it is part of
    default_retries: int = 0  # MAX_JOB_RETRIES, for a job without retries of its own


def job_detail(
    service: Scheduler,
    job_id: str,
    show_env: bool,
    notice: str,
    notice_from: str = "",
    shown: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> JobDetail:
    """One job with every attempt; raises NotFound. Env values only when asked for, and
    then as `shown` lets the viewer see them (others' masked)."""
    job = service.reads.get(job_id)
    visible = dict(job.env_vars or {})
    if shown is not None and visible:
        visible = shown({"env_vars": visible, "owner": job.owner})["env_vars"]
    attempts = [
        _attempt_row(number, attempt, jobs.FAILED, current=False)
        for number, attempt in enumerate(job.attempts, start=1)
    ]
    # The current attempt's end reads as the header does (`cancelled`, `timed out`); the
    # earlier ones were retried, so each of them simply failed.
    attempts.append(_attempt_row(len(attempts) + 1, job, formatting.job_state(job), current=True))
    env = [(name, value if show_env else None) for name, value in visible.items()]
    return JobDetail(
        now=service.clock.now_us(),
        job=job,
        attempts=attempts,
        env=env,
        show_env=show_env,
        cancellable=jobs.can_cancel(job),
        retryable=actions.can_retry(job),
        notice=actions.NOTICES.get(notice),
        waiting_for=service.reads.waiting_for(job),
        notice_key=notice if notice in actions.NOTICES else "",
        # Only a job id is ever shown from the URL, so a link cannot put words on the page.
        notice_from=notice_from if jobs.parse_job_id(notice_from) is not None else "",
        holdable=job.status == jobs.PENDING,
        array=ArraySummary.of(service, job),
        default_retries=service.settings.max_job_retries,
    )


def _attempt_row(number: int, run: Job | Attempt, status: str, current: bool) -> AttemptRow:
    """A row of the attempts table: an earlier attempt, or the job itself for the current one
    (both carry the same node, exit code, outputs and times)."""
    return AttemptRow(
        number=number,
        node_id=run.node_id,
        status=status,
        exit_code=run.exit_code,
        stdout=run.stdout,
        stderr=run.stderr,
        running_at=run.running_at,
        finished_at=run.finished_at,
        current=current,
    )


# --- queues -----------------------------------------------------------------------------------


def queue_list(service: Scheduler) -> list[QueueView]:
    """Every queue that has jobs or settings, by name."""
    return service.queues.listing()


def set_paused(service: Scheduler, name: str, paused: bool) -> None:
    """Pause or resume a queue, keeping its limit (raises BadRequest for a bad name)."""
    if not queues.is_valid_name(name):
        raise errors.BadRequest(validation.QUEUE_MESSAGE)
    current = next((view for view in service.queues.listing() if view.queue == name), None)
    limit = current.max_running if current is not None else None
    service.queues.update(queues.QueueSettings(name, limit, paused))
