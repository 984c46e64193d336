"""Our server CPU per job beside the previous tree's, in one sitting (issue 37).

"The previous tree" is the end of the last round, `PREVIOUS_COMMIT`: the cost this round's
work is measured against. The scenario checks it out into a temporary folder (`git worktree
add --detach`, removed afterwards) and runs that commit's daemon with this venv (`TreeProcess`:
its folder first on the module path). Each run starts a fresh daemon of each tree on a fresh
database and measures, one tree after the other (the order swapped every run, so neither
always gets the warmer or the quieter turn): submissions from one client, then the 50-agent
cycle, both exactly as in `scenarios`. The figure is server CPU per submission and per
completed job (the worker's CPU over the window divided by the rate), its median over the
runs, and ours as a ratio of the previous tree's. Without git or the commit (a shallow clone,
an exported tarball) the scenario is skipped with the reason. `--previous-commit` measures
against another commit (what a change bought, against its parent).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import scenarios
from .procs import Server, TreeProcess
from .scenarios import Bench

PREVIOUS_COMMIT = "8b49a71"
"""The end of round three: round four's work started after it."""

REPOSITORY = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def checkout(commit: str) -> Iterator[Path | str]:
    """A detached checkout of `commit` in a temporary folder, or why there is none."""
    folder = Path(tempfile.mkdtemp(prefix="bench-previous-"))
    tree = folder / "tree"
    try:
        added = subprocess.run(
            ["git", "-C", str(REPOSITORY), "worktree", "add", "--detach", str(tree), commit],
            capture_output=True,
            text=True,
        )
    except OSError as exc:
        added = subprocess.CompletedProcess([], 1, "", str(exc))
    try:
        if added.returncode != 0:
            yield f"commit {commit} not reachable: {added.stderr.strip().splitlines()[-1:]}"
        else:
            yield tree
    finally:
        if added.returncode == 0:
            subprocess.run(
                ["git", "-C", str(REPOSITORY), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
            )
        shutil.rmtree(folder, ignore_errors=True)


def previous(bench: Bench) -> dict[str, Any]:
    commit = bench.options.previous_commit or PREVIOUS_COMMIT
    with checkout(commit) as tree:
        if isinstance(tree, str):
            return {"previous": {"commit": commit, "skipped": tree}}
        trees: list[tuple[str, Path | None]] = [("ours", None), ("previous", tree)]
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            label: {"submit_1": [], "cycle": []} for label, _ in trees
        }
        for run in range(bench.options.runs):
            for label, where in trees if run % 2 == 0 else trees[::-1]:
                runs[label]["submit_1"].append(_submissions(bench, label, where))
                runs[label]["cycle"].append(_cycle(bench, label, where))
    out: dict[str, Any] = {"commit": commit}
    for label, cases in runs.items():
        out[label] = {name: scenarios._case(case) for name, case in cases.items()}
    return {"previous": out}


def _submissions(bench: Bench, label: str, tree: Path | None) -> dict[str, Any]:
    server = _start(bench, f"{label}-submit", tree)
    try:
        figures, _ = scenarios.submit_run(bench, server, 1, f"{label}-submit-1")
    finally:
        server.stop()
    return _with_cost(figures)


def _cycle(bench: Bench, label: str, tree: Path | None) -> dict[str, Any]:
    server = _start(bench, f"{label}-cycle", tree)
    try:
        figures = scenarios.cycle_run(bench, server, f"{label}-cycle")
    finally:
        server.stop()
    return _with_cost(figures)


def _start(bench: Bench, name: str, tree: Path | None) -> Server:
    server = bench.server(name, bench.options.workdir / f"{name}.db", tree=tree).start()
    process = server.process
    if isinstance(process, TreeProcess) and not process.runs_tree():
        server.stop()
        raise RuntimeError(f"the {name} daemon does not run {tree}'s code")
    return server


def _with_cost(figures: dict[str, Any]) -> dict[str, Any]:
    rate = figures["rate"]
    cpu = figures["cpu"]["server"]
    figures["server_us"] = round(cpu / rate * 1e6, 1) if rate else float("nan")
    return figures
