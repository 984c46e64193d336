"""The floor of the daemon's gunicorn worker: server CPU per request of our
`tiny_scheduler.server.worker.BufferingWorker` against gunicorn's own `gthread`, same settings,
same load; and between them our worker with its fast path off (`BufferingOnly`), to tell what
the loop's buffering costs or saves by itself from what the fast path (httptools, no
gunicorn request and response objects, inline answers) adds.

    .venv/bin/python -m benchmarks.worker_floor            # 3 passes of each, ~4 minutes
    .venv/bin/python -m benchmarks.worker_floor --runs 1 --seconds 3
    .venv/bin/python -m benchmarks --only worker           # the same, in `make bench`

Each pass starts a fresh gunicorn (one worker, 32 threads, keep-alive) and drives it with 8
keep-alive clients in 2 processes (the benchmark's load generator, `loadgen.py`) back to back
for a measuring window, then reads the worker's CPU over that window. Three request shapes:

- `wsgi GET`: a bare WSGI callable answering an empty body: nothing but the worker;
- `wsgi POST`: the same, reading a 120-byte JSON body (the body path of the worker);
- `daemon /health`: the scheduler itself (its production config; plain gthread through
  `GUNICORN_CMD_ARGS=--worker-class gthread`), on an empty database.

Passes alternate between the workers so that noise on the machine hits both alike; the
table shows medians. CPU time is all a shared VM offers (no hardware counters), and it moves
with whatever else runs; `--syscalls` adds a figure that does not: the system calls the
worker makes per request (strace -c on it while one client sends requests one at a time),
with the futex calls (threads waiting for each other or the GIL) counted apart.

This module is also the trivial app gunicorn loads (`app`).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from tiny_scheduler.dev.daemon import SchedulerProcess, free_port
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.server.worker import BufferingWorker

from .loadgen import Recorder, Session, Window, request, run_load

ROOT = Path(__file__).resolve().parent.parent


class BufferingOnly(BufferingWorker):
    """The daemon's worker with its fast path off: requests are read whole in the loop and
    written through the write buffer as always, but every one is parsed by gunicorn, answered
    by its response code, and on a thread (no inline answers). Only this benchmark uses it."""

    fast_path = False


WORKERS = {
    "gthread": "gthread",
    "buffering": "benchmarks.worker_floor.BufferingOnly",
    "fast": "tiny_scheduler.server.worker.BufferingWorker",
}
"""The workers compared: gunicorn's own; ours with buffering alone; ours as the daemon runs it
(buffering and the fast path)."""

BODY = b'{"command":"echo hello from the floor benchmark","env_vars":{"N":"1","M":"2","K":"3"}}'


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """The trivial WSGI app: reads the body if there is one, answers an empty 200."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length:
        environ["wsgi.input"].read(length)
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "0")])
    return []


def floor_clients(window: Window, clients: int, raw: bytes) -> tuple[list[Session], Any]:
    """Loadgen builder: `clients` sessions sending `raw` back to back until the window ends."""
    recorder = Recorder(window)

    def client() -> Session:
        while time.monotonic_ns() < window.t1:
            reply = yield raw
            recorder.add(reply)

    return [client() for _ in range(clients)], recorder.result


SHAPES = {
    "wsgi GET": request("GET", "/"),
    "wsgi POST": request("POST", "/", BODY, "application/json"),
    "daemon /health": request("GET", "/health"),
}


@contextlib.contextmanager
def bare_gunicorn(worker_class: str, threads: int) -> Iterator[tuple[int, int]]:
    """gunicorn serving `app` with the daemon's worker settings; yields (port, worker pid)."""
    port = free_port()
    # An empty config file: not the repository's gunicorn.conf.py (the daemon's), which
    # gunicorn reads by default from the working directory.
    with tempfile.NamedTemporaryFile(suffix=".py") as config:
        argv = [
            *(sys.executable, "-m", "gunicorn", "--config", config.name),
            *("--worker-class", worker_class, "--workers", "1", "--threads", str(threads)),
            *("--keep-alive", "120", "--bind", f"127.0.0.1:{port}", "--no-control-socket"),
            *("--log-level", "warning", "benchmarks.worker_floor:app"),
        ]
        proc = subprocess.Popen(argv, cwd=ROOT, start_new_session=True)
        try:
            wait_answering(port, "/")
            yield port, only_child(proc.pid)
        finally:
            proc.terminate()
            proc.wait(20)


@contextlib.contextmanager
def daemon(worker_class: str, registry_url: str, threads: int) -> Iterator[tuple[int, int]]:
    """The scheduler itself, with `worker_class` in place of the configured one."""
    with tempfile.TemporaryDirectory() as folder:
        env = {
            "REGISTRY_URL": registry_url,
            "SCHEDULER_THREADS": str(threads),
            "GUNICORN_CMD_ARGS": f"--worker-class {worker_class}",
            # gunicorn imports the worker class by name: BufferingOnly is in this package.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        proc = SchedulerProcess(os.path.join(folder, "floor.db"), env=env)
        proc.start(timeout=60)
        try:
            assert proc.proc is not None
            yield proc.port, only_child(proc.proc.pid)
        finally:
            proc.stop()


def only_child(master: int) -> int:
    """The gunicorn worker: the master's one child (once it has started)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        if len(children) == 1:
            return int(children[0])
        time.sleep(0.05)
    raise RuntimeError(f"gunicorn master {master} has no single worker")


def wait_answering(port: int, path: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        with contextlib.suppress(OSError):
            conn.request("GET", path)
            conn.getresponse().read()
            return
        conn.close()
        time.sleep(0.05)
    raise TimeoutError(f"nothing answers on port {port}")


def one_pass(
    shape: str, worker: str, args: argparse.Namespace, registry_url: str
) -> dict[str, float]:
    """One server, one window of load: requests/s and worker CPU µs per request."""
    server = (
        daemon(WORKERS[worker], registry_url, args.threads)
        if shape.startswith("daemon")
        else bare_gunicorn(WORKERS[worker], args.threads)
    )
    with server as (port, pid):
        window = Window.plan(args.warmup, args.seconds)
        per_process = args.clients // 2
        jobs = [(floor_clients, (per_process, SHAPES[shape]))] * 2
        result = run_load(("127.0.0.1", port), window, jobs, {"server": pid})
    done = sum(len(r["latencies"]) for r in result.workers)
    errors = sum(sum(r["errors"].values()) for r in result.workers)
    if errors or not done:
        raise RuntimeError(f"{shape} on {worker}: {errors} errors, {done} answers")
    return {
        "rps": done / window.seconds,
        "cpu_us": result.cpu["server"] * window.seconds / done * 1e6,
        "other": max(0.0, result.cpu["machine"] - result.cpu["server"] - result.cpu["clients"]),
    }


def count_syscalls(worker: str, shape: str, requests: int, threads: int) -> tuple[float, float]:
    """(system calls, futex calls) per request of `worker` serving `shape` to one client."""
    raw = SHAPES[shape]
    with (
        bare_gunicorn(WORKERS[worker], threads) as (port, pid),
        tempfile.NamedTemporaryFile() as out,
    ):
        with socket_pair(port) as (sock, reader):
            sock.sendall(raw)  # warm up before counting
            read_status(reader)
            argv = ["strace", "-c", "-f", "-p", str(pid), "-o", out.name]
            tracer = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
            assert tracer.stderr is not None
            # Count from the moment it is attached to every thread, which it says first.
            attached = tracer.stderr.readline()
            if "attached" not in attached:
                raise RuntimeError(f"strace: {attached}")
            for _ in range(requests):
                sock.sendall(raw)
                read_status(reader)
            tracer.send_signal(signal.SIGINT)
            tracer.communicate(timeout=30)
        summary = Path(out.name).read_text()
    total = re.search(r"^\s*100\.00\s+\S+\s+\S+\s+(\d+)", summary, re.M)
    futex = re.search(r"^\s*\S+\s+\S+\s+\S+\s+(\d+)\s+(?:\d+\s+)?futex$", summary, re.M)
    if total is None:
        raise RuntimeError(f"no strace summary: {summary[-500:]}")
    futexes = int(futex.group(1)) if futex else 0
    return int(total.group(1)) / requests, futexes / requests


@contextlib.contextmanager
def socket_pair(port: int) -> Iterator[tuple[Any, Any]]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    with sock, sock.makefile("rb") as reader:
        yield sock, reader


def read_status(reader: Any) -> None:
    """Read one reply (status line, headers, Content-Length body); it must be a 200."""
    assert reader.readline().split()[1] == b"200"
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    reader.read(length)


def print_syscalls(args: argparse.Namespace) -> None:
    if shutil.which("strace") is None:
        raise SystemExit("--syscalls needs strace")
    shapes = [shape for shape in args.only.split(",") if shape.startswith("wsgi")]
    print(f"\nsystem calls per request of the worker, one client, {args.syscalls} requests")
    row = "{:<16} {:<10} {:>9} {:>9} {:>9}"
    print(row.format("shape", "worker", "all", "futex", "others"))
    for shape in shapes:
        for worker in WORKERS:
            calls, futexes = count_syscalls(worker, shape, args.syscalls, args.threads)
            print(
                row.format(shape, worker, *(f"{n:.1f}" for n in (calls, futexes, calls - futexes)))
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="passes of each (medians shown)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measuring window")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--only", default=",".join(SHAPES), help="shapes, comma-separated")
    parser.add_argument(
        "--syscalls",
        type=int,
        default=0,
        metavar="N",
        help="also count system calls over N requests (needs strace)",
    )
    args = parser.parse_args(argv)
    if args.syscalls:
        print_syscalls(args)
    if args.runs:
        print_cpu(args)


def measure(
    shapes: list[str], args: argparse.Namespace, registry_url: str
) -> dict[str, dict[str, dict[str, float]]]:
    """`args.runs` passes of each shape on each worker, interleaved; the medians, by shape and
    worker: req/s, worker CPU µs per request, and the cores busy elsewhere (`other`)."""
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for shape in shapes:
        for _ in range(args.runs):
            for worker in WORKERS:
                results.setdefault((shape, worker), []).append(
                    one_pass(shape, worker, args, registry_url)
                )
    return {
        shape: {
            worker: {
                key: statistics.median(r[key] for r in results[(shape, worker)])
                for key in ("rps", "cpu_us", "other")
            }
            for worker in WORKERS
        }
        for shape in shapes
    }


def print_cpu(args: argparse.Namespace) -> None:
    registry = FakeRegistry()
    registry.start()
    registry.set_node("node-a")
    try:
        medians = measure(args.only.split(","), args, registry.url)
    finally:
        registry.stop()
    print(f"\nworker floor: {args.clients} keep-alive clients, {args.threads} threads, ", end="")
    print(f"medians of {args.runs} pass(es) of {args.seconds:.0f} s, {os.cpu_count()} cores")
    print(text_table(medians))


def text_table(medians: dict[str, dict[str, dict[str, float]]]) -> str:
    row = "{:<16} {:<10} {:>9} {:>12} {:>10} {:>7}"
    lines = [row.format("shape", "worker", "req/s", "CPU µs/req", "x gthread", "other")]
    for shape, workers in medians.items():
        floor = workers["gthread"]["cpu_us"]
        for worker, m in workers.items():
            lines.append(
                row.format(
                    shape,
                    worker,
                    f"{m['rps']:.0f}",
                    f"{m['cpu_us']:.0f}",
                    f"{m['cpu_us'] / floor:.2f}",
                    f"{m['other']:.2f}",
                )
            )
    return "\n".join(lines)


def scenario(bench: Any) -> dict[str, Any]:
    """`make bench`'s `worker` case: the three workers on the three shapes, with the bench's
    runs, window and registry (the JSON keeps the medians; report.py shows them)."""
    options = bench.options
    args = argparse.Namespace(
        runs=options.runs,
        seconds=options.duration_s,
        warmup=options.warmup_s,
        clients=8,
        threads=32,
    )
    return {"worker_floor": measure(list(SHAPES), args, bench.registry.url)}


if __name__ == "__main__":
    main()
