"""Issue 40's command-line figures: the wall time of one `tiny-scheduler submit` (what a
shell loop pays per job), beside the floor of starting Python and importing click, and the
rate of `submit --from-file`.

Against one daemon on the benchmark's registry (50 healthy nodes, no agent: the jobs stay
pending). Each call is the installed console script, as a user runs it, with compiled
bytecode (PYTHONDONTWRITEBYTECODE is dropped from its environment, and a first call writes the
cache): `CALLS` rounds, each one floor run and one submit, interleaved, medians. The file is
`FILE_JOBS` lines of `true`, sent `--runs` times.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CALLS = 30
FILE_JOBS = 5000
TARGET_SUBMIT_MS = 60.0
TARGET_FILE_JOBS_S = 500.0


def cli(bench: Any) -> dict[str, Any]:
    opts = bench.options
    server = bench.server("cli", opts.workdir / "cli.db").start()
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["SCHEDULER_URL"] = f"http://127.0.0.1:{server.addr[1]}"
    submit = [str(bin_dir / "tiny-scheduler"), "submit", "-q", "true"]
    floor = [sys.executable, "-c", "import click"]
    try:
        _timed(submit, env)  # writes the bytecode cache, if it is not there yet
        timings: dict[str, list[float]] = {"submit": [], "floor": []}
        for _ in range(CALLS):
            timings["floor"].append(_timed(floor, env))
            timings["submit"].append(_timed(submit, env))
        jobs_file = opts.workdir / "cli-jobs.txt"
        jobs_file.write_text("true\n" * FILE_JOBS)
        batch = [str(bin_dir / "tiny-scheduler"), "submit", "--from-file", str(jobs_file)]
        file_secs = [_timed(batch, env) for _ in range(opts.runs)]
    finally:
        server.stop()
    return {
        "cli": {
            "submit_ms": round(statistics.median(timings["submit"]) * 1000, 1),
            "submit_best_ms": round(min(timings["submit"]) * 1000, 1),
            "floor_ms": round(statistics.median(timings["floor"]) * 1000, 1),
            "file_jobs": FILE_JOBS,
            "file_jobs_s": round(FILE_JOBS / statistics.median(file_secs)),
            "calls": CALLS,
        }
    }


def _timed(argv: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - began
