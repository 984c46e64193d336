"""Prometheus metrics: every metric object of one scheduler, and their wiring to its hooks.

Each app gets its own `CollectorRegistry` (never prometheus-client's global one), so two
schedulers in one process keep separate numbers. The metrics are fed only by the hooks the
parts already offer: the service's listeners (job events), the store's commit observers, the
registry's and the SQS/SNS clients' call observers, and a before/after-request pair timing
each HTTP request. Gauges that describe current state (jobs by status, store health, SNS queue
depth) are read at scrape time by a custom collector, so nothing has to keep them in step.

Labels stay bounded: statuses, reasons, sources, Flask endpoint names, HTTP status codes, peer
call results; never a job id. Node ids appear on one gauge only (queue depth per node), read
at scrape time for the nodes that have waiting jobs, at most `MAX_NODE_SERIES` of them: a
node that leaves takes its series with it. Queue names likewise, on the jobs-per-queue gauge.
Every request pays one cached child lookup and one observation for its timing; the job event
it causes (submit, poll, PATCH) adds a counter increment or two and at most one more
observation. Nothing on these paths scans the table.

No HTTP here beyond the request hooks: `api/metrics.py` serves the text format.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from flask import Flask, Response, g, request
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from .cluster.peers import CallObserver, Outcome
from .domain import jobs
from .domain.jobs import Job
from .domain.schedules import SkipCause
from .server import inline
from .server.waiting import WAITED_KEY
from .service import Event, Move, Scheduler
from .version import version

if TYPE_CHECKING:
    from .loops import Background
    from .loops.schedules import Outcome as FireOutcome

log = logging.getLogger(__name__)

PREFIX = "tiny_scheduler_"

_EXTENSION = "tiny_scheduler.metrics"
_STARTED = "_tiny_scheduler_started"  # attribute of flask.g: when the request began

UNMATCHED_ENDPOINT = "unmatched"
"""Endpoint label of requests no route matched (404, 405): one value, whatever the path."""

HTTP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""Seconds. Polls and reads take well under a millisecond; a submission waits for one fsync
and maybe one registry call (seconds when the registry is slow)."""

COMMIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
"""Seconds of one group commit (an fsync on most disks: a few milliseconds)."""

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Callers whose changes one group commit carried."""

WAIT_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 86400)
"""Seconds a job waited pending: agents poll every 3 s, so a few seconds is an idle cluster."""

RUN_BUCKETS = (0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400)
"""Seconds an attempt ran: from quick one-shot jobs to long-lived services."""

SOURCES = ("http", "sqs", "schedule")
PEERS = ("registry", "sqs", "sns")
MOVES = tuple(move.value for move in Move)

MAX_NODE_SERIES = 100
"""Nodes given a series of their own on the per-node queue gauge; the waiting jobs of any
further nodes are added up under `node="_other"`, so a huge cluster cannot flood Prometheus."""

OTHER_NODES = "_other"


class Metrics:
    """The metric objects of one scheduler, and the observers that feed them."""

    def __init__(self, service: Scheduler) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        self.queue_depth: Callable[[], int] | None = None  # set by watch_background
        reg = self.registry

        self.submitted = Counter(
            PREFIX + "jobs_submitted",
            "Jobs created, by where the request came from (http, sqs).",
            ["source"],
            registry=reg,
        )
        self.finished = Counter(
            PREFIX + "jobs_finished",
            "Jobs that reached a final status (done, or failed after its last retry), by status "
            "and, for failures, reason (exit, timeout, node_lost, cancelled).",
            ["status", "reason"],
            registry=reg,
        )
        self.retries = Counter(
            PREFIX + "job_retries",
            "Failed attempts put back to pending for another try.",
            registry=reg,
        )
        self.timeouts = Counter(
            PREFIX + "job_timeouts",
            "Running jobs failed by the scheduler because they ran past their timeout.",
            registry=reg,
        )
        self.node_lost = Counter(
            PREFIX + "node_lost_failures",
            "Running attempts failed by the scheduler because their node was gone too long.",
            registry=reg,
        )
        self.moved = Counter(
            PREFIX + "jobs_moved",
            "Waiting jobs moved to another node, by why: stolen (an idle node's poll took it "
            "from a node that could not start it) or node_down (its node was unhealthy or gone).",
            ["why"],
            registry=reg,
        )
        self.polls = Counter(
            PREFIX + "agent_polls",
            "Agent polls answered (GET /jobs?node_id=N&status=pending).",
            registry=reg,
        )
        self.wait_seconds = Histogram(
            PREFIX + "job_wait_seconds",
            "Seconds from submission (or from the retry) until an agent claimed the job.",
            buckets=WAIT_BUCKETS,
            registry=reg,
        )
        self.run_seconds = Histogram(
            PREFIX + "job_run_seconds",
            "Seconds from an agent's claim until the attempt ended, by job type and outcome.",
            ["job_type", "status"],
            buckets=RUN_BUCKETS,
            registry=reg,
        )
        self.http_seconds = Histogram(
            PREFIX + "http_request_duration_seconds",
            "Seconds spent answering HTTP requests, by Flask endpoint and status code.",
            # `code`, the name Prometheus' own exporters give an HTTP status, so that dashboards
            # and alerts written for them (code=~"5..") read ours; `status` is a job's status.
            ["endpoint", "code"],
            buckets=HTTP_BUCKETS,
            registry=reg,
        )
        self.commit_seconds = Histogram(
            PREFIX + "store_commit_duration_seconds",
            "Seconds per SQLite group commit (one transaction and its fsync).",
            buckets=COMMIT_BUCKETS,
            registry=reg,
        )
        self.commit_batch = Histogram(
            PREFIX + "store_commit_batch_size",
            "Writers whose changes one group commit carried.",
            buckets=BATCH_BUCKETS,
            registry=reg,
        )
        self.peer_calls = Counter(
            PREFIX + "peer_calls",
            "Calls to the registry, SQS and SNS, by peer, endpoint and result "
            "(ok, error, unreachable, garbage).",
            ["peer", "endpoint", "result"],
            registry=reg,
        )
        self.schedule_fires = Counter(
            PREFIX + "schedule_fires",
            "Jobs made by schedules at their fire times (catch-ups included).",
            registry=reg,
        )
        self.schedule_catch_ups = Counter(
            PREFIX + "schedule_catch_ups",
            "Fires made for a fire time missed while no scheduler ran (catch_up: true).",
            registry=reg,
        )
        self.schedule_skips = Counter(
            PREFIX + "schedule_skips",
            "Fire times that passed without a job, by cause (overlap, missed, placement, store).",
            ["cause"],
            registry=reg,
        )
        # The usual build_info gauge (always 1, the facts in its labels): a graph can show
        # when each daemon was upgraded, and a query can join it to any other series.
        build = Gauge(PREFIX + "build_info", "The running build.", ["version"], registry=reg)
        build.labels(version()).set(1)
        reg.register(_StateCollector(self))
        # Memory, CPU, open files and GC of this process: the first things to look at when the
        # scheduler misbehaves. Registered per app too; they read the same process.
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)

        # Known label values start at zero, so rate() and alerts see them before the first event.
        for source in SOURCES:
            self.submitted.labels(source)
        self.finished.labels(jobs.DONE, "")
        for reason in jobs.REASONS:
            self.finished.labels(jobs.FAILED, reason)
        for move in MOVES:
            self.moved.labels(move)
        for cause in SkipCause:
            self.schedule_skips.labels(cause.value)
        # Request children by (endpoint, status): prometheus-client's labels() validates and
        # locks on every call; this dict lookup is all the hot paths pay.
        self._http_children: dict[tuple[str, int], Histogram] = {}

    # --- observers ---------------------------------------------------------------------------

    def listener(self, event: Event, job: Job | None, detail: str) -> None:
        """A service listener: count job events and time their lifecycle."""
        if event == Event.POLLED:
            self.polls.inc()
        elif job is None:
            return
        elif event == Event.SUBMITTED:
            self.submitted.labels(detail or "http").inc()
        elif event == Event.STARTED:
            self._started(job)
        elif event == Event.FINISHED:
            self._finished(job)
        elif event == Event.RETRIED:
            self._retried(job)
        elif event == Event.MOVED:
            self.moved.labels(detail or Move.NODE_DOWN.value).inc()

    def observe_commit(self, seconds: float, batch_size: int) -> None:
        """A store commit observer."""
        self.commit_seconds.observe(seconds)
        self.commit_batch.observe(batch_size)

    def watch_peers(self, observers: list[CallObserver]) -> None:
        """Count every call to a peer (registry, SQS, SNS) by peer, endpoint and outcome."""
        calls = self.peer_calls

        def observe(peer: str, endpoint: str, outcome: Outcome) -> None:
            calls.labels(peer, endpoint, outcome.value).inc()

        observers.append(observe)

    def watch_background(self, background: Background) -> None:
        """Read the SNS queue depth, when SNS is on; count the schedules' fires and skips."""
        if background.sns is not None:
            self.queue_depth = background.sns.depth  # read at each scrape: must be cheap
        background.schedules.observers.append(self.observe_fire)

    def observe_fire(self, outcome: FireOutcome, cause: SkipCause | None) -> None:
        """A schedule fire observer."""
        if outcome == "fired":
            self.schedule_fires.inc()
        elif outcome == "caught_up":
            self.schedule_catch_ups.inc()
        elif cause is not None:
            self.schedule_skips.labels(cause.value).inc()

    # --- HTTP request timing -----------------------------------------------------------------

    def request_started(self) -> None:
        setattr(g, _STARTED, time.perf_counter())

    def request_finished(self, response: Response) -> Response:
        started = getattr(g, _STARTED, None)
        # A request sent on to a thread (inline.py) is timed when it runs there; a parked
        # wait (waiting.py) is timed when it parks, not again when it runs after its wake.
        if (
            started is not None
            and response.response is not inline.NEEDS_THREAD
            and request.environ.get(WAITED_KEY) is None
        ):
            key = (request.endpoint or UNMATCHED_ENDPOINT, response.status_code)
            child = self._http_children.get(key)
            if child is None:
                child = self._http_children[key] = self.http_seconds.labels(key[0], str(key[1]))
            child.observe(time.perf_counter() - started)
        return response

    # --- job events --------------------------------------------------------------------------

    def _started(self, job: Job) -> None:
        if job.running_at is None:
            return
        # A retried job waited since its last attempt ended, not since it was first submitted.
        queued_at = job.attempts[-1].finished_at if job.attempts else job.created_at
        if queued_at is not None:
            self.wait_seconds.observe(max(0, job.running_at - queued_at) / 1e6)

    def _finished(self, job: Job) -> None:
        self.finished.labels(job.status, job.reason or "").inc()
        if job.reason == jobs.Reason.TIMEOUT:
            self.timeouts.inc()
        elif job.reason == jobs.Reason.NODE_LOST:
            self.node_lost.inc()
        if job.running_at is not None and job.finished_at is not None:
            self._observe_run(job.job_type, job.status, job.running_at, job.finished_at)

    def _retried(self, job: Job) -> None:
        self.retries.inc()
        if not job.attempts:
            return
        attempt = job.attempts[-1]
        # An attempt keeps no reason; the scheduler's own failure of one that is retried (a
        # lost node; a timeout is never retried) is known by its fixed text, exit -1.
        if attempt.exit_code == -1 and attempt.stderr == jobs.NODE_LOST_STDERR:
            self.node_lost.inc()
        if attempt.running_at is not None and attempt.finished_at is not None:
            self._observe_run(job.job_type, jobs.FAILED, attempt.running_at, attempt.finished_at)

    def _observe_run(self, job_type: str, status: str, running_at: int, finished_at: int) -> None:
        seconds = max(0, finished_at - running_at) / 1e6
        self.run_seconds.labels(job_type, status).observe(seconds)


class _StateCollector(Collector):
    """Gauges of current state, read when Prometheus scrapes rather than kept in step."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return self._families(with_values=False)

    def collect(self) -> Iterable[Metric]:
        return self._families(with_values=True)

    def _families(self, with_values: bool) -> list[Metric]:
        service = self._metrics.service
        by_status = GaugeMetricFamily(
            PREFIX + "jobs", "Jobs in the scheduler, by status.", labels=["status"]
        )
        healthy = GaugeMetricFamily(
            PREFIX + "store_healthy",
            "1 while the job store can be written (its latest write or probe, at most a few "
            "seconds old, succeeded), else 0.",
        )
        depth = GaugeMetricFamily(
            PREFIX + "sns_queue_depth",
            "Final-state events waiting in the outbox to be published to SNS (0 when SNS is off).",
        )
        node_queue = GaugeMetricFamily(
            PREFIX + "node_queue_depth",
            f"Pending jobs waiting on each node that has any (at most {MAX_NODE_SERIES} nodes; "
            f'the rest under node="{OTHER_NODES}").',
            labels=["node"],
        )
        by_queue = GaugeMetricFamily(
            PREFIX + "queue_jobs",
            f"Pending and running jobs of each queue that has any (at most {MAX_NODE_SERIES} "
            f'queues; the rest under queue="{OTHER_NODES}").',
            labels=["queue", "status"],
        )
        leader = GaugeMetricFamily(
            PREFIX + "leader",
            "1 while this daemon leads and serves (always with SQLite), 0 on a standby.",
        )
        changes = CounterMetricFamily(
            PREFIX + "leader_changes",
            "Times this daemon saw the leadership change hands (the lease's epoch rise, its own "
            "takeovers included) since it started.",
        )
        if with_values:
            # Queue names come from submitters: bounded like the node series.
            active = [view for view in service.queues.listing() if view.pending or view.running]
            for status in (jobs.PENDING, jobs.RUNNING):
                counts = {view.queue: getattr(view, status) for view in active}
                for name, count in _bounded(counts):
                    by_queue.add_metric([name, status], count)
            leader.add_metric([], 1 if service.terms.is_serving() else 0)
            changes.add_metric([], service.terms.leader_changes())
            for status, count in service.reads.counts().items():
                by_status.add_metric([status], count)
            healthy.add_metric([], 1 if service.reads.store_health()[0] else 0)
            queue_depth = self._metrics.queue_depth
            depth.add_metric([], queue_depth() if queue_depth is not None else 0)
            for node, count in _bounded(service.reads.queue_depths()):
                node_queue.add_metric([node], count)
        return [by_status, healthy, depth, node_queue, by_queue, leader, changes]


def _bounded(depths: dict[str, int]) -> list[tuple[str, int]]:
    """The first MAX_NODE_SERIES nodes by id with their depth, the rest added up."""
    ordered = sorted(depths.items())
    shown = ordered[:MAX_NODE_SERIES]
    rest = sum(count for _, count in ordered[MAX_NODE_SERIES:])
    return [*shown, (OTHER_NODES, rest)] if rest else shown


def init_app(app: Flask, service: Scheduler) -> Metrics:
    """Create the app's metrics, hook them to the service's events and commits, and time
    every request (`api/metrics.py` serves them)."""
    # No `<name>_created` series beside each counter and histogram: a start-up timestamp per
    # series that nobody graphs, doubling the scrape. The switch is the client's, process-wide.
    disable_created_metrics()
    metrics = Metrics(service)
    service.listeners.append(metrics.listener)
    service.reads.watch_commits(metrics.observe_commit)
    # First of all before-request hooks: a request the auth check refuses is timed too.
    app.before_request_funcs.setdefault(None, []).insert(0, metrics.request_started)
    app.after_request(metrics.request_finished)
    app.extensions[_EXTENSION] = metrics
    return metrics


def metrics_of(app: Flask) -> Metrics:
    """The metrics of an app built by `create_app`."""
    return app.extensions[_EXTENSION]
