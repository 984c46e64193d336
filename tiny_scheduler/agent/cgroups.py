"""Control groups for jobs: where they go, one per job attempt, its limits and its accounting.

**Which hierarchy** (`choose`, pure, from the texts of `/proc/mounts` and `/proc/self/cgroup`
and the unified root's `cgroup.controllers`): cgroup v2 only when its root lists both `memory`
and `cpu`; else v1, whose `memory`, `cpu` and `cpuacct` controllers may each be a mount of
their own (or `cpu,cpuacct` one), found in `/proc/mounts`; else none. A machine with a unified
mount that holds no such controller (only `hugetlb`, say) beside v1 mounts is a v1 machine.
`detect()` reads those files, and then proves the choice by making and removing a group
(`layout_check`): a read-only or foreign cgroup file system means `none`.

**Where**: under the agent's own group in each hierarchy (from `/proc/self/cgroup`), one
group per job attempt, named after the agent and the job's folder. In v2 a group that hands
controllers to children may hold no process itself, so the agent first moves itself into a
leaf (`agent`) of its own group, and enables `memory` and `cpu` for the children.

**A job's group** (`JobGroup`): its memory limit from `memory_mb` (v1 `memory.limit_in_bytes`
and `memory.memsw.limit_in_bytes` where swap is accounted: no swap beyond it; v2 `memory.max`
and `memory.swap.max` 0), its CPU quota from `cpus` (`cpus` times the 100 ms period); none for
what the job did not ask. The job's owner (owner.py) writes the job's process into it between
fork and exec, so every instruction of the job, and every process it starts, is in it. The
group outlives the agent as the owner does; once the job has ended, the owner reads from it
what the job used (CPU seconds, peak memory) and whether its OOM-kill count rose, kills what
is left in it, and removes it.

Standard library only, and no import of the package: `owner.py`, run with the standard
library alone, loads this file from beside itself. Tests: `tests/test_agent_cgroups.py`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time

TYPE_CHECKING = False  # typing itself is not imported: the owner keeps to a few MiB
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

V1, V2, NONE = "cgroup-v1", "cgroup-v2", "none"
"""The heartbeat's `enforcement`."""

PERIOD_US = 100_000
"""The CPU quota's period (microseconds): `cpus` times this much CPU time in each."""

AGENT_LEAF = "agent"
"""In v2, the child of the agent's own group that the agent moves itself into."""

V1_ROLES = ("memory", "cpu", "cpuacct")
"""The v1 controllers a job's group uses: its limit, its quota, and its CPU accounting
(optional: without it, the CPU seconds come from the job's rusage)."""

KILL_SECS = 5.0
"""How long the owner tries to empty a job's group (SIGKILL to what is left) before it gives
up removing it (the agent tries again when it removes the job's folder)."""

REMOVE_SECS = 2.0
"""How long an empty group that is still busy (its processes not yet reaped) is tried again."""


# --- which hierarchy (pure) ----------------------------------------------------------------


class Mount:
    """One cgroup file system of /proc/mounts."""

    __slots__ = ("fstype", "options", "path")

    def __init__(self, path: str, fstype: str, options: frozenset[str]) -> None:
        self.path, self.fstype, self.options = path, fstype, options


def parse_mounts(text: str) -> list[Mount]:
    """The cgroup file systems of a `/proc/mounts` text, in its order."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("cgroup", "cgroup2"):
            continue
        found.append(Mount(_unescape(fields[1]), fields[2], frozenset(fields[3].split(","))))
    return found


def _unescape(field: str) -> str:
    """A /proc/mounts path field with its octal escapes (`\\040` for a space) undone."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_own_groups(text: str) -> dict[str, str]:
    """A process's group in each hierarchy, from its `/proc/<pid>/cgroup` text: controller
    name -> path, and "" -> the unified (v2) path."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            found[""] = path
        for name in controllers.split(","):
            if name:
                found.setdefault(name, path)
    return found


class Layout:
    """Where job groups go: `version` (V1 or V2) and, per role, the agent's own group's
    directory (v1: `memory`, `cpu` and maybe `cpuacct`, some possibly one directory; v2:
    `unified`); in v2 `root` is the hierarchy's mount point (whose group may hold
    processes)."""

    __slots__ = ("bases", "root", "version")

    def __init__(self, version: str, bases: tuple[tuple[str, str], ...], root: str = "") -> None:
        self.version, self.bases, self.root = version, bases, root

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and (self.version, self.bases, self.root) == (
            other.version,
            other.bases,
            other.root,
        )

    def __repr__(self) -> str:
        return f"Layout({self.version!r}, {self.bases!r}, {self.root!r})"

    def base(self, role: str) -> str | None:
        return dict(self.bases).get(role)

    def describe(self) -> str:
        return ", ".join(f"{role} {path}" for role, path in self.bases)


def choose(
    mounts: Iterable[Mount], own: Mapping[str, str], unified_controllers: str | None
) -> Layout | None:
    """The hierarchy to put jobs in, or None when there is none to use. `unified_controllers`:
    the text of the v2 root's `cgroup.controllers` (None when there is no v2 mount)."""
    mounts = list(mounts)
    unified = next((m for m in mounts if m.fstype == "cgroup2"), None)
    offered = set((unified_controllers or "").split())
    if unified is not None and {"memory", "cpu"} <= offered and "" in own:
        return Layout(V2, (("unified", _join(unified.path, own[""])),), unified.path)
    bases = []
    for role in V1_ROLES:
        mount = next((m for m in mounts if m.fstype == "cgroup" and role in m.options), None)
        if mount is not None and role in own:
            bases.append((role, _join(mount.path, own[role])))
    if {"memory", "cpu"} <= {role for role, _ in bases}:
        return Layout(V1, tuple(bases))
    return None


def _join(mount: str, path: str) -> str:
    return os.path.normpath(os.path.join(mount, path.lstrip("/")))


# --- detection and the checks that prove it (the machine's) ---------------------------------


def detect(probe_name: str) -> tuple[Layout | None, str]:
    """The layout this machine lets the agent use, and why not when there is none. Makes and
    removes a group named `probe_name` to prove it can (and, in v2, moves the agent into its
    leaf first)."""
    try:
        mounts = parse_mounts(_read("/proc/mounts"))
        own = parse_own_groups(_read("/proc/self/cgroup"))
    except OSError as exc:
        return None, f"cannot read the cgroups: {exc.strerror or exc}"
    unified = next((m for m in mounts if m.fstype == "cgroup2"), None)
    controllers = None
    if unified is not None:
        with contextlib.suppress(OSError):
            controllers = _read(os.path.join(unified.path, "cgroup.controllers"))
    layout = choose(mounts, own, controllers)
    if layout is None:
        return None, "no cgroup hierarchy with the memory and cpu controllers"
    problem = layout_check(layout, probe_name)
    if problem:
        return None, f"{layout.version}: {problem}"
    return layout, ""


def layout_check(layout: Layout, probe_name: str) -> str:
    """ "" when job groups can be made where `layout` says, else why not."""
    try:
        if layout.version == V2:
            _prepare_v2(layout.bases[0][1], layout.root)
        for base in _distinct(path for _, path in layout.bases):
            probe = os.path.join(base, probe_name)
            with contextlib.suppress(FileExistsError):
                os.mkdir(probe)
            os.rmdir(probe)
    except OSError as exc:
        return f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")
    return ""


def _prepare_v2(base: str, root: str) -> None:
    """Let `base` hand memory and cpu to the job groups: it must hold no process, so the
    agent moves itself into its leaf (a job's owner, started later, is born there too)."""
    wanted = {"memory", "cpu"}
    if wanted <= set(_read(os.path.join(base, "cgroup.subtree_control")).split()):
        return
    missing = wanted - set(_read(os.path.join(base, "cgroup.controllers")).split())
    if missing:
        raise OSError(0, f"its group is not given {' and '.join(sorted(missing))}", base)
    if (
        os.path.normpath(base) != os.path.normpath(root)
        and _read(os.path.join(base, "cgroup.procs")).split()
    ):
        leaf = os.path.join(base, AGENT_LEAF)
        with contextlib.suppress(FileExistsError):
            os.mkdir(leaf)
        _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
    _write(os.path.join(base, "cgroup.subtree_control"), "+memory +cpu")


# --- one job's group -----------------------------------------------------------------------


def create(layout: Layout, name: str, memory_mb: int, cpus: int) -> JobGroup:
    """Make the group `name` for one job attempt, with its limits; OSError when the machine
    refuses (nothing is left behind then)."""
    dirs = tuple((role, os.path.join(base, name)) for role, base in layout.bases)
    group = JobGroup(layout.version, dirs)
    made: list[str] = []
    try:
        for path in _distinct(path for _, path in dirs):
            with contextlib.suppress(FileExistsError):
                os.mkdir(path)
            made.append(path)
        group.limit(memory_mb, cpus)
    except OSError:
        for path in made:
            with contextlib.suppress(OSError):
                os.rmdir(path)
        raise
    return group


class JobGroup:
    """One job attempt's group: its directory per role (see `Layout`)."""

    __slots__ = ("dirs", "version")

    def __init__(self, version: str, dirs: tuple[tuple[str, str], ...]) -> None:
        self.version, self.dirs = version, dirs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobGroup) and (self.version, self.dirs) == (
            other.version,
            other.dirs,
        )

    def __repr__(self) -> str:
        return f"JobGroup({self.version!r}, {self.dirs!r})"

    def to_spec(self) -> dict[str, Any]:
        return {"version": self.version, "dirs": dict(self.dirs)}

    @classmethod
    def from_spec(cls, spec: Any) -> JobGroup | None:
        """The group a job's spec names; None for none (or anything of another shape)."""
        if not isinstance(spec, dict) or spec.get("version") not in (V1, V2):
            return None
        dirs = spec.get("dirs")
        if not isinstance(dirs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and os.path.isabs(v) for k, v in dirs.items()
        ):
            return None
        return cls(spec["version"], tuple(dirs.items()))

    def dir(self, role: str) -> str | None:
        if self.version == V2:
            return dict(self.dirs).get("unified")
        return dict(self.dirs).get(role)

    def paths(self) -> list[str]:
        return _distinct(path for _, path in self.dirs)

    def limit(self, memory_mb: int, cpus: int) -> None:
        """Write the limits the job asked for (none for what it did not)."""
        memory, cpu = self.dir("memory"), self.dir("cpu")
        assert memory is not None and cpu is not None
        if memory_mb > 0:
            limit = str(memory_mb << 20)
            if self.version == V2:
                _write(os.path.join(memory, "memory.max"), limit)
                _write_if_there(os.path.join(memory, "memory.swap.max"), "0")
            else:
                _write(os.path.join(memory, "memory.limit_in_bytes"), limit)
                # Memory and swap together: the job may not swap its way past its limit.
                _write_if_there(os.path.join(memory, "memory.memsw.limit_in_bytes"), limit)
        if cpus > 0:
            quota = str(cpus * PERIOD_US)
            if self.version == V2:
                _write(os.path.join(cpu, "cpu.max"), f"{quota} {PERIOD_US}")
            else:
                _write(os.path.join(cpu, "cpu.cfs_period_us"), str(PERIOD_US))
                _write(os.path.join(cpu, "cpu.cfs_quota_us"), quota)

    def join(self, pid: int) -> None:
        """Put process `pid` (a whole thread group) into the group, in every hierarchy."""
        for path in self.procs_files():
            _write(path, str(pid))

    def procs_files(self) -> list[str]:
        """The files a process joins the group by writing its pid, one per hierarchy."""
        return [os.path.join(path, "cgroup.procs") for path in self.paths()]

    def oom_kills(self) -> int | None:
        """How many processes the kernel killed in the group for its memory limit so far;
        None when the kernel does not say (a v1 kernel from before 4.13)."""
        memory = self.dir("memory")
        name = "memory.events" if self.version == V2 else "memory.oom_control"
        if memory is None:
            return None
        try:
            return _field(_read(os.path.join(memory, name)), "oom_kill")
        except OSError:
            return None

    def cpu_secs(self) -> float | None:
        """CPU seconds (user and system) every process of the group used; None when unknown."""
        try:
            if self.version == V2:
                unified = self.dir("unified")
                assert unified is not None
                micros = _field(_read(os.path.join(unified, "cpu.stat")), "usage_usec")
                return None if micros is None else micros / 1e6
            account = self.dir("cpuacct")
            if account is None:
                return None
            return int(_read(os.path.join(account, "cpuacct.usage")).strip()) / 1e9
        except (OSError, ValueError):
            return None

    def peak_mb(self) -> float | None:
        """The most memory the group was charged at once (what its limit counts), in MiB;
        None when unknown (a v2 kernel from before 5.19 keeps no peak)."""
        memory = self.dir("memory")
        name = "memory.peak" if self.version == V2 else "memory.max_usage_in_bytes"
        if memory is None:
            return None
        try:
            return int(_read(os.path.join(memory, name)).strip()) / (1 << 20)
        except (OSError, ValueError):
            return None

    def pids(self) -> list[int]:
        """The processes in the group now."""
        found: set[int] = set()
        for path in self.paths():
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in _read(os.path.join(path, "cgroup.procs")).split())
        return sorted(found)

    def kill_all(self, seconds: float = KILL_SECS) -> bool:
        """SIGKILL every process in the group until none is left (also those that left the
        job's process group or session); whether it emptied within `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            left = self.pids()
            if not left:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def remove(self, seconds: float = REMOVE_SECS) -> bool:
        """Remove the group (it must be empty); whether it is gone. A group whose last
        processes are dead but not yet reaped (by init, once they were orphaned) is still
        busy: tried again for up to `seconds`."""
        deadline = time.monotonic() + seconds
        left = self.paths()
        while True:
            busy = []
            for path in left:
                try:
                    os.rmdir(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        return False
                    busy.append(path)
            if not busy:
                return True
            if time.monotonic() > deadline:
                return False
            left = busy
            time.sleep(0.02)


def leftovers(layout: Layout, prefix: str, keep: Iterable[str]) -> list[JobGroup]:
    """The groups named `prefix` + a name not in `keep` that `layout`'s bases hold: those of
    jobs whose folders are gone (an owner killed with SIGKILL could not remove its own)."""
    kept = set(keep)
    names: set[str] = set()
    for _, base in layout.bases:
        with contextlib.suppress(OSError):
            names.update(
                entry
                for entry in os.listdir(base)
                if entry.startswith(prefix) and entry[len(prefix) :] not in kept
            )
    return [
        JobGroup(
            layout.version, tuple((role, os.path.join(base, name)) for role, base in layout.bases)
        )
        for name in sorted(names)
    ]


def out_of_memory(before: int | None, after: int | None, exit_code: int) -> bool:
    """Whether a job ended for its memory: its group's OOM-kill count rose while it ran and it
    failed. (A `kill -9` from a person leaves the count alone: an ordinary exit. A job that
    recovered from a child's kill and exited 0 is done.)"""
    return exit_code != 0 and before is not None and after is not None and after > before


def usage(
    wall_secs: float,
    rusage_cpu_secs: float,
    rusage_max_rss_mb: float,
    group: JobGroup | None,
) -> dict[str, float]:
    """What a job used, as a final report carries it: from its group where there is one (every
    process the job started counts, not only those its owner waited for), else from the
    rusage of the processes the owner waited for."""
    cpu = group.cpu_secs() if group is not None else None
    peak = group.peak_mb() if group is not None else None
    return {
        "cpu_secs": round(rusage_cpu_secs if cpu is None else cpu, 3),
        "max_rss_mb": round(rusage_max_rss_mb if peak is None else peak, 1),
        "wall_secs": round(wall_secs, 3),
    }


# --- files ---------------------------------------------------------------------------------


def _field(text: str, name: str) -> int | None:
    """The number after `name` in a `key value` per line text (memory.events, cpu.stat)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == name and parts[1].isdigit():
            return int(parts[1])
    return None


def _distinct(paths: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(paths))


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _write_if_there(path: str, value: str) -> None:
    if os.path.exists(path):
        _write(path, value)
