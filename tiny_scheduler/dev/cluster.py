"""The local dev cluster: N agents and the scheduler (and, when asked, a dev registry), started
and stopped as one.

`DevCluster` owns the lifecycle of those parts on loopback: the scheduler under real gunicorn
(`SchedulerProcess`; with `standbys`, several daemons on a PostgreSQL database made for the
cluster, the first one leading at start), and each agent as its own process (the production
agent, `tiny-scheduler agent`), so that SIGKILLing one is a real node failure. By default the
scheduler is its own node registry (`REGISTRY_URL=builtin`): the nodes are the agents that
heartbeat, as in a cluster of this project's own. With `dev_registry` it runs the
`FakeRegistry` in this process instead and the agents register with it (`--registry`), for
what only the tiny-aws registry has: instances, registered services, registry faults. It leaves no
orphans: every child runs in its own process group, `stop()` ends them all and is registered
with `atexit`, a start-up that fails halfway stops what it had started, and a watchdog process
kills every part should this process die without stopping them (SIGKILL, a crash).
`tiny-scheduler dev`, `make demo` and the end-to-end tests all run it.

It does not schedule anything or talk to the scheduler's API beyond waiting for it, and its
nodes, to be up.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

import requests

from ..agent.config import DEFAULT_REGISTRY_HEARTBEAT_SECS
from ..agent.groups import kill_groups, kill_recorded_children
from ..client import session
from .daemon import SchedulerProcess
from .registry import FakeRegistry

log = logging.getLogger(__name__)

BUILTIN = "builtin"
"""REGISTRY_URL when the scheduler is its own node registry."""

AGENT_STOP_SECS = 5.0
"""Seconds an agent gets to stop its jobs, report them and exit after SIGTERM before it is
SIGKILLed."""

AGENT_DRAIN_SECS = 0.0
AGENT_KILL_GRACE_SECS = 1.0
"""A dev cluster stops at once: its agents stop their jobs on SIGTERM without waiting for
them, and give them a second between SIGTERM and SIGKILL."""

START_TIMEOUT_SECS = 30.0
"""Seconds the whole cluster may take to come up (scheduler healthy, every node registered)."""


RESTART_AFTER_SECS = 1.0
"""With standbys, a daemon that died is started again this long after it was seen dead (a
moment, so that a crash loop does not spin): it comes back as a standby."""

DEV_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
"""The PostgreSQL server a cluster with standbys uses unless told another (the tests' default)."""


class ClusterError(RuntimeError):
    """The cluster could not start; the message says why in one line."""


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """What to start. Intervals are seconds; `None` leaves the scheduler's own default."""

    agents: int = 3
    scheduler_port: int | None = None  # None: any free port
    # False: REGISTRY_URL=builtin, the agents' heartbeats are the node list. True: a dev
    # registry (the tiny-aws registry's behaviour) lists the nodes, on this port (0: any).
    dev_registry: bool = False
    registry_port: int = 0
    # None: the agents wait for work in their heartbeats (their default); a number: they poll.
    poll_secs: float | None = None
    # builtin: NODE_HEARTBEAT_SECS (the agents follow the period their heartbeats are
    # answered with); dev registry: the agents' heartbeats to it (None: 10 s).
    heartbeat_secs: float | None = None
    unhealthy_after: float = 30.0  # dev registry: no heartbeat this long -> node unhealthy
    agent_slots: tuple[int, ...] = ()  # each agent's --slots in turn; missing: its CPU count
    scan_interval_secs: float | None = None  # TIMEOUT_SCAN_INTERVAL_SECS
    node_lost_secs: float | None = None  # NODE_LOST_SECS
    registry_cache_secs: float | None = None  # REGISTRY_CACHE_SECS
    api_key: str | None = None  # TINYAWS_API_KEY for the scheduler and the registry
    scheduler_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    work_dir: str | None = None  # logs, database, scratch dirs; None: a temp dir removed at stop
    node_prefix: str = "node-"
    # With standbys, the daemons share a PostgreSQL database of the cluster's own, made on
    # this server (DEV_POSTGRES_URL when None) and dropped at stop.
    standbys: int = 0
    postgres_url: str | None = None

    @classmethod
    def quick(cls, **changes: object) -> ClusterConfig:
        """Short intervals everywhere: for tests and the demo, where a lost node and a
        timeout should show within seconds."""
        fast = {
            "poll_secs": 0.2,
            # builtin: a node is unhealthy after 3 silent periods, 0.9 s, about the dev
            # registry's 1 s; shorter would flap on a busy machine and move work for nothing.
            "heartbeat_secs": 0.3,
            "unhealthy_after": 1.0,
            "scan_interval_secs": 0.2,
            "node_lost_secs": 1.0,
            "registry_cache_secs": 0.2,
        }
        return cls(**{**fast, **changes})  # type: ignore[arg-type]


@dataclasses.dataclass
class _AgentProcess:
    node_id: str
    proc: subprocess.Popen[bytes]
    work_dir: str
    log_path: str


class DevCluster:
    """Registry + agents + scheduler on loopback. Use as a context manager or start()/stop()."""

    def __init__(self, config: ClusterConfig | None = None) -> None:
        self.config = config or ClusterConfig()
        self.node_ids = [f"{self.config.node_prefix}{i}" for i in range(1, self.config.agents + 1)]
        self._own_work_dir = self.config.work_dir is None
        self.work_dir = self.config.work_dir or tempfile.mkdtemp(prefix="tiny-dev-")
        os.makedirs(self.work_dir, exist_ok=True)
        self.registry: FakeRegistry | None = None
        self.scheduler: SchedulerProcess | None = None  # the first daemon: the leader at start
        self.standbys: list[SchedulerProcess] = []
        self._dead_since: dict[int, float] = {}  # id(daemon) -> monotonic, when seen dead
        self.database: str | None = None  # the PostgreSQL database made for this cluster
        self.agents: dict[str, _AgentProcess] = {}
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._stopped = False

    @property
    def scheduler_url(self) -> str:
        assert self.scheduler is not None, "cluster not started"
        return self.scheduler.url

    @property
    def registry_url(self) -> str:
        """The scheduler's REGISTRY_URL: the dev registry's URL, or `builtin`."""
        if not self.config.dev_registry:
            return BUILTIN
        assert self.registry is not None, "cluster not started"
        return self.registry.url

    @property
    def scheduler_log(self) -> str:
        return os.path.join(self.work_dir, "scheduler.log")

    @property
    def daemons(self) -> list[SchedulerProcess]:
        """Every scheduler daemon: the first, then the standbys."""
        return [proc for proc in [self.scheduler, *self.standbys] if proc is not None]

    @property
    def scheduler_urls(self) -> str:
        """Every daemon's URL, comma-separated: SCHEDULER_URL for the CLI, and the agents'."""
        return ",".join(proc.url for proc in self.daemons)

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> DevCluster:
        """Start everything and wait until the scheduler answers and every node is healthy.
        On any failure, whatever had started is stopped before the error propagates."""
        atexit.register(self.stop)
        try:
            self._start_watchdog()
            if self.config.dev_registry:
                self._start_registry()
            self._start_scheduler()
            for node_id in self.node_ids:
                self.start_agent(node_id)
            self.wait_nodes_healthy(self.node_ids)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop agents (they kill their jobs), then the scheduler, then the registry.
        Idempotent; never raises, so that one stuck part cannot leave the others running."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        for agent in self.agents.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.proc.pid, signal.SIGTERM)
        for agent in self.agents.values():
            try:
                agent.proc.wait(AGENT_STOP_SECS)
            except subprocess.TimeoutExpired:
                log.warning("agent %s did not stop in time; killing it", agent.node_id)
            self._kill_agent_group(agent)
        for daemon in reversed(self.daemons):  # standbys first: no takeover on the way out
            try:
                daemon.stop()
            except Exception:
                log.exception("stopping the scheduler failed; killing it")
                with contextlib.suppress(Exception):
                    daemon.kill()
        if self.database is not None:
            with contextlib.suppress(Exception):
                _drop_database(self._postgres_server(), self.database)
        if self.registry is not None:
            with contextlib.suppress(Exception):
                self.registry.stop()
        self._tell_watchdog(_WATCHDOG_CLEAN)
        if self._watchdog is not None and self._watchdog.stdin is not None:
            with contextlib.suppress(OSError):
                self._watchdog.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(5)
        if self._own_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> DevCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- parts ------------------------------------------------------------------------------

    def _start_registry(self) -> None:
        try:
            registry = FakeRegistry(
                port=self.config.registry_port,
                key=self.config.api_key,
                unhealthy_after=self.config.unhealthy_after,
            )
        except OSError as exc:
            raise ClusterError(
                f"cannot start the registry on port {self.config.registry_port}: {exc.strerror}"
            ) from None
        registry.start()
        self.registry = registry

    def _start_scheduler(self) -> None:
        port = self.config.scheduler_port
        if port is not None and not _port_free(port):
            # Checked first: another scheduler already on the port would answer /health and
            # pass for ours.
            raise ClusterError(f"port {port} is already in use; choose another scheduler port")
        env = {
            "REGISTRY_URL": self.registry_url,
            # An empty value counts as unset: no key unless the cluster was given one.
            "TINYAWS_API_KEY": self.config.api_key or "",
        }
        if not self.config.dev_registry and self.config.heartbeat_secs is not None:
            env["NODE_HEARTBEAT_SECS"] = str(self.config.heartbeat_secs)
        optional = {
            "TIMEOUT_SCAN_INTERVAL_SECS": self.config.scan_interval_secs,
            "NODE_LOST_SECS": self.config.node_lost_secs,
            "REGISTRY_CACHE_SECS": self.config.registry_cache_secs,
        }
        env.update({name: str(value) for name, value in optional.items() if value is not None})
        env.update(self.config.scheduler_env)
        db_path = os.path.join(self.work_dir, "scheduler.db")
        if self.config.standbys:
            db_path = self._make_database()
        # No port given: each SchedulerProcess holds a free one of its own until it listens.
        ports: list[int | None] = [port]
        for number in range(1, self.config.standbys + 1):
            wanted = port + number if port else None
            if port and not _port_free(wanted):
                raise ClusterError(f"port {wanted} is already in use; choose another port")
            ports.append(wanted)
        for number, daemon_port in enumerate(ports):
            log_name = "scheduler.log" if number == 0 else f"scheduler-standby-{number}.log"
            proc = SchedulerProcess(
                db_path=db_path,
                env=env,
                port=daemon_port,
                log_path=os.path.join(self.work_dir, log_name),
            )
            if number == 0:
                self.scheduler = proc
            else:
                self.standbys.append(proc)
            try:
                # One after the other: the first is up, and leads, before the standbys come.
                proc.start(wait=False)
                assert proc.proc is not None
                self._tell_watchdog(f"group {proc.proc.pid}")  # gunicorn's own session
                proc.wait_ready(timeout=START_TIMEOUT_SECS)
            except (RuntimeError, TimeoutError) as exc:
                raise ClusterError(f"the scheduler did not start: {exc}") from None

    def _postgres_server(self) -> str:
        return self.config.postgres_url or DEV_POSTGRES_URL

    def _make_database(self) -> str:
        """A fresh PostgreSQL database for this cluster; its URL."""
        import psycopg

        server = self._postgres_server()
        name = f"tiny_scheduler_dev_{os.getpid()}_{int(time.time())}"
        try:
            with psycopg.connect(server, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
        except psycopg.Error as exc:
            raise ClusterError(f"cannot make a database on {server}: {exc}".strip()) from None
        self.database = name
        return urlunsplit(urlsplit(server)._replace(path=f"/{name}"))

    def start_agent(self, node_id: str) -> None:
        """Start (or restart) the agent process of one node."""
        assert self.scheduler is not None
        work_dir = os.path.join(self.work_dir, node_id)
        os.makedirs(work_dir, exist_ok=True)
        log_path = os.path.join(self.work_dir, f"agent-{node_id}.log")
        env = {**os.environ, "TINYAWS_API_KEY": self.config.api_key or ""}
        argv = [
            *(sys.executable, "-m", "tiny_scheduler.cli", "--url", self.scheduler_urls),
            *("agent", "--node-id", node_id, "--work-dir", work_dir),
            *(("--poll-secs", str(self.config.poll_secs)) if self.config.poll_secs else ()),
            *("--drain-secs", str(AGENT_DRAIN_SECS)),
            *("--kill-grace-secs", str(AGENT_KILL_GRACE_SECS)),
            *self._agent_options(node_id),
            # A dev cluster that stops leaves nothing running: its agents drain, not detach.
            "--drain-on-exit",
            "--exit-with-parent",
        ]
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: a kill reaches nothing else
            )
        self.agents[node_id] = _AgentProcess(node_id, proc, work_dir, log_path)
        self._tell_watchdog(f"group {proc.pid}")
        self._tell_watchdog(f"dir {work_dir}")

    def _agent_options(self, node_id: str) -> list[str]:
        options = []
        number = self.node_ids.index(node_id) if node_id in self.node_ids else -1
        if 0 <= number < len(self.config.agent_slots):
            options += ["--slots", str(self.config.agent_slots[number])]
        if self.registry is not None:
            every = self.config.heartbeat_secs or DEFAULT_REGISTRY_HEARTBEAT_SECS
            options += ["--registry", self.registry.url, "--registry-heartbeat-secs", str(every)]
        # With the built-in node list no period is given: the first heartbeat's answer sets
        # it, as in production.
        return options

    def crash_agent(self, node_id: str) -> None:
        """SIGKILL a node's agent process alone, as a crash (or `systemctl kill`) would: its
        jobs go on with their owners, for the next agent to take back (`start_agent`)."""
        agent = self.agents[node_id]
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait(10)

    def kill_agent(self, node_id: str) -> None:
        """SIGKILL a node: its agent and every job it was running, with no chance to report.
        To the scheduler the node just goes silent."""
        agent = self.agents[node_id]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait(10)
        self._kill_agent_group(agent)

    def _kill_agent_group(self, agent: _AgentProcess) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.proc.wait(5)
        kill_recorded_children(agent.work_dir)

    def _start_watchdog(self) -> None:
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "tiny_scheduler.dev.cluster", "--watchdog"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # out of the terminal's reach: Ctrl-C must not kill it
        )

    def _tell_watchdog(self, line: str) -> None:
        if self._watchdog is None or self._watchdog.stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):  # it is gone, or we closed the pipe
            self._watchdog.stdin.write(line.encode() + b"\n")
            self._watchdog.stdin.flush()

    def node_health(self) -> dict[str, str]:
        """Each node's health as the node source says: the scheduler's `GET /nodes` (from
        the first daemon that answers), or the dev registry's listing. Empty while neither
        answers."""
        if self.registry is not None:
            listing = self.registry.nodes_listing()
            return {node_id: node.get("status", "") for node_id, node in listing.items()}
        for daemon in self.daemons:
            try:
                with session(daemon.url, self.config.api_key) as http:
                    reply = http.get(daemon.url + "/nodes", timeout=5)
            except requests.RequestException:
                continue  # not up yet, or a daemon that died: ask the next
            if reply.status_code == 200:
                return {node["node_id"]: node["health"] for node in reply.json()}
        return {}

    def wait_nodes_healthy(self, node_ids: list[str], timeout: float = START_TIMEOUT_SECS) -> None:
        """Wait until the node source lists every given node as healthy."""
        deadline = time.monotonic() + timeout
        while True:
            health = self.node_health()
            missing = [n for n in node_ids if health.get(n) != "healthy"]
            if not missing:
                return
            for node_id in missing:
                agent = self.agents.get(node_id)
                if agent is not None and agent.proc.poll() is not None:
                    raise ClusterError(
                        f"agent {node_id} exited with {agent.proc.returncode}; see {agent.log_path}"
                    )
            if time.monotonic() > deadline:
                raise ClusterError(f"nodes not healthy after {timeout}s: {', '.join(missing)}")
            time.sleep(0.05)

    def supervise(self) -> list[str]:
        """With standbys, start every daemon that died `RESTART_AFTER_SECS` ago again, on
        its port, database and log (it comes back as a standby: the lease went on meanwhile);
        returns their URLs. Call it from a watch loop. Without standbys nothing: a lone
        daemon's death is a problem to show."""
        if not self.standbys:
            return []
        restarted = []
        now = time.monotonic()
        for daemon in self.daemons:
            if daemon.proc is None or daemon.proc.poll() is None:
                continue
            dead_since = self._dead_since.setdefault(id(daemon), now)
            if now - dead_since < RESTART_AFTER_SECS:
                continue
            del self._dead_since[id(daemon)]
            daemon.stop()  # of a dead process: only closes its log file, reopened by start
            daemon.start(wait=False)  # not waited for: the loop goes on watching the others
            assert daemon.proc is not None
            self._tell_watchdog(f"group {daemon.proc.pid}")
            restarted.append(daemon.url)
        return restarted

    def problems(self) -> list[str]:
        """Parts that died on their own (for `tiny-scheduler dev`'s watch loop). With standbys
        a dead daemon is what they are for: only every daemon dead is a problem."""
        found = []
        exited = [
            f"the scheduler {proc.url} exited with {proc.proc.poll()}; see {proc.log_path}"
            for proc in self.daemons
            if proc.proc is not None and proc.proc.poll() is not None
        ]
        if exited and (not self.standbys or len(exited) == len(self.daemons)):
            found += exited
        for agent in self.agents.values():
            code = agent.proc.poll()
            if code is not None:
                found.append(f"agent {agent.node_id} exited with {code}; see {agent.log_path}")
        return found


def _drop_database(server: str, name: str) -> None:
    import psycopg

    with psycopg.connect(server, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.closing(socket.socket()) as sock:
        # As gunicorn binds: a port in TIME_WAIT is free, one with a listener is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


_WATCHDOG_CLEAN = "clean"


def watchdog() -> None:
    """The watchdog process: reads `group <pgid>` and `dir <agent work dir>` lines from the
    cluster on stdin. If stdin ends without a `clean` line, the cluster's process died
    without stopping its parts, so this kills them: every group, and every job an agent
    recorded in its work dir."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups: list[int] = []
    work_dirs: list[str] = []
    for line in sys.stdin:
        kind, _, value = line.strip().partition(" ")
        if kind == _WATCHDOG_CLEAN:
            return
        if kind == "group":
            groups.append(int(value))
        elif kind == "dir":
            work_dirs.append(value)
    for work_dir in work_dirs:
        kill_recorded_children(work_dir)
    kill_groups(groups, grace=0)


if __name__ == "__main__" and sys.argv[1:] == ["--watchdog"]:
    watchdog()
