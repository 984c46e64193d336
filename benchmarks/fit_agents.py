"""The fit scenario's simulated agents: threads speaking this project's agent protocol to a
real daemon (`REGISTRY_URL=builtin`), each node with the CPUs and labels of its `NodeSpec`.

- **Heartbeat** (`PUT /nodes/{id}`, every `BEAT_SECS`): `cpu_count`, `memory_mb`, `gpus`,
  `labels`, the jobs it runs and their attempts (the body `agent.heartbeat.Facts` makes).
- **Poll** (`GET /jobs?node_id=…&status=pending`, read as strictly as the agent reads it):
  every job handed out is claimed (`PATCH` running, naming the node and the attempt) and run,
  unless it needs more CPUs than the node has free by the agent's own count (`refused`: the
  scheduler handed out more than fits; it stays pending, as our agent leaves it). Polls again
  at once when a job ends, else `IDLE_S` after the last poll (the real agent: every 3 s, which
  would measure the poll interval, not placement).
- **A job runs** on the node's `Cores` for its `BENCH_SECS` at full speed while the CPUs its
  running jobs need (their `BENCH_CPUS`, what each really uses, whatever it asked for) are at
  most the node's; beyond that every job slows in proportion, as CPU-bound processes sharing
  too few cores do. So a node given more work than it has CPUs (one job one slot, a 4-CPU job
  counted as one) takes longer, instead of sleeping through it for free. Then the final report
  (`PATCH` done, naming the attempt).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from tiny_scheduler.agent.heartbeat import Facts
from tiny_scheduler.agent.protocol import RUNNING_UPDATE, PolledJob, parse_poll_reply, report_update

from .fit_trace import NodeSpec

BEAT_SECS = 1.0
IDLE_S = 0.05
_HTTP_TIMEOUT = 30.0


class Cores:
    """A node's CPUs, shared by its running jobs (see the module's notes); also how far they
    were ever overfilled."""

    def __init__(self, cpus: int) -> None:
        self.cpus = cpus
        self._changed = threading.Condition()
        self._left: dict[str, float] = {}  # job -> seconds of work at full speed still to do
        self._demand = 0  # CPUs the running jobs use
        self._at = time.monotonic()
        self.peak = 0  # the most CPUs its jobs ever used at once
        self.over_cpu_secs = 0.0  # the time integral of CPUs used beyond the node's

    def _rate(self) -> float:
        return 1.0 if self._demand <= self.cpus else self.cpus / self._demand

    def _catch_up(self) -> None:
        now = time.monotonic()
        done = (now - self._at) * self._rate()
        for key in self._left:
            self._left[key] -= done
        self.over_cpu_secs += (now - self._at) * max(0, self._demand - self.cpus)
        self._at = now

    def run(self, key: str, cpus: int, secs: float) -> None:
        """Return once `secs` of work at full speed on `cpus` CPUs is done."""
        with self._changed:
            self._catch_up()
            self._left[key] = secs
            self._demand += cpus
            self.peak = max(self.peak, self._demand)
            self._changed.notify_all()  # the others' speed changed
            while True:
                self._catch_up()
                if self._left[key] <= 1e-6:
                    break
                self._changed.wait(self._left[key] / self._rate())
            del self._left[key]
            self._demand -= cpus
            self._changed.notify_all()


class Client:
    """One keep-alive connection to the daemon (one thread's), opened again when the daemon
    closed it between two requests."""

    def __init__(self, addr: tuple[str, int]) -> None:
        self.addr = addr
        self._conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        payload = json.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        for again in (True, False):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(*self.addr, timeout=_HTTP_TIMEOUT)
            try:
                self._conn.request(method, path, payload, headers)
                reply = self._conn.getresponse()
                return reply.status, reply.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # Closed while idle, before it read the request: sending it again is safe.
                self.close()
                if not again:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class Agent:
    """One simulated node (see the module's notes); `ran` is called with each job reported."""

    def __init__(
        self,
        addr: tuple[str, int],
        node: NodeSpec,
        stop: threading.Event,
        ran: Callable[[str, str], None],
    ) -> None:
        self.addr = addr
        self.node = node
        self.cores = Cores(node.cpus)
        self.refused = 0
        self.errors: list[str] = []
        self._stop = stop
        self._ran = ran
        self._lock = threading.Lock()
        self._free = node.cpus
        self._running: dict[str, int | None] = {}  # job id -> its attempt
        self._ended = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Agent:
        for target, what in ((self._beat_loop, "beat"), (self._poll_loop, "poll")):
            thread = threading.Thread(target=target, name=f"{self.node.node_id}-{what}")
            thread.start()
            self._threads.append(thread)
        return self

    def join(self, timeout: float) -> None:
        for thread in self._threads:
            thread.join(timeout)

    def _facts(self) -> Facts:
        with self._lock:
            attempts = dict(self._running)
        return Facts(
            self.node.cpus,
            attempts,
            "bench",
            agent_id=f"bench-{self.node.node_id}",
            memory_mb=self.node.cpus * 2048,
            labels=tuple(sorted(self.node.labels.items())),
        )

    def _beat_loop(self) -> None:
        client = Client(self.addr)
        try:
            while True:
                beat = self._facts().body()
                status, data = client.call("PUT", f"/nodes/{self.node.node_id}", beat)
                if status != 200:
                    self.errors.append(f"heartbeat {status} {data[:200]!r}")
                if self._stop.wait(BEAT_SECS):
                    return
        finally:
            client.close()

    def _poll_loop(self) -> None:
        client = Client(self.addr)
        poll = f"/jobs?node_id={self.node.node_id}&status=pending"
        try:
            while not self._stop.is_set():
                self._ended.clear()
                status, data = client.call("GET", poll)
                for job in parse_poll_reply(data) if status == 200 else []:
                    self._take(client, job)
                self._ended.wait(IDLE_S)
        finally:
            client.close()

    def _take(self, client: Client, job: PolledJob) -> None:
        need = 0 if job.job_type == "service" else max(1, job.cpus)
        with self._lock:
            if job.job_id in self._running:
                return  # offered again before the claim was answered
            if need > self._free:
                self.refused += 1
                return
            # Listed (and its CPUs held) before the claim: a heartbeat meanwhile shows it.
            self._free -= need
            self._running[job.job_id] = job.retry_count
        names: dict[str, Any] = {"node_id": self.node.node_id}  # the attempt it reports on
        if job.retry_count is not None:
            names["attempt"] = job.retry_count
        status, data = client.call("PATCH", f"/jobs/{job.job_id}", {**RUNNING_UPDATE, **names})
        if status != 200:
            self.errors.append(f"claim of {job.job_id}: {status} {data[:200]!r}")
            with self._lock:
                self._free += need
                del self._running[job.job_id]
            return
        thread = threading.Thread(
            target=self._run, args=(job, need, names), name=f"{self.node.node_id}-{job.job_id}"
        )
        thread.start()
        self._threads.append(thread)

    def _run(self, job: PolledJob, need: int, names: dict[str, Any]) -> None:
        env = job.env_vars or {}
        self.cores.run(job.job_id, int(env.get("BENCH_CPUS", "1")), float(env["BENCH_SECS"]))
        with self._lock:
            self._free += need  # its process has ended: the node's CPUs are free again
        client = Client(self.addr)
        try:
            report = {**report_update(0), **names}
            status, data = client.call("PATCH", f"/jobs/{job.job_id}", report)
        finally:
            client.close()
        with self._lock:
            del self._running[job.job_id]
        if status == 200:
            self._ran(job.job_id, self.node.node_id)
        else:
            self.errors.append(f"report of {job.job_id}: {status} {data[:200]!r}")
        self._ended.set()
