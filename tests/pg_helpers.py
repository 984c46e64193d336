"""PostgreSQL for the tests: find the server, make a database of our own, drop it afterwards.

The server is the one at `TEST_POSTGRES_URL`, else `postgresql://postgres@127.0.0.1:5432/postgres`
when it answers. Without one, tests that need it are skipped with one line saying so; with
`TEST_REQUIRE_POSTGRES=1` (CI) that skip is a failure instead.

Every database made here is named `tiny_scheduler_test_<pid>_<n>` and dropped when the test
run ends; one left behind by a run that was killed (its pid gone) is dropped by the next run.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import os
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
"""The server tests use when TEST_POSTGRES_URL is unset."""

PREFIX = "tiny_scheduler_test_"

_created: list[str] = []
_numbers = itertools.count(1)


def server_url() -> str:
    return os.environ.get("TEST_POSTGRES_URL") or DEFAULT_URL


@functools.cache
def _unreachable() -> str | None:
    """Why the server cannot be used, or None when it answers."""
    try:
        with psycopg.connect(server_url(), connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL not reachable at {server_url()} ({str(exc).strip()})"
    _drop_leftovers()
    return None


def require_server() -> None:
    """Skip the test (fail it under TEST_REQUIRE_POSTGRES=1) when there is no server."""
    reason = _unreachable()
    if reason is None:
        return
    if os.environ.get("TEST_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"{reason}; TEST_REQUIRE_POSTGRES=1 forbids skipping", pytrace=False)
    pytest.skip(reason)


def fresh_database() -> str:
    """The URL of a new, empty database of this test run's own (the test is skipped when
    there is no server)."""
    require_server()
    name = f"{PREFIX}{os.getpid()}_{next(_numbers)}"
    with psycopg.connect(server_url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    _created.append(name)
    return database_url(name)


def database_url(name: str) -> str:
    parts = urlsplit(server_url())
    return urlunsplit(parts._replace(path=f"/{name}"))


def drop_database(name: str) -> None:
    with psycopg.connect(server_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@atexit.register
def _drop_created() -> None:
    for name in _created:
        try:
            drop_database(name)
        except psycopg.Error as exc:
            print(f"could not drop test database {name}: {exc}")


def _drop_leftovers() -> None:
    with psycopg.connect(server_url(), autocommit=True) as conn:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", (PREFIX + "%",)
            )
        ]
    for name in names:
        pid = name[len(PREFIX) :].partition("_")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            drop_database(name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
