"""The job RQ's workers run in `e2e.py`: the command in `sh -c`, as our agent runs a job.

Imported by RQ's work horses (in the benchmark's own RQ virtualenv), so: the standard library
only.
"""

from __future__ import annotations

import subprocess


def run(command: str) -> int:
    """Run `command` as our agent does (`sh -c`), and fail as the job fails."""
    return subprocess.run(["sh", "-c", command], check=True).returncode
