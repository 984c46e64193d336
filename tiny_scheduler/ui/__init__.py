"""The web dashboard under /ui/: server-rendered pages for the people who run the cluster.

Pages: the overview (the daemons, counts, a chart of the last hour, nodes, recent failures),
the nodes (health, agent, drain state, slots, load, jobs) and one node (Drain / Undrain), the
jobs list (newest first and paged, searched and filtered, one row per array with its summary;
Cancel, Hold or Release, Retry on each row), one array's jobs by index, one job (outputs, live
while it runs; attempts; its name, array and the job it retries; what a waiting job waits for;
Cancel or Stop; Hold or Release; Retry as a new job), the schedules and one schedule (its jobs;
Pause / Resume, Run now, Delete) and the queues (pending, running, limit, pause and resume).
Jinja templates, one stylesheet and one small script, no build step and nothing fetched from
elsewhere (the chart is inline SVG drawn on the server). The script keeps the open page
current from the job events (`live`), falling back to reloading it every few seconds, and
keeps relative times current. Without JavaScript every page still works (refresh by hand).
The layout holds from a phone's 400 px up, without sideways scrolling.

Views only pick the page's data from `pages` (`node_pages`, `schedule_pages`) and render it,
or do one `actions` change (or a queue's pause) and redirect to the page that shows its
outcome. The UI reads through the service like the API does and changes only what the API's
matching calls change. Authentication and roles are the API's (`api/auth.py`, `api/access.py`:
HTTP Basic with the key or a token as password when a key is set; the role table decides what
each page and button may do, and a user or viewer sees `***` for others' env values). The
header says who is signed in, and a token's user gets a "My jobs" link (`?owner=`).
Actions are form POSTs, refused when the browser says they come
from another site, so a page elsewhere cannot use the operator's saved credentials to act on
the cluster.
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

from .. import errors
from ..api import access
from ..api.forward import MARKER
from ..api.replies import scheduler
from ..domain import jobs
from ..service import Scheduler
from . import actions, daemons, formatting, live, node_pages, pages, schedule_pages

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
    failures = pages.RecentFailures(service.clock)
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
bp.add_app_template_global(formatting.job_ending, "job_ending")
bp.add_app_template_global(formatting.job_state, "job_state")
bp.add_app_template_global(access.principal, "signed_in")
live.init_blueprint(bp)


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
    return _page("nodes.html", view=node_pages.nodes(scheduler()))


@bp.get("/jobs")
def job_list() -> Response:
    """Jobs matching the filters, a page at a time, newest first (an array's: by index)."""
    return _page("jobs.html", view=pages.job_list(scheduler(), request.args))


@bp.get("/jobs/<job_id>")
def job(job_id: str) -> Response:
    """One job: its command, environment, outputs and every attempt."""
    show_env = request.args.get("show_env") == "1"
    notice = request.args.get("notice", "")
    try:
        view = pages.job_detail(
            scheduler(), job_id, show_env, notice, request.args.get("from", ""), access.shown
        )
    except errors.NotFound:
        return _page("error.html", 404, message=f"There is no job {job_id}.")
    return _page("job.html", view=view)


@bp.get("/schedules")
def schedule_list() -> Response:
    """Every schedule: its next and last fire, and the status of the last job it made."""
    args = request.args
    view = schedule_pages.schedule_list(
        scheduler(), args.get("notice", ""), args.get("schedule", "")
    )
    return _page("schedules.html", view=view)


@bp.get("/nodes/<node_id>")
def node(node_id: str) -> Response:
    """One node: its agent, slots, drain state and every job it runs or waits for."""
    try:
        view = node_pages.node_detail(scheduler(), node_id, request.args.get("notice", ""))
    except errors.NotFound:
        return _page("error.html", 404, message=f"There is no node {node_id}.")
    return _page("node.html", view=view)


@bp.get("/schedules/<schedule_id>")
def schedule(schedule_id: str) -> Response:
    """One schedule: its settings, its job and the jobs it made lately."""
    args = request.args
    try:
        view = schedule_pages.schedule_detail(
            scheduler(), schedule_id, args.get("notice", ""), args.get("job", "")
        )
    except errors.NotFound:
        return _page("error.html", 404, message=f"There is no schedule {schedule_id}.")
    return _page("schedule.html", view=view)


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


# --- what the buttons do: form POSTs, each answered 303 to the page that shows the outcome,
# so that a reload shows the page again rather than doing the action twice.


@bp.post("/jobs/<job_id>/cancel")
def cancel(job_id: str) -> Response:
    """Cancel a pending job, or stop a running one, then show it again with the outcome."""
    try:
        notice = actions.cancel(scheduler(), job_id)
    except errors.NotFound:
        return _page("error.html", 404, message=f"There is no job {job_id}.")
    return redirect(url_for("ui.job", job_id=job_id, notice=notice), 303)


@bp.post("/jobs/<job_id>/retry")
def retry(job_id: str) -> Response:
    """Submit a finished job's request again as a new job, then show the new job."""
    try:
        new_id = actions.retry(scheduler(), job_id, access.owner())
    except errors.NotFound:
        return _page("error.html", 404, message=f"There is no job {job_id}.")
    except errors.Conflict:
        return redirect(url_for("ui.job", job_id=job_id, notice="not_finished"), 303)
    except errors.PlacementError as exc:
        return _page("error.html", 503, message=f"Not submitted: {exc.message}.")
    return redirect(url_for("ui.job", job_id=new_id, notice="retry", **{"from": job_id}), 303)


@bp.post("/jobs/<job_id>/hold")
def hold(job_id: str) -> Response:
    """Hold a pending job, then show it again with the outcome."""
    return _held(job_id, True)


@bp.post("/jobs/<job_id>/release")
def release(job_id: str) -> Response:
    """Release a held job, then show it again with the outcome."""
    return _held(job_id, False)


def _held(job_id: str, on: bool) -> Response:
    try:
        notice = actions.hold(scheduler(), job_id, on)
    except errors.NotFound:
        return _page("error.html", 404, message=f"There is no job {job_id}.")
    back = request.form.get("back", "")
    if back.startswith("/ui/") and "//" not in back:  # the list it was pressed on
        return redirect(back, 303)
    return redirect(url_for("ui.job", job_id=job_id, notice=notice), 303)


@bp.post("/nodes/<node_id>/drain")
def drain(node_id: str) -> Response:
    """Drain the node (form field `drain=1`) or undrain it (`drain=0`)."""
    try:
        notice = actions.drain(scheduler(), node_id, request.form.get("drain") == "1")
    except errors.NotFound:
        return _page("error.html", 404, message=f"There is no node {node_id}.")
    return redirect(url_for("ui.node", node_id=node_id, notice=notice), 303)


@bp.post("/schedules/<schedule_id>/<action>")
def schedule_action(schedule_id: str, action: str) -> Response:
    """Pause, resume, run now or delete a schedule, then show the outcome."""
    if action not in actions.SCHEDULE_ACTIONS:
        return _page("error.html", 404, message=f"A schedule has no action {action}.")
    try:
        notice, job_id = actions.schedule_action(scheduler(), schedule_id, action)
    except errors.NotFound:
        return _page("error.html", 404, message=f"There is no schedule {schedule_id}.")
    if action == "delete":
        return redirect(url_for("ui.schedule_list", notice=notice, schedule=schedule_id), 303)
    target = url_for("ui.schedule", schedule_id=schedule_id, notice=notice, job=job_id or None)
    return redirect(target, 303)


def _page(template: str, status: int = 200, **context: object) -> Response:
    return Response(render_template(template, **context), status=status, mimetype="text/html")
