"""The processes around a measurement: the registry, the scheduler, and readings of their use.

- `RegistryProcess`: the `FakeRegistry` in a forked process of its own, so that the threads
  answering the scheduler's `/nodes` calls never compete for a GIL with the load generator;
- `Server`: one gunicorn-run scheduler (`SchedulerProcess`) started with its start-up timed to
  the first healthy `/health`, and the pid and resident memory of its worker;
- `FloorProcess`: the floor app (`floor_app.py`) under the daemon's gunicorn settings;
- `TreeProcess`: the scheduler of another checkout (the previous tree), on this venv;
- `CpuMeter`: CPU used by named processes and by the whole machine over a window, in cores;
- `side_by_side`: a few runs at once, each in a thread (scenarios whose work is sleeping).
"""

from __future__ import annotations

import http.client
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tiny_scheduler.dev.daemon import SchedulerProcess, memory_bytes
from tiny_scheduler.dev.registry import FakeRegistry

T = TypeVar("T")

_FORK = multiprocessing.get_context("fork")
_TICK = os.sysconf("SC_CLK_TCK")


def side_by_side(runs: dict[str, Callable[[], T]], prefix: str) -> dict[str, T]:
    """Each run's result by name, all run at the same time; the first error is raised once
    all have ended."""
    results: dict[str, T] = {}
    errors: list[BaseException] = []

    def one(name: str) -> None:
        try:
            results[name] = runs[name]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(name,), name=f"{prefix}-{name}") for name in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


class RegistryProcess:
    """A FakeRegistry listing `nodes` as healthy, served from its own process."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.url = ""
        self.pid = 0
        self._proc: Any = None

    def start(self) -> RegistryProcess:
        receiver, sender = _FORK.Pipe(duplex=False)
        self._proc = _FORK.Process(target=_serve_registry, args=(self.nodes, sender), daemon=True)
        self._proc.start()
        if not receiver.poll(10):
            raise RuntimeError("the registry process did not start")
        self.url = receiver.recv()
        self.pid = self._proc.pid
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)


def _serve_registry(nodes: list[str], sender: Any) -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    registry = FakeRegistry()
    for node in nodes:
        registry.set_node(node)  # forced healthy: no heartbeats needed during a run
    registry.start()
    sender.send(registry.url)
    sender.close()
    signal.pause()


class Server:
    """One scheduler daemon on `db_path`, configured like production except where `env` says."""

    def __init__(
        self,
        db_path: Path,
        registry_url: str,
        log_path: Path,
        env: dict[str, str],
        floor: bool = False,
        tree: Path | None = None,
    ):
        kind = FloorProcess if floor else SchedulerProcess
        options: dict[str, Any] = {
            "env": {"REGISTRY_URL": registry_url, **env},
            "log_path": str(log_path),
        }
        if tree is not None:
            self.process: SchedulerProcess = TreeProcess(tree, str(db_path), **options)
        else:
            self.process = kind(str(db_path), **options)
        self.addr = ("127.0.0.1", self.process.port)
        self.startup_s = 0.0

    def start(self, timeout: float = 120.0) -> Server:
        """Start gunicorn and time it until `/health` first answers healthy."""
        began = time.monotonic()
        self.process.start(wait=False)
        deadline = began + timeout
        while True:
            if self.process.proc is not None and self.process.proc.poll() is not None:
                raise RuntimeError(f"scheduler exited early; see {self.process.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"scheduler not healthy after {timeout}s")
            if self._healthy(deadline - time.monotonic()):
                break
            time.sleep(0.002)
        self.startup_s = time.monotonic() - began
        return self

    def _healthy(self, timeout: float) -> bool:
        conn = http.client.HTTPConnection(*self.addr, timeout=max(timeout, 0.1))
        try:
            conn.request("GET", "/health")
            reply = conn.getresponse()
            return reply.status == 200 and b'"status":"healthy"' in reply.read()
        except OSError:
            return False  # not listening yet (the master binds before the worker loads)
        finally:
            conn.close()

    @property
    def master_pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid

    @property
    def worker_pid(self) -> int:
        """The gunicorn worker: the one child of the master."""
        return self.process.worker_pid

    def worker_rss_bytes(self) -> int:
        return rss_bytes(self.worker_pid)

    def stop(self) -> None:
        self.process.stop()


class FloorProcess(SchedulerProcess):
    """The floor app under gunicorn with the daemon's settings (`floor_conf.py`)."""

    argv = (sys.executable, "-m", "gunicorn", "-c", "python:benchmarks.floor_conf")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.extra_env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)


class TreeProcess(SchedulerProcess):
    """The scheduler of another checkout of this repository, run with this venv's Python and
    libraries: `python -m gunicorn` in the checkout puts its folder first on the module path,
    before this worktree's editable install."""

    def __init__(self, tree: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cwd = str(tree)
        self.extra_env["PYTHONPATH"] = str(tree)

    def runs_tree(self) -> bool:
        """Whether the worker really runs the checkout's code (its working directory)."""
        return Path(f"/proc/{self.worker_pid}/cwd").resolve() == Path(self.cwd).resolve()


def rss_bytes(pid: int) -> int:
    """Resident memory of a process now."""
    return memory_bytes(pid, "VmRSS")


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, all its threads; zeros when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


def _machine() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, summed over its cores."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values) - idle) / _TICK, sum(values) / _TICK


class CpuMeter:
    """CPU used over a window by named processes, and by the whole machine, in cores.

    Each process gets `name` (user + system) and `name_sys` (the kernel's part: sockets,
    fsync); `machine` counts every busy core, including other users of the machine.
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._begin: dict[str, tuple[float, float]] = {}
        self._machine = 0.0
        self._began = 0.0

    def begin(self) -> None:
        self._begin = {name: _cpu_seconds(pid) for name, pid in self.pids.items()}
        self._machine = _machine()[0]
        self._began = time.monotonic()

    def end(self) -> dict[str, float]:
        elapsed = time.monotonic() - self._began
        shares = {"machine": (_machine()[0] - self._machine) / elapsed}
        for name, pid in self.pids.items():
            user, system = _cpu_seconds(pid)
            user0, system0 = self._begin[name]
            shares[name] = (user - user0 + system - system0) / elapsed
            shares[f"{name}_sys"] = (system - system0) / elapsed
        return {name: round(share, 3) for name, share in shares.items()}
