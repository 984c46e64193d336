"""Leadership among the daemons that share one PostgreSQL database: a lease, an epoch, a fence.

One row (`leadership`, made by `storage.postgres`) says who leads: its epoch, the leader's
advertised URL, the backend pid of its lease session and when the lease expires, by the
database's clock. This module runs the protocol on that row, on a connection of its own:

- a **standby** reads the row every `poll_secs`; it takes over when the lease has expired, or at
  once when the leader's lease session is gone from the server (its process died), by raising
  the epoch in one conditional UPDATE: of several standbys only one can win;
- the **leader** renews the lease every `renew_secs`, and counts it valid only until a little
  before the database would let a standby take over, measured from when it sent the renewal;
- a **watchdog** thread steps the leader down the moment its lease runs out locally (a renewal
  that hangs on a cut network, a process that was paused) and breaks connections that hang;
- the **fence** is what correctness rests on: the store (`PostgresStore.fence_with`) commits
  only while the row still holds this leader's epoch, so whatever this process believes, a
  deposed leader never commits. The local checks only make it stop sooner.

Each daemon also keeps its own row in a small `daemons` table (id, advertised URL, role,
version, started, last seen), written on the lease connection after a lease round, at most
once every `RECORD_SECS`, in the same statement that reads the other daemons' rows: that is
what `GET /cluster` lists, from memory, so it can be answered while the database is away.

Terms begin and end on a thread of their own (`on_elected` loads the jobs and starts the loops,
which may take seconds while the lease must go on being renewed; `on_deposed` stops them), one
after the other. No HTTP here, and no job logic: the service asks `view()` and `is_serving()`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.errors

from ..clock import SYSTEM, Clock
from ..errors import StoreError
from ..storage.base import StoreOpenError
from ..storage.postgres import PostgresStore, application_name, connect, interrupt
from ..version import version
from . import lease

log = logging.getLogger(__name__)

FAILURE_LOG_SECS = 30.0
"""While the lease connection keeps failing, one warning per this many seconds (the first
failure is logged at once; a database that is down must not fill the log five times a
second)."""

POLL_SECS = 0.2
"""Seconds between a standby's looks at the lease row (at most a tenth of the lease): how soon
it notices that the leader's session is gone."""

WATCH_SECS = 0.05
"""Seconds between two checks of the watchdog."""

LOCK_WAIT_SECS = 0.5
"""Seconds a takeover (or a renewal) waits for the lease row's lock. A commit holds it for
milliseconds; longer means a writer that cannot finish (its process paused, its network cut)."""

RECORD_SECS = 1.0
"""Seconds between two writes of this daemon's row in `daemons` (a standby looks at the lease
five times a second; its "last seen" needs no such precision)."""

GONE_SECS = 15.0
"""A daemon whose row was not written for this long is gone: killed, or cut off from the
database. A running one writes it every RECORD_SECS, leader or standby, whatever its lease."""

FORGET_SECS = 3600.0
"""A daemon whose row was not written for this long is taken out of the table (it was killed,
or moved): the list shows what runs, and what stopped lately."""

_DAEMONS_SCHEMA = """
CREATE TABLE IF NOT EXISTS daemons (
    id text PRIMARY KEY,
    url text NOT NULL,
    role text NOT NULL,
    version text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now()
)
"""
# One statement a round: this daemon's row written, rows of daemons gone for long (or of an
# earlier run at this same URL) removed, and every row read back. The final SELECT sees the
# table as it was before the statement, so this daemon's row comes from `mine`.
_US = "(extract(epoch FROM {0}) * 1000000)::bigint"
_RECORD = f"""
WITH gone AS (
    DELETE FROM daemons
    WHERE id <> %(id)s
      AND (url = %(url)s OR last_seen_at < now() - make_interval(secs => %(forget)s))
), mine AS (
    INSERT INTO daemons (id, url, role, version) VALUES (%(id)s, %(url)s, %(role)s, %(version)s)
    ON CONFLICT (id) DO UPDATE SET role = excluded.role, last_seen_at = now()
    RETURNING id, url, role, version, started_at, last_seen_at
)
SELECT id, url, role, version, {_US.format("started_at")}, {_US.format("last_seen_at")},
       {_US.format("now()")}
FROM daemons
WHERE id <> %(id)s AND url <> %(url)s
  AND last_seen_at >= now() - make_interval(secs => %(forget)s)
UNION ALL
SELECT id, url, role, version, {_US.format("started_at")}, {_US.format("last_seen_at")},
       {_US.format("now()")}
FROM mine
"""
_FORGET_ME = "DELETE FROM daemons WHERE id = %(id)s"

_READ = """
SELECT epoch, leader_url, expires_at < now(), {gone}
FROM leadership WHERE id = 1
"""
_SESSION_GONE = (
    "(session_pid IS NULL OR NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = session_pid))"
)
_TAKE_OVER = f"""
UPDATE leadership
SET epoch = epoch + 1, leader_url = %(url)s, session_pid = pg_backend_pid(),
    expires_at = now() + make_interval(secs => %(lease)s)
WHERE id = 1 AND epoch = %(seen)s AND (expires_at < now() OR {_SESSION_GONE})
RETURNING epoch
"""
_RENEW = """
UPDATE leadership
SET expires_at = now() + make_interval(secs => %(lease)s), session_pid = pg_backend_pid()
WHERE id = 1 AND epoch = %(epoch)s
RETURNING epoch
"""
# The lease is over (a takeover only waits for the row when it may take it), so the writer
# sessions of the old leader still holding the row in a transaction are ended: their commit
# can never come. Only writers: a standby's lease session is never in the way for long.
_END_STUCK_WRITERS = """
SELECT activity.pid, pg_terminate_backend(activity.pid)
FROM pg_locks AS lock JOIN pg_stat_activity AS activity ON activity.pid = lock.pid
WHERE lock.relation = 'leadership'::regclass AND lock.granted
  AND activity.application_name = %(writer)s AND activity.pid <> pg_backend_pid()
"""
_RESIGN = """
UPDATE leadership SET expires_at = '-infinity', session_pid = NULL
WHERE id = 1 AND epoch = %(epoch)s
"""


@dataclasses.dataclass(frozen=True, slots=True)
class LeaderView:
    """What this daemon knows of the leadership."""

    serving: bool  # this daemon leads and serves
    leader_url: str | None  # the leader's advertised URL, None when no leader is known
    epoch: int  # the epoch of the lease row as last seen


@dataclasses.dataclass(frozen=True, slots=True)
class DaemonRow:
    """One daemon as its row in `daemons` says, times in microseconds since the epoch by the
    database's clock."""

    id: str
    url: str
    role: str  # "leader" or "standby"
    version: str
    started_at: int
    last_seen_at: int


@dataclasses.dataclass(frozen=True, slots=True)
class Roster:
    """The daemons' rows as last read, and the database's time when they were."""

    daemons: tuple[DaemonRow, ...]
    read_at: int  # by the database's clock, microseconds since the epoch


Callback = Callable[[int], None]
"""Told the epoch of the term that begins or ends."""


def expected_failure(exc: BaseException) -> str | None:
    """The one line to log for a term that failed because the database failed under it (a
    terminated backend, a server restarting, the job store refusing): that is the election's
    business, not a bug; None for anything else (logged with its traceback)."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and len(chain) < 5:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if not any(isinstance(link, (psycopg.Error, StoreError, OSError)) for link in chain):
        return None
    words = [str(link).strip().splitlines()[0] for link in chain if str(link).strip()]
    return ": ".join(dict.fromkeys(words)) or type(exc).__name__


def _nothing(epoch: int) -> None:
    pass


class Leadership:
    """This daemon's part in the election; `start()` it once, `close()` it at shutdown."""

    def __init__(
        self,
        url: str,
        advertise_url: str,
        lease_secs: float,
        store: PostgresStore,
        clock: Clock = SYSTEM,
    ) -> None:
        self._url = url
        self._clock = clock
        self.advertise_url = advertise_url
        self.lease_secs = lease_secs
        self._store = store
        self.on_elected: Callback = _nothing
        """Begins a term (load the jobs, start the loops); runs before the leader serves."""
        self.on_deposed: Callback = _nothing
        """Ends a term (stop the loops); runs after the leader stopped serving."""
        self.renew_secs = lease_secs * lease.RENEW_FRACTION
        self.poll_secs = min(POLL_SECS, lease_secs / 10)
        self._lock = threading.Lock()
        self._epoch: int | None = None  # ours, while we lead (serving or starting a term)
        self._serving = False
        self._valid_until = 0.0  # monotonic
        self._seen = LeaderView(False, None, 0)
        self._conn: psycopg.Connection[Any] | None = None
        self._call_deadline: float | None = None  # monotonic, while a lease call runs
        self._last_contact = 0.0  # monotonic, the last answer on the lease connection
        self._last_error: str | None = "not connected yet"
        self._failures = 0  # lease-connection failures in a row
        self._failure_logged = 0.0  # monotonic, when one was last logged
        self.daemon_id = uuid.uuid4().hex[:12]
        """This run's id in the `daemons` table (a restarted daemon is a new run)."""
        self.leader_changes = 0
        """How often this daemon saw the lease change hands (the epoch rise) since it started."""
        self.roster = Roster((), 0)
        self.roster_read_monotonic = 0.0  # the clock's monotonic() when the roster was read
        self._version = version()
        self._recorded_at = -RECORD_SECS  # monotonic
        self._recorded_role = ""
        self._record_failing = False
        self._epoch_seen: int | None = None
        self._said_leader: tuple[str | None, int] = (None, 0)  # last logged (leader, epoch)
        self._terms: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        store.on_fenced = lambda epoch: self.step_down(epoch, "a write found the lease taken")

    # --- what the service asks ----------------------------------------------------------------

    def is_serving(self) -> bool:
        """Whether this daemon leads, has loaded its term, and its lease is valid right now."""
        return self._serving and lease.is_valid(self._clock.monotonic(), self._valid_until)

    def view(self) -> LeaderView:
        with self._lock:
            if self._epoch is not None:
                serving = self.is_serving()
                return LeaderView(serving, self.advertise_url if serving else None, self._epoch)
            seen = self._seen
        if seen.leader_url is not None and not self.health()[0]:
            # The lease row has not been read for a lease: whoever led then may have lost it
            # since. Naming nobody makes this standby answer 503 itself, not send clients on.
            return LeaderView(False, None, seen.epoch)
        return seen

    gone_after_secs = GONE_SECS
    """A daemon whose row was not written for this long is shown as gone (`GET /cluster`)."""

    def role(self) -> str:
        """`leader` from the takeover on (also while the term loads), else `standby`."""
        return "standby" if self._epoch is None else "leader"

    def health(self) -> tuple[bool, str | None]:
        """Whether the lease connection answered within the lease, and the error if not."""
        if lease.database_reachable(self._clock.monotonic(), self._last_contact, self.lease_secs):
            return True, None
        return False, self._last_error or "no answer from the database"

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        for name, target in (
            ("leadership", self._run),
            ("lease-watchdog", self._watch),
            ("leader-terms", self._run_terms),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop_serving(self) -> None:
        """Stop answering as the leader (shutdown: new requests are redirected), keeping the
        epoch so that writes already queued still commit."""
        self._serving = False

    def close(self) -> None:
        """Give the lease up so that a standby takes over at once, and stop."""
        self._stop.set()
        self._serving = False
        self._terms.put(("stop", 0))
        for thread in self._threads:
            thread.join(self.lease_secs + 5)
        epoch, self._epoch = self._epoch, None
        if epoch is not None and self._conn is not None and not self._conn.broken:
            try:
                self._conn.execute(_RESIGN, {"epoch": epoch})
                log.info("leadership: resigned epoch %d", epoch)
            except psycopg.Error as exc:
                log.warning("leadership: could not resign epoch %d: %s", epoch, exc)
        if self._conn is not None and not self._conn.broken:
            # A daemon stopped on purpose leaves the list at once; a killed one after a while.
            with contextlib.suppress(psycopg.Error):
                self._conn.execute(_FORGET_ME, {"id": self.daemon_id})
        if self._conn is not None:
            self._conn.close()

    def step_down(self, epoch: int | None, reason: str) -> None:
        """Stop leading at once (from any thread): no more serving, no more writes, a write
        hanging on the network broken; the term's loops are stopped on the terms thread."""
        with self._lock:
            if self._epoch is None or (epoch is not None and epoch != self._epoch):
                return
            ended, self._epoch = self._epoch, None
            self._serving = False
            self._seen = LeaderView(False, None, ended)
        self._store.fence_with(None)
        self._store.interrupt()
        log.warning("leadership: stepped down from epoch %d: %s; now a standby", ended, reason)
        self._terms.put(("deposed", ended))

    # --- the lease thread ---------------------------------------------------------------------

    def _run(self) -> None:
        renew_due = 0.0  # monotonic
        while not self._stop.is_set():
            leading = self._epoch is not None
            try:
                if not leading:
                    self._look()
                    wait = self.poll_secs
                else:
                    now = self._clock.monotonic()
                    if now >= renew_due:
                        self._renew()
                        renew_due = now + self.renew_secs
                    # A long lease renews rarely; this daemon's row is written more often.
                    wait = max(0.0, min(renew_due - now, RECORD_SECS))
                self._recovered()
                self._record()
            except (psycopg.Error, StoreOpenError) as exc:
                self._last_error = str(exc).strip()
                self._failed()
                self._drop_connection()
                wait = self.poll_secs  # the watchdog ends a term whose lease runs out meanwhile
            self._stop.wait(wait)

    def _failed(self) -> None:
        """Log a failure of the lease connection: the first at once, then one a while."""
        now = self._clock.monotonic()
        self._failures += 1
        if self._failures == 1 or now - self._failure_logged >= FAILURE_LOG_SECS:
            more = f" ({self._failures} failures so far)" if self._failures > 1 else ""
            log.warning("leadership: lease connection failed: %s%s", self._last_error, more)
            self._failure_logged = now

    def _recovered(self) -> None:
        if self._failures:
            log.warning("leadership: lease connection back after %d failures", self._failures)
            self._failures = 0

    def _look(self) -> None:
        """A standby's round: note who leads; take over when the lease is free."""
        epoch, url, expired, gone = self._call(_READ.format(gone=_SESSION_GONE)).fetchone()
        self._saw_epoch(epoch)
        known = not (expired or gone) and url != self.advertise_url
        self._seen = LeaderView(False, url if known else None, epoch)
        if not (expired or gone):
            self._say_leader(url if known else None, epoch)
            return
        sent = self._clock.monotonic()
        try:
            won = self._call(
                _TAKE_OVER, {"url": self.advertise_url, "lease": self.lease_secs, "seen": epoch}
            ).fetchone()
        except psycopg.errors.LockNotAvailable:
            ended = self._call(_END_STUCK_WRITERS, {"writer": application_name("writer")})
            pids = [row[0] for row in ended.fetchall()]
            log.warning("leadership: ended stuck writer sessions %s of the old leader", pids)
            return  # the next look takes over
        if won is None:
            return  # another standby was quicker, or the leader renewed
        with self._lock:
            self._epoch = won[0]
            self._valid_until = lease.valid_until(sent, self.lease_secs)
        self._saw_epoch(won[0])
        self._store.fence_with(won[0])
        self._said_leader = (self.advertise_url, won[0])
        if epoch == 0:
            # Nobody led this database before: the first daemon on it, not a failover.
            log.info("leadership: leader of a new database, epoch %d", won[0])
        else:
            why = "its session is gone" if gone else "its lease expired"
            log.warning("leadership: took over as leader from %s, epoch %d (%s)", url, won[0], why)
        self._terms.put(("elected", won[0]))

    def _say_leader(self, url: str | None, epoch: int) -> None:
        """Log, once per leader, that this daemon is a standby and whom it follows: a
        standby's log must say what it is and where the leader is."""
        if (url, epoch) == self._said_leader or url is None:
            return
        self._said_leader = (url, epoch)
        log.info(
            "leadership: standby %s; the leader is %s (epoch %d)", self.advertise_url, url, epoch
        )

    def _renew(self) -> None:
        epoch = self._epoch
        if epoch is None:
            return
        sent = self._clock.monotonic()
        renewed = self._call(_RENEW, {"lease": self.lease_secs, "epoch": epoch}).fetchone()
        if renewed is None:
            self.step_down(epoch, "another scheduler holds the lease")
            return
        with self._lock:
            if self._epoch == epoch:
                self._valid_until = lease.valid_until(sent, self.lease_secs)

    def _saw_epoch(self, epoch: int) -> None:
        """Count a rise of the epoch as a change of leader (the first look only sets it)."""
        if self._epoch_seen is not None and epoch > self._epoch_seen:
            self.leader_changes += 1
        if self._epoch_seen is None or epoch > self._epoch_seen:
            self._epoch_seen = epoch

    def _record(self) -> None:
        """Write this daemon's row and read every row, when due: after RECORD_SECS, or at once
        when the role changed. A failure here is logged and left: the list may go stale, the
        lease must not suffer for it."""
        role = self.role()
        now = self._clock.monotonic()
        if role == self._recorded_role and now - self._recorded_at < RECORD_SECS:
            return
        params = {
            "id": self.daemon_id,
            "url": self.advertise_url,
            "role": role,
            "version": self._version,
            "forget": FORGET_SECS,
        }
        try:
            rows = self._call(_RECORD, params).fetchall()
        except (psycopg.Error, StoreOpenError) as exc:
            if not self._record_failing:  # once per outage: the lease's own failures log on
                log.warning("leadership: could not record this daemon in `daemons`: %s", exc)
            self._record_failing = True
            return
        self._record_failing = False
        self._recorded_at, self._recorded_role = now, role
        read_at = rows[-1][6] if rows else 0
        daemons = tuple(DaemonRow(*row[:6]) for row in rows)
        self.roster = Roster(daemons, read_at)
        self.roster_read_monotonic = self._clock.monotonic()

    def _call(self, query: str, params: dict[str, object] | None = None) -> psycopg.Cursor[Any]:
        """One statement on the lease connection, broken by the watchdog if it hangs."""
        conn = self._connection()
        self._call_deadline = self._clock.monotonic() + self.lease_secs / 2 + 0.5
        try:
            cursor = conn.execute(query, params)
        finally:
            self._call_deadline = None
        self._last_contact = self._clock.monotonic()
        return cursor

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        self._drop_connection()
        conn = connect(self._url, self.lease_secs, "lease")
        # A takeover that waits on a row lock, or a statement the server cannot answer, ends
        # within the lease rather than keeping this thread from its next renewal.
        conn.execute(f"SET statement_timeout = {int(self.lease_secs * 1000 / 2)}")
        conn.execute(f"SET lock_timeout = {int(LOCK_WAIT_SECS * 1000)}")
        # Two daemons making it at the same moment: IF NOT EXISTS does not lock, one fails.
        with contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
            conn.execute(_DAEMONS_SCHEMA)
        self._conn = conn
        return conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    # --- the watchdog -------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_SECS):
            now = self._clock.monotonic()
            epoch = self._epoch
            if epoch is not None and not lease.is_valid(now, self._valid_until):
                self.step_down(epoch, "the lease was not renewed in time")
            deadline = self._call_deadline
            if deadline is not None and now >= deadline:
                self._call_deadline = None
                log.warning("leadership: the database did not answer in time; reconnecting")
                interrupt(self._conn)

    # --- terms --------------------------------------------------------------------------------

    def _run_terms(self) -> None:
        while True:
            kind, epoch = self._terms.get()
            if kind == "stop":
                return
            try:
                if kind == "elected":
                    self._begin(epoch)
                else:
                    self.on_deposed(epoch)
            except Exception as exc:
                expected = expected_failure(exc)
                if expected is None:
                    log.exception("leadership: %s term %d failed", kind, epoch)
                else:
                    # The database went away under the term (a backend terminated, a
                    # restart): the next election deals with it, no traceback needed.
                    log.warning("leadership: %s term %d failed: %s", kind, epoch, expected)
                self.step_down(epoch, "its term could not start")

    def _begin(self, epoch: int) -> None:
        if self._epoch != epoch:
            return  # deposed before the term could start
        started = self._clock.monotonic()
        self.on_elected(epoch)
        with self._lock:
            if self._epoch == epoch:
                self._serving = True
        log.warning(
            "leadership: serving as leader, epoch %d (ready in %.2fs)",
            epoch,
            self._clock.monotonic() - started,
        )
