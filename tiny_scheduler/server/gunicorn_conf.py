"""Gunicorn settings for the scheduler daemon (`gunicorn.conf.py` at the repo root imports
these, and `tiny-scheduler serve` points gunicorn here).

Settings and the database are checked here, in the master, so a bad variable or an unusable
database file stops start-up with one clear line instead of a worker traceback: first what
`preflight` can tell without creating anything (the listen address, the database's place),
then the store opens the file. Once gunicorn listens, the master logs the start-up banner.
What only the worker can find (a row that cannot be read, a damaged page: SQLite's check of
the whole file runs beside the worker's load, not before it; another scheduler that took the
file since the check) stops it with one line too (`worker_app`).
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import sys

from flask import Flask

from tiny_scheduler import storage
from tiny_scheduler.config import OWNER_WAIT_SECS, ConfigError, Settings
from tiny_scheduler.logs import EscapeControlCharacters, LogWriter
from tiny_scheduler.server import banner, connections, preflight

try:
    _settings = Settings.from_env()
    _address = preflight.check(_settings)
    # The master only checks (another scheduler holding the file is refused here); the worker
    # takes the file for its life, so a worker started again never finds the master in the way.
    storage.check(_settings.db_path, OWNER_WAIT_SECS)
except ConfigError as _exc:
    sys.exit(f"tiny-scheduler: configuration error: {_exc}")
except (preflight.PreflightError, storage.StoreOpenError) as _exc:
    sys.exit(f"tiny-scheduler: {_exc}")

wsgi_app = "tiny_scheduler.server.gunicorn_conf:worker_app()"
bind = [_settings.bind]

# Exactly one worker: the job table lives in this process's memory. A second worker would hold
# a second, diverging table over the same database file.
workers = 1
# gunicorn's gthread worker, except that connections are read in its event loop and a thread
# gets a request only once it has arrived in full: idle, slow and silent clients cost no
# thread (see tiny_scheduler/server/worker.py).
worker_class = "tiny_scheduler.server.worker.BufferingWorker"
# Threads serve concurrent requests. Requests waiting on a group commit each hold one, so more
# threads mean bigger batches for the same fsync.
threads = _settings.threads
# Idle kept-alive connections cost the worker only a socket: keep them past the agents' and
# the Go CLI's 90 s of reuse, so we never close one just as its next request is sent.
keepalive = connections.KEEPALIVE_SECS
# MAX_CONNECTIONS, as far as the open-files limit allows (its soft limit is raised here to the
# hard limit, the banner says so, and the worker inherits it); near it the worker sheds idle
# connections (server/admission.py).
_files = connections.open_files(_settings.max_connections)
worker_connections = _files.connections
# A request waits for at most one registry call (a few seconds) and one commit.
timeout = 60
graceful_timeout = 15
# gunicorn's control socket sits at one fixed path per user, so two schedulers on one machine
# (tests, a dev cluster beside a real one) would fight over it; nothing here uses it.
control_socket_disable = True

# Only the error log. No access log: with one worker serving every agent's poll, formatting a
# line per request costs more than the poll itself (`--access-logfile -` turns it on).
errorlog = "-"
loglevel = _settings.log_level


def worker_app() -> Flask:
    """The app, built in the worker. A database the worker cannot use stops the daemon with one
    line (gunicorn's "App failed to load" path), not a traceback."""
    from gunicorn.errors import AppImportError

    from tiny_scheduler import create_app

    try:
        # On a reload (SIGHUP) the new worker starts while the old one still finishes its
        # requests and commits: wait for it to let go of the file, then load what it wrote.
        return create_app(_settings, owner_wait_secs=graceful_timeout + OWNER_WAIT_SECS)
    except storage.StoreOpenError as exc:
        raise AppImportError(f"tiny-scheduler: {exc}") from None


def on_starting(server) -> None:
    """The scheduler's log lines go where gunicorn's own go: its error log, at its level."""
    # Thread and multiprocessing names are in no log format here; skip looking them up.
    logging.logThreads = False
    logging.logMultiprocessing = False
    ours = logging.getLogger("tiny_scheduler")
    for handler in server.log.error_log.handlers:
        # Node ids, message ids and peers' answers come from outside: no value may forge
        # a line of the log.
        handler.addFilter(EscapeControlCharacters())
    ours.handlers[:] = server.log.error_log.handlers
    ours.setLevel(server.log.error_log.level)
    ours.propagate = False


def when_ready(server) -> None:
    """Listening now: say what this daemon is and how it is set up, once."""
    banner.log_banner(_settings, _address, _files)


class _HandOff(logging.handlers.QueueHandler):
    """Pass the record itself to the writing thread: it lives in this process, so the
    formatting and copying QueueHandler does to make records picklable is wasted work on
    every request thread."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


def post_worker_init(worker) -> None:
    """Start the loops in the one worker, after the app has loaded."""
    from tiny_scheduler import start_background

    # Request threads hand their log records to one thread that writes them, a batch at a
    # time (tiny_scheduler/logs.py says why).
    ours = logging.getLogger("tiny_scheduler")
    records: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
    worker.log_writer = LogWriter(records, ours.handlers)
    ours.handlers[:] = [_HandOff(records)]
    worker.log_writer.start()
    start_background(worker.wsgi)


def worker_exit(server, worker) -> None:
    """On SIGTERM: stop the loops, commit what is queued, close the database."""
    from tiny_scheduler import stop_background

    app = getattr(worker, "wsgi", None)
    if app is not None:
        stop_background(app)
    log_writer = getattr(worker, "log_writer", None)
    if log_writer is not None:
        log_writer.stop()  # writes what is still queued
