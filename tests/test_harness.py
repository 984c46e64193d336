"""The suite's own guards for what a machine may lack: without a browser or PostgreSQL the tests
that need one are skipped with one line saying how to run them, and with `TEST_REQUIRE_BROWSER=1`
or `TEST_REQUIRE_POSTGRES=1` (as `.ci/run` sets) they fail instead. Proven by running pytest on
a few of those tests in a child process whose world lacks the thing; and the PostgreSQL
database factory proven against the real server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PostgresDatabases

ROOT = Path(__file__).resolve().parent.parent

BROWSER_TESTS = (
    "tests/test_ui_browser.py::test_overview_shows_counts_nodes_and_failures",
    "tests/test_ui_browser.py::test_page_refreshes_itself",
)
POSTGRES_TEST = "tests/test_harness.py::test_a_fresh_database_per_test"


def run_pytest(tests: tuple[str, ...], **env: str) -> subprocess.CompletedProcess[str]:
    """pytest, as `make test` runs it (the project's options), on `tests` with `env` added; in
    one process (`-n 0`): a few tests need no workers of their own."""
    unset = ("TEST_REQUIRE_BROWSER", "TEST_REQUIRE_POSTGRES", "TEST_POSTGRES_URL")
    base = {name: value for name, value in os.environ.items() if name not in unset}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", *tests],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def skip_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("SKIPPED")]


def without_browser() -> dict[str, str]:
    """A PATH holding the venv's programs only: no chromium, no chromedriver."""
    return {"PATH": str(Path(sys.executable).parent)}


def without_postgres(port: int) -> dict[str, str]:
    """A server URL on a loopback port nobody listens on (`unused_port`)."""
    return {"TEST_POSTGRES_URL": f"postgresql://postgres@127.0.0.1:{port}/postgres"}


def test_browser_tests_skip_with_one_line_saying_how_to_run_them() -> None:
    run = run_pytest(BROWSER_TESTS, **without_browser())
    assert run.returncode == 0, run.stdout + run.stderr
    [line] = skip_lines(run.stdout)
    assert re.match(r"SKIPPED \[2\] tests/test_ui_browser\.py:\d+: chromium and chromedriver", line)
    assert "apt-get install chromium chromium-driver" in line
    assert "TEST_REQUIRE_BROWSER=1" in line
    assert re.search(r"\b2 skipped\b", run.stdout.splitlines()[-1])


def test_browser_tests_fail_when_required() -> None:
    run = run_pytest(BROWSER_TESTS, TEST_REQUIRE_BROWSER="1", **without_browser())
    assert run.returncode == 1, run.stdout + run.stderr
    assert not skip_lines(run.stdout)
    assert "chromium and chromedriver not found" in run.stdout
    assert re.search(r"\b2 errors?\b", run.stdout.splitlines()[-1])


def test_postgres_tests_skip_with_one_line_saying_how_to_run_them(unused_port: int) -> None:
    env = without_postgres(unused_port)
    run = run_pytest((POSTGRES_TEST,), **env)
    assert run.returncode == 0, run.stdout + run.stderr
    [line] = skip_lines(run.stdout)
    port = env["TEST_POSTGRES_URL"].split(":")[-1].split("/")[0]
    assert re.match(
        rf"SKIPPED \[1\] tests/conftest\.py:\d+: no PostgreSQL answers at 127\.0\.0\.1:{port} ",
        line,
    )
    assert "set TEST_POSTGRES_URL" in line
    assert "TEST_REQUIRE_POSTGRES=1" in line


def test_postgres_tests_fail_when_required(unused_port: int) -> None:
    run = run_pytest((POSTGRES_TEST,), TEST_REQUIRE_POSTGRES="1", **without_postgres(unused_port))
    assert run.returncode == 1, run.stdout + run.stderr
    assert not skip_lines(run.stdout)
    assert "no PostgreSQL answers at 127.0.0.1:" in run.stdout
    assert re.search(r"\b1 error\b", run.stdout.splitlines()[-1])


def test_a_fresh_database_per_test(postgres_database: PostgresDatabases) -> None:
    import psycopg

    first, second = postgres_database.create(), postgres_database.create()
    assert first != second
    with psycopg.connect(first) as conn:
        conn.execute("CREATE TABLE jobs (seq integer PRIMARY KEY, command text NOT NULL)")
        conn.execute("INSERT INTO jobs VALUES (1, 'true')")
        conn.commit()
        assert conn.execute("SELECT command FROM jobs").fetchall() == [("true",)]
    with psycopg.connect(second) as conn:
        assert conn.execute("SELECT to_regclass('jobs')").fetchone() == (None,)

    names = {url.rsplit("/", 1)[-1] for url in (first, second)}
    with psycopg.connect(postgres_database.server_url) as admin:
        listed = admin.execute("SELECT datname FROM pg_database").fetchall()
        assert names <= {name for (name,) in listed}

        # Dropped even while a connection to it is still open (a daemon a test left running).
        holder = psycopg.connect(first)
        postgres_database.drop(first)
        with pytest.raises(psycopg.OperationalError):
            holder.execute("SELECT 1")
        holder.close()
        gone = admin.execute(
            "SELECT count(*) FROM pg_database WHERE datname = %s", (first.rsplit("/", 1)[-1],)
        ).fetchone()
        assert gone == (0,)
