"""The command line starts without the server: `--version`, `--help`, `status` and `list`
import none of the daemon's libraries, and `submit` (called in shell loops) not even
`requests` or `http.client`: only its own command's module, over a plain socket.

Checked by what Python imports (`-X importtime` lists every module), not by a clock: a test
that timed start-up would fail on a busy machine and pass on a broken one. The figure itself
is measured and printed (`pytest -s`) for the record.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

SERVER_LIBRARIES = (
    "flask",
    "gunicorn",
    "werkzeug",
    "sortedcontainers",
    "psycopg",
    "prometheus_client",
)
"""Top-level packages only the daemon needs."""


def imported(*args: str) -> set[str]:
    """The top-level packages `python -m tiny_scheduler.cli ARGS` imports."""
    return {name.split(".")[0] for name in imported_modules(*args)}


def imported_modules(*args: str) -> set[str]:
    """Every module `python -m tiny_scheduler.cli ARGS` imports, by its full name."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tiny_scheduler.cli", *args],
        capture_output=True,
        text=True,
        # A port nothing listens on: `status` and `list` fail fast, after their imports.
        env={"SCHEDULER_URL": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    assert "tiny_scheduler" in names, done.stderr[-2000:]
    return names


@pytest.mark.parametrize("args", [("--version",), ("--help",), ("status", "1"), ("list",)])
def test_the_cli_imports_nothing_of_the_server(args: tuple[str, ...]) -> None:
    found = imported(*args)
    assert not found & set(SERVER_LIBRARIES), sorted(found & set(SERVER_LIBRARIES))


def test_submit_imports_neither_requests_nor_http_client_nor_other_commands() -> None:
    found = imported_modules("submit", "true")
    heavy = {"requests", "urllib3", "http.client", "email.parser", "ssl"}
    assert not found & heavy, sorted(found & heavy)
    # Only the command that runs is imported: not the agent's, the dev cluster's, the daemon's.
    others = {
        "tiny_scheduler.cli.agent_command",
        "tiny_scheduler.cli.dev_commands",
        "tiny_scheduler.server.daemon_command",
        "tiny_scheduler.domain.validation",
        "tiny_scheduler.config",
    }
    assert not found & others, sorted(found & others)


def test_version_and_help_do_not_even_import_requests() -> None:
    # requests and urllib3 are most of the client's import time; only a call needs them.
    assert "requests" not in imported("--version")
    assert "requests" not in imported("--help")


def test_report_start_up_figures() -> None:
    """Not an assertion: the best of five wall-clock runs, printed for the record."""
    for args in (("--version",), ("--help",), ("submit", "true")):
        best = min(_run_secs(args) for _ in range(5))
        print(f"tiny-scheduler {' '.join(args)}: {best * 1000:.0f} ms (best of 5)")


def _run_secs(args: tuple[str, ...]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tiny_scheduler.cli", *args], capture_output=True)
    return time.perf_counter() - started


def test_the_quick_exit_keeps_the_output_and_the_exit_status() -> None:
    """`run` ends the process without tearing the interpreter down: what was printed still
    arrives whole (through a pipe, flushed), and the status is the command's."""
    env = {"SCHEDULER_URL": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin"}
    shown = subprocess.run(
        [sys.executable, "-m", "tiny_scheduler.cli", "--help"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert shown.returncode == 0
    assert "submit" in shown.stdout and shown.stdout.endswith("\n")
    failed = subprocess.run(
        [sys.executable, "-m", "tiny_scheduler.cli", "status", "1"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert failed.returncode == 1
    assert failed.stderr.startswith("error: cannot reach the scheduler at http://127.0.0.1:9")
    misused = subprocess.run(
        [sys.executable, "-m", "tiny_scheduler.cli", "submit", "--port", "x"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert misused.returncode == 2 and "Invalid value for '--port'" in misused.stderr
