"""`python -m benchmarks`: run the measurements, print the table, write the JSON.

    python -m benchmarks            # the full run (3 runs of each case, 10k/100k/1M history)
    python -m benchmarks --quick    # one short run of each, 10k/100k history: for development
    python -m benchmarks --only submit,cycle --runs 1 --profile
    python -m benchmarks --only placement --placement-scale 0.1   # issue 13's scenario, 10x faster
    python -m benchmarks --only fit --fit-scale 0.25   # issue 34's scenario, 4x faster
    python -m benchmarks --only simulate   # issue 38: a week of 100k jobs replayed

See benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import (
    agents,
    cli_figures,
    e2e,
    fit,
    ha,
    idle_agents,
    owners,
    placement,
    previous,
    priorities,
    profile,
    report,
    scenarios,
    simulate,
    waiters,
    worker_floor,
)
from .history import node_names
from .procs import RegistryProcess

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SCENARIOS = (
    "submit",
    "report",
    "history",
    "cycle",
    "floor",
    "previous",
    "worker",
    "postgres",
    "placement",
    "fit",
    "waiters",
    "priorities",
    "agents1000",
    "owners",
    "e2e",
    "cli",
    "idle_agents",
    "simulate",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="one short run each, no 1M history")
    parser.add_argument(
        "--only", default=",".join(SCENARIOS), help="comma list of " + "/".join(SCENARIOS)
    )
    parser.add_argument("--runs", type=int, help="runs per case (median taken); default 3, quick 1")
    parser.add_argument(
        "--duration", type=float, help="seconds measured per run; default 5, quick 2"
    )
    parser.add_argument(
        "--cycle-duration", type=float, help="seconds of the cycle; default 8, quick 3"
    )
    parser.add_argument(
        "--warmup", type=float, help="seconds before each window; default 1, quick 0.5"
    )
    parser.add_argument(
        "--simulate-jobs", type=int, default=simulate.JOBS, help="jobs of the simulate week"
    )
    parser.add_argument("--sizes", help="history sizes, comma list; default 10000,100000,1000000")
    parser.add_argument(
        "--placement-scale",
        type=float,
        help="placement: multiply every job's run time (20 s / 0.2 s); default 1, quick 0.1",
    )
    parser.add_argument(
        "--fit-scale",
        type=float,
        help="fit: multiply every job's run time (1-6 s); default 1, quick 0.25",
    )
    parser.add_argument(
        "--nodes", type=int, default=50, help="compute nodes (and agents); default 50"
    )
    parser.add_argument(
        "--agent-idle",
        type=float,
        default=scenarios.DEFAULT_AGENT_IDLE_S,
        help="seconds an agent waits after an empty poll",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=scenarios.DEFAULT_BACKLOG,
        help="cycle: most jobs submitted but not done (0: no limit)",
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment of the server (repeatable), e.g. SCHEDULER_LOG_LEVEL=warning",
    )
    parser.add_argument(
        "--json", type=Path, default=RESULTS / "latest.json", help="where the JSON goes"
    )
    parser.add_argument("--markdown", action="store_true", help="also print the table as markdown")
    parser.add_argument(
        "--profile", action="store_true", help="py-spy the worker during each case's first run"
    )
    parser.add_argument("--py-spy", default=os.environ.get("PY_SPY", ""), help="py-spy executable")
    parser.add_argument(
        "--previous-commit",
        default="",
        help=f"the previous case's tree; default {previous.PREVIOUS_COMMIT} (the last round's end)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the databases in results/work")
    args = parser.parse_args(argv)
    quick = args.quick
    args.runs = args.runs or (1 if quick else 3)
    args.duration = args.duration or (2.0 if quick else 5.0)
    args.cycle_duration = args.cycle_duration or (3.0 if quick else 8.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if quick else 1.0)
    args.placement_scale = args.placement_scale or (0.1 if quick else 1.0)
    args.fit_scale = args.fit_scale or (0.25 if quick else 1.0)
    sizes = args.sizes or ("10000,100000" if quick else "10000,100000,1000000")
    args.sizes = [int(size) for size in sizes.split(",")]
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(args.only) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = RESULTS / "work"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)

    profiler = None
    if args.profile:
        executable = args.py_spy or shutil.which("py-spy")
        if not executable:
            sys.exit("--profile needs py-spy: pip install py-spy, or pass --py-spy PATH")
        profiler = profile.PySpy(executable, RESULTS / "profiles")

    env = {}
    for item in args.server_env:
        name, equals, value = item.partition("=")
        if not equals:
            sys.exit(f"--server-env wants NAME=VALUE, got {item!r}")
        env[name] = value
    options = scenarios.Options(
        runs=args.runs,
        warmup_s=args.warmup,
        duration_s=args.duration,
        cycle_s=args.cycle_duration,
        sizes=args.sizes,
        nodes=args.nodes,
        workdir=workdir,
        server_env=env,
        agent_idle_s=args.agent_idle,
        backlog=args.backlog,
        profiler=profiler,
        previous_commit=args.previous_commit,
    )
    meta = _meta(args)
    began = time.monotonic()
    registry = RegistryProcess(node_names(args.nodes)).start()
    results: dict[str, Any] = {}
    try:
        bench = scenarios.Bench(options, registry)
        steps = {
            "submit": scenarios.submissions,
            "history": scenarios.history_and_restart,
            "report": scenarios.reports,
            "cycle": scenarios.cycle,
            "floor": scenarios.floor,
            # Issue 37: ours beside the end of the last round, both built here.
            "previous": previous.previous,
            # Issue 32: stock gthread, our buffering alone, buffering and the fast path.
            "worker": worker_floor.scenario,
            "postgres": ha.postgres,
            # Its own registries (4 nodes each), not the 50-node one.
            "placement": lambda _: placement.run(workdir, env, args.placement_scale),
            # Issue 34: its own daemons, nodes from their agents' heartbeats.
            "fit": lambda _: fit.run(workdir, env, args.fit_scale),
            "waiters": waiters.waiters,
            "priorities": priorities.priorities,
            "agents1000": agents.agents,
            "owners": owners.owners,
            # Issue 40: 500 x true on two slots, ours beside RQ; the CLI's own figures.
            "e2e": e2e.e2e,
            "cli": cli_figures.cli,
            # Issue 37: 5,000 agents waiting for work in their heartbeats, beside 50.
            "idle_agents": idle_agents.idle_agents,
            # Issue 38: in this process, no daemon: the replay of a drawn week.
            "simulate": lambda _: simulate.run(args.simulate_jobs),
        }
        for name in SCENARIOS:
            if name in args.only:
                print(f"[bench] {name} ...", file=sys.stderr, flush=True)
                results.update(steps[name](bench))
    finally:
        registry.stop()
        if not args.keep:
            for path in workdir.glob("*.db*"):
                path.unlink()
    meta["elapsed_s"] = round(time.monotonic() - began, 1)
    meta["loadavg_after"] = os.getloadavg()

    table = report.rows(results)
    print(report.text_table(table))
    print(
        "\ncpu: cores busy during the window (server worker / load generator / everything else "
        f"on the machine), {meta['cpus']} cores in all. Medians of {args.runs} run(s), "
        f"{meta['elapsed_s']} s in all."
    )
    if args.markdown:
        print("\n" + report.markdown_table(table))
    if profiler is not None:
        for path in profiler.finish():
            summary = profile.summary(path)
            path.with_suffix(".summary").write_text(summary + "\n")
            print("\n" + summary)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "meta": meta,
        "options": {k: v for k, v in vars(args).items() if k not in ("json", "py_spy")},
        "results": results,
        "table": [vars(row) for row in table],
    }
    args.json.write_text(json.dumps(document, indent=1, default=_plain) + "\n")
    print(f"\nwrote {args.json}", file=sys.stderr)
    errors = {case: body["errors"] for case, body in results.items() if body.get("errors")}
    if errors:
        print(f"error replies during the runs: {errors}", file=sys.stderr)
    return 0


def _meta(args: argparse.Namespace) -> dict[str, Any]:
    def git(*command: str) -> str:
        done = subprocess.run(["git", *command], cwd=HERE, capture_output=True, text=True)
        return done.stdout.strip()

    return {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--", "tiny_scheduler")),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
        "mode": "quick" if args.quick else "full",
    }


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    try:
        return list(value)  # the latency arrays
    except TypeError:
        return str(value)


if __name__ == "__main__":
    sys.exit(main())
