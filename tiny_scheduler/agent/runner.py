"""One job on the node, as the agent sees it: its folder, its owner process, its output.

Each job gets a folder of its own under `WORK_DIR/jobs/` (`job-7.0.xxxx`: job, attempt, a
random part). `Runner.start()` prepares the job there (fetches and unpacks a deploy zip when
it has one), writes what to run into `spec.json`, and hands the job to its **owner** (the
node's spawner, `spawner.py`, or else a single owner, `owner.py`), a process of its own
session that starts the job, stops it when told (or at its timeout, or at the fence), and
writes its result; so the job outlives the agent.
`Runner.adopt()` takes back a job a previous run of the agent started: its owner may still
run it, or have left its result. `wait()` returns the outcome once the owner is done: the exit
code, why the job ended, its resource usage, and the tails of its output.

What the job was given goes into `spec.json` too, so that a restarted agent holds it again:
its grant (CPUs, memory, GPU indexes: `resources`) and its control group (`cgroups`), made
here before the owner starts, with the job's limits, and left for the owner to join, read and
remove.

The output goes from the job straight to files in its folder; the agent reads them from
offsets (`OutputFile`): what is new for live sending, the last `max_output_bytes` of each for
the final report. So a job printing gigabytes costs the agent no more memory than one printing
a line, and a restarted agent goes on sending live output where its previous run stopped
(`sent` remembers how far that was).

A `service` job's output goes to the same files; its report carries none, as `peers.md` says.
The folder stays until the job's final report is settled (`remove_folder()`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Any

import requests

from ..domain.jobs import cap_tail, parse_job_id
from . import cgroups, owner
from .groups import Groups, signal_groups
from .protocol import PolledJob
from .resources import Grant, Need, grant_from_spec, grant_to_spec, job_environment
from .spawner import OWNER_LOG
from .spawning import Spawned, Spawner

DOWNLOAD_TIMEOUT = (5.0, 60.0)
"""(connect, read) seconds for fetching a `deploy_url` zip."""

KEY_VARIABLE = "TINYAWS_API_KEY"

SENT = "sent"
"""File in a job's folder: how many bytes of stdout and stderr were sent live."""

OWNER_DIED = (
    "\n[tiny-scheduler agent: the job's owner process died; "
    "the job was stopped and its exit status is unknown]\n"
)
NEVER_STARTED = "\n[tiny-scheduler agent: the agent stopped before the job started]\n"
OWNER_GAVE_UP = (
    "\n[tiny-scheduler agent: the job's owner could not start or end it (its log says why); "
    "the job was stopped]\n"
)


class PrepareError(Exception):
    """The job could not be started; the message is its stderr (`download error: …`)."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    why: str = "exit"  # exit, timeout (its own), out_of_memory, stopped (asked to), fenced
    usage: dict[str, float] | None = None
    kept: bool = False
    """Whether the job's folder keeps this outcome on disk (its owner's result, fsynced, and
    its output), so that the agent's next run reports it from there after a crash; else it
    is the agent's own (the job never started, or its owner died): only the spool keeps it."""


RESULT_LOOK_SECS = 0.25
"""How often the agent looks for the result of a job it does not hear about (one a previous
run of the agent started, or whose owner is another process's)."""

NO_USAGE = {"cpu_secs": 0.0, "max_rss_mb": 0.0, "wall_secs": 0.0}
"""The usage of a job that never started (its zip did not download, say)."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the node gives every job: where job groups go (None: enforcement `none`), the
    prefix of their names (the agent's), how many GPUs the node has, and the node's fence
    file (`owner.write_node_fence`; None: each job's folder has a fence of its own)."""

    layout: cgroups.Layout | None = None
    group_prefix: str = "tiny-scheduler."
    node_gpus: int = 0
    fence_file: str | None = None


class OutputFile:
    """One output stream of a job, in its file: what is new since the last send, and the
    tail the final report carries."""

    def __init__(self, path: str, limit: int, sent: int = 0) -> None:
        self.path = path
        self.limit = limit
        self.sent = sent

    def size(self) -> int:
        try:
            return os.path.getsize(self.path)
        except OSError:
            return 0

    def unsent(self) -> bytes:
        """What came since the last send, up to the last whole UTF-8 character; at most
        `limit` bytes (the newest: what a reader of the live output would keep)."""
        size = self.size()
        if size <= self.sent:
            return b""
        start = max(self.sent, size - self.limit)
        data = self._read(start, size - start)
        if start > self.sent:
            self.sent = start  # skipped: more than the scheduler keeps came meanwhile
        return data[: _whole_characters(data)]

    def text(self) -> str:
        """Everything kept: the whole output, or its tail behind the scheduler's own marker
        saying how many bytes were dropped."""
        size = self.size()
        start = max(0, size - self.limit)
        kept = self._read(start, size - start)
        if size <= self.limit:
            return kept.decode("utf-8", "replace")
        return cap_tail(kept, size, self.limit)

    def _read(self, start: int, length: int) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(start)
                return f.read(length)
        except OSError:
            return b""


class Runner:
    """One job's folder and owner. Not reusable: start() (or adopt()) once, wait() once."""

    def __init__(
        self,
        job: PolledJob,
        attempt: int | None,
        node_id: str,
        folder: str,
        groups: Groups,
        max_output_bytes: int,
        grant: Grant | None = None,
    ) -> None:
        self.job = job
        self.attempt = attempt
        self.node_id = node_id
        self.folder = folder
        self.is_service = job.job_type == "service"
        self.grant = grant or Grant(Need.of(job.cpus, job.memory_mb, job.gpus, self.is_service))
        self.group: cgroups.JobGroup | None = None  # made by start(), or read by adopt()
        self._groups = groups
        sent = _read_sent(folder)
        self.stdout = OutputFile(os.path.join(folder, owner.STDOUT), max_output_bytes, sent[0])
        self.stderr = OutputFile(os.path.join(folder, owner.STDERR), max_output_bytes, sent[1])
        self._proc: subprocess.Popen[bytes] | None = None  # the owner, when we started it
        self._spawned: Spawned | None = None  # the job, when the spawner owns it
        self.node_fenced = False  # its owner reads the node's fence, which the agent moves
        self.live_output = not self.is_service  # false once the scheduler refused it
        # Its output goes live once it has run a while: a short job's goes with its report.
        self.created = time.monotonic()

    @classmethod
    def new(
        cls,
        job: PolledJob,
        attempt: int | None,
        node_id: str,
        work_dir: str,
        groups: Groups,
        max_output_bytes: int,
        grant: Grant,
    ) -> Runner:
        jobs_dir = os.path.join(work_dir, "jobs")
        os.makedirs(jobs_dir, exist_ok=True)
        label = f"{job.job_id}.{attempt if attempt is not None else 'x'}."
        folder = tempfile.mkdtemp(prefix=label, dir=jobs_dir)
        return cls(job, attempt, node_id, folder, groups, max_output_bytes, grant)

    @classmethod
    def adopt(
        cls, folder: str, node_id: str, groups: Groups, max_output_bytes: int
    ) -> Runner | None:
        """The job a previous run of the agent started in `folder`, or None when the folder
        holds no job (its spec was never written)."""
        spec = read_spec(folder)
        if spec is None:
            return None
        asked = spec.get("request") if isinstance(spec.get("request"), dict) else {}
        job = PolledJob(
            job_id=spec["job_id"],
            command="",
            job_type=spec.get("job_type"),
            port=spec.get("port"),
            **{name: _count(asked.get(name)) for name in ("cpus", "memory_mb", "gpus")},
        )
        grant = grant_from_spec(spec.get("grant"), job.job_type == "service")
        runner = cls(job, spec.get("attempt"), node_id, folder, groups, max_output_bytes, grant)
        runner.group = cgroups.JobGroup.from_spec(spec.get("cgroup"))
        runner.node_fenced = isinstance(spec.get("node_fence"), str)
        return runner

    @property
    def job_id(self) -> str:
        return self.job.job_id

    def start(
        self,
        timeout_secs: float,
        kill_grace_secs: float,
        fence: float | None,
        limits: Limits | None = None,
        spawner: Spawner | None = None,
    ) -> None:
        """Prepare the job (and its control group, where `limits` has a layout) and start its
        owner (`spawner` when it answers, else a single owner of its own); raises
        PrepareError when it cannot start. `fence`: the deadline (monotonic) its owner stops
        it at unless the agent moves it (without a node fence file in `limits`)."""
        limits = limits or Limits()
        argv, cwd = self._prepare(os.path.join(self.folder, "work"))
        env = {**os.environ, "TINY_NODE_ID": self.node_id, "TINY_JOB_ID": self.job_id}
        # The agent's key is the node's credential, not the job's: a job that needs one says
        # so in its env_vars.
        env.pop(KEY_VARIABLE, None)
        env.update(self.job.env_vars or {})
        # After the job's own: what it was given is the node's to say.
        job = self.job
        env.update(job_environment(job.cpus, job.memory_mb, self.grant, limits.node_gpus))
        if limits.layout is not None:
            name = limits.group_prefix + os.path.basename(self.folder)
            try:
                self.group = cgroups.create(limits.layout, name, job.memory_mb, job.cpus)
            except OSError as exc:
                raise PrepareError(f"cannot make the job's cgroup: {exc}") from None
        try:
            self._start_owner(
                argv, cwd, env, timeout_secs, kill_grace_secs, fence, limits.fence_file, spawner
            )
        except BaseException:
            if self.group is not None:
                self.group.remove()  # nothing of the job ran in it
            raise

    def _start_owner(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        timeout_secs: float,
        kill_grace_secs: float,
        fence: float | None,
        node_fence: str | None,
        spawner: Spawner | None,
    ) -> None:
        job = self.job
        spec = {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "job_type": self.job.job_type,
            "port": self.job.port,
            "argv": argv,
            "cwd": cwd,
            "env": env,
            "timeout_secs": 0 if self.is_service else timeout_secs,
            "kill_grace_secs": kill_grace_secs,
            "request": {"cpus": job.cpus, "memory_mb": job.memory_mb, "gpus": job.gpus},
            "grant": grant_to_spec(self.grant),
            "cgroup": self.group.to_spec() if self.group is not None else None,
            "node_fence": node_fence,
        }
        self.node_fenced = node_fence is not None
        if fence is not None:
            self.renew_fence(fence)
        # Not fsynced (two fsyncs, ~16 ms, on every job's path to its start): the spec is
        # what a restarted agent adopts a live job by, and after a crash of the machine no
        # job runs; a folder whose spec did not survive holds no job (`read_spec`), is
        # removed, and the scheduler fails the job as lost by its agent, as it would a job
        # whose owner died with the machine.
        owner.write_atomically(self.folder, owner.SPEC, json.dumps(spec).encode(), durable=False)
        self._spawned = spawner.spawn(self.folder) if spawner is not None else None
        if self._spawned is not None:
            return
        try:
            with open(os.path.join(self.folder, OWNER_LOG), "ab") as log:
                self._proc = subprocess.Popen(
                    # -I -S: the standard library only, nothing from the environment.
                    [sys.executable, "-I", "-S", owner.__file__, self.folder],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    # A session of its own: a signal to the agent's group (Ctrl-C, systemd's
                    # stop of the agent) does not reach it.
                    start_new_session=True,
                )
        except OSError:
            # No owner: the job did not start, and will not, once the agent holds the folder
            # (a spawner that answers late then starts nothing). When a late spawner claimed
            # it first, the job runs: wait() follows it.
            if owner.claim(self.folder):
                raise
            return
        self._groups.add(self._proc.pid, self.job_id)

    def _prepare(self, scratch: str) -> tuple[list[str], str]:
        """What to execute and where: (argv, cwd). Fetches and unpacks a deploy zip first."""
        os.makedirs(scratch, exist_ok=True)
        if not self.job.deploy_url:
            return ["sh", "-c", self.job.command], scratch
        try:
            reply = requests.get(self.job.deploy_url, timeout=DOWNLOAD_TIMEOUT)
            reply.raise_for_status()
        except requests.RequestException as exc:
            raise PrepareError(f"download error: {exc}") from None
        app_dir = os.path.join(scratch, "app")
        try:
            with zipfile.ZipFile(io.BytesIO(reply.content)) as archive:
                archive.extractall(app_dir)
        except (zipfile.BadZipFile, OSError) as exc:
            raise PrepareError(f"extract failed: {exc}") from None
        if self.job.command:
            return ["sh", "-c", self.job.command], app_dir
        return ["sh", "start.sh"], app_dir

    def wait(self) -> Outcome:
        """Wait for the owner to be done; the job's outcome from its result and output."""
        if self._proc is not None:
            self._proc.wait()
            self._groups.remove(self._proc.pid)
        gave_up = False
        if self._spawned is not None:
            done, self._spawned = self._spawned.done, None
            try:
                _wait_readable(done, None)  # closed: the result is written
                gave_up = os.read(done, 1) == owner.GAVE_UP
            finally:
                os.close(done)
        # Also after our own owner ended: it may have found the job claimed by the spawner,
        # answering too late (`owner.claim`), which is the one that runs it.
        result = read_result(self.folder) if gave_up else self._wait_for_result()
        kept = result is not None
        if result is None:
            result = self._owner_died(OWNER_GAVE_UP if gave_up else None)
        code, why = result.get("exit_code", -1), result.get("why", "exit")
        usage = result.get("usage") if isinstance(result.get("usage"), dict) else NO_USAGE
        if self.is_service:
            return Outcome(code, why=why, usage=usage, kept=kept)
        stderr = self.stderr.text() + (result.get("note") or "")
        return Outcome(code, self.stdout.text(), stderr, why, usage, kept)

    def _wait_for_result(self) -> dict[str, Any] | None:
        """The job's result, once its owner (as `owner.pid` records it: a single owner, or a
        spawner that owns other jobs too) wrote it; None when the owner ended without one,
        or when the folder never had one: then the agent has claimed the folder itself, so
        that no owner answering late starts the job it is about to report as never started."""
        while True:
            result = read_result(self.folder)
            if result is not None:
                return result
            record = owner.read_pid(self.folder, owner.OWNER_PID)
            if record is None:
                if owner.claim(self.folder):
                    return None
                continue  # an owner claimed it just now: wait for that one
            if not owner.alive(record):
                return read_result(self.folder)  # written just before it ended, or never
            try:
                handle = os.pidfd_open(record[0])
            except ProcessLookupError:
                continue  # gone meanwhile: the next look says whether it left a result
            except OSError:
                time.sleep(RESULT_LOOK_SECS)  # no descriptor to wait with (EMFILE): look later
                continue
            try:
                # The start time is checked again: the pid may have been reused between the
                # look and the pidfd_open. A spawner ends only with its last job: look again
                # in a while.
                if owner.start_time(record[0]) == record[1]:
                    _wait_readable(handle, RESULT_LOOK_SECS)
            finally:
                os.close(handle)

    def _owner_died(self, note: str | None = None) -> dict[str, Any]:
        """The result of a job whose owner died before it wrote one (or never started, or
        gave up: `note`): whatever of the job still runs has nobody to report it, and ends
        here; what it used is what its control group counted (no rusage is left)."""
        job = owner.read_pid(self.folder, owner.JOB_PID)
        if owner.alive(job):
            assert job is not None
            signal_groups([job[0]], signal.SIGKILL)
        wall = 0.0
        if job is not None:
            with contextlib.suppress(OSError):  # job.pid is written as the job starts
                wall = max(
                    0.0, time.time() - os.path.getmtime(os.path.join(self.folder, owner.JOB_PID))
                )
        if self.group is not None:
            self.group.kill_all()
        usage = cgroups.usage(wall, 0.0, 0.0, self.group)
        if self.group is not None:
            self.group.remove()
        return {
            "exit_code": -1,
            "why": "exit",
            "note": note or (OWNER_DIED if job is not None else NEVER_STARTED),
            "usage": usage,
        }

    @property
    def ended(self) -> bool:
        return read_result(self.folder) is not None

    def stop(self, note: str = "") -> None:
        """Have the owner stop the job (SIGTERM to its group, SIGKILL after the grace); `note`
        is added to the job's stderr. Returns at once. A job still being prepared (its zip
        downloading) is stopped once its owner starts."""
        with contextlib.suppress(OSError):
            owner.write_atomically(self.folder, owner.STOP, note.encode())
        record = owner.read_pid(self.folder, owner.OWNER_PID)
        if owner.alive(record):
            assert record is not None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(record[0], signal.SIGTERM)

    def renew_fence(self, deadline: float) -> None:
        """Move the job's own fence on (a job whose owner reads the node's fence, which the
        agent moves for all, has none): the owner stops the job once the monotonic clock
        passes `deadline`. Not fsynced: after a crash of the machine nothing of the job runs."""
        if self.node_fenced:
            return
        path = os.path.join(self.folder, owner.FENCE)
        with contextlib.suppress(OSError):
            with open(path + ".tmp", "w") as f:
                f.write(repr(deadline))
            os.replace(path + ".tmp", path)

    def save_sent(self) -> None:
        """Remember how far the live output was sent (for a restarted agent)."""
        with contextlib.suppress(OSError):
            path = os.path.join(self.folder, SENT)
            with open(path + ".tmp", "w") as f:
                f.write(f"{self.stdout.sent} {self.stderr.sent}")
            os.replace(path + ".tmp", path)


def remove_folder(folder: str) -> None:
    """Remove a job's folder once its report is settled, and its control group when the
    owner could not (a process of the job was slow to die)."""
    spec = _read_json(os.path.join(folder, owner.SPEC))
    group = cgroups.JobGroup.from_spec(spec.get("cgroup")) if spec else None
    if group is not None and group.kill_all(seconds=1.0):
        group.remove()
    shutil.rmtree(folder, ignore_errors=True)


def read_spec(folder: str) -> dict[str, Any] | None:
    """The job a folder was made for, or None when its spec is missing or not of the shape
    the agent writes (a job id `job-N`, an attempt number or none): such a folder holds no
    job, and its contents must never reach a heartbeat, which the scheduler would refuse.
    A spec lost to a crash of the machine (it is not fsynced) is made good by the job's
    result, which is, and repeats who the job was (`owner.IDENTITY`)."""
    spec = _job_record(_read_json(os.path.join(folder, owner.SPEC)))
    return spec if spec is not None else _job_record(read_result(folder))


def _job_record(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    if spec is None or not isinstance(spec.get("job_id"), str):
        return None
    attempt = spec.get("attempt")
    if parse_job_id(spec["job_id"]) is None or not (
        attempt is None or (isinstance(attempt, int) and not isinstance(attempt, bool))
    ):
        return None
    return spec


def read_result(folder: str) -> dict[str, Any] | None:
    return _read_json(os.path.join(folder, owner.RESULT))


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _read_sent(folder: str) -> tuple[int, int]:
    try:
        with open(os.path.join(folder, SENT)) as f:
            out, err = f.read().split()
        return int(out), int(err)
    except (OSError, ValueError):
        return 0, 0


def _wait_readable(fd: int, seconds: float | None) -> None:
    """Until `fd` reads ready (or `seconds` have passed). poll, not select: an agent with many
    jobs holds descriptors numbered above select's 1024."""
    waiter = select.poll()
    waiter.register(fd, select.POLLIN)
    waiter.poll(None if seconds is None else seconds * 1000)


def _whole_characters(data: bytes) -> int:
    """The length of `data` without a UTF-8 sequence left incomplete at its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: the sequence started further back
        needed = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
        return len(data) if back >= needed else len(data) - back
    return len(data)
