"""The /jobs resource: submit (one job, or an array; or a batch of submissions), list (and the
agent poll), read, update, cancel, hold and release, retry as a new job."""

from __future__ import annotations

from urllib.parse import urlencode

from flask import Blueprint, Response, request
from werkzeug.exceptions import HTTPException

from .. import errors
from ..domain import validation
from ..domain.jobs import JOB_ID_PREFIX
from ..server import inline
from . import access, auth
from .replies import json_array_reply, json_reply, scheduler

bp = Blueprint("jobs", __name__)


@bp.post("/jobs")
def submit_job() -> Response:
    """Create a job (201), or return the one an earlier request with the same
    Idempotency-Key created (200)."""
    job_request = validation.parse_job_request(read_body(errors.DECODE_JOB))
    access.check_request(job_request)
    key = request.headers.get("Idempotency-Key") or None
    dedupe = f"http:{key}" if key else None
    job, created = scheduler().jobs.submit(job_request, dedupe, owner=access.owner())
    access.created(job.job_id)
    return json_reply(access.shown(job.to_wire()), 201 if created else 200)


@bp.post("/jobs/batch")
def submit_batch() -> Response:
    """Create the jobs of several submissions in one transaction (201, the first job of each
    in their order), or return those an earlier batch with the same Idempotency-Key
    created (200). Each is checked as `POST /jobs` checks its body (`job 3: …`)."""
    job_requests = validation.parse_batch(read_body(validation.BATCH_MESSAGE))
    for index, job_request in enumerate(job_requests):
        try:
            access.check_request(job_request)
        except errors.ServiceError as exc:
            raise exc.of_item(index) from None
    key = request.headers.get("Idempotency-Key") or None
    dedupe = f"batch:{key}" if key else None
    made, created = scheduler().jobs.submit_batch(job_requests, dedupe, owner=access.owner())
    return json_reply([access.shown(job.to_wire()) for job in made], 201 if created else 200)


@bp.get("/jobs")
@inline.answers_inline  # the agent poll; a listing reads the disk (below)
def list_jobs() -> Response:
    """Jobs oldest first, filtered; with exactly node_id and status=pending, the agent poll."""
    service = scheduler()
    node_id = validation.agent_poll_node(request.args)
    if node_id is not None:
        # Pending jobs: no output to show, so nothing is read from disk on this hot path.
        # A poll without a key is the tiny-aws agent's, and tells what its node runs.
        from_agent = "Authorization" not in request.headers
        found = inline.from_memory(
            lambda: service.dispatch.poll_in_memory(node_id, from_agent),
            lambda: service.dispatch.poll(node_id, from_agent),
        )
        return json_reply([job.to_wire() for job in found])
    inline.may_wait()  # outputs are read from disk as the reply is written
    query = validation.parse_query(request.args)
    page = service.reads.list_jobs(query)
    headers = None
    if page.next_after is not None:
        following = dict(request.args.items(), after=f"{JOB_ID_PREFIX}{page.next_after}")
        headers = {"Link": f'<{request.path}?{urlencode(following)}>; rel="next"'}
    shown = access.shown
    if not query.with_output:  # output=none: history and replay read no output at all
        return json_array_reply((shown(job.to_wire()) for job in page.jobs), headers=headers)
    # Each job's output is read from disk as the reply gets to it, and a long reply is
    # streamed: ten thousand jobs of megabytes each are never in memory together. A pending
    # job says what it waits for, as GET /jobs/{id} does (the poll's answer never does).
    waiting = service.reads.waiting_for_each(page.jobs)
    found = (
        shown(_with_waiting(job.to_wire(), waiting.get(job.seq)))
        for job in service.reads.with_output(page.jobs)
    )
    return json_array_reply(found, headers=headers)


def _with_waiting(wire: dict, why: str | None) -> dict:
    if why is not None:
        wire["waiting_for"] = why
    return wire


@bp.get("/jobs/<job_id>")
def get_job(job_id: str) -> Response:
    """One job with its earlier attempts, and the output of each (read from disk); while it
    is pending, also what it waits for."""
    service = scheduler()
    job = service.reads.get(job_id)
    return json_reply(
        access.shown(_with_waiting(job.to_wire(with_attempts=True), service.reads.waiting_for(job)))
    )


UNLIMITED_BODIES = frozenset({"jobs.update_job"})
"""Endpoints whose body MAX_REQUEST_BYTES does not limit: the agent's report, which it never
sends twice (`update_job`)."""


@bp.patch("/jobs/<job_id>")
def update_job(job_id: str) -> Response:
    """An agent's report: running, done or failed. Never refused for its size."""
    service = scheduler()
    # Straight from the WSGI input: Flask's own reading stops at MAX_REQUEST_BYTES (413), and
    # the agent does not retry a refused final report.
    stream = request.environ["wsgi.input"]
    try:
        update = validation.read_update(stream.read, service.settings.max_output_bytes)
    except errors.ServiceError:
        raise
    except Exception:
        # A body that cannot even be read (a malformed chunk size...) cannot be decoded
        # either; the WSGI server raises its own exception types for these.
        raise errors.BadRequest(errors.DECODE_UPDATE) from None
    access.check_target(update.node_id)
    # Whether it carried a credential: an attempt claimed with one takes no keyless report.
    credential = auth.carries_credential()
    return json_reply(service.jobs.update(job_id, update, credential).to_wire())


@bp.post("/jobs/<job_id>/cancel")
def cancel_job(job_id: str) -> Response:
    """Cancel a job that has not ended: a pending one, or a running one (its agent stops it)."""
    return json_reply(access.shown(scheduler().jobs.cancel(job_id).to_wire()))


@bp.post("/jobs/<job_id>/hold")
def hold_job(job_id: str) -> Response:
    """Hold a pending job: it stays pending but is not handed out until released."""
    service = scheduler()
    job = service.jobs.hold(job_id)
    return json_reply(access.shown(_with_waiting(job.to_wire(), service.reads.waiting_for(job))))


@bp.post("/jobs/<job_id>/release")
def release_job(job_id: str) -> Response:
    """Release a held job: it waits like any other pending job again."""
    service = scheduler()
    job = service.jobs.release(job_id)
    return json_reply(access.shown(_with_waiting(job.to_wire(), service.reads.waiting_for(job))))


@bp.post("/jobs/<job_id>/retry")
def retry_job(job_id: str) -> Response:
    """Submit a finished job's request again as a new job (201), `retry_of` naming it."""
    new = scheduler().jobs.retry_as_new(job_id, owner=access.owner() or None)
    return json_reply(access.shown(new.to_wire()), 201)


def read_body(message: str) -> bytes:
    """The request body, or 413 when it is over MAX_REQUEST_BYTES.

    One that cannot even be read, such as a chunked body with a malformed chunk size, is a
    body that cannot be decoded: 400 with `message`, not a 500. The WSGI server raises its own
    exception types for these, hence the broad catch.
    """
    try:
        data = request.get_data(cache=False)
        # A body of unknown length (chunked) is cut at the limit by werkzeug, not refused:
        # if anything follows the cut, the body was too large.
        limit = request.max_content_length
        overflow = (
            limit is not None
            and request.content_length is None
            and len(data) >= limit
            and bool(request.environ["wsgi.input"].read(1))
        )
    except HTTPException:
        raise  # werkzeug's own answers, such as 413 for a declared length over the limit
    except Exception:
        raise errors.BadRequest(message) from None
    if overflow:
        raise errors.TooLarge(errors.REQUEST_TOO_LARGE)
    return data
