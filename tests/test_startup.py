"""Start-up, as an operator sees it in the daemon's output: the banner saying how it is set up
(and the warning when anyone on the network could use it), and the one-line errors that stop it
before it creates anything: a listen address that does not parse, and each way the database's
place can be unusable.

The daemon is the real command (`tiny-scheduler serve`'s gunicorn line). Cases that need the
machine to refuse something root is otherwise allowed run the daemon without root's powers over
file permissions (setpriv), or in a mount namespace of its own where its folder is read-only
(unshare).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import BASE_ENV, SchedulerFactory, stop_scheduler
from helpers import wait_for

from tiny_scheduler.config import ConfigError, Settings
from tiny_scheduler.dev.daemon import PortReservation, SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.server import banner
from tiny_scheduler.server.daemon_command import SERVE_ARGV
from tiny_scheduler.server.preflight import ListenAddress, parse_bind

EXIT_SECS = 30.0
"""Seconds a daemon that must refuse to start may take to exit (the machine is shared)."""

# Root ignores permission bits; this runs a command as root without that power.
WITHOUT_DAC_OVERRIDE = (
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
    "--",
)


def refused_start(
    tmp_path: Path, env: dict[str, str], wrapper: Sequence[str] = ()
) -> tuple[int, str]:
    """Run the daemon, which must exit by itself; its exit code and everything it printed."""
    command = [*wrapper, *SERVE_ARGV]
    with PortReservation() as port:  # in case it gets as far as binding
        proc = subprocess.Popen(
            command,
            env={**os.environ, **BASE_ENV, "SCHEDULER_BIND": f"127.0.0.1:{port}", **env},
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=EXIT_SECS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            pytest.fail(f"the daemon did not refuse to start: {' '.join(command)}")
    return proc.returncode, output


def one_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    return lines[0]


# --- the listen address -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown", "beyond"),
    [
        ("0.0.0.0:9001", "0.0.0.0:9001", True),
        (":9001", "0.0.0.0:9001", True),
        ("[::]:9001", "[::]:9001", True),
        ("10.1.2.3:80", "10.1.2.3:80", True),
        ("scheduler.internal:9001", "scheduler.internal:9001", True),
        ("127.0.0.1:9001", "127.0.0.1:9001", False),
        ("127.8.9.10:9001", "127.8.9.10:9001", False),
        ("localhost:9001", "localhost:9001", False),
        ("[::1]:9001", "[::1]:9001", False),
        ("tcp://127.0.0.1:9001", "127.0.0.1:9001", False),
        ("unix:/run/ts.sock", "unix:/run/ts.sock", False),
        ("fd://3", "fd://3", False),
    ],
)
def test_listen_addresses_parse(text: str, shown: str, beyond: bool) -> None:
    address = parse_bind(text)
    assert (str(address), address.beyond_loopback) == (shown, beyond)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("nonsense:abc", "the port 'abc' is not a number from 1 to 65535"),
        ("127.0.0.1:0", "the port '0' is not a number"),
        ("127.0.0.1:65536", "the port '65536' is not a number"),
        ("127.0.0.1", "no port"),
        ("::1:9001", "write an IPv6 address in brackets"),
        ("[::1]", "an IPv6 address in brackets needs :PORT after it"),
        ("[db]:9001", "'db' is not an IPv6 address"),
        ("unix:", "the socket path is empty"),
        ("fd://three", "'three' is not a file descriptor number"),
    ],
)
def test_bad_listen_addresses_name_the_variable(text: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_bind(text)
    assert str(caught.value).startswith("SCHEDULER_BIND must be HOST:PORT, [IPV6]:PORT, ")
    assert f"got {text!r}: {why}" in str(caught.value)


def test_a_bad_listen_address_stops_the_daemon_before_the_database_exists(
    tmp_path: Path,
) -> None:
    database = tmp_path / "jobs.db"
    code, output = refused_start(
        tmp_path, {"SCHEDULER_BIND": "nonsense:abc", "SCHEDULER_DB": str(database)}
    )
    assert code != 0
    assert one_line(output) == (
        "tiny-scheduler: configuration error: SCHEDULER_BIND must be HOST:PORT, [IPV6]:PORT, "
        "unix:PATH or fd://N, got 'nonsense:abc': the port 'abc' is not a number from 1 to 65535"
    )
    assert list(tmp_path.iterdir()) == []


# --- the database's place -----------------------------------------------------------------------


def test_a_missing_directory(tmp_path: Path) -> None:
    database = tmp_path / "not-yet" / "jobs.db"
    code, output = refused_start(tmp_path, {"SCHEDULER_DB": str(database)})
    assert code != 0
    assert one_line(output) == (
        f"tiny-scheduler: SCHEDULER_DB: the directory {database.parent} for the database "
        f"{database} does not exist; create it or choose another path"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_path_that_is_a_directory(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    code, output = refused_start(tmp_path, {"SCHEDULER_DB": str(folder)})
    assert code != 0
    assert one_line(output) == (
        f"tiny-scheduler: SCHEDULER_DB: {folder} is a directory; name the database file in "
        f"it, e.g. {folder / 'scheduler.db'}"
    )
    assert list(folder.iterdir()) == []


def test_a_relative_path_is_named_in_full(tmp_path: Path) -> None:
    code, output = refused_start(tmp_path, {"SCHEDULER_DB": "missing/jobs.db"})
    assert code != 0
    assert f"the directory {tmp_path / 'missing'} for the database " in one_line(output)


def test_a_directory_that_is_not_writable(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    wrapper: Sequence[str] = ()
    if os.geteuid() == 0:
        assert shutil.which("setpriv"), "root needs setpriv (util-linux) for this test"
        wrapper = WITHOUT_DAC_OVERRIDE
    try:
        code, output = refused_start(tmp_path, {"SCHEDULER_DB": str(folder / "jobs.db")}, wrapper)
    finally:
        folder.chmod(0o755)
    assert code != 0
    line = one_line(output)
    assert line.startswith(
        f"tiny-scheduler: SCHEDULER_DB: the directory {folder} for the database "
        f"{folder / 'jobs.db'} is not writable by user "
    )
    assert line.endswith("; the database and its -wal and -shm files are created there")
    assert list(folder.iterdir()) == []


def read_only_mount(folder: Path) -> list[str]:
    """A command prefix that runs its command in a mount namespace of its own, where `folder`
    is mounted read-only; the test is skipped where the machine allows no such namespace."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    prefix = ["unshare", *user, "--mount", "sh", "-c", script, str(folder)]
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is missing: cannot make a read-only mount")
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"this machine allows no private read-only mount: {probe.stderr.strip()}")
    return prefix


def test_a_read_only_file_system(tmp_path: Path) -> None:
    folder = tmp_path / "frozen"
    folder.mkdir()
    code, output = refused_start(
        tmp_path, {"SCHEDULER_DB": str(folder / "jobs.db")}, read_only_mount(folder)
    )
    assert code != 0
    assert one_line(output) == (
        f"tiny-scheduler: SCHEDULER_DB: the directory {folder} for the database "
        f"{folder / 'jobs.db'} is on a read-only file system"
    )
    assert list(folder.iterdir()) == []


# --- the banner ---------------------------------------------------------------------------------


def log_text(proc: SchedulerProcess) -> str:
    assert proc.log_path is not None
    return Path(proc.log_path).read_text()


def test_the_banner_says_how_the_daemon_is_set_up(
    scheduler_factory: SchedulerFactory, registry: FakeRegistry, tmp_path: Path
) -> None:
    proc = scheduler_factory(
        env={"TINYAWS_API_KEY": "k3y", "SNS_URL": "http://127.0.0.1:9", "SNS_TOPIC": "events"}
    )
    text = wait_for(lambda: "SNS events" in log_text(proc) and log_text(proc))
    block = (
        rf"\[INFO\] tiny-scheduler {re.escape(banner.version())} starting\n"
        rf"  listening on   http://127\.0\.0\.1:{proc.port} \(loopback only\)\n"
        r"  connections    at most 10000, 2000 per client address \(open files: [^\n]+\)\n"
        rf"  dashboard      http://127\.0\.0\.1:{proc.port}/ui/\n"
        rf"  database       {re.escape(str(tmp_path / 'scheduler.db'))} \(SQLite\)\n"
        rf"  registry       {re.escape(registry.url)}\n"
        r"  auth           on \(bearer key; the tiny-aws agent's poll for a listed node and its "
        r"PATCH exempt: AUTH_AGENT_EXEMPT=auto\)\n"
        r"  timeout scan   every 3600 s\n"
        r"  SQS ingestion  off\n"
        r"  SNS events     on \(http://127\.0\.0\.1:9, topic events\)\n"
    )
    assert re.search(block, text), text
    assert text.count(" starting\n") == 1
    assert "[WARNING]" not in text
    assert banner.version() != "unknown"


def test_listening_beyond_loopback_with_auth_off_warns(
    registry: FakeRegistry, tmp_path: Path, unused_port: int
) -> None:
    port = unused_port
    proc = SchedulerProcess(
        str(tmp_path / "scheduler.db"),
        env={**BASE_ENV, "REGISTRY_URL": registry.url, "SCHEDULER_BIND": f"0.0.0.0:{port}"},
        port=port,
        log_path=str(tmp_path / "scheduler.log"),
    )
    try:
        proc.start()
        text = wait_for(lambda: "[WARNING]" in log_text(proc) and log_text(proc))
    finally:
        stop_scheduler(proc)
    assert f"  listening on   http://0.0.0.0:{port} (every interface)\n" in text
    assert "  auth           off (TINYAWS_API_KEY is unset: no request needs a key)\n" in text
    [warning] = [line for line in text.splitlines() if "[WARNING]" in line]
    assert warning.endswith(
        f"[WARNING] listening on 0.0.0.0:{port} with auth off: anyone who can reach this port "
        "can run shell commands on every node. Set TINYAWS_API_KEY, or listen on loopback only "
        f"(SCHEDULER_BIND=127.0.0.1:{port})"
    )


@pytest.mark.parametrize(
    ("bind", "key", "warned"),
    [
        ("0.0.0.0:9001", None, True),
        ("192.168.1.5:9001", None, True),
        ("0.0.0.0:9001", "k3y", False),
        ("127.0.0.1:9001", None, False),
        ("unix:/run/ts.sock", None, False),
    ],
)
def test_who_gets_the_warning(bind: str, key: str | None, warned: bool) -> None:
    address: ListenAddress = parse_bind(bind)
    warning = banner.exposure_warning(Settings(bind=bind, api_key=key), address)
    assert (warning is not None) is warned


def test_a_database_password_stays_out_of_the_banner() -> None:
    settings = Settings(db_path="postgresql://sched:hunter2@db.internal:5432/jobs")
    text = "\n".join(banner.lines(settings, parse_bind("127.0.0.1:9001")))
    assert "hunter2" not in text
    assert "  database       postgresql://sched:***@db.internal:5432/jobs\n" in text + "\n"
