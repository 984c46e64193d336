"""The load generator: keep-alive HTTP/1.1 clients, several per process, as cheap as we can.

A client is a *session*: a generator that yields what it wants next, either a request (the raw
bytes of one HTTP/1.1 request) or a `Pause`, and is sent back the `Reply` (or None after a
pause). One epoll loop per process drives all its sessions, one TCP connection each, Nagle
off. There is no HTTP library in the way: requests are built once as bytes, and a reply is
parsed only as far as its status and Content-Length. On a 2-core machine every microsecond
the client spends is taken from the server, so the client's CPU is measured and reported too.

`run_load` forks the worker processes (each its own GIL), starts them all at one instant,
samples CPU at the edges of the measuring window and gathers what every worker recorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import multiprocessing
import os
import selectors
import socket
import time
from array import array
from collections import Counter
from collections.abc import Callable, Generator
from typing import Any

from .procs import CpuMeter

_FORK = multiprocessing.get_context("fork")

START_DELAY_S = 0.4
"""Seconds between forking the workers and the common start: time to connect everyone."""


@dataclasses.dataclass(frozen=True)
class Window:
    """When a run starts, when its measuring window opens and closes, and when it must end.

    All instants are `time.monotonic_ns()` values, which are comparable across processes
    (CLOCK_MONOTONIC). Requests sent before `t0` are warm-up; sessions stop sending new work at
    `t1`, except those that drain (the agents finish the jobs submitted in the window) until
    `drain_end`.
    """

    start: int
    t0: int
    t1: int
    drain_end: int

    @classmethod
    def plan(cls, warmup_s: float, duration_s: float, drain_s: float = 0.0) -> Window:
        start = time.monotonic_ns() + int(START_DELAY_S * 1e9)
        t0 = start + int(warmup_s * 1e9)
        t1 = t0 + int(duration_s * 1e9)
        return cls(start, t0, t1, t1 + int(drain_s * 1e9))

    @property
    def seconds(self) -> float:
        return (self.t1 - self.t0) / 1e9

    def measuring(self, sent_ns: int) -> bool:
        return self.t0 <= sent_ns < self.t1


@dataclasses.dataclass(frozen=True, slots=True)
class Pause:
    """Yielded by a session: wake me up after this many seconds."""

    seconds: float


class Reply:
    """One HTTP reply, with when its request was sent and when the reply was complete."""

    __slots__ = ("body", "done_ns", "sent_ns", "status")

    def __init__(self, status: int, body: bytes, sent_ns: int, done_ns: int) -> None:
        self.status = status
        self.body = body
        self.sent_ns = sent_ns
        self.done_ns = done_ns

    @property
    def latency_ns(self) -> int:
        return self.done_ns - self.sent_ns


Session = Generator["bytes | Pause", "Reply | None", None]


@dataclasses.dataclass(frozen=True, slots=True)
class FromAddress:
    """A session whose connection comes from `source`, a loopback address of its own (the
    daemon caps connections per client address: thousands of agents need several)."""

    session: Session
    source: str


def request(method: str, path: str, body: bytes = b"", content_type: str = "") -> bytes:
    """The bytes of one HTTP/1.1 keep-alive request."""
    head = f"{method} {path} HTTP/1.1\r\nHost: bench\r\n"
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    if body or method in ("POST", "PATCH", "PUT"):
        head += f"Content-Length: {len(body)}\r\n"
    return (head + "\r\n").encode("latin-1") + body


class Recorder:
    """Latencies (ns) of successful replies to requests sent in the window, the errors in the
    window, and every successful reply of the run (warm-up included) as `ok`."""

    def __init__(self, window: Window) -> None:
        self.window = window
        self.latencies = array("q")
        self.errors: Counter[int] = Counter()
        self.ok = 0

    def add(self, reply: Reply, ok: int = 200) -> bool:
        """Record a reply; whether it had the expected status."""
        if reply.status != ok:
            if self.window.measuring(reply.sent_ns):
                self.errors[reply.status] += 1
            return False
        self.ok += 1
        if self.window.measuring(reply.sent_ns):
            self.latencies.append(reply.done_ns - reply.sent_ns)
        return True

    def result(self) -> dict[str, Any]:
        return {"latencies": self.latencies, "errors": dict(self.errors), "ok": self.ok}


# --- the per-process loop ------------------------------------------------------------------


class _Conn:
    """One session and its keep-alive connection."""

    __slots__ = (
        "addr",
        "body_at",
        "buf",
        "closing",
        "need",
        "sent_ns",
        "session",
        "sock",
        "source",
        "status",
    )

    def __init__(self, addr: tuple[str, int], session: Session, source: str | None = None) -> None:
        self.addr = addr
        self.session = session
        self.source = source
        self.sock = _connect(addr, source)
        self.buf = bytearray()
        self.need = -1  # bytes of the whole reply, once its head is parsed
        self.body_at = 0
        self.sent_ns = 0
        self.status = 0
        self.closing = False

    def send(self, data: bytes) -> None:
        self.sent_ns = time.monotonic_ns()
        self.sock.sendall(data)  # small requests, never pipelined: the kernel takes them whole

    def read(self) -> tuple[Reply | None, bool]:
        """Read what arrived; (the reply once complete, whether the server closes after it)."""
        data = self.sock.recv(262144)
        if not data:
            raise ConnectionError("server closed the connection")
        buf = self.buf
        buf += data
        if self.need < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return None, False
            head = bytes(buf[:end]).lower()
            self.status = int(head[9:12])
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : stop if stop > 0 else len(head)])
            elif self.status in (204, 304):
                length = 0
            else:
                raise ConnectionError(f"reply without Content-Length: {head[:200]!r}")
            self.body_at = end + 4
            self.need = self.body_at + length
            self.closing = b"\r\nconnection: close" in head
        if len(buf) < self.need:
            return None, False
        now = time.monotonic_ns()
        reply = Reply(self.status, bytes(buf[self.body_at : self.need]), self.sent_ns, now)
        del buf[: self.need]
        self.need = -1
        return reply, self.closing

    def reconnect(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        self.sock = _connect(self.addr, self.source)
        self.buf.clear()
        self.need = -1


def _connect(addr: tuple[str, int], source: str | None = None) -> socket.socket:
    sock = socket.create_connection(
        addr, timeout=30, source_address=None if source is None else (source, 0)
    )
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def drive(
    addr: tuple[str, int],
    sessions: list[Session | FromAddress],
    start_ns: int,
    hard_stop_ns: int,
) -> None:
    """Run the sessions until all have returned (or `hard_stop_ns` passes)."""
    selector = selectors.EpollSelector()
    conns = [
        _Conn(addr, s.session, s.source) if isinstance(s, FromAddress) else _Conn(addr, s)
        for s in sessions
    ]
    for conn in conns:
        selector.register(conn.sock, selectors.EVENT_READ, conn)
    timers: list[tuple[int, int, _Conn]] = []
    live = len(conns)
    order = 0

    def step(conn: _Conn, value: Reply | None) -> None:
        nonlocal live, order
        try:
            action = conn.session.send(value)
        except StopIteration:
            selector.unregister(conn.sock)
            conn.sock.close()
            live -= 1
            return
        if isinstance(action, Pause):
            order += 1
            heapq.heappush(timers, (time.monotonic_ns() + int(action.seconds * 1e9), order, conn))
        else:
            conn.send(action)

    _sleep_until(start_ns)
    for conn in conns:
        step(conn, None)
    while live and time.monotonic_ns() < hard_stop_ns:
        timeout = 0.5
        if timers:
            timeout = max(0.0, (timers[0][0] - time.monotonic_ns()) / 1e9)
        for key, _ in selector.select(timeout):
            conn = key.data
            try:
                reply, closing = conn.read()
            except (ConnectionError, OSError):
                # The server dropped us mid-request: report it as status 0, then reconnect.
                selector.unregister(conn.sock)
                conn.reconnect()
                selector.register(conn.sock, selectors.EVENT_READ, conn)
                step(conn, Reply(0, b"", conn.sent_ns, time.monotonic_ns()))
                continue
            if reply is None:
                continue
            if closing:
                selector.unregister(conn.sock)
                conn.reconnect()
                selector.register(conn.sock, selectors.EVENT_READ, conn)
            step(conn, reply)
        if timers:
            now = time.monotonic_ns()
            while timers and timers[0][0] <= now:
                step(heapq.heappop(timers)[2], None)
    selector.close()


def _sleep_until(instant_ns: int) -> None:
    left = (instant_ns - time.monotonic_ns()) / 1e9
    if left > 0:
        time.sleep(left)


# --- running worker processes ------------------------------------------------------------------

Builder = Callable[..., tuple[list[Session | FromAddress], Callable[[], dict[str, Any]]]]
"""builder(window, *args) -> (sessions, collect): the sessions one worker runs, and a function
giving what they recorded (picklable) once they are done."""


@dataclasses.dataclass
class LoadResult:
    workers: list[dict[str, Any]]  # what each worker's collect() returned
    cpu: dict[str, float]  # share of one core used in the window, per role, plus "machine"


def run_load(
    addr: tuple[str, int],
    window: Window,
    jobs: list[tuple[Builder, tuple[Any, ...]]],
    watch: dict[str, int],
    at_open: Callable[[], Any] | None = None,
) -> LoadResult:
    """Fork one worker per (builder, args), run them over `window`, and gather their records.

    `watch` names processes (server worker, registry) whose CPU use over the window is
    reported alongside the clients'. `at_open` is called as the window opens (the profiler).
    """
    hard_stop = window.drain_end + int(30e9)
    procs = []
    for builder, args in jobs:
        receiver, sender = _FORK.Pipe(duplex=False)
        proc = _FORK.Process(
            target=_worker_main, args=(addr, window, hard_stop, builder, args, sender), daemon=True
        )
        proc.start()
        sender.close()
        procs.append((proc, receiver))
    meter = CpuMeter({**watch, **{f"client{i}": p.pid for i, (p, _) in enumerate(procs)}})
    _sleep_until(window.t0)
    meter.begin()
    if at_open is not None:
        at_open()
    _sleep_until(window.t1)
    cpu = meter.end()
    clients = sum(v for k, v in cpu.items() if k.startswith("client") and k[-4:] != "_sys")
    cpu = {k: v for k, v in cpu.items() if not k.startswith("client")}
    cpu["clients"] = round(clients, 3)
    results = []
    for proc, receiver in procs:
        left = max(1.0, (hard_stop - time.monotonic_ns()) / 1e9 + 5)
        if not receiver.poll(left):
            proc.kill()
            raise RuntimeError(f"load worker {proc.pid} did not finish")
        results.append(receiver.recv())
        proc.join(10)
    failed = [r["failure"] for r in results if "failure" in r]
    if failed:
        raise RuntimeError(f"load worker failed: {failed[0]}")
    return LoadResult(results, cpu)


def shared_counters(count: int) -> Any:
    """Counters in shared memory that forked workers read and write (each its own slot)."""
    return _FORK.Array("q", count, lock=False)


def _worker_main(
    addr: tuple[str, int],
    window: Window,
    hard_stop: int,
    builder: Builder,
    args: tuple[Any, ...],
    sender: Any,
) -> None:
    try:
        sessions, collect = builder(window, *args)
        drive(addr, sessions, window.start, hard_stop)
        outcome = collect()
    except BaseException as exc:  # reported to the parent, which stops the benchmark
        outcome = {"failure": f"{type(exc).__name__}: {exc} (pid {os.getpid()})"}
    sender.send(outcome)
    sender.close()
