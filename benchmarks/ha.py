"""The PostgreSQL figures (issue 12): submissions beside SQLite's, and failover times.

- `pg_submit_1`, `pg_submit_8`: the submissions of `scenarios.submissions`, on a PostgreSQL
  database (one leader, no standby), then a SIGKILL and a count of the acknowledged jobs.
- `failover_sigkill`: two daemons; the leader's process group is SIGKILLed; seconds until the
  standby answers `/leader` with 200 (it has loaded the jobs and serves).
- `failover_sigstop`: the same after a SIGSTOP (a hang): the standby must wait for the lease
  (LEADER_LEASE_SECS, default 5) to run out.

Each run gets a database of its own on the server at BENCH_POSTGRES_URL (else
TEST_POSTGRES_URL, else the local one), dropped afterwards. Without a server the scenario is
skipped with a line saying so.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import os
import signal
import sys
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from . import scenarios, sessions
from .procs import Server

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"

FAILOVER_RUNS = 3
"""Failovers measured per kind at least (the median is reported)."""

DEADLINE_S = 60.0
"""Seconds a daemon may take to lead before the benchmark gives up."""

_numbers = itertools.count(1)


def server_url() -> str:
    return (
        os.environ.get("BENCH_POSTGRES_URL")
        or os.environ.get("TEST_POSTGRES_URL")
        or (DEFAULT_SERVER)
    )


@contextlib.contextmanager
def database() -> Any:
    """A fresh database's URL, dropped on the way out."""
    name = f"tiny_scheduler_bench_{os.getpid()}_{next(_numbers)}"
    with psycopg.connect(server_url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(server_url())._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(server_url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postgres(bench: scenarios.Bench) -> dict[str, Any]:
    try:
        with psycopg.connect(server_url(), connect_timeout=3):
            pass
    except psycopg.Error as exc:
        print(f"[bench] postgres skipped: no server at {server_url()} ({exc})", file=sys.stderr)
        return {}
    out = submissions(bench)
    runs = max(FAILOVER_RUNS, bench.options.runs)
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        cases = [failover(bench, sig) for _ in range(runs)]
        out[f"failover_{sig.name.lower()}"] = scenarios._case(cases)
    return out


def submissions(bench: scenarios.Bench) -> dict[str, Any]:
    out: dict[str, Any] = {}
    acknowledged = 0
    with database() as url:
        server = bench.server("pg-submit", url, fresh=False).start()  # type: ignore[arg-type]
        wait_leading(server)
        try:
            for clients in (1, 8):
                runs = []
                for _ in range(bench.options.runs):
                    window = bench.window()
                    per = scenarios.split(clients, scenarios.CONNS_PER_PROCESS)
                    workers = [(sessions.submit_worker, (n,)) for n in per]
                    result = bench.load(server, workers, window, f"pg-submit-{clients}")
                    acknowledged += sum(w["ok"] for w in result.workers)
                    runs.append(scenarios.run_figures(result, window))
                out[f"pg_submit_{clients}"] = scenarios._case(runs)
        finally:
            server.process.kill()
        with psycopg.connect(url) as conn:
            stored = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
    out["pg_durability"] = {"acknowledged": acknowledged, "stored_after_sigkill": stored}
    if stored < acknowledged:
        raise RuntimeError(f"{acknowledged} jobs acknowledged but only {stored} in the database")
    return out


def failover(bench: scenarios.Bench, sig: signal.Signals) -> dict[str, float]:
    """Two daemons; `sig` to the leader; seconds until the standby serves."""
    with database() as url:
        first = bench.server("pg-failover-1", url, fresh=False).start()  # type: ignore[arg-type]
        wait_leading(first)
        second = bench.server("pg-failover-2", url, fresh=False).start()  # type: ignore[arg-type]
        try:
            began = time.monotonic()
            os.killpg(first.master_pid, sig)
            wait_leading(second)
            seconds = time.monotonic() - began
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(first.master_pid, signal.SIGCONT)
            first.process.kill()
            second.process.stop()
    print(f"[bench] failover after {sig.name}: {seconds:.2f}s", file=sys.stderr, flush=True)
    return {"seconds": round(seconds, 3)}


def wait_leading(server: Server) -> None:
    """Until the daemon answers /leader with 200: it leads, has loaded the jobs, serves."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection(*server.addr, timeout=1)
        try:
            conn.request("GET", "/leader")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.005)  # polling the daemon's state, as fine-grained as the figure needs
    raise TimeoutError(f"no leader at {server.addr} after {DEADLINE_S}s")
