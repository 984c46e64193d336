"""Live output of a job: its agent appends (`POST /jobs/{id}/output`), anyone with the key
reads from an offset, waiting up to `wait` seconds for more (`GET /jobs/{id}/output`).

A read that must wait does not hold a request thread when the worker can park it
(`waiting.AskAgain`): it is run again once output arrives, the job changes, or the wait is
over. Under another server it waits in its thread.
"""

from __future__ import annotations

from flask import Blueprint, Response, request

from .. import errors
from ..clock import SYSTEM
from ..domain import validation
from ..server.waiting import PARK_KEY, WAITED_KEY, AskAgain, wait_in_thread
from . import access
from .jobs import read_body
from .replies import scheduler

bp = Blueprint("output", __name__)

MAX_WAIT_SECS = 30
DECODE_OUTPUT = "failed to decode output"
STRINGS_MESSAGE = "stdout and stderr must be strings"
STREAM_MESSAGE = "stream must be stdout or stderr"
OFFSET_MESSAGE = "offset must be a whole number of bytes, 0 or more"
ATTEMPT_MESSAGE = "attempt must be a whole number, 0 for the first attempt"
WAIT_MESSAGE = f"wait must be a number of seconds from 0 to {MAX_WAIT_SECS}"


@bp.post("/jobs/<job_id>/output")
def append_output(job_id: str) -> Response:
    data = validation.decode_object(read_body(DECODE_OUTPUT), DECODE_OUTPUT)
    stdout, stderr = data.get("stdout") or "", data.get("stderr") or ""
    if not isinstance(stdout, str) or not isinstance(stderr, str):
        raise errors.BadRequest(STRINGS_MESSAGE)
    node_id, attempt = validation.report_names(data, DECODE_OUTPUT)
    access.check_target(node_id)
    scheduler().output.append(job_id, stdout, stderr, node_id, attempt)
    return Response(status=204)


@bp.get("/jobs/<job_id>/output")
def read_output(job_id: str) -> Response:
    stream, offset, wait, attempt = _query()
    service = scheduler()
    seen = service.output.signal.count  # before the look: a change after it wakes the wait
    read = service.output.read(job_id, stream, offset, attempt)
    now = SYSTEM.monotonic()
    deadline = request.environ.get(WAITED_KEY) or now + wait
    if not read.data and read.current and read.status == "running" and now < deadline:
        service.waiters.enter()
        if request.environ.get(PARK_KEY):
            # Parked in the worker's loop: this request runs again when something happens.
            body = AskAgain(service.output.signal, seen, deadline, service.waiters.leave)
            return Response(body, status=200, direct_passthrough=True)
        try:
            wait_in_thread(service.output.signal, deadline - now)
        finally:
            service.waiters.leave()
        read = service.output.read(job_id, stream, offset, attempt)
    headers = {
        "X-Output-Offset": str(read.next_offset),
        "X-Job-Status": read.status,
        "X-Attempt": str(read.attempt),
    }
    return Response(read.data, 200, headers, content_type="text/plain; charset=utf-8")


def _query() -> tuple[str, int, float, int | None]:
    args = request.args
    stream = args.get("stream", "stdout")
    if stream not in ("stdout", "stderr"):
        raise errors.BadRequest(STREAM_MESSAGE)
    raw_offset = args.get("offset", "0")
    if not raw_offset.isascii() or not raw_offset.isdigit() or len(raw_offset) > 18:
        raise errors.BadRequest(OFFSET_MESSAGE)
    raw_wait = args.get("wait", "0")
    try:
        wait = float(raw_wait)
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= MAX_WAIT_SECS:
        raise errors.BadRequest(WAIT_MESSAGE)
    raw_attempt = args.get("attempt")
    if raw_attempt is not None and (
        not raw_attempt.isascii() or not raw_attempt.isdigit() or len(raw_attempt) > 9
    ):
        raise errors.BadRequest(ATTEMPT_MESSAGE)
    return stream, int(raw_offset), wait, None if raw_attempt is None else int(raw_attempt)
