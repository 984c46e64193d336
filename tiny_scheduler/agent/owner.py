"""The owner of a running job: a process apart from the agent, which outlives it.

`OwnedJob` is what owning one job means; two kinds of process do it. The agent's spawner
(`spawner.py`) owns every job it starts; when the spawner does not answer, the agent starts a
single owner for the job (`python -I -S owner.py JOB_DIR`: no site, no package, the standard
library only; `run()`). Either way the agent forgets nothing if it dies: the owner, not the
agent, is the job's parent. It

- starts the job (`sh -c …`, as `spec.json` in JOB_DIR says) in a session and process group of
  its own, its stdout and stderr going straight to the files `stdout` and `stderr` in JOB_DIR
  (so its output outlives the agent and the owner too), and in the job's control group when
  the spec names one (`cgroups.py`: joined by a shell that then becomes the job, so the
  job's first instruction already runs within its limits);
- stops the job's whole group (SIGTERM, SIGKILL after the grace) when the agent asks (the
  reason in the folder's `stop` file; a SIGTERM to the owner makes it look at once), when
  its `timeout_secs` have passed since it started, or when the **fence** has passed: the
  node's fence file (`write_node_fence`; a job from an agent before it: the folder's own
  `fence`) holds a deadline on the machine's monotonic clock that the agent moves on after
  every heartbeat the leader answers; a node cut off from the scheduler, or whose agent is
  dead or frozen, stops its own jobs by then;
- collects the exit status and the resource usage (`wait4`, or the control group's own
  accounting, which counts every process the job started), kills what the job left in its
  process group and its control group, tells an out-of-memory end (the group's OOM-kill count
  rose) from an ordinary one, removes the control group, and writes `result.json`
  (atomically, fsynced, after the output files it points to, repeating who the job was), the
  job's final result, which stays until the agent has had the scheduler acknowledge it.

`owner.pid` is created once (`claim`): a second owner started for the same folder ends unused
(it names the spawner when the spawner owns the job).
`owner.pid` and `job.pid` hold "pid start-time" (the start time from /proc, in clock ticks since
boot): a pid is only ever signalled after its start time was checked, so a pid the system has
since given to another process is never mistaken for the job's.

Only the job's `sh -c` carries its command line: this process's argv names the folder alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time

TYPE_CHECKING = False  # typing itself is not imported: a single owner keeps to a few MiB
if TYPE_CHECKING:
    from collections.abc import Callable

if __package__:
    from . import cgroups
else:  # run as a script (`python -I -S owner.py`): its one module is the file beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cgroups  # type: ignore[no-redef]

SPEC, RESULT, STOP, FENCE = "spec.json", "result.json", "stop", "fence"
OWNER_PID, JOB_PID = "owner.pid", "job.pid"
STDOUT, STDERR = "stdout", "stderr"

GAVE_UP = b"!"
"""Written into a job's done pipe by a spawner that claimed the job and can give no result
(it could not start it, or not write its result): the agent ends the job then, rather than
wait for a result from an owner that is alive and will never write one."""

IDENTITY = ("job_id", "attempt", "job_type", "port")
"""The spec's fields a result repeats: a folder whose spec did not survive a crash of the
machine (it is not fsynced) is still known by its result, which is."""

LOOK_SECS = 0.25
"""How often the owner looks at its stop order, the timeout and the fence while the job runs."""

_stop_asked = False


def start_time(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks since boot), or None when there is none."""
    fields = _stat(pid)
    return int(fields[19]) if len(fields) > 19 else None


def _stat(pid: int) -> list[bytes]:
    """The fields of /proc/PID/stat after the command name (the state first), or []."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return []
    # The command name (field 2) may hold spaces and parentheses: count from its last ')'.
    return stat.rsplit(b")", 1)[-1].split()


def read_pid(folder: str, name: str) -> tuple[int, int] | None:
    """(pid, start time) as recorded in `name`, or None when not (yet) recorded."""
    try:
        with open(os.path.join(folder, name)) as f:
            pid, started = f.read().split()
        return int(pid), int(started)
    except (OSError, ValueError):
        return None


def alive(record: tuple[int, int] | None) -> bool:
    """Whether the recorded process still runs: the same pid with the same start time, and
    not a zombie (one that ended, not yet reaped by its parent)."""
    if record is None:
        return False
    fields = _stat(record[0])
    return len(fields) > 19 and fields[0] != b"Z" and int(fields[19]) == record[1]


def write_atomically(folder: str, name: str, data: bytes, durable: bool = True) -> None:
    """Write a file whole or not at all, durable once this returns (with `durable`: two
    fsyncs, ~8 ms each on these disks; without, it survives a crash of the agent or the
    owner, not of the machine)."""
    path = os.path.join(folder, name)
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    if not durable:
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_result(
    folder: str,
    spec: dict,
    exit_code: int,
    note: str,
    why: str = "exit",
    usage: dict[str, float] | None = None,
) -> None:
    """Write the job's result (`usage`: none to speak of, for a job that did not run or not
    for long), saying who the job was (`IDENTITY`, from its `spec`). The result is the job's
    outcome on this node until a scheduler has it: what it printed is made as durable first."""
    result = {"exit_code": exit_code, "why": why, "note": note}
    result["usage"] = usage if usage is not None else cgroups.usage(0.0, 0.0, 0.0, None)
    result.update({name: spec.get(name) for name in IDENTITY})
    for name in (STDOUT, STDERR):
        _sync_if_written(os.path.join(folder, name))
    write_atomically(folder, RESULT, json.dumps(result).encode())


def raise_open_files(needed: int) -> None:
    """Raise this process's soft limit of open files (towards its hard one) when `needed`
    descriptors would not fit: an owner of many jobs, and the agent that waits on them, hold
    descriptors per job. Only then: what a process starts inherits its limit, and programs
    that use select() want the usual 1024."""
    import resource  # here: a single owner never needs it

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    target = hard if hard == resource.RLIM_INFINITY else min(hard, 2 * needed)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))


def _sync_if_written(path: str) -> None:
    """fsync a job's output file unless it is empty (most short jobs print nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        if os.fstat(fd).st_size:
            os.fsync(fd)
    finally:
        os.close(fd)


def _record(folder: str, name: str, pid: int) -> None:
    # Not fsynced: a record names a live process, and after a crash of the machine none is.
    path = os.path.join(folder, name)
    with open(f"{path}.tmp", "w") as f:
        f.write(f"{pid} {start_time(pid)}\n")
    os.replace(f"{path}.tmp", path)


def claimed_by_me(folder: str) -> bool:
    """Whether this process is the one `owner.pid` in `folder` names."""
    record = read_pid(folder, OWNER_PID)
    return record is not None and record[0] == os.getpid()


def claim(folder: str) -> bool:
    """Record this process in `owner.pid` as the job's owner, unless a process already is
    (or was): a job is started by one owner only, even when the agent, not hearing from its
    spawner in time, started one of its own for a job the spawner then forked one for too."""
    path = os.path.join(folder, OWNER_PID)
    temporary = f"{path}.{os.getpid()}"
    with open(temporary, "w") as f:
        f.write(f"{os.getpid()} {start_time(os.getpid())}\n")
    try:
        os.link(temporary, path)  # fails where the name exists: whole, and only once
    except FileExistsError:
        return False
    finally:
        os.unlink(temporary)
    return True


def _read_text(folder: str, name: str) -> str | None:
    try:
        with open(os.path.join(folder, name)) as f:
            return f.read()
    except OSError:
        return None


def write_node_fence(path: str, deadline: float | None) -> None:
    """Set the node's fence (the file at `path`, in the agent's work directory) to `deadline`
    on the monotonic clock; None: the node has no fence. The deadline is the file's
    modification time: changing it is one atomic update of an inode the file keeps, where a
    file written anew after every heartbeat would make (and delete) an inode each time."""
    if deadline is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    stamp = int(deadline * 1e9)
    try:
        os.utime(path, ns=(stamp, stamp))
    except FileNotFoundError:
        # Made whole under another name, its time set, then put in place: a fence file is
        # never seen with the wall clock's time (on the monotonic clock, far ahead).
        temporary = f"{path}.{os.getpid()}"
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        os.utime(temporary, ns=(stamp, stamp))
        os.replace(temporary, path)


def read_node_fence(path: str) -> float | None:
    """The node's fence deadline (monotonic), or None when the node has none."""
    try:
        return os.stat(path).st_mtime_ns / 1e9
    except OSError:
        return None


def _folder_fence_passed(folder: str, now: float) -> bool:
    """A job folder's own fence (from an agent before the node-wide one): its text."""
    text = _read_text(folder, FENCE)
    try:
        return text is not None and now > float(text)
    except ValueError:
        return False  # being rewritten, or never meant as one: the next look decides


def _on_stop(signum: int, frame: object) -> None:
    global _stop_asked
    _stop_asked = True


# What Python ignores (SIGPIPE, SIGXFSZ) and what the owner ignores or catches would be
# inherited by the job: it gets the defaults, as from a shell.
JOB_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGHUP, signal.SIGTERM)


def _spawn(spec: dict, folder: str, group: cgroups.JobGroup | None) -> int | None:
    """Start the job in a session of its own (and in its control group, when it has one),
    its output going to the files; None when it could not start (said in its stderr)."""
    out = os.open(os.path.join(folder, STDOUT), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    err = os.open(os.path.join(folder, STDERR), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    argv = spec["argv"] if group is None else _joining(group, spec["argv"])
    try:
        # posix_spawn (a vfork, not a copy of this process's memory: about 2 ms less CPU per
        # job than a fork). It cannot change the child's directory, so the owner moves there
        # first: everything it opens afterwards is named by absolute path.
        os.chdir(spec["cwd"])
        return os.posix_spawn(
            _executable(argv[0], spec["env"]),
            argv,
            spec["env"],
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out, 1),
                (os.POSIX_SPAWN_DUP2, err, 2),
            ],
            setsid=True,
            setsigdef=JOB_DEFAULT_SIGNALS,
        )
    except OSError as exc:
        os.write(err, f"cannot start the job: {exc}\n".encode())
        return None
    finally:
        os.close(out)
        os.close(err)


JOIN_THEN_EXEC = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do '
    'echo $$ > "$1" || { echo "cannot start the job: cannot join its cgroup $1" >&2; exit 127; }; '
    'shift; n=$((n - 1)); done; exec "$@"'
)
"""A shell that puts itself into the job's control group (its pid into each hierarchy's
`cgroup.procs`) and then becomes the job (`exec`), as cgexec does: the job's first
instruction runs within its limits, and the owner needs no fork of its own (a copy of a
Python process, where posix_spawn copies nothing)."""


def _joining(group: cgroups.JobGroup, argv: list[str]) -> list[str]:
    files = group.procs_files()
    return ["/bin/sh", "-c", JOIN_THEN_EXEC, "tiny-scheduler-join", str(len(files)), *files, *argv]


def _executable(name: str, env: dict[str, str]) -> str:
    """`name` looked up in the job's PATH, as exec*p does with the job's environment
    (posix_spawnp would look in the owner's)."""
    if "/" in name:
        return name
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(directory or ".", name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    raise FileNotFoundError(2, "No such file or directory", name)


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class OwnedJob:
    """One job this process owns: started from its folder's spec (`start`), looked after
    while it runs (`look`: its stop order, its timeout, the fence), its result written once
    it ended (`finish`). The single-job owner (`run`) and the spawner, which owns every job
    it starts, both drive it."""

    def __init__(
        self,
        folder: str,
        spec: dict,
        group: cgroups.JobGroup | None,
        pid: int,
        started: float,
        oom_before: int | None,
    ) -> None:
        self.folder = folder
        self.group = group
        self.pid = pid
        self.started = started
        self.oom_before = oom_before
        self.spec = spec
        self.timeout = spec.get("timeout_secs") or 0
        self.node_fence: str | None = spec.get("node_fence")  # else the folder's own
        self.grace = float(spec.get("kill_grace_secs", 10))
        self.waiter = os.pidfd_open(pid)
        """Readable once the job has ended."""
        self.why, self.note = "exit", ""
        self.kill_at: float | None = None
        self.killed = False

    @classmethod
    def start(cls, folder: str) -> OwnedJob | None:
        """Claim `folder` and start its job; None when the folder has its owner already, or
        when the job could not start (its result, written here, says so: exit 127)."""
        if not claim(folder):
            return None  # the job has its owner: this one ends unused
        with open(os.path.join(folder, SPEC)) as f:
            spec = json.load(f)
        group = cgroups.JobGroup.from_spec(spec.get("cgroup"))
        oom_before = group.oom_kills() if group is not None else None
        started = time.monotonic()
        pid = _spawn(spec, folder, group)
        if pid is None:  # nothing ran: the code a shell gives a command it cannot run
            _write_result(folder, spec, 127, "")
            return None
        try:
            _record(folder, JOB_PID, pid)
            return cls(folder, spec, group, pid, started, oom_before)
        except OSError as exc:
            # A job nobody could look after (no descriptor left to wait on it, say) must not
            # run on unseen: it ends here, and its result says why.
            _kill_group(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            note = f"\n[tiny-scheduler agent: cannot look after the job: {exc}]\n"
            _write_result(folder, spec, -1, note)
            return None

    def look(
        self,
        now: float,
        stop_asked: bool = False,
        node_fence: Callable[[str], float | None] = read_node_fence,
    ) -> None:
        """Stop the job when it is asked to (`stop_asked`, or a `stop` file), when its
        timeout or the fence has passed (the node's, as `node_fence` reads it); SIGKILL it
        once the grace after that is over."""
        if self.kill_at is None:
            folder = self.folder
            if stop_asked or os.path.exists(os.path.join(folder, STOP)):
                self.why, self.note = "stopped", _read_text(folder, STOP) or ""
            elif self.timeout and now - self.started >= self.timeout:
                self.why, self.note = "timeout", ""
            elif self._fence_passed(now, node_fence):
                self.why = "fenced"
                self.note = (
                    "\n[tiny-scheduler agent: stopped: no word from the scheduler in time]\n"
                )
            if self.why != "exit":
                _kill_group(self.pid, signal.SIGTERM)
                self.kill_at = now + self.grace
        elif not self.killed and now >= self.kill_at:
            _kill_group(self.pid, signal.SIGKILL)
            self.killed = True

    def _fence_passed(self, now: float, node_fence: Callable[[str], float | None]) -> bool:
        if self.node_fence is None:
            return _folder_fence_passed(self.folder, now)
        deadline = node_fence(self.node_fence)
        return deadline is not None and now > deadline

    def finish(self) -> None:
        """Once the job has ended (`waiter` readable): collect it, end what it left behind,
        and write its result."""
        os.close(self.waiter)
        _, status, rusage = os.wait4(self.pid, 0)
        wall = time.monotonic() - self.started
        _kill_group(self.pid, signal.SIGKILL)  # what the job left behind in its group ends with it
        code = os.waitstatus_to_exitcode(status)
        exit_code = 128 - code if code < 0 else code  # killed by signal N: 128 + N
        group, why = self.group, self.why
        if group is not None:
            # Also what left the job's process group (a daemon it started): the group holds it.
            group.kill_all()
            if why == "exit" and cgroups.out_of_memory(
                self.oom_before, group.oom_kills(), exit_code
            ):
                why = "out_of_memory"
        usage = cgroups.usage(
            wall, rusage.ru_utime + rusage.ru_stime, rusage.ru_maxrss / 1024, group
        )
        if group is not None:
            group.remove()  # when it cannot be yet, the agent tries again with the job's folder
        _write_result(self.folder, self.spec, exit_code, self.note, why, usage)


def run(folder: str) -> int:
    """Own the one job in `folder`, as a process of its own, until its result is written."""
    folder = os.path.abspath(folder)  # the owner moves to the job's directory to start it
    signal.signal(signal.SIGTERM, _on_stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    job = OwnedJob.start(folder)
    if job is None:
        return 0
    ended = select.poll()
    ended.register(job.waiter, select.POLLIN)
    while not ended.poll(LOOK_SECS * 1000):
        job.look(time.monotonic(), _stop_asked)
    job.finish()
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
