"""The web dashboard under /ui/: server-rendered pages for the people who run the cluster.

Pages: the overview (the daemons, counts, a chart of the last hour, nodes, recent failures), the
nodes (slots, load, running and waiting jobs), the jobs list (filters, paging), one job
(outputs, attempts, cancel, what a waiting job waits for), the schedules (next and last fire,
the last job) and the queues (pending, running, limit, pause and resume). Jinja templates, one
stylesheet and one small script, no build step and nothing fetched from elsewhere (the chart
is inline SVG drawn on the server); the script refreshes the open page every few seconds and
keeps relative times current. Without JavaScript every page still works (refresh by hand).
The layout holds from a phone's 400 px up.

Views only pick the page's data from `pages` and render it. The UI reads through the service
like the API does and changes nothing but through `service.cancel` and a queue's pause.
Authentication is the API's (`api/auth.py`: HTTP Basic with the key as password when a key is
set). A cancel (or a queue's pause) is a form POST, refused when the browser says it comes
from another site, so a page elsewhere cannot use the operator's saved credentials to cancel
jobs.
"""

from __future__ import annotations

from flask import (
    Blueprint,
    Flask,
    Response,
    current_app,
    redirect,
    render_template,
    request,
    url_for,
)

from .. import errors, jobs
from ..api.forward import MARKER
from ..api.replies import scheduler
from ..service import Scheduler
from . import daemons, formatting, pages

bp = Blueprint(
    "ui",
    __name__,
    url_prefix="/ui",
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)

_EXTENSION = "tiny_scheduler.ui.failures"
_CHARTS = "tiny_scheduler.ui.activity"

# The pages show commands, environments and outputs: never cached, never framed, and only
# our own script and style run on them.
_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}


def init_app(app: Flask, service: Scheduler) -> None:
    """Serve the dashboard on `app` and start remembering failures for its overview."""
    failures = pages.RecentFailures()
    service.listeners.append(failures.listener)
    app.extensions[_EXTENSION] = failures
    app.extensions[_CHARTS] = pages.ActivityCache()
    app.register_blueprint(bp)


bp.add_app_template_filter(formatting.relative_time, "ago")
bp.add_app_template_filter(formatting.exact_time, "exact_time")
bp.add_app_template_filter(jobs.format_time, "rfc3339")
bp.add_app_template_global(formatting.duration, "duration")
bp.add_app_template_global(pages.REFRESH_SECS, "refresh_secs")
bp.add_app_template_global(jobs.can_cancel, "can_cancel")


@bp.before_request
def _refuse_cross_site_posts() -> Response | None:
    if request.method != "POST":
        return None
    site = request.headers.get("Sec-Fetch-Site")
    origin = request.headers.get("Origin")
    if site is not None:
        same = site in ("same-origin", "none")
    else:
        same = origin is None or origin == request.host_url.rstrip("/")
    if same:
        return None
    return _page("error.html", 403, message="Refused: this form was sent from another site.")


@bp.after_request
def _secure(response: Response) -> Response:
    for name, value in _HEADERS.items():
        response.headers.setdefault(name, value)
    return response


@bp.get("/")
def overview() -> Response:
    """Counts by status, the last hour's chart, each node with its jobs, recent failures."""
    extensions = current_app.extensions
    view = pages.overview(scheduler(), extensions[_EXTENSION], extensions[_CHARTS])
    forwarded_by = request.headers.get(MARKER)
    cluster = daemons.daemons(scheduler(), forwarded_by, request.host_url.rstrip("/"))
    return _page("overview.html", view=view, cluster=cluster)


@bp.get("/nodes")
def node_list() -> Response:
    """Each node's health, slots, load, running and waiting jobs."""
    return _page("nodes.html", view=pages.nodes(scheduler()))


@bp.get("/jobs")
def job_list() -> Response:
    """Jobs matching the filters, a page at a time, oldest first."""
    return _page("jobs.html", view=pages.job_list(scheduler(), request.args))


@bp.get("/jobs/<job_id>")
def job(job_id: str) -> Response:
    """One job: its command, environment, outputs and every attempt."""
    show_env = request.args.get("show_env") == "1"
    notice = request.args.get("notice", "")
    try:
        view = pages.job_detail(scheduler(), job_id, show_env, notice)
    except errors.NotFound:
        return _page("error.html", 404, message=f"There is no job {job_id}.")
    return _page("job.html", view=view)


@bp.get("/schedules")
def schedule_list() -> Response:
    """Every schedule: its next and last fire, and the status of the last job it made."""
    return _page("schedules.html", view=pages.schedule_list(scheduler()))


@bp.get("/queues")
def queue_list() -> Response:
    """Every queue: its pending and running jobs, its limit, and pause or resume."""
    return _page("queues.html", queues=pages.queue_list(scheduler()))


@bp.post("/queues/<name>")
def queue_pause(name: str) -> Response:
    """Pause (form field paused=1) or resume (paused=0) a queue, then show the queues."""
    try:
        pages.set_paused(scheduler(), name, request.form.get("paused") == "1")
    except errors.BadRequest as exc:
        return _page("error.html", 400, message=exc.message)
    # 303: the browser follows with a GET, so reloading the page sends nothing again.
    return redirect(url_for("ui.queue_list", _anchor=f"queue-{name}"), 303)


@bp.post("/jobs/<job_id>/cancel")
def cancel(job_id: str) -> Response:
    """Cancel a pending job, then show it again with the outcome."""
    try:
        notice = pages.cancel(scheduler(), job_id)
    except errors.NotFound:
        return _page("error.html", 404, message=f"There is no job {job_id}.")
    # 303: the browser follows with a GET, so reloading the page does not cancel twice.
    return redirect(url_for("ui.job", job_id=job_id, notice=notice), 303)


def _page(template: str, status: int = 200, **context: object) -> Response:
    return Response(render_template(template, **context), status=status, mimetype="text/html")
