"""Issue 23's scenario: do parked waiters slow the agents down?

The daemon parks long waits in its worker's event loop (`tiny_scheduler/waiting.py`): event
streams (`GET /events`) and output reads with `wait` on running jobs that have nothing new.
They should cost nothing while nothing happens. Here one server (MAX_WAITERS=128) answers the
agent poll from 4 back-to-back clients plus a `/health` probe every 10 ms, in runs without
waiters and runs with 64 event streams and 64 output waits held open, interleaved in the same
sitting so that both see the same machine. A run with waiters also sends a 129th waiter, which
must get 503.

The waiters are held by a process of their own (`_hold`): plain sockets in one epoll loop that
read whatever the streams send and send an output wait again whenever one is answered.
"""

from __future__ import annotations

import multiprocessing
import selectors
import socket
import time
from typing import Any

from . import history, loadgen, sessions
from .loadgen import Pause, Recorder, Session, Window, request
from .scenarios import _case, latency_figures, merge_errors

_FORK = multiprocessing.get_context("fork")

STREAMS = 64
OUTPUT_WAITS = 64
MAX_WAITERS = STREAMS + OUTPUT_WAITS
WAIT_S = 25
POLLERS = 4
HEALTH_EVERY_S = 0.01
PENDING_JOBS = 2_000
"""Stored pending jobs (50 per polled node), so that every poll answers one job."""

RUNNING_NODES = 10
"""Nodes (of the 50) that run the jobs the output waits read, and are never polled."""

HOLD_LIMIT_S = 120.0
"""The holder process gives up after this long even if nobody tells it to stop."""

TARGET_RATIO = 1.2


def waiters(bench: Any) -> dict[str, Any]:
    opts = bench.options
    db = opts.workdir / "waiters.db"
    # The pollers poll most nodes; the running jobs the output waits read are on the others,
    # because a poll from a node that should be running a job fails that job.
    polled, busy = bench.nodes[:-RUNNING_NODES], bench.nodes[-RUNNING_NODES:]
    running = history.build_pending_and_running(db, PENDING_JOBS, polled, OUTPUT_WAITS, busy)
    env = {**opts.server_env, "MAX_WAITERS": str(MAX_WAITERS)}
    server = bench.server("waiters", db, fresh=False)
    server.process.extra_env.update(env)
    server.start()
    out: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
    try:
        for run in range(opts.runs):
            # Alternate which goes first, so that a drift of the machine does not favour one.
            order = ("without", "with") if run % 2 == 0 else ("with", "without")
            for kind in order:
                out[kind].append(_run(bench, server, polled, running if kind == "with" else None))
    finally:
        server.stop()
    return {"waiters_without": _case(out["without"]), "waiters_with": _case(out["with"])}


def _run(bench: Any, server: Any, polled: list[str], running: list[str] | None) -> dict[str, Any]:
    holder = None
    held: dict[str, Any] = {}
    if running is not None:
        holder = _Holder(server.addr, running)
        held = holder.open()
    try:
        window = bench.window()
        workers = [(poll_and_health_worker, (POLLERS, polled))]
        watch_extra = {"holder": holder.pid} if holder else {}
        result = loadgen.run_load(
            server.addr,
            window,
            workers,
            {"server": server.worker_pid, "registry": bench.registry.pid, **watch_extra},
        )
    finally:
        if holder is not None:
            held.update(holder.close())
    cpu = dict(result.cpu)
    # The holder is part of the load generator: its CPU counts as the clients'.
    cpu["clients"] = round(cpu.get("clients", 0) + cpu.pop("holder", 0), 3)
    cpu.pop("holder_sys", None)
    w = result.workers[0]
    polls, health = w["polls"], w["health"]
    return {
        "rate": round(len(polls["latencies"]) / window.seconds, 1),
        **latency_figures([polls["latencies"]]),
        "health": latency_figures([health["latencies"]]),
        "errors": merge_errors([polls["errors"], health["errors"]]),
        "cpu": cpu,
        "held": held,
    }


def poll_and_health_worker(
    window: Window, clients: int, nodes: list[str]
) -> tuple[list[Session], sessions.Collect]:
    """`clients` back-to-back pollers and one `/health` probe every HEALTH_EVERY_S."""
    pollers, collect_polls = sessions.poll_worker(window, clients, nodes)
    health = Recorder(window)
    probe = request("GET", "/health")

    def prober() -> Session:
        while time.monotonic_ns() < window.t1:
            reply = yield probe
            health.add(reply)
            yield Pause(HEALTH_EVERY_S)

    def collect() -> dict[str, Any]:
        return {"polls": collect_polls(), "health": health.result()}

    return [*pollers, prober()], collect


# --- the holder ---------------------------------------------------------------------------------


class _Holder:
    """A forked process holding STREAMS event streams and one output wait per running job."""

    def __init__(self, addr: tuple[str, int], running: list[str]) -> None:
        self._pipe, child = _FORK.Pipe()
        self._proc = _FORK.Process(target=_hold, args=(addr, running, child), daemon=True)
        self._proc.start()
        child.close()
        self.pid = self._proc.pid

    def open(self) -> dict[str, Any]:
        """Wait until every waiter is open; what the 129th got."""
        if not self._pipe.poll(30):
            self._proc.kill()
            raise RuntimeError("the waiter holder did not open its waiters")
        opened = self._pipe.recv()
        if "failure" in opened:
            raise RuntimeError(f"waiter holder: {opened['failure']}")
        return opened

    def close(self) -> dict[str, Any]:
        self._pipe.send("stop")
        counts = self._pipe.recv() if self._pipe.poll(10) else {"failure": "no answer"}
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
        return counts


def _connect(addr: tuple[str, int], data: bytes) -> socket.socket:
    sock = socket.create_connection(addr, timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(data)
    sock.setblocking(False)
    return sock


def _status_of(sock: socket.socket, seconds: float) -> int:
    """The status of the reply on a blocking read of its head (0: none in time)."""
    sock.setblocking(True)
    sock.settimeout(seconds)
    try:
        head = sock.recv(4096)
    except OSError:
        return 0
    return int(head[9:12]) if head.startswith(b"HTTP/1.1 ") else 0


def _hold(addr: tuple[str, int], running: list[str], pipe: Any) -> None:
    try:
        _hold_loop(addr, running, pipe)
    except BaseException as exc:  # reported to the parent, which stops the benchmark
        pipe.send({"failure": f"{type(exc).__name__}: {exc}"})


def _hold_loop(addr: tuple[str, int], running: list[str], pipe: Any) -> None:
    stream_req = request("GET", "/events")
    selector = selectors.EpollSelector()
    refused = 0
    # Streams first, each confirmed by its head (the worker sends the head and the retry hint
    # at once), so that the output waits are known to come on top of 64 open streams.
    for _ in range(STREAMS):
        sock = _connect(addr, stream_req)
        status = _status_of(sock, 10)
        if status != 200:
            refused += 1
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, ("stream", None))
    wait_reqs = {
        job_id: request("GET", f"/jobs/{job_id}/output?wait={WAIT_S}") for job_id in running
    }
    for job_id, req in wait_reqs.items():
        selector.register(_connect(addr, req), selectors.EVENT_READ, ("wait", job_id))
    # An output wait gives no sign that it is parked: the 129th waiter, an event stream,
    # is tried until it is refused, for at most 3 s (a 200 means some were not parked yet).
    probe_status = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        probe = socket.create_connection(addr, timeout=5)
        probe.sendall(stream_req)
        probe_status = _status_of(probe, 5)
        probe.close()
        if probe_status == 503:
            break
        time.sleep(0.1)
    pipe.send({"streams_refused": refused, "probe_129th": probe_status})

    lines = answered = early = dropped = 0
    sent_at = dict.fromkeys(wait_reqs, time.monotonic())
    stop_at = time.monotonic() + HOLD_LIMIT_S
    while time.monotonic() < stop_at and not pipe.poll(0):
        for key, _ in selector.select(0.05):
            kind, job_id = key.data
            try:
                data = key.fileobj.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                dropped += 1
                selector.unregister(key.fileobj)
                key.fileobj.close()
                continue
            lines += data.count(b"\n")
            if kind == "wait" and b"\r\n\r\n" in data:
                answered += 1
                if time.monotonic() - sent_at[job_id] < WAIT_S - 1:
                    # Answered before its time: the job changed. Asking again at once would
                    # turn this waiter into a busy client, so it is counted and left alone.
                    early += 1
                    continue
                # The wait ran out: wait again, as a client following the output would.
                sent_at[job_id] = time.monotonic()
                key.fileobj.sendall(wait_reqs[job_id])
    for key in list(selector.get_map().values()):
        key.fileobj.close()
    pipe.send(
        {
            "lines_read": lines,
            "waits_answered": answered,
            "answered_early": early,
            "dropped": dropped,
        }
    )
