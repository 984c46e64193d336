"""Issue 25's scenario: does the agent poll slow down when jobs carry priorities and queues?

Two daemons run side by side, each on 100k stored pending jobs over the 50 nodes: one plain
FIFO (no `priority`, no `queue`: every job at the defaults), one with the jobs spread over 10
priority levels (0-100) and 10 queues. The histories are written with the store's own code
before the daemons start (`history.build_pending`, `history.build_prioritised`), which takes
seconds instead of the minutes 200k `POST /jobs` would. The poll from 1 and 8 clients is run
against one daemon, then the other, alternating run by run in the same sitting; the target is
the priority daemon's latency within 1.2x of the FIFO one's.
"""

from __future__ import annotations

from typing import Any

from . import history, sessions
from .scenarios import CONNS_PER_PROCESS, _case, run_figures, split

PENDING = 100_000
PRIORITIES = 10
QUEUES = 10
CLIENTS = (1, 8)


def priorities(bench: Any) -> dict[str, Any]:
    opts = bench.options
    fifo_db = opts.workdir / "fifo-100k.db"
    prio_db = opts.workdir / "priorities-100k.db"
    history.build_pending(fifo_db, PENDING, bench.nodes)
    history.build_prioritised(prio_db, PENDING, bench.nodes, PRIORITIES, QUEUES)
    servers = {
        "fifo": bench.server("fifo", fifo_db, fresh=False),
        "prio": bench.server("priorities", prio_db, fresh=False),
    }
    runs: dict[str, list[dict[str, Any]]] = {f"{kind}_{n}": [] for kind in servers for n in CLIENTS}
    try:
        for server in servers.values():
            server.start()
        for run in range(opts.runs):
            # Alternate which daemon goes first, so a drift of the machine favours neither.
            kinds = ("fifo", "prio") if run % 2 == 0 else ("prio", "fifo")
            for clients in CLIENTS:
                for kind in kinds:
                    runs[f"{kind}_{clients}"].append(
                        _poll(bench, servers[kind], clients, f"{kind}-poll-{clients}")
                    )
    finally:
        for server in servers.values():
            server.stop()
    return {f"priorities_{name}": _case(case) for name, case in runs.items()}


def _poll(bench: Any, server: Any, clients: int, name: str) -> dict[str, Any]:
    window = bench.window()
    workers = [(sessions.poll_worker, (n, bench.nodes)) for n in split(clients, CONNS_PER_PROCESS)]
    result = bench.load(server, workers, window, name)
    empty = sum(w["empty"] for w in result.workers)
    return {**run_figures(result, window), "empty_replies": empty}
