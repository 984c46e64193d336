"""gunicorn settings of the floor app: the daemon's own (threads, keep-alive,
logging), serving `floor_app` instead of the scheduler, with no background loops to start."""

from tiny_scheduler.server.gunicorn_conf import *  # noqa: F403

wsgi_app = "benchmarks.floor_app:app"
# The floor is Flask on stock gunicorn (its own gthread worker and parser): what our own
# worker and hot paths are measured against (issue 27).
worker_class = "gthread"


def post_worker_init(worker) -> None:
    """The scheduler starts its loops here; the floor has none."""


def worker_exit(server, worker) -> None:
    """Nothing to stop or commit."""
