"""A job's life: submit (one job, or an array of copies), the agent's reports, cancel, hold and
release, failures seen by the scheduler, retries (of an attempt, and of a whole finished job as
a new one), retention.

Each operation holds the job busy in the table (`table.changing`), lets the state machine
(`jobs`) decide the next version, and hands it to the core's one committer. Placement is asked
for a node only when a job is created or retried.

An array (`array: N`) is N copies of the request made in one transaction, with consecutive
ids: each is placed by the placement rule as a submission of its own would be, and carries
`array_id` (the first one's id), `array_index` (0…N-1) and `TINY_ARRAY_INDEX` in its
environment; the submission answers the first. An Idempotency-Key belongs to the first.

A batch (`submit_batch`) is several submissions made in one transaction, all or nothing: each
checked and placed as it would be alone (and seeing the ones placed before it), with
consecutive ids, answered by the first job of each. Its Idempotency-Key belongs to its first
job, and `KEY#i` to the first of its item i, so that a repeat answers the same jobs.

Tests: `tests/test_decisions.py`, `tests/test_harness.py`, `tests/test_batch_comforts.py`,
`tests/test_batch_submission.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence

from .. import errors
from ..domain import fencing, jobs
from ..domain.jobs import Job, Reason
from ..domain.placement import NEVER_FITS
from ..domain.validation import JobRequest, JobUpdate
from . import dependencies
from .core import Core, Event, job_seq

log = logging.getLogger("tiny_scheduler.service")

ARRAY_INDEX_VAR = "TINY_ARRAY_INDEX"
"""The environment variable that tells each copy of an array its index (Slurm's
SLURM_ARRAY_TASK_ID)."""

_NOT_REPEATED = frozenset({"not_before", "delay_secs"})
"""Request fields a retry as a new job does not repeat: a time that has passed, a delay that
already passed once."""

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
        self,
        request: JobRequest,
        dedupe_key: str | None = None,
        source: str = "http",
        owner: str = "",
        retry_of: int = 0,
    ) -> tuple[Job, bool]:
        """Create a pending job (an array: its copies), durable before this returns, and
        return it (an array's first). With a dedupe key that already created a job, return
        that job instead; the bool says whether a job was created. `owner`: the user whose
        token submitted it ("" for the shared key); `retry_of`: the job this one retries as a
        new job."""
        core = self._core
        with core.table.deduplicating(dedupe_key) as existing:
            if existing is not None:
                return core.with_stored_output(existing), False
            self._check(request)  # a 400 before a node is chosen
            # Each copy placed as a submission of its own would be, each seeing the ones
            # before it: the rotation moves on, and loads count the copies placed already.
            node_ids = core.placement.place_many(
                request.array or 1, request.instance_id, wants=request
            )
            (made,) = self._create([request], [dedupe_key], [node_ids], owner, retry_of)
        self._tell([request], [made], source)
        return made[0], True

    def submit_batch(
        self,
        requests: Sequence[JobRequest],
        dedupe_key: str | None = None,
        source: str = "http",
        owner: str = "",
    ) -> tuple[list[Job], bool]:
        """Create the jobs of several submissions in one transaction, durable before this
        returns, and return the first job of each (an array's first copy); with a dedupe key
        that already made a batch, return that batch's jobs instead. The bool says whether
        jobs were created. An error about one item is that of its submission alone, its
        message prefixed `job <index>: `, and nothing is created."""
        core = self._core
        with core.table.deduplicating(dedupe_key) as existing:
            if existing is not None:
                return self._batch_of(existing, dedupe_key), False
            for index, request in enumerate(requests):
                with _about_item(index):
                    self._check(request)
            node_ids = core.placement.place_each(
                [(request.array or 1, request.instance_id, request) for request in requests]
            )
            keys = [dedupe_key] + [
                f"{dedupe_key}#{index}" if dedupe_key else None for index in range(1, len(requests))
            ]
            made = self._create(requests, keys, node_ids, owner, in_batch=True)
        self._tell(requests, made, source)
        return [copies[0] for copies in made], True

    def _check(self, request: JobRequest) -> None:
        """A submission's 400s that need the table and the nodes: an unknown dependency, a
        job no node could ever run."""
        self._check_dependencies(request)
        if not request.instance_id:
            self.check_fits(request)

    def _create(
        self,
        requests: Sequence[JobRequest],
        keys: Sequence[str | None],
        node_ids: Sequence[list[str]],
        owner: str,
        retry_of: int = 0,
        in_batch: bool = False,
    ) -> list[list[Job]]:
        """Make and commit, in one transaction with consecutive ids, the jobs of submissions
        already checked and placed: for each, its job or its array's copies. With
        dependencies, under the dependency lock: a dependency failing meanwhile either finds
        them among its dependents or has failed before they are looked at. One whose `ok`
        dependency already failed ends at once (it could never run)."""
        core = self._core
        dependent = any(request.depends_on for request in requests)
        with core.dependency_lock if dependent else contextlib.nullcontext():
            found = []
            for index, request in enumerate(requests):
                # Again, as they stand under the lock.
                with _about_item(index) if in_batch else contextlib.nullcontext():
                    found.append(self._check_dependencies(request) if request.depends_on else {})
            with core.table.creating(sum(map(len, node_ids))) as seq:
                made: list[list[Job]] = []
                for request, key, nodes, depends in zip(
                    requests, keys, node_ids, found, strict=True
                ):
                    copies = self._copies(request, key, seq, nodes, retry_of, owner)
                    failed = dependencies.doomed(copies[0], depends) if depends else None
                    if failed is not None:  # the same for every copy
                        copies = [dependencies.fail(job, failed, job.created_at) for job in copies]
                    made.append(copies)
                    seq += len(copies)
                core.commit_new([job for copies in made for job in copies])
        return made

    def _tell(self, requests: Sequence[JobRequest], made: Sequence[list[Job]], source: str) -> None:
        """Log and announce what `_create` committed."""
        core = self._core
        for request, copies in zip(requests, made, strict=True):
            if request.array:
                core.created_array(copies, source)
            else:
                core.created(copies[0], source)
            for job in copies:
                if job.is_final:
                    core.announce(job)

    def _batch_of(self, first: Job, dedupe_key: str | None) -> list[Job]:
        """The first job of each item of the batch that `first` began (those still kept)."""
        found = [first]
        index = 1
        while (job := self._core.table.keyed(f"{dedupe_key}#{index}")) is not None:
            found.append(job)
            index += 1
        return [self._core.with_stored_output(job) for job in found]

    def _copies(
        self,
        request: JobRequest,
        dedupe_key: str | None,
        seq: int,
        node_ids: list[str],
        retry_of: int = 0,
        owner: str = "",
    ) -> list[Job]:
        """The jobs of one submission (not yet committed), from id `seq` on: the job, or an
        array's copies (the dedupe key is the first one's)."""
        first = self.new_job(request, dedupe_key, seq, node_ids[0], owner=owner)
        if retry_of:
            first = first.evolve(retry_of=retry_of)
        if not request.array:
            return [first]
        env = first.env_vars or {}
        return [
            first.evolve(
                seq=seq + index,
                node_id=node_id,
                dedupe_key=dedupe_key if index == 0 else None,
                array_id=seq,
                array_index=index,
                env_vars={**env, ARRAY_INDEX_VAR: str(index)},
            )
            for index, node_id in enumerate(node_ids)
        ]

    def check_fits(self, request: JobRequest) -> None:
        """BadRequest (`no node can run this job: …`) when no known node could ever run the
        job, even empty: checked after the body's other 400s and before placement's 503."""
        why = self._core.placement.never_fits(request)
        if why is not None:
            raise errors.BadRequest(NEVER_FITS + why)

    def _check_dependencies(self, request: JobRequest) -> dict[int, Job | None]:
        """The jobs the request depends on, by seq; BadRequest naming the first that does
        not exist."""
        table = self._core.table
        found = {seq: table.get(seq) for seq in request.depends_on}
        lost = dependencies.missing(request.depends_on, found)
        if lost is not None:
            raise errors.BadRequest(f"depends_on: {jobs.job_id_of(lost)} not found")
        return found

    def retry_as_new(self, job_id: str, source: str = "http", owner: str | None = None) -> Job:
        """Submit a finished job's request again, as a new job whose `retry_of` names it
        (`POST /jobs/{id}/retry`), the job of `owner` (None: the old job's owner). NotFound
        for an unknown id, Conflict `job is not finished` for a job still waiting or running,
        and what a submission may raise."""
        old = self._core.table.get(job_seq(job_id))
        if old is None:
            raise errors.NotFound(errors.JOB_NOT_FOUND)
        if not jobs.can_retry_as_new(old):
            raise errors.Conflict(errors.NOT_FINISHED)
        new, _ = self.submit(
            self._request_of(old),
            source=source,
            owner=old.owner if owner is None else owner,
            retry_of=old.seq,
        )
        log.info("job %s submitted again as %s", old.job_id, new.job_id)
        return new

    def _request_of(self, job: Job) -> JobRequest:
        """The request that made `job`, as a retry repeats it: its time (`not_before`) left
        out, and the dependencies retention has removed since (they ended long ago: one that
        is gone counts as met). An array's copy is one job again, with its index in its
        environment still."""
        fields = {
            field.name: getattr(job, field.name)
            for field in dataclasses.fields(JobRequest)
            if field.name in _REQUEST_FIELDS and field.name not in _NOT_REPEATED
        }
        table = self._core.table
        fields["depends_on"] = tuple(seq for seq in job.depends_on if table.get(seq) is not None)
        return JobRequest(**fields)

    def hold(self, job_id: str) -> Job:
        """Hold a pending job: it is not handed out until released (Conflict `job is not
        pending` otherwise; a held job stays as it is)."""
        return self._set_hold(job_id, jobs.hold, Event.HELD)

    def release(self, job_id: str) -> Job:
        """Release a held job: it waits like any other pending job again (Conflict `job is not
        pending` otherwise; a job not held stays as it is)."""
        return self._set_hold(job_id, jobs.release, Event.RELEASED)

    def _set_hold(self, job_id: str, change: Callable[[Job], Job], event: Event) -> Job:
        core = self._core
        with core.table.changing(job_seq(job_id)) as job:
            try:
                new = change(job)
            except jobs.NotPending:
                raise errors.Conflict(errors.NOT_PENDING) from None
            if new is job:
                return job  # held already, or not held: nothing to change
            core.commit(new)
        log.info("job %s %s on node %s", new.job_id, event, new.node_id)
        core.emit(event, new)
        return new

    def new_job(
        self,
        request: JobRequest,
        dedupe_key: str | None,
        seq: int,
        node_id: str,
        schedule_id: str = "",
        owner: str = "",
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
            owner=owner,
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
            node_id = core.placement.place(failed.instance_id, avoid=failed.node_id, wants=failed)
        except errors.PlacementError as exc:
            # The agent never repeats its final report, so a registry hiccup must not turn
            # it into an error: keep the node; the lost-node scan moves the job if need be.
            log.warning("job %s: retry stays on node %s (%s)", failed.job_id, failed.node_id, exc)
            node_id = failed.node_id
        return jobs.retry(failed, node_id)


@contextlib.contextmanager
def _about_item(index: int) -> Iterator[None]:
    """Errors raised inside are about item `index` of a batch (`job <index>: …`)."""
    try:
        yield
    except errors.ServiceError as exc:
        raise exc.of_item(index) from None
