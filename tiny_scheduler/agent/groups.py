"""The process groups an agent started, recorded on disk, and how to end them.

Every job runs in a process group of its own. Whoever comes after an agent that could not
clean up (a SIGKILL) finds them all: the agent itself when it starts again, the dev cluster,
its watchdog. A job's folder names its owner and its process (`owner.pid`, `job.pid`:
`owned_jobs`), and the agent writes the group ids of the single owners it started itself to
`children.pids` in its work directory (a job the spawner owns needs no line there: its folder
says all). A job's control group, when it has one, is named in its folder's spec: what is
left in it is killed and the group removed too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterable

from . import cgroups, owner

CHILDREN_FILE = "children.pids"
"""File in the work directory listing the process group of every live job, one a line."""


class Groups:
    """The live process groups of one agent (group id -> job id), mirrored to disk."""

    def __init__(self, work_dir: str) -> None:
        self.path = os.path.join(work_dir, CHILDREN_FILE)
        self._lock = threading.Lock()
        self._groups: dict[int, str] = {}

    def add(self, pgid: int, job_id: str) -> None:
        with self._lock:
            self._groups[pgid] = job_id
            self._write()

    def remove(self, pgid: int) -> None:
        with self._lock:
            self._groups.pop(pgid, None)
            self._write()

    def _write(self) -> None:
        # Best effort: the record only helps clean up after a crash; a full disk must not stop
        # a job from running.
        with contextlib.suppress(OSError):
            with open(self.path + ".tmp", "w") as f:
                f.writelines(f"{pgid} {job_id}\n" for pgid, job_id in self._groups.items())
            os.replace(self.path + ".tmp", self.path)


def recorded_groups(work_dir: str) -> list[int]:
    """The group ids an agent recorded in `work_dir` (none when there is no record)."""
    try:
        with open(os.path.join(work_dir, CHILDREN_FILE)) as f:
            return [int(line.split()[0]) for line in f if line.strip()]
    except (OSError, ValueError, IndexError):
        return []


def kill_recorded_children(work_dir: str, only_inside: bool = False) -> list[int]:
    """SIGKILL every process group an agent recorded in `work_dir`; the groups it killed.

    With `only_inside`, a group is killed only while its leader still works in `work_dir`
    (where every job's scratch directory is): a group id the system has since given to a
    stranger is left alone. The agent checks so when it starts; the dev cluster, which knows
    the ids are fresh, does not need to.
    """
    groups = recorded_groups(work_dir)
    if only_inside:
        groups = [pgid for pgid in groups if _works_in(pgid, work_dir)]
    groups += owned_jobs(work_dir)  # each job is a session of its own, apart from its owner
    kill_groups(groups, grace=0)
    for group in job_cgroups(work_dir):
        # What left the job's session is still in its control group; then the group goes.
        if group.kill_all(seconds=2.0):
            group.remove()
    return groups


def job_folders(work_dir: str) -> list[str]:
    """The job folders in `work_dir` (none when it has none)."""
    jobs_dir = os.path.join(work_dir, "jobs")
    try:
        return [os.path.join(jobs_dir, name) for name in os.listdir(jobs_dir)]
    except OSError:
        return []


def job_cgroups(work_dir: str) -> list[cgroups.JobGroup]:
    """The control groups the job folders in `work_dir` name (that may be gone already)."""
    found = []
    for folder in job_folders(work_dir):
        try:
            with open(os.path.join(folder, owner.SPEC), "rb") as f:
                spec = json.loads(f.read())
        except (OSError, ValueError):
            continue
        group = cgroups.JobGroup.from_spec(spec.get("cgroup") if isinstance(spec, dict) else None)
        if group is not None:
            found.append(group)
    return found


def owned_jobs(work_dir: str) -> list[int]:
    """The process groups of the jobs whose owners recorded them in `work_dir`'s job folders
    and that still run (checked by start time, so a reused pid is left alone)."""
    found = []
    for folder in job_folders(work_dir):
        for record_name in (owner.OWNER_PID, owner.JOB_PID):
            record = owner.read_pid(folder, record_name)
            if record is not None and owner.alive(record):
                found.append(record[0])
    return found


def _works_in(pid: int, folder: str) -> bool:
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return cwd.startswith(os.path.realpath(folder) + os.sep)


def kill_groups(groups: Iterable[int], grace: float) -> None:
    """SIGTERM the process groups, give them `grace` seconds, then SIGKILL what is left."""
    groups = list(groups)
    if grace > 0:
        signal_groups(groups, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(map(group_alive, groups)):
            time.sleep(0.05)
    signal_groups(groups, signal.SIGKILL)


def signal_groups(groups: Iterable[int], sig: int) -> None:
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
