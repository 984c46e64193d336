"""Every command README.md and docs/*.md show in a shell block is run, or named here with what
runs it.

A shell block is a fenced block marked `sh`, `shell`, `bash` or `console`. In a block with
`$ ` prompts the prompted lines are the commands (the rest is their output); in one without,
every line is (a trailing backslash joins the next; `#` comments are dropped). Each command
is then one of:

- run here, in order, file by file, each file against a fresh dev cluster of its own (real
  scheduler under gunicorn, real agents), with `SCHEDULER_URL` pointing at it and
  `localhost:9001` in a command read as that cluster's address. A command must exit 0,
  unless the block shows `error: …` right after it (then it must fail with 1, not crash);
- a daemon start line (`… serve`, `… gunicorn -c gunicorn.conf.py`), started here with the
  machine-specific values (the database path, the registry) swapped for a sandbox's, until
  it is healthy, then stopped with SIGTERM;
- on `ELSEWHERE`, with the test or target that runs it. A command on neither fails the test.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from helpers import wait_for

from tiny_scheduler.dev.cluster import ClusterConfig, DevCluster
from tiny_scheduler.dev.daemon import free_port
from tiny_scheduler.dev.registry import FakeRegistry

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent

ELSEWHERE = {
    "make demo": "tests/test_dev_cluster.py::test_the_demo_ends_as_expected runs the demo",
    "make test": "this suite",
    "make install": "every other make target runs it first (its prerequisite)",
    "make lint": "ruff check . and ruff format --check ., the house rule before each commit",
    "make soak": "pytest -m slow: the tests marked slow",
    "make test-quick": "pytest -m quick: the tests conftest.py marks quick (a part of this suite)",
    "make test-stress": "tests/stress.sh around this suite (CI runs this suite itself)",
    "make bench": "benchmarks/__main__.py; docs/benchmarks.md holds its last figures",
    (
        'printf \'echo one\\n# a comment\\n{"command": "echo two", "priority": 70}\\n\''
        " | tiny-scheduler submit --from-file - --queue nightly"
    ): "tests/test_batch_submit.py::test_the_documented_pipe runs it against a daemon",
    "tiny-scheduler dev": "tests/test_front_door.py::test_the_dev_banner_names_the_dashboard",
    "tiny-scheduler dev --standby 2": "tests/test_ha.py: a dev cluster with standbys",
    **{
        command: "tests/test_simulate.py::test_the_commands_docs_simulate_shows_run_on_a_history"
        for command in (
            "tiny-scheduler simulate --db /var/lib/tiny-scheduler/scheduler.db --nodes +2",
            "tiny-scheduler simulate --db /var/lib/tiny-scheduler/scheduler.db --since 7d"
            " --placement binpack",
            "tiny-scheduler simulate --db /var/lib/tiny-scheduler/scheduler.db --queue nightly=3"
            " --json",
            "tiny-scheduler simulate --db /var/lib/tiny-scheduler/scheduler.db --nodes nodes.json"
            " --user ann=2",
        )
    },
    "tiny-scheduler --url http://sched-1:9001 agent --work-dir /var/lib/tiny-scheduler-agent": (
        "tests/test_agent_process.py runs `tiny-scheduler agent` with these options"
    ),
}
"""Commands run by something else than this test, and what runs them."""

ON_POSTGRES = "SCHEDULER_DB=postgresql://"
"""A daemon start line for PostgreSQL: tests/test_ha.py runs daemons so (needs a server)."""

SHELL_BLOCK = re.compile(r"^```(sh|shell|bash|console)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def commands(text: str) -> Iterator[tuple[str, bool]]:
    """Each command of the shell blocks in `text`, and whether the block shows it failing."""
    for _, body in SHELL_BLOCK.findall(text):
        lines = body.splitlines()
        prompted = any(line.startswith("$ ") for line in lines)
        joined: list[str] = []
        for line in lines:
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1].rstrip() + " " + line.strip()
            else:
                joined.append(line)
        for number, line in enumerate(joined):
            if prompted and not line.startswith("$ "):
                continue
            command = _without_comment(line.removeprefix("$ ")).strip()
            if not command:
                continue
            following = joined[number + 1] if number + 1 < len(joined) else ""
            yield command, prompted and following.startswith("error: ")


def _without_comment(line: str) -> str:
    """The line without a `#` comment: a `#` that starts the line or follows two spaces."""
    if line.lstrip().startswith("#"):
        return ""
    return re.split(r"\s{2,}#", line, maxsplit=1)[0]


def documented() -> dict[Path, list[tuple[str, bool]]]:
    return {path: list(commands(path.read_text())) for path in DOCS}


def is_daemon_start(command: str) -> bool:
    return command.endswith(("tiny-scheduler serve", "gunicorn -c gunicorn.conf.py"))


def runs_here(command: str) -> bool:
    words = shlex.split(command)
    return words[0] in ("tiny-scheduler", "curl") and command not in ELSEWHERE


def test_the_reader_finds_the_commands() -> None:
    # A check of the reader on a known block: otherwise finding nothing would pass.
    text = "```console\n$ a --x  # note\nout\nerror: no\n$ b \\\n  c\nerror: x\n```\n"
    assert list(commands(text)) == [("a --x", False), ("b c", True)]
    assert ("make demo", False) in documented()[ROOT / "README.md"]


def test_every_command_is_run_or_named() -> None:
    unknown = [
        (path.name, command)
        for path, found in documented().items()
        for command, _ in found
        if not (
            runs_here(command)
            or is_daemon_start(command)
            or command in ELSEWHERE
            or command.startswith("export SCHEDULER_URL=")  # the sandbox sets it
        )
    ]
    assert unknown == []


@pytest.mark.parametrize(
    "path",
    [path for path in DOCS if any(runs_here(c) for c, _ in commands(path.read_text()))],
    ids=lambda path: path.name,
)
def test_the_commands_of_a_page_run(path: Path, tmp_path: Path) -> None:
    config = ClusterConfig.quick(agents=2, work_dir=str(tmp_path / "cluster"))
    with DevCluster(config) as cluster:
        address = cluster.scheduler_url.removeprefix("http://")
        env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "SCHEDULER_URL": cluster.scheduler_url,
        }
        env.pop("TINYAWS_API_KEY", None)
        ran = 0
        for command, fails in commands(path.read_text()):
            if not runs_here(command):
                continue
            done = subprocess.run(
                ["sh", "-c", command.replace("localhost:9001", address)],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert "Traceback" not in done.stderr, (command, done.stderr)
            assert done.returncode == (1 if fails else 0), (command, done.stdout, done.stderr)
            ran += 1
        print(f"{path.name}: {ran} commands ran against a dev cluster")


def test_the_daemon_start_lines_start_a_daemon(tmp_path: Path) -> None:
    registry = FakeRegistry()
    registry.start()
    try:
        lines = [
            command
            for found in documented().values()
            for command, _ in found
            if is_daemon_start(command) and ON_POSTGRES not in command
        ]
        assert len(lines) >= 2  # README's and operations.md's
        for number, command in enumerate(lines):
            _start_and_stop(command, tmp_path / f"db-{number}", registry.url)
    finally:
        registry.stop()


def _start_and_stop(command: str, folder: Path, registry_url: str) -> None:
    """The documented line, with this machine's values swapped for the sandbox's."""
    folder.mkdir()
    port = free_port()
    local = (
        command.replace("/var/lib/tiny-scheduler/jobs.db", str(folder / "jobs.db"))
        .replace("http://registry:9000", registry_url)
        .replace(".venv/bin/", f"{BIN}/")
    )
    assert local != command  # the swap found what it swaps
    env = {**os.environ, "SCHEDULER_BIND": f"127.0.0.1:{port}", "SQS_URL": "", "SNS_URL": ""}
    daemon = subprocess.Popen(
        ["sh", "-c", f"exec env {local}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        health = wait_for(
            lambda: _health(port) or (daemon.poll() is not None and "exited"),
            timeout=60,
            message=f"{command} to be healthy",
        )
        assert health == "healthy", (command, daemon.stderr and daemon.stderr.read())
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, (command, err[-2000:])


def _health(port: int) -> str | None:
    try:
        return requests.get(f"http://127.0.0.1:{port}/health", timeout=2).json()["status"]
    except requests.RequestException:
        return None


def test_every_variable_the_daemon_reads_is_in_the_configuration_reference() -> None:
    source = (ROOT / "tiny_scheduler" / "config.py").read_text()
    read = set(re.findall(r'env\.\w+\(\s*"([A-Z][A-Z0-9_]+)"', source))
    assert {"SCHEDULER_DB", "MAX_WAITERS"} <= read  # the reader works
    reference = (ROOT / "docs" / "configuration.md").read_text()
    assert sorted(name for name in read if f"`{name}`" not in reference) == []
