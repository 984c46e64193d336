"""tiny-scheduler: the job scheduler of a small self-hosted cloud.

`create_app(settings)` builds one complete scheduler (store, job table, placement, service,
HTTP API) from one settings object. Nothing is a module-level singleton, so two schedulers can
run side by side in one process (the tests do). Background loops are built here too but only
started by `start_background(app)`, which the gunicorn worker hook calls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .clock import SYSTEM, Clock

if TYPE_CHECKING:
    from flask import Flask

    from . import storage
    from .cluster.leadership import Leadership
    from .config import Settings
    from .loops import Background
    from .service import Scheduler

__all__ = ["Settings", "create_app", "start_background", "stop_background"]


def __getattr__(name: str) -> Any:
    # Every import of a submodule runs this package first: the command line's `submit` would
    # pay for the settings (and `logging` under them) it never reads. `Settings` is loaded
    # when first asked for instead.
    if name == "Settings":
        from .config import Settings

        return Settings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def create_app(
    settings: Settings | None = None, owner_wait_secs: float = 0.0, clock: Clock = SYSTEM
) -> Flask:
    """The scheduler as a WSGI app; settings default to the environment's. The database is
    the app's alone until `stop_background`; another scheduler that has it open is waited for
    up to `owner_wait_secs`, then refused (StoreOpenError, like a database that cannot be
    read). `clock` is the time every decision reads (tests hand in one they move)."""
    # The server's modules are imported here, not at the top: the agent and the command line
    # import this package too, and must not pay for Flask and the whole daemon (nor need it).
    import logging

    from . import api, metrics, storage, ui
    from .cluster.node_book import BuiltinNodes, Drains, NodeBook
    from .cluster.peers import CallObserver
    from .cluster.registry import Registry
    from .config import Settings
    from .domain.nodes import NodeRecord, NodeSource
    from .domain.placement import Placement
    from .loops import Background
    from .service import Scheduler
    from .state.schedule_table import ScheduleTable
    from .state.table import JobTable

    log = logging.getLogger(__name__)
    settings = settings or Settings.from_env()
    backend = storage.open_store(settings.db_path, owner_wait_secs, settings.leader_lease_secs)
    store = storage.Writer(backend)
    leadership = _leadership(settings, backend, clock)
    if leadership is None:
        try:
            loaded = store.load(compact=True)  # the table takes `Ended` jobs
        except BaseException:
            store.close()  # lets go of the file
            raise
        table = JobTable(
            loaded.jobs,
            loaded.last_seq,
            loaded.queues,
            loaded.users,
            settings.fairshare_half_life_secs,
        )
        schedule_table = ScheduleTable(loaded.schedules, loaded.last_schedule_seq)
        node_records: list[NodeRecord] = loaded.nodes
        credentials = (loaded.tokens, loaded.last_token_seq, loaded.audit, loaded.last_audit_id)
        last_seq = loaded.last_seq
        del loaded
        _settle_loaded()
        log.info("loaded %d jobs from %s (last id job-%d)", len(table), store.location, last_seq)
    else:
        # A standby holds no jobs and no schedules: each term as leader loads them.
        table, schedule_table = JobTable(), ScheduleTable()
        node_records = []
        credentials = None
    store.start()
    peer_calls: list[CallObserver] = []  # told of every call to a peer (the metrics count them)
    book = NodeBook(clock, settings.node_heartbeat_secs, settings.node_lost_secs)
    source: NodeSource = (
        BuiltinNodes(book) if settings.builtin_registry else Registry(settings, peer_calls, clock)
    )
    placement = Placement(Drains(source, book), settings, table, clock)
    service = Scheduler(
        settings, store, table, placement, schedule_table, leadership, clock, book, node_records
    )
    if credentials is not None:
        service.load_credentials(*credentials)
    if store.events_waiting and not settings.sns_url:
        log.warning(
            "%d SNS events of an earlier run wait in the outbox; SNS_URL is unset, so they stay "
            "there until it is set again",
            store.events_waiting,
        )

    # No app-wide /static route: there is no such folder; the dashboard serves its own files.
    app = _app_class()(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes
    app.connections_per_client = settings.max_connections_per_client  # type: ignore[attr-defined]
    api.replies.attach(app, service)
    api.init_app(app)
    app_metrics = metrics.init_app(app, service)
    ui.init_app(app, service)
    api.init_inline(app)  # last: its hook goes before every other
    background = Background(service, peer_calls)
    app_metrics.watch_peers(peer_calls)
    app_metrics.watch_background(background)
    app.extensions["tiny_scheduler.background"] = background
    app.extensions["tiny_scheduler.store"] = store
    if leadership is not None:
        _run_terms(leadership, service, background)
        app.extensions["tiny_scheduler.leadership"] = leadership
    return app


@functools.cache
def _app_class() -> type[Flask]:
    """The app's class, made on first use so that importing the package does not import
    Flask."""
    from flask import Flask
    from flask.sessions import NullSession, SessionInterface

    class _NoSessions(SessionInterface):
        """No cookie sessions (nothing here uses them): Flask's default opens one, finds no
        secret key, makes a null session and checks it again on the way out, per request."""

        null = NullSession()  # refuses every write, so one serves every request

        def open_session(self, app: Flask, request: Any) -> NullSession:
            return self.null

        def save_session(self, app: Flask, session: Any, response: Any) -> None:
            pass

        def is_null_session(self, obj: object) -> bool:
            return True

    class _App(Flask):
        """Flask, minus a per-request cost this app does not need, plus the question the
        worker asks before it sends `100 Continue`."""

        # The worker may run plain requests in its event loop: the app sends the ones that
        # would wait to a thread (inline.py).
        inline_requests = True
        # Of those, only requests of these methods are tried there (api.init_inline).
        inline_methods: frozenset[str] | None = None
        # What the worker allows one client address (MAX_CONNECTIONS_PER_CLIENT): set per app.
        connections_per_client: int | None = None
        session_interface = _NoSessions()

        def ensure_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
            # Flask asks of every hook and view, on every request, whether it is a coroutine
            # function (to run it in an event loop): none here is, and the question costs more
            # than some of the hooks.
            return func

        def answered_before_body(self, environ: dict[str, Any]) -> bool:
            """Whether this request's answer is settled by its head (see worker.py)."""
            from . import api

            return api.answered_before_body(self, environ)

    return _App


def _settle_loaded() -> None:
    """After a load of the jobs: move them out of the cycle collector's sight (they live as long
    as the process; else every full collection walks a million objects, a latency spike each
    time), and give back the heap the load freed (`_give_back_freed_memory`)."""
    import gc

    gc.freeze()
    _give_back_freed_memory()


def _give_back_freed_memory() -> None:
    """Return to the system the heap the load freed (its row tuples and temporary lists):
    glibc keeps freed memory for reuse unless asked, and after a load it would stay in the
    worker's resident size for good (~15 MB at 1M jobs). A no-op where the C library is not
    glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def _leadership(settings: Settings, backend: storage.JobStore, clock: Clock) -> Leadership | None:
    """With PostgreSQL, this daemon's part in the election (None with SQLite)."""
    from . import storage

    if not storage.is_postgres(settings.db_path):
        return None
    # Here, not at the top: a daemon on SQLite never loads psycopg (a tenth of its start).
    from .cluster.leadership import Leadership
    from .storage.postgres import PostgresStore

    assert isinstance(backend, PostgresStore)  # open_store chose it by the same test
    assert settings.advertise_url is not None  # Settings insists on it with PostgreSQL
    # The same clock as the service's: `Terms.cluster` measures the roster's age since
    # `roster_read_monotonic` on it.
    return Leadership(
        settings.db_path, settings.advertise_url, settings.leader_lease_secs, backend, clock
    )


def _run_terms(leadership: Leadership, service: Scheduler, background: Background) -> None:
    """What a term as leader begins and ends with: the jobs, and the loops."""

    from .config import SCHEDULE_TICK_SECS

    def elected(epoch: int) -> None:
        service.terms.take_over()
        _settle_loaded()
        # The previous leader ran the schedules until at most a lease (and a look) ago: fire
        # times since then are due, not missed. A fire it committed moved its schedule on.
        gap = leadership.lease_secs + 2 * SCHEDULE_TICK_SECS
        background.start(schedules_since=service.clock.now_us() - int(gap * 1_000_000))

    def deposed(epoch: int) -> None:
        background.stop()
        service.terms.hand_over()

    leadership.on_elected = elected
    leadership.on_deposed = deposed


def start_background(app: Flask) -> None:
    """Start the daemon threads (timeouts, lost nodes, SQS, SNS, retention, schedules); with
    PostgreSQL, the election, which starts them whenever this daemon becomes the leader."""
    leadership = app.extensions.get("tiny_scheduler.leadership")
    if leadership is not None:
        leadership.start()
    else:
        app.extensions["tiny_scheduler.background"].start()


def stop_background(app: Flask) -> None:
    """Stop the daemon threads, then commit what is queued and close the store; a leader
    then gives up its lease, so that a standby takes over at once."""
    leadership = app.extensions.get("tiny_scheduler.leadership")
    if leadership is not None:
        leadership.stop_serving()
    app.extensions["tiny_scheduler.background"].stop()
    app.extensions["tiny_scheduler.store"].close()
    if leadership is not None:
        leadership.close()
