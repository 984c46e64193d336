"""The periodic scan: run timeouts, lost nodes, and retention, every TIMEOUT_SCAN_INTERVAL_SECS.

- Timeouts: a running `run` job past its `timeout_secs` (or JOB_TIMEOUT_SECS), counted from
  `running_at`, fails with exit -1, `job timed out` and reason `timeout`, and is not retried
  (on a node whose agent fences, and so stops its jobs at their timeout itself, only after the
  kill grace and two heartbeat periods more: the scan is the backstop there).
  It keeps its slot (its process still runs on the node) until the agent's late report.
  Services have no scheduler timeout.
- Lost nodes: a pending job whose node is gone from the registry or unhealthy is placed again
  on a healthy node (instance-pinned jobs stay: their instance lives there). A running job
  whose node has been gone or unhealthy for longer than NODE_LOST_SECS (and, when its agent
  fences, whose fence has surely stopped it: `fencing.lost_at`) fails as an attempt
  with exit -1 and `node lost`, and the retry rule sends it elsewhere (reason `node_lost` when
  no retry is left); a timed-out job's slot there is freed. When the registry cannot be
  reached nothing moves: an outage of the registry is not an outage of every node.
- Retention: finished jobs older than JOB_RETENTION_SECS leave memory and the database.

Each step works on one job at a time through the service, and one job's failure is logged and
skipped, never the end of the sweep. The scan reads only running jobs and the jobs of nodes
that are in trouble, so its cost does not grow with history.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .. import errors
from ..domain import jobs
from ..service import Scheduler
from ..service.moves import judge_nodes

log = logging.getLogger(__name__)

RETENTION_BATCH = 5000
"""Jobs deleted per retention transaction, so one sweep never holds the writer for long."""


class Scan:
    """One scan's state between ticks: since when each troubled node has been seen down."""

    def __init__(self, service: Scheduler) -> None:
        self.service = service
        self.settings = service.settings
        self.clock = service.clock
        self._down_since: dict[str, float] = {}  # node id -> monotonic time first seen down

    def reset(self) -> None:
        """Count every node as freshly seen: its lost-node clock starts again."""
        self._down_since.clear()

    def tick(self) -> None:
        self.expire_timeouts()
        self.handle_lost_nodes()
        self.apply_retention()

    def expire_timeouts(self) -> int:
        """Fail every running job past its deadline; returns how many. On a node whose agent
        fences (this project's, which stops its own jobs at their timeout) the scan is only
        the backstop: it waits the kill grace and two heartbeat periods more, so that the
        agent's own report, with the job's output, comes first."""
        now = self.clock.now_us()
        expired = 0
        fencing_nodes = self.service.nodes.fence_holds().keys()
        slack = self.settings.kill_grace_secs + 2 * self.settings.node_heartbeat_secs
        for job in self.service.reads.running():
            deadline = jobs.run_deadline(job, self.settings.job_timeout_secs)
            if deadline is not None and job.node_id in fencing_nodes:
                deadline += int(slack * 1_000_000)
            if deadline is None or now < deadline:
                continue
            if _guarded(self.service.jobs.fail_running, job, jobs.Reason.TIMEOUT):
                log.warning("job %s timed out on node %s", job.job_id, job.node_id)
                expired += 1
        return expired

    def handle_lost_nodes(self) -> None:
        busy = self.service.reads.busy_nodes()
        if not busy:
            self._down_since.clear()
            return
        try:
            nodes = self.service.reads.node_health()
        except errors.PlacementError as exc:
            log.warning("lost-node scan skipped: %s", exc.message)
            return
        verdict = judge_nodes(
            busy,
            nodes,
            self._down_since,
            self.clock.monotonic(),
            self.settings.node_lost_secs,
            self.service.nodes.fence_holds(),
        )
        self._down_since = verdict.down_since
        for node in verdict.replace:
            for job in self.service.reads.jobs_on(node).pending:
                _guarded(
                    self.service.dispatch.move_pending, job
                )  # it leaves pinned jobs where they are
        for node in verdict.lost:
            on_node = self.service.reads.jobs_on(node)
            for job in on_node.running:
                if _guarded(self.service.jobs.fail_running, job, jobs.Reason.NODE_LOST):
                    log.warning("job %s lost with node %s", job.job_id, node)
            for job in on_node.held:
                _guarded(self.service.jobs.release_slot, job)

    def apply_retention(self) -> int:
        """Delete finished jobs and audit records older than JOB_RETENTION_SECS; returns how
        many jobs."""
        keep_secs = self.settings.job_retention_secs
        if not keep_secs:
            return 0
        cutoff = self.clock.now_us() - keep_secs * 1_000_000
        removed = 0
        while True:
            count = self.service.jobs.expire(cutoff, RETENTION_BATCH)
            removed += count
            if count < RETENTION_BATCH:
                break
        # The audit trail is kept as long as the jobs it is about.
        while self.service.audit.expire(cutoff, RETENTION_BATCH) == RETENTION_BATCH:
            pass
        return removed


def _guarded(action: Callable[..., object], job: jobs.Job, *args: object) -> object:
    """Run one job's step; log and go on when it fails (the next scan tries again)."""
    try:
        return action(job.seq, *args)
    except errors.ServiceError as exc:
        log.warning("scan: job %s: %s", job.job_id, exc.message)
    except Exception:
        log.exception("scan: job %s failed", job.job_id)
    return None
