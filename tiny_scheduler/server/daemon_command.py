"""How the scheduler daemon is started: the one command line that `tiny-scheduler serve`, the
dev cluster, the tests and the benchmark all run.

It owns that command line only. It imports nothing of the scheduler, so any part (the CLI,
`dev/daemon.py`) can use it without pulling in the other.
"""

from __future__ import annotations

import sys

SERVE_ARGV = (sys.executable, "-m", "gunicorn", "-c", "python:tiny_scheduler.server.gunicorn_conf")
"""gunicorn with the package's config, every setting taken from the environment: exactly what
an operator runs."""
