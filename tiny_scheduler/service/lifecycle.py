"""A job's life: submit, the agent's reports, cancel, failures seen by the scheduler, retries,
retention.

Each operation holds the job busy in the table (`table.changing`), lets the state machine
(`jobs`) decide the next version, and hands it to the core's one committer. Placement is asked
for a node only when a job is created or retried.

Tests: `tests/test_decisions.py`, `tests/test_harness.py`.
"""

from __future__ import annotations

import dataclasses
import logging

from .. import errors
from ..domain import fencing, jobs
from ..domain.jobs import Job, Reason
from ..domain.validation import JobRequest, JobUpdate
from . import dependencies
from .core import Core, job_seq

log = logging.getLogger("tiny_scheduler.service")

# The request fields a job keeps as they are (delay_secs becomes the job's not_before).
_REQUEST_FIELDS = tuple(
    field.name
    for field in dataclasses.fields(JobRequest)
    if field.name in {job_field.name for job_field in dataclasses.fields(Job)}
)


class Lifecycle:
    """Creating jobs and moving them through their states."""

    def __init__(self, core: Core) -> None:
        self._core = core

    def submit(
        self, request: JobRequest, dedupe_key: str | None = None, source: str = "http"
    ) -> tuple[Job, bool]:
        """Create a pending job, durable before this returns. With a dedupe key that already
        created a job, return that job instead; the bool says whether a job was created."""
        core = self._core
        table = core.table
        with table.deduplicating(dedupe_key) as existing:
            if existing is not None:
                return core.with_stored_output(existing), False
            self._check_dependencies(request)  # a 400 before a node is chosen
            node_id = core.placement.place(request.instance_id)
            if request.depends_on:
                job = self._create_dependent(request, dedupe_key, node_id)
            else:
                with table.creating() as seq:
                    job = self.new_job(request, dedupe_key, seq, node_id)
                    core.commit(job)
        core.created(job, source)
        if job.is_final:
            core.announce(job)
        return job, True

    def _check_dependencies(self, request: JobRequest) -> dict[int, Job | None]:
        """The jobs the request depends on, by seq; BadRequest naming the first that does
        not exist."""
        table = self._core.table
        found = {seq: table.get(seq) for seq in request.depends_on}
        lost = dependencies.missing(request.depends_on, found)
        if lost is not None:
            raise errors.BadRequest(f"depends_on: {jobs.job_id_of(lost)} not found")
        return found

    def _create_dependent(self, request: JobRequest, dedupe_key: str | None, node_id: str) -> Job:
        """Create a job with dependencies, under the dependency lock: a dependency failing
        meanwhile either finds it among its dependents or has failed before it is looked at.
        One whose `ok` dependency already failed ends at once (it could never run)."""
        core = self._core
        with core.dependency_lock:
            found = self._check_dependencies(request)  # again: as they stand under the lock
            with core.table.creating() as seq:
                job = self.new_job(request, dedupe_key, seq, node_id)
                failed = dependencies.doomed(job, found)
                if failed is not None:
                    job = dependencies.fail(job, failed, job.created_at)
                core.commit(job)
        return job

    def new_job(
        self,
        request: JobRequest,
        dedupe_key: str | None,
        seq: int,
        node_id: str,
        schedule_id: str = "",
    ) -> Job:
        """A new pending job for the request (not yet committed). Its node is chosen first,
        and only then its id taken (`table.creating`): a slow registry must not hold back
        every listing at an id in flight."""
        now = self._core.now()
        fields = {name: getattr(request, name) for name in _REQUEST_FIELDS}
        if request.delay_secs:
            fields["not_before"] = now + request.delay_secs * 1_000_000
        return Job(
            seq=seq,
            node_id=node_id,
            created_at=now,
            dedupe_key=dedupe_key,
            schedule_id=schedule_id,
            **fields,
        )

    def update(self, job_id: str, update: JobUpdate, credential: bool = False) -> Job:
        """Apply an agent's report: the claim (running), or the end of an attempt. The late
        end of an attempt the scheduler ended leaves the job as it is, keeps the attempt's
        output and frees its slot; a report about another attempt than the current one is
        refused (Conflict), its output kept on its own attempt. `credential`: the report
        carried one (with auth on); a keyless report for an attempt claimed with one is
        refused (Unauthorized), whatever it says."""
        core = self._core
        auth_on = core.settings.api_key is not None
        with core.table.changing(job_seq(job_id)) as job:
            claim = update.status == jobs.RUNNING
            if fencing.keyless_report_refused(job, auth_on, credential, claim):
                log.warning(
                    "job %s: a %s report without a key refused (its attempt was claimed with one)",
                    job.job_id,
                    update.status,
                )
                raise errors.Unauthorized(errors.UNAUTHORIZED)
            stale = fencing.stale_report(job, update.node_id, update.attempt, claim)
            if stale is not None:
                if not claim:
                    self._keep_stale_output(job, update)
                log.warning("job %s: %s (report from %s)", job.job_id, stale, update.node_id)
                raise errors.Conflict(stale)
            late = jobs.is_late_report(job, update.status)
            if late:
                new = self._late_report(job, update)
            else:
                now = core.now()
                try:
                    if claim:
                        named = update.node_id is not None or update.attempt is not None
                        new = jobs.start(job, now, named, keyed=auth_on and credential)
                    else:
                        new = self._end_attempt(job, update, now)
                except jobs.TransitionError as exc:
                    raise errors.Conflict(str(exc)) from None
                if new.status == jobs.RUNNING:
                    # A claim counts against its queue's limit from the check to the commit.
                    with core.table.starting(new):
                        core.commit(new)
                else:
                    core.commit(new)
        if late:
            # The job as it stands, with the output its timeout gave it (on disk by now).
            return core.with_stored_output(new)
        core.announce(new)
        return new

    def _late_report(self, job: Job, update: JobUpdate) -> Job:
        """(Busy marker held.) The agent ended an attempt the scheduler had ended already
        (timed out, cancelled, lost): its state stays, its output is kept on the attempt."""
        log.info(
            "job %s: late %s report (exit %s) from node %s after its %s; job unchanged",
            job.job_id,
            update.status,
            update.exit_code,
            job.node_id,
            job.reason,
        )
        stored = self._attempt_output(job, job.retry_count)
        kept = self._merged(stored, update)
        new = job.evolve(stdout=kept.stdout, stderr=kept.stderr) if kept != stored else job
        if update.usage is not None and new.usage != update.usage:
            new = new.evolve(usage=update.usage)  # what the attempt used, up to its end
        if job.holds_slot:
            new = jobs.release_slot(new)
            log.info("job %s: node %s's slot freed", job.job_id, job.node_id)
        if new is job:
            return job  # a repeated report with nothing new
        self._core.commit(new, becomes_final=False)
        return new.without_output()

    def _keep_stale_output(self, job: Job, update: JobUpdate) -> None:
        """(Busy marker held.) A stale final report about an earlier attempt of this job: its
        output goes on that attempt, which the scheduler had ended (lost, most likely)."""
        number = update.attempt
        if number is None or number >= len(job.attempts):
            return
        attempt = job.attempts[number]
        if update.node_id is not None and update.node_id != attempt.node_id:
            return  # not that attempt's node: not its output either
        stored = self._attempt_output(job, number)
        kept = self._merged(stored, update)
        usage = update.usage or attempt.usage
        if kept == stored and usage == attempt.usage:
            return
        attempts = list(job.attempts)
        attempts[number] = dataclasses.replace(attempt.with_output(kept), usage=usage)
        self._core.commit(job.evolve(attempts=tuple(attempts)), becomes_final=False)

    def _attempt_output(self, job: Job, number: int) -> jobs.Output:
        """What the store holds of one attempt's output (live output, or its end's)."""
        found = self._core.store.read_outputs(job.seq) or {}
        return found.get(number) or jobs.Output("", "")

    def _merged(self, stored: jobs.Output, update: JobUpdate) -> jobs.Output:
        cap = self._core.settings.max_output_bytes
        merged = jobs.late_output(stored, jobs.Output(update.stdout, update.stderr))
        return jobs.Output(jobs.cap_output(merged.stdout, cap), jobs.cap_output(merged.stderr, cap))

    def _live_output(self, job: Job) -> jobs.Output:
        """The running attempt's output so far (what its agent sent live), which the
        scheduler's end of the attempt keeps; none for a job that is not running."""
        if job.status != jobs.RUNNING:
            return jobs.Output("", "")
        return self._attempt_output(job, job.retry_count)

    def cancel(self, job_id: str) -> Job:
        core = self._core
        with core.table.changing(job_seq(job_id)) as job:
            try:
                new = self._capped(jobs.cancel(job, core.now(), self._live_output(job)))
            except jobs.TransitionError as exc:
                raise errors.Conflict(str(exc)) from None
            core.commit(new)
        core.announce(new)
        return new

    def fail_running(self, seq: int, reason: Reason, stderr: str | None = None) -> Job | None:
        """Fail a running job from the scheduler's side (`timeout`, `node_lost`), with the
        retry rule; `stderr` replaces the reason's usual text. None when the job is no longer
        running by the time it is looked at."""
        core = self._core
        with core.table.changing(seq) as job:
            if job.status != jobs.RUNNING:
                return None
            failed = jobs.fail_by_scheduler(job, reason, core.now(), stderr, self._live_output(job))
            new = self._maybe_retry(self._capped(failed))
            core.commit(new)
        core.announce(new)
        return new

    def release_slot(self, seq: int) -> Job | None:
        """Free the slot a timed-out job kept (its node counts as lost: whatever ran there is
        gone); None when it holds none by now."""
        core = self._core
        with core.table.changing(seq) as job:
            if not job.holds_slot:
                return None
            new = jobs.release_slot(job)
            core.commit(new, becomes_final=False)
        log.info("job %s: slot on lost node %s freed", job.job_id, job.node_id)
        return new

    def expire(self, cutoff: int, limit: int = 10000) -> int:
        """Delete up to `limit` jobs that finished before `cutoff`; returns how many."""
        core = self._core
        seqs = core.table.finished_before(cutoff, limit)
        if seqs:
            core.store.delete(seqs)
            core.table.remove(seqs)
            log.info("retention removed %d finished jobs", len(seqs))
        return len(seqs)

    def _end_attempt(self, job: Job, update: JobUpdate, now: int) -> Job:
        cap = self._core.settings.max_output_bytes
        if update.timed_out:
            # The agent stopped it at its timeout: final, as the scan's timeout is.
            stderr = jobs.with_last_line(update.stderr, jobs.TIMED_OUT_STDERR)
            new = jobs.finish(
                job, jobs.FAILED, -1, update.stdout, stderr, now, jobs.Reason.TIMEOUT, update.usage
            )
            return self._capped(new)
        if update.out_of_memory:
            # Killed for its memory limit on the node: final too (it would run out again).
            stderr = jobs.with_last_line(update.stderr, jobs.OUT_OF_MEMORY_STDERR)
            new = jobs.finish(
                job,
                jobs.FAILED,
                update.exit_code,
                update.stdout,
                stderr,
                now,
                jobs.Reason.OUT_OF_MEMORY,
                update.usage,
            )
            return self._capped(new)
        new = jobs.finish(
            job,
            update.status,
            update.exit_code,
            jobs.cap_output(update.stdout, cap),
            jobs.cap_output(update.stderr, cap),
            now,
            usage=update.usage,
        )
        return self._maybe_retry(new)

    def _capped(self, job: Job) -> Job:
        """The version with its current output within MAX_OUTPUT_BYTES (a note added after
        a capped output can pass it by a line)."""
        cap = self._core.settings.max_output_bytes
        return job.evolve(
            stdout=jobs.cap_output(job.stdout, cap), stderr=jobs.cap_output(job.stderr, cap)
        )

    def _maybe_retry(self, failed: Job) -> Job:
        core = self._core
        if not jobs.should_retry(failed, core.settings.max_job_retries):
            return failed
        try:
            node_id = core.placement.place(failed.instance_id, avoid=failed.node_id)
        except errors.PlacementError as exc:
            # The agent never repeats its final report, so a registry hiccup must not turn
            # it into an error: keep the node; the lost-node scan moves the job if need be.
            log.warning("job %s: retry stays on node %s (%s)", failed.job_id, failed.node_id, exc)
            node_id = failed.node_id
        return jobs.retry(failed, node_id)
