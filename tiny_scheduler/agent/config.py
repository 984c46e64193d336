"""The agent's settings and their defaults, in one place for the command line and the docs.

Each setting has an option of `tiny-scheduler agent` and an environment variable (the command
line declares both); the names shared with the scheduler (`NODE_HEARTBEAT_SECS`,
`KILL_GRACE_SECS`, `MAX_OUTPUT_BYTES`) mean the same thing on both sides.
"""

from __future__ import annotations

import dataclasses
import os

# The settings the agent shares with the scheduler have the scheduler's defaults: one value.
from ..config import DEFAULT_KILL_GRACE_SECS, DEFAULT_MAX_OUTPUT_BYTES
from ..config import DEFAULT_NODE_HEARTBEAT_SECS as DEFAULT_HEARTBEAT_SECS

__all__ = [
    "DEFAULT_DRAIN_SECS",
    "DEFAULT_HEARTBEAT_SECS",
    "DEFAULT_KILL_GRACE_SECS",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_POLL_SECS",
    "DEFAULT_REGISTRY_HEARTBEAT_SECS",
    "DEFAULT_SPOOL_MAX_BYTES",
    "DEFAULT_SPOOL_MAX_FILES",
    "AgentConfig",
    "default_work_dir",
]

DEFAULT_POLL_SECS = 3.0
"""Seconds between two polls, as the tiny-aws agent does."""

DEFAULT_DRAIN_SECS = 60.0
"""Seconds running jobs get to finish after SIGTERM before they are stopped."""

DEFAULT_SPOOL_MAX_FILES = 1000
DEFAULT_SPOOL_MAX_BYTES = 1024**3
"""At these the spool is full: the agent takes no new work until reports leave it."""

DEFAULT_REGISTRY_HEARTBEAT_SECS = 10.0
"""Seconds between two registry heartbeats (dev registry: unhealthy after 30 s)."""


def default_work_dir() -> str:
    """Where scratch directories and the spool go unless told: a per-user state directory,
    which survives a reboot (a spool in /tmp might not)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "tiny-scheduler-agent")


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """One agent's settings; `urls` are the schedulers' base URLs, leader first or not."""

    urls: tuple[str, ...]
    node_id: str
    slots: int
    work_dir: str
    spool_dir: str
    key: str | None = None
    poll_secs: float = DEFAULT_POLL_SECS
    # Wait for work in the heartbeat (spec, "Waiting for work"); False: poll every
    # `poll_secs` as the tiny-aws agent does (`--poll-secs` given).
    wait_for_work: bool = True
    heartbeat_secs: float = DEFAULT_HEARTBEAT_SECS
    drain_secs: float = DEFAULT_DRAIN_SECS
    kill_grace_secs: float = DEFAULT_KILL_GRACE_SECS
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    # None: `auto`, from the scheduler's NODE_LOST_SECS (see `fencing.fence_secs_auto`).
    fence_secs: float | None = None
    # SIGTERM drains (the jobs finish or are stopped) instead of detaching from them.
    drain_on_exit: bool = False
    spool_max_files: int = DEFAULT_SPOOL_MAX_FILES
    spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES
    # The node's memory (MiB) and GPUs; None: detected (`resources`). Its labels.
    memory_mb: int | None = None
    gpus: int | None = None
    labels: tuple[tuple[str, str], ...] = ()
    # False: give jobs no control group even where the machine could (`enforcement: none`).
    enforce: bool = True
    # Dev only: the dev registry to heartbeat to and register services with.
    registry_url: str | None = None
    registry_heartbeat_secs: float = DEFAULT_REGISTRY_HEARTBEAT_SECS
    # Dev only: drain when the process that started the agent is gone.
    exit_with_parent: bool = False
