"""The dashboard's live feeds: the job events and a running job's output, under /ui/.

They are the API's own views (`GET /events`, `GET /jobs/{id}/output`), served again under the
dashboard's path for one reason: a browser sends the dashboard's key (HTTP Basic, see
`api/auth.py`) only to /ui/ and below, and an EventSource or fetch cannot be given a bearer
header. Same answers, same limits (MAX_WAITERS), and parked in the worker's loop alike: the
worker runs a parked request again through the app, which routes it here again.
"""

from __future__ import annotations

from flask import Blueprint, Response

from ..api import events, output


def init_blueprint(bp: Blueprint) -> None:
    bp.add_url_rule("/events", "events", _events)
    bp.add_url_rule("/jobs/<job_id>/output", "job_output", _job_output)


def _events() -> Response:
    """Every job change as a server-sent event (the page refreshes what it shows)."""
    return events.events()


def _job_output(job_id: str) -> Response:
    """A stream of the job's current attempt from an offset, waiting a while for more."""
    return output.read_output(job_id)
