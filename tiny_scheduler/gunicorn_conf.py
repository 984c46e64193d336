"""Gunicorn settings for the scheduler daemon (`gunicorn.conf.py` at the repo root imports
these, and `tiny-scheduler serve` points gunicorn here).

Settings and the database are checked here, in the master, so a bad variable or an unusable
database file stops start-up with one clear line instead of a worker traceback.
"""

from __future__ import annotations

import os
import sys

from tiny_scheduler import store
from tiny_scheduler.config import ConfigError, Settings

try:
    _settings = Settings.from_env()
    store.check(_settings.db_path)
except ConfigError as _exc:
    sys.exit(f"tiny-scheduler: configuration error: {_exc}")
except store.StoreOpenError as _exc:
    sys.exit(f"tiny-scheduler: {_exc}")

wsgi_app = "tiny_scheduler:create_app()"
bind = [_settings.bind]

# Exactly one worker: the job table lives in this process's memory. A second worker would hold
# a second, diverging table over the same database file.
workers = 1
worker_class = "gthread"
# Threads serve concurrent requests. Requests waiting on a group commit each hold one, so more
# threads mean bigger batches for the same fsync.
threads = int(os.environ.get("SCHEDULER_THREADS") or 32)
# Agents poll every 3 s over keep-alive connections: keep them open across polls.
keepalive = 10
# A request waits for at most one registry call (a few seconds) and one commit.
timeout = 60
graceful_timeout = 15
# gunicorn's control socket sits at one fixed path per user, so two schedulers on one machine
# (tests, a dev cluster beside a real one) would fight over it; nothing here uses it.
control_socket_disable = True

errorlog = "-"
loglevel = os.environ.get("SCHEDULER_LOG_LEVEL", "info")
_level = loglevel.upper()
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"}
    },
    "handlers": {
        "stderr": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "stream": "ext://sys.stderr",
        }
    },
    "root": {"level": "WARNING", "handlers": ["stderr"]},
    "loggers": {
        "gunicorn.error": {"level": _level, "handlers": ["stderr"], "propagate": False},
        "tiny_scheduler": {"level": _level, "handlers": ["stderr"], "propagate": False},
    },
}


def post_worker_init(worker) -> None:
    """Start the loops in the one worker, after the app has loaded."""
    from tiny_scheduler import start_background

    start_background(worker.wsgi)


def worker_exit(server, worker) -> None:
    """On SIGTERM: stop the loops, commit what is queued, close the database."""
    from tiny_scheduler import stop_background

    app = getattr(worker, "wsgi", None)
    if app is not None:
        stop_background(app)
