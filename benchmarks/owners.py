"""Issue 31's figure: what a running job's owner process (`agent/owner.py`) costs the node.

Each running job has an owner of its own, which outlives the agent. This starts `OWNERS`
owners, each running `sleep`, as the agent starts them (`python -I -S owner.py FOLDER`), and
reads each one's memory from `/proc/<pid>/smaps_rollup` once it runs: its private memory
(what the machine gives it alone; the interpreter's code is shared) and its proportional
share (Pss). Also how long an owner takes from its start to its job's start. Medians.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from tiny_scheduler.agent import owner

OWNERS = 20
TARGET_PRIVATE_MIB = 8.0


def owners(bench: Any) -> dict[str, Any]:
    del bench  # needs neither the scheduler nor the registry
    private, shared, startup = [], [], []
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as root:
        try:
            for number in range(OWNERS):
                folder = os.path.join(root, f"job-{number}")
                os.mkdir(folder)
                spec = {
                    "job_id": f"job-{number}",
                    "argv": ["sleep", "60"],
                    "cwd": folder,
                    "env": {},
                }
                owner.write_atomically(folder, owner.SPEC, json.dumps(spec).encode())
                began = time.monotonic()
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-I", "-S", owner.__file__, folder],
                        start_new_session=True,
                    )
                )
                while owner.read_pid(folder, owner.JOB_PID) is None:
                    time.sleep(0.002)
                startup.append(time.monotonic() - began)
            for proc in procs:
                rollup = _rollup(proc.pid)
                private.append((rollup["Private_Clean"] + rollup["Private_Dirty"]) / 1024)
                shared.append(rollup["Pss"] / 1024)
        finally:
            for proc in procs:
                proc.terminate()  # the owner stops its job, then ends
            for proc in procs:
                proc.wait(30)
    return {
        "owners": {
            "count": OWNERS,
            "private_mib": statistics.median(private),
            "pss_mib": statistics.median(shared),
            "start_ms": statistics.median(startup) * 1000,
        }
    }


def _rollup(pid: int) -> dict[str, int]:
    """/proc/<pid>/smaps_rollup's kB figures by name."""
    found = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                found[name] = int(parts[0])
    return found
