"""Start and stop a real scheduler daemon (gunicorn) as a child process.

The dev cluster, the tests and the benchmark all run the scheduler this way, exactly as an
operator would: `tiny-scheduler serve`'s command line (`daemon_command.SERVE_ARGV`),
configured only through environment variables, on a loopback port, waited for until `/health`
answers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import requests

from ..server.daemon_command import SERVE_ARGV


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (and anyone may take before you do: to keep it
    for a server about to start, see `PortReservation`)."""
    with contextlib.closing(socket.socket()) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class PortReservation:
    """A free TCP port held for a server that has yet to listen on it.

    Holds a socket bound to the port (with SO_REUSEADDR, never listening): while it is held
    the kernel gives the port to nobody else, neither to a bind to port 0 (`free_port`,
    another reservation, in any process) nor to an outgoing connection, and a connection to
    it is refused; yet a server that binds it with SO_REUSEADDR, as gunicorn and http.server
    do, may listen on it. Release it once the server listens, or when it is not needed.
    (After a plain `free_port()` the port is anyone's until the server binds it: tests running
    in parallel could give two daemons the same one.)
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._sock: socket.socket | None = socket.socket()
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, 0))
        except OSError:
            self.release()
            raise
        self.port: int = self._sock.getsockname()[1]

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> int:
        return self.port

    def __exit__(self, *exc: object) -> None:
        self.release()


class SchedulerProcess:
    """One gunicorn-run scheduler; `start()` returns once it answers /health."""

    argv: tuple[str, ...] = SERVE_ARGV
    """The command line it runs: the daemon's own."""
    cwd: str | None = None
    """Where it runs (None: here). `python -m` puts this folder first on the module path, so a
    checkout of another commit runs that commit's code (the benchmark's previous tree)."""

    def __init__(
        self,
        db_path: str,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        log_path: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.db_path = db_path
        self._reservation: PortReservation | None = None
        if not port:
            # A port of its own, held until the daemon listens on it (or exits).
            self._reservation = PortReservation(host)
            port = self._reservation.port
        self.port = port
        self.url = f"http://{host}:{self.port}"
        self.extra_env = dict(env or {})
        self.log_path = log_path
        self._bind = f"{host}:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = None

    def start(self, timeout: float = 20.0, wait: bool = True) -> SchedulerProcess:
        env = {**os.environ, "SCHEDULER_DB": self.db_path, "SCHEDULER_BIND": self._bind}
        if self.db_path.startswith(("postgresql://", "postgres://")):
            # Daemons sharing a database send clients to each other at this URL.
            env["SCHEDULER_ADVERTISE_URL"] = self.url
        env.update(self.extra_env)
        if self.log_path:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            self.argv,
            env=env,
            cwd=self.cwd,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if self._log else subprocess.DEVNULL,
            start_new_session=True,  # so a kill reaches gunicorn's worker too
        )
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Poll /health until it answers (any status: an unhealthy store is still up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"scheduler exited with {self.proc.returncode}; {self._tail()}")
            with contextlib.suppress(requests.RequestException):
                requests.get(self.url + "/health", timeout=1)
                self._release_port()  # it listens: the port is its own now
                return
            time.sleep(0.05)
        raise TimeoutError(f"scheduler not ready after {timeout}s; {self._tail()}")

    @property
    def worker_pid(self) -> int:
        """The gunicorn worker, the master's one child: the process that holds the jobs."""
        assert self.proc is not None
        master = self.proc.pid
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        if len(children) != 1:
            raise RuntimeError(f"gunicorn master {master} has children {children}, expected one")
        return int(children[0])

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait: the clean shutdown an operator's service manager does."""
        return self._signal(signal.SIGTERM, timeout)

    def kill(self) -> int | None:
        """SIGKILL the whole process group: a crash, nothing gets to clean up."""
        return self._signal(signal.SIGKILL, 10.0, group=True)

    def _signal(self, sig: int, timeout: float, group: bool = False) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            self._close_log()  # it exited by itself (a bad setting, a crash)
            return self.proc.returncode if self.proc else None
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait(10)
        if group or sig == signal.SIGKILL:
            # the worker is in the same group; make sure it is gone before anyone reuses the db
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._close_log()
        return code

    def _release_port(self) -> None:
        if self._reservation is not None:
            self._reservation.release()
            self._reservation = None

    def _close_log(self) -> None:
        self._release_port()  # it exited: it will never listen
        if self._log:
            self._log.close()
            self._log = None

    def _tail(self) -> str:
        if not self.log_path:
            return "no log"
        with open(self.log_path, "rb") as f:
            return f.read()[-2000:].decode("utf-8", "replace")

    def __enter__(self) -> SchedulerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def memory_bytes(pid: int, field: str = "VmRSS") -> int:
    """A memory figure of a process from /proc/<pid>/status: VmRSS (resident now), VmHWM (the
    peak resident size, since start or `reset_peak_memory`), ..."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def reset_peak_memory(pid: int) -> None:
    """Start a process's peak resident size (VmHWM) afresh from its size now (Linux 4.0+)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
