"""The four measurements of issue 7, each returning its runs and their medians.

1. `submissions`: POST /jobs back to back from 1 and from 8 keep-alive clients.
2. `history` (the poll and the restart share the big databases): for 10k, 100k and 1M jobs of
   history, start the scheduler on the file several times (start-up time to the first healthy
   /health, resident memory of the worker), then on the last start time the agent poll
   `GET /jobs?node_id=N&status=pending` from 1 and 8 clients. An empty database is the memory
   baseline.
3. `cycle`: 50 simulated agents (poll, PATCH running, PATCH done) while 4 clients submit.
5. `floor`: the same load against a trivial Flask app under the same gunicorn settings
   (`floor_app.py`), one call shape at a time: what the stack costs by itself.

A scenario's record is {case: {"runs": [...], "median": {...}}}: every run kept for the JSON,
the median of each figure over the runs for the table.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import history, loadgen, sessions
from .loadgen import LoadResult, Window
from .procs import RegistryProcess, Server, memory_bytes, rss_bytes

CONNS_PER_PROCESS = 4
"""Clients per load generator process for submitters and pollers (8 clients: 2 processes)."""

AGENTS_PER_PROCESS = 10
"""Simulated agents per process in the cycle. An agent spends most of its time waiting for the
scheduler; ten share one epoll loop without queueing behind each other (see the client CPU
column), and five processes rather than twenty leave the two cores to the server."""

CYCLE_SUBMITTERS = 4

DEFAULT_BACKLOG = 100
"""In the cycle, submitters hold off while this many jobs are submitted but not done (two per
agent): the queue stays at a realistic depth instead of growing for the whole run."""

DEFAULT_AGENT_IDLE_S = 0.1
"""How long a simulated agent waits after an empty poll. The real agent waits 3 s; a short
wait here keeps fifty agents able to take whatever the submitters offer, without their empty
polls (up to 500/s) crowding out the work."""

DRAIN_S = 1.5
"""After the cycle's window, agents keep working this long to finish the window's jobs."""


@dataclasses.dataclass
class Options:
    runs: int
    warmup_s: float
    duration_s: float
    cycle_s: float
    sizes: list[int]
    nodes: int
    workdir: Path
    server_env: dict[str, str]
    agent_idle_s: float = DEFAULT_AGENT_IDLE_S
    backlog: int = DEFAULT_BACKLOG
    profiler: Callable[[int, str, float], Any] | None = None  # (pid, name, seconds) -> started
    previous_commit: str = ""  # the `previous` case's tree ("": `previous.PREVIOUS_COMMIT`)


class Bench:
    """What the scenarios share: options, the registry process, servers' files and logs."""

    def __init__(self, options: Options, registry: RegistryProcess) -> None:
        self.options = options
        self.registry = registry
        self.nodes = registry.nodes
        self._profiled: set[str] = set()

    def server(
        self,
        name: str,
        db: Path,
        fresh: bool = True,
        floor: bool = False,
        tree: Path | None = None,
    ) -> Server:
        """A server on `db` (removed first when `fresh`): ours, the floor app, or the scheduler
        of the checkout `tree`."""
        if fresh:
            history.remove_database(db)
        log = self.options.workdir / f"server-{name}.log"
        return Server(db, self.registry.url, log, self.options.server_env, floor, tree)

    def load(
        self,
        server: Server,
        workers: list[tuple[loadgen.Builder, tuple[Any, ...]]],
        window: Window,
        name: str,
    ) -> LoadResult:
        worker_pid = server.worker_pid
        at_open = None
        profiler = self.options.profiler
        if profiler is not None and name not in self._profiled:
            self._profiled.add(name)

            def at_open() -> None:
                profiler(worker_pid, name, window.seconds)

        return loadgen.run_load(
            server.addr,
            window,
            workers,
            {"server": worker_pid, "registry": self.registry.pid},
            at_open,
        )

    def window(self, duration_s: float | None = None, drain_s: float = 0.0) -> Window:
        return Window.plan(self.options.warmup_s, duration_s or self.options.duration_s, drain_s)


# --- figures -----------------------------------------------------------------------------------


def split(total: int, per: int) -> list[int]:
    """`total` clients in groups of at most `per`, as evenly as possible."""
    groups = -(-total // per)
    return [total // groups + (1 if i < total % groups else 0) for i in range(groups)]


def latency_figures(latencies: Iterable[Iterable[int]]) -> dict[str, float]:
    merged = sorted(value for part in latencies for value in part)
    if not merged:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    return {
        "p50_ms": round(merged[(len(merged) - 1) // 2] / 1e6, 3),
        "p99_ms": round(merged[min(len(merged) - 1, int(len(merged) * 0.99))] / 1e6, 3),
    }


def merge_errors(parts: Iterable[dict[int, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for status, count in part.items():
            total[str(status)] = total.get(str(status), 0) + count
    return total


def run_figures(result: LoadResult, window: Window) -> dict[str, Any]:
    """One run of back-to-back requests: requests/s sent in the window, their latency, the
    errors, the CPU, and how many load generator processes sent them."""
    latencies = [w["latencies"] for w in result.workers]
    return {
        "rate": round(sum(len(x) for x in latencies) / window.seconds, 1),
        **latency_figures(latencies),
        "errors": merge_errors(w["errors"] for w in result.workers),
        "cpu": result.cpu,
        "load_processes": len(result.workers),
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every number over the runs (nested dicts too, e.g. the CPU shares)."""
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        if key == "errors" or isinstance(value, bool) or not isinstance(value, int | float | dict):
            continue
        if isinstance(value, dict):
            out[key] = medians([run[key] for run in runs])
        else:
            out[key] = round(statistics.median(run[key] for run in runs), 3)
    return out


def _case(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs, their medians, and every error reply of every run added up."""
    errors = merge_errors(run.get("errors", {}) for run in runs)
    return {"runs": runs, "median": medians(runs), "errors": errors}


# --- 1. submissions ------------------------------------------------------------------------------


def submissions(bench: Bench) -> dict[str, Any]:
    """Submissions from 1 and 8 clients; then the server is SIGKILLed and every acknowledged
    (201) job must be in the database: the reply comes only after the commit."""
    out: dict[str, Any] = {}
    db = bench.options.workdir / "submit.db"
    server = bench.server("submit", db).start()
    acknowledged = 0
    try:
        for clients in (1, 8):
            runs = []
            for _ in range(bench.options.runs):
                figures, acked = submit_run(bench, server, clients, f"submit-{clients}")
                acknowledged += acked
                runs.append(figures)
            out[f"submit_{clients}"] = _case(runs)
    finally:
        server.process.kill()
    stored = len(history.stored_jobs(db))
    out["durability"] = {"acknowledged": acknowledged, "stored_after_sigkill": stored}
    if stored < acknowledged:
        raise RuntimeError(f"{acknowledged} jobs acknowledged but only {stored} in the database")
    return out


def submit_run(bench: Bench, server: Server, clients: int, name: str) -> tuple[dict[str, Any], int]:
    """One run of back-to-back submissions from `clients`: its figures, and how many jobs
    were acknowledged."""
    window = bench.window()
    workers = [(sessions.submit_worker, (n,)) for n in split(clients, CONNS_PER_PROCESS)]
    result = bench.load(server, workers, window, name)
    return run_figures(result, window), sum(w["ok"] for w in result.workers)


# --- 2 and 4. the agent poll over history, and restarts ---------------------------------------


def history_and_restart(bench: Bench) -> dict[str, Any]:
    opts = bench.options
    out: dict[str, Any] = {}
    empty_db = opts.workdir / "empty.db"
    starts = []
    for _ in range(opts.runs):
        server = bench.server("empty", empty_db).start()
        try:
            starts.append(_start_figures(server))
        finally:
            server.stop()
    out["restart_0"] = _case(starts)
    baseline = out["restart_0"]["median"]["rss_bytes"]

    for size in opts.sizes:
        db = opts.workdir / f"history-{size}.db"
        built_s = history.build(db, size, bench.nodes)
        starts = []
        for run in range(opts.runs):
            server = bench.server(f"history-{size}", db, fresh=False).start()
            try:
                figures = _start_figures(server)
                figures["bytes_per_job"] = round((figures["rss_bytes"] - baseline) / size, 1)
                starts.append(figures)
                if run == opts.runs - 1:
                    out.update(_polls(bench, server, size))
            finally:
                server.stop()
        out[f"restart_{size}"] = _case(starts)
        out[f"restart_{size}"]["build_s"] = round(built_s, 2)
        out[f"restart_{size}"]["file_mb"] = round(db.stat().st_size / 1e6, 1)
    return out


def _start_figures(server: Server) -> dict[str, Any]:
    worker = server.worker_pid
    return {
        "startup_s": round(server.startup_s, 3),
        "rss_bytes": rss_bytes(worker),
        "hwm": memory_bytes(worker, "VmHWM"),
    }


def _polls(bench: Bench, server: Server, size: int) -> dict[str, Any]:
    out = {}
    for clients in (1, 8):
        runs = []
        for _ in range(bench.options.runs):
            window = bench.window()
            workers = [
                (sessions.poll_worker, (n, bench.nodes)) for n in split(clients, CONNS_PER_PROCESS)
            ]
            result = bench.load(server, workers, window, f"poll-{size}-{clients}")
            empty = sum(w["empty"] for w in result.workers)
            runs.append({**run_figures(result, window), "empty_replies": empty})
        out[f"poll_{size}_{clients}"] = _case(runs)
    return out


# --- 3. the full cycle ----------------------------------------------------------------------


def cycle(bench: Bench) -> dict[str, Any]:
    runs = []
    server = bench.server("cycle", bench.options.workdir / "cycle.db").start()
    try:
        for _ in range(bench.options.runs):
            runs.append(cycle_run(bench, server, "cycle"))
    finally:
        server.stop()
    return {"cycle": _case(runs)}


def cycle_run(bench: Bench, server: Server, name: str) -> dict[str, Any]:
    """One window of the cycle against `server`: its figures."""
    opts = bench.options
    agent_groups = [
        bench.nodes[i : i + AGENTS_PER_PROCESS]
        for i in range(0, len(bench.nodes), AGENTS_PER_PROCESS)
    ]
    submit_groups = split(CYCLE_SUBMITTERS, CONNS_PER_PROCESS)
    submitted = loadgen.shared_counters(len(submit_groups))
    done = loadgen.shared_counters(len(agent_groups))
    window = bench.window(opts.cycle_s, DRAIN_S)
    workers: list[tuple[loadgen.Builder, tuple[Any, ...]]] = [
        (sessions.cycle_submit_worker, (n, i, submitted, done, opts.backlog))
        for i, n in enumerate(submit_groups)
    ]
    workers += [
        (sessions.agent_worker, (group, i, done, opts.agent_idle_s))
        for i, group in enumerate(agent_groups)
    ]
    result = bench.load(server, workers, window, name)
    submitters = result.workers[: len(submit_groups)]
    agents = result.workers[len(submit_groups) :]
    sent_at = {k: v for w in submitters for k, v in w["sent_at"].items()}
    done_at = {k: v for w in agents for k, v in w["done_at"].items()}
    completed = sum(1 for t in done_at.values() if window.t0 <= t < window.t1)
    latencies = [done_at[job] - sent for job, sent in sent_at.items() if job in done_at]
    requests = {
        "submit": sum(len(w["latencies"]) for w in submitters),
        "poll": sum(len(w["polls"]["latencies"]) for w in agents),
        "patch": sum(len(w["patches"]["latencies"]) for w in agents),
    }
    figures = latency_figures([latencies])
    return {
        "rate": round(completed / window.seconds, 1),
        "p50_ms": figures["p50_ms"],
        "p99_ms": figures["p99_ms"],
        "submit_rate": round(len(sent_at) / window.seconds, 1),
        "unfinished": len(sent_at) - len(latencies),
        "submit": latency_figures(w["latencies"] for w in submitters),
        "poll": latency_figures(w["polls"]["latencies"] for w in agents),
        "patch": latency_figures(w["patches"]["latencies"] for w in agents),
        "empty_polls": sum(w["empty"] for w in agents),
        # requests sent inside the window, per completed job, by shape
        "per_job": {k: round(n / max(completed, 1), 3) for k, n in requests.items()},
        "errors": merge_errors(
            [w["errors"] for w in submitters]
            + [w["polls"]["errors"] for w in agents]
            + [w["patches"]["errors"] for w in agents]
        ),
        "cpu": result.cpu,
        "load_processes": len(workers),
    }


# --- 5. the floor: the same stack with a trivial app ---------------------------------------------

REPORT_JOBS_PER_CLIENT = 1500
"""Stored pending jobs each reporting client gets per run: more than it can claim and finish
in a window (two PATCHes a job)."""


def reports(bench: Bench) -> dict[str, Any]:
    """The agent's reports from 8 clients: each claims (PATCH running) and finishes (PATCH
    done) stored pending jobs of its own, back to back; every reply comes after a commit."""
    db = bench.options.workdir / "report.db"
    clients = 8
    lists_needed = bench.options.runs * clients
    ids = history.build_pending(db, lists_needed * REPORT_JOBS_PER_CLIENT, bench.nodes)
    lists = [ids[i::lists_needed] for i in range(lists_needed)]
    server = bench.server("report", db, fresh=False).start()
    runs = []
    try:
        for run in range(bench.options.runs):
            window = bench.window()
            mine = lists[run * clients : (run + 1) * clients]
            workers = [
                (sessions.report_worker, (mine[first : first + CONNS_PER_PROCESS],))
                for first in range(0, clients, CONNS_PER_PROCESS)
            ]
            result = bench.load(server, workers, window, "report-8")
            runs.append(run_figures(result, window))
    finally:
        server.stop()
    return {"report_8": _case(runs)}


FLOOR_SHAPES = {
    "get": (sessions.poll_worker, "poll"),
    "post": (sessions.submit_worker, "submit"),
    "patch": (sessions.patch_worker, "patch"),
}
"""The floor app's call shapes: the load generator session that drives each, and the
scheduler's call it stands for."""


def floor(bench: Bench) -> dict[str, Any]:
    """Each hot call shape from 8 clients against the floor app; CPU µs per request."""
    out: dict[str, Any] = {}
    server = bench.server("floor", bench.options.workdir / "floor.db", floor=True).start()
    try:
        for shape, (builder, _) in FLOOR_SHAPES.items():
            runs = []
            for _ in range(bench.options.runs):
                window = bench.window()
                extra: tuple[Any, ...] = (bench.nodes,) if shape == "get" else ()
                workers = [(builder, (n, *extra)) for n in split(8, CONNS_PER_PROCESS)]
                result = bench.load(server, workers, window, f"floor-{shape}")
                runs.append(run_figures(result, window))
            out[f"floor_{shape}"] = _case(runs)
    finally:
        server.stop()
    return out
