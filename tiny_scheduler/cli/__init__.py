"""The `tiny-scheduler` command line: run the daemon or a dev cluster, and talk to a scheduler.

The console script runs `run`: a plain `submit` is sent by `quick` without click (a shell
loop's call pays for little more than Python's start); anything else goes to the click group
`main` of `group` (the options every command shares, `--version`, help, and one rule for
failures: a `client.ClientError` becomes one line on stderr and exit 1). The commands live in
`job_commands` (submit, status, list, logs, cancel, stop: clients of the HTTP API at
SCHEDULER_URL, sending TINYAWS_API_KEY as the bearer token), `job_actions` (hold, release,
retry), `cluster_command` (the daemons
and their leader), `queue_commands` (`queues` and the `queue` group, a client of /queues),
`schedule_commands` (the `schedule` group, a client of /schedules), `node_commands` (nodes,
node drain|undrain, version), `dev_commands` (the local dev cluster and dev registry) and
`token_commands` (`token create|list|revoke`, `whoami`, `audit`), `agent_command` (a node's
compute agent), `simulate_command` (what if: the history replayed); what they print is in
`output`. Tables for people,
`--json` for scripts.

Each command's module is imported only when that command runs (or `--help` lists it): a
`submit` in a shell loop pays for itself, not for the agent, the dev cluster or the daemon.
`main` is imported from here as before (`from tiny_scheduler.cli import main`), on first use.

Nothing outside this package imports it: it is the top of the import graph.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["main", "run"]


def __getattr__(name: str) -> Any:
    # The click group is imported on first use: `run` answers a plain `submit` without it.
    if name == "main":
        from .group import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run() -> None:
    """The `tiny-scheduler` console script (and `python -m tiny_scheduler.cli`): a plain
    `submit` by `quick`, anything else by the click group `main`; then the exit.

    A command that has answered and left nothing running ends the process at once: tearing
    the interpreter down (every module, every object) costs a `submit` a sixth of its time,
    and in a shell loop that is paid on every call. With another thread still alive (the
    agent's, the dev cluster's) it ends as Python ends, waiting for them."""
    from .quick import quick_submit

    code: object = quick_submit(sys.argv[1:])
    if code is None:
        from .group import main

        try:
            main(prog_name="tiny-scheduler")
            code = 0
        except SystemExit as done:
            code = done.code
    if "threading" in sys.modules and sys.modules["threading"].active_count() > 1:
        sys.exit(code)
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()  # what its exit hook would do: flush the handlers
    status = _exit_status(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (`| head`), a closed stream
            status = status or 1
    os._exit(status)


def _exit_status(code: object) -> int:
    """The status `sys.exit(code)` ends with: None is 0, a number itself, anything else is
    printed on stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
