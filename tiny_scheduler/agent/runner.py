"""One job on the node: its process group, its output tails, and stopping it.

`Runner.start()` prepares the job (fetches and unpacks a deploy zip when it has one) and
starts `sh -c <command>` (or the zip's `start.sh`) in a scratch directory of its own, in a new
process group, with the job's `env_vars` added to the agent's environment. A `run` job's
stdout and stderr are read as they come into `Tail`s that keep at most `max_output_bytes` of
each, so a job printing gigabytes costs the agent no more memory than one printing a line; a
`service` job's output goes to a file in its scratch directory (its report carries none, as
`peers.md` says). `wait()` returns the exit code and the output once the job's shell has
ended; whatever the shell left running in its group is killed then, so that no stray process
outlives the job it belonged to. `stop()` ends the job from outside: SIGTERM to the whole
group, SIGKILL after a grace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import zipfile
from typing import IO

import requests

from ..dev.agent_protocol import PolledJob
from ..jobs import cap_tail
from .groups import Groups, group_alive, signal_groups

DOWNLOAD_TIMEOUT = (5.0, 60.0)
"""(connect, read) seconds for fetching a `deploy_url` zip."""

KEY_VARIABLE = "TINYAWS_API_KEY"

READ_CHUNK = 64 * 1024

READER_JOIN_SECS = 5.0
"""Seconds to wait for a job's output to end after its group was killed."""


class PrepareError(Exception):
    """The job could not be started; the message is its stderr (`download error: …`)."""


class Tail:
    """The last `limit` bytes of a stream, with how many came in all, plus what was not yet
    taken for live sending (bounded the same way)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._kept = bytearray()
        self._unsent = bytearray()
        self._total = 0

    def add(self, chunk: bytes) -> None:
        with self._lock:
            self._total += len(chunk)
            for buffer in (self._kept, self._unsent):
                buffer += chunk
                if len(buffer) > self.limit:
                    del buffer[: len(buffer) - self.limit]

    def text(self) -> str:
        """Everything kept: the whole output, or its tail behind the scheduler's own marker
        saying how many bytes were dropped."""
        with self._lock:
            kept, total = bytes(self._kept), self._total
        if total <= self.limit:
            return kept.decode("utf-8", "replace")
        return cap_tail(kept, total, self.limit)

    def take_unsent(self) -> bytes:
        """What came since the last take, up to the last whole UTF-8 character (the rest of
        a character cut by a read waits for the next take)."""
        with self._lock:
            end = _whole_characters(self._unsent)
            taken = bytes(self._unsent[:end])
            del self._unsent[:end]
        return taken

    def give_back(self, chunk: bytes) -> None:
        """Put back what could not be sent, before anything that came since."""
        with self._lock:
            self._unsent[:0] = chunk
            if len(self._unsent) > self.limit:
                del self._unsent[: len(self._unsent) - self.limit]


@dataclasses.dataclass(frozen=True)
class Outcome:
    exit_code: int
    stdout: str = ""
    stderr: str = ""


class Runner:
    """One job's process. Not reusable: start() once, wait() once."""

    def __init__(
        self,
        job: PolledJob,
        node_id: str,
        work_dir: str,
        groups: Groups,
        max_output_bytes: int,
    ) -> None:
        self.job = job
        self.node_id = node_id
        self.is_service = job.job_type == "service"
        self._work_dir = work_dir
        self._groups = groups
        self.stdout = Tail(max_output_bytes)
        self.stderr = Tail(max_output_bytes)
        self._proc: subprocess.Popen[bytes] | None = None
        self._scratch: str | None = None
        self._readers: list[threading.Thread] = []
        self._stop_lock = threading.Lock()
        self._stop_grace: float | None = None  # set once a stop was asked for
        self._stop_note = ""
        self.live_output = not self.is_service  # false once the scheduler refused it

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        """Prepare and start the job; raises PrepareError when it cannot start."""
        jobs_dir = os.path.join(self._work_dir, "jobs")
        os.makedirs(jobs_dir, exist_ok=True)
        self._scratch = tempfile.mkdtemp(prefix=f"{self.job_id}-", dir=jobs_dir)
        argv, cwd = self._prepare(self._scratch)
        env = {**os.environ, "TINY_NODE_ID": self.node_id, "TINY_JOB_ID": self.job_id}
        # The agent's key is the node's credential, not the job's: a job that needs one says
        # so in its env_vars.
        env.pop(KEY_VARIABLE, None)
        env.update(self.job.env_vars or {})
        if self.is_service:
            with open(os.path.join(self._scratch, "service.log"), "wb") as log_file:
                self._proc = self._popen(argv, cwd, env, log_file, subprocess.STDOUT)
            return
        self._proc = self._popen(argv, cwd, env, subprocess.PIPE, subprocess.PIPE)
        assert self._proc.stdout is not None and self._proc.stderr is not None
        for stream, tail in ((self._proc.stdout, self.stdout), (self._proc.stderr, self.stderr)):
            reader = threading.Thread(
                target=_read_into, args=(stream, tail), name=f"{self.job_id}-out", daemon=True
            )
            reader.start()
            self._readers.append(reader)

    def _popen(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        stdout: int | IO[bytes],
        stderr: int,
    ) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            # Its own group (and session): a stop reaches whatever the command forked, and a
            # Ctrl-C meant for the agent does not reach the jobs.
            start_new_session=True,
        )
        self._groups.add(proc.pid, self.job_id)
        with self._stop_lock:
            self._proc = proc
            grace = self._stop_grace
        if grace is not None:  # stopped while it was being prepared
            self._signal_stop(proc.pid, grace)
        return proc

    def _prepare(self, scratch: str) -> tuple[list[str], str]:
        """What to execute and where: (argv, cwd). Fetches and unpacks a deploy zip first."""
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
        """Wait for the job's shell to end; kill what it left in its group; the outcome."""
        assert self._proc is not None
        code = self._proc.wait()
        pgid = self._proc.pid
        # The shell is gone: the rest of its group belongs to a job that has ended.
        signal_groups([pgid], signal.SIGKILL)
        for reader in self._readers:
            # EOF comes once every holder of the pipes is gone; a process that left the
            # group (setsid) could hold them open for ever.
            reader.join(READER_JOIN_SECS)
        self._groups.remove(pgid)
        if code < 0:
            code = 128 - code  # killed by signal N: report it as a shell would, 128 + N
        if self.is_service:
            return Outcome(code)
        stderr = self.stderr.text()
        if self._stop_note:
            stderr += self._stop_note
        return Outcome(code, self.stdout.text(), stderr)

    def stop(self, grace: float, note: str = "") -> None:
        """SIGTERM the job's group now and SIGKILL it after `grace` seconds unless it has
        ended; returns at once. `note` is added to the job's stderr. A job still being
        prepared (its zip downloading) is stopped as soon as it starts."""
        with self._stop_lock:
            if self._stop_grace is not None:
                return
            self._stop_grace, self._stop_note = grace, note
            proc = self._proc
        if proc is not None:
            self._signal_stop(proc.pid, grace)

    def _signal_stop(self, pgid: int, grace: float) -> None:
        signal_groups([pgid], signal.SIGTERM)
        threading.Thread(
            target=self._kill_later, args=(pgid, grace), name=f"{self.job_id}-kill", daemon=True
        ).start()

    def _kill_later(self, pgid: int, grace: float) -> None:
        assert self._proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(grace)
        if group_alive(pgid):
            signal_groups([pgid], signal.SIGKILL)

    def cleanup(self) -> None:
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)


def _whole_characters(data: bytearray) -> int:
    """The length of `data` without a UTF-8 sequence left incomplete at its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: the sequence started further back
        needed = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
        return len(data) if back >= needed else len(data) - back
    return len(data)


def _read_into(stream: IO[bytes], tail: Tail) -> None:
    with stream:
        while chunk := stream.read1(READ_CHUNK):  # type: ignore[attr-defined]
            tail.add(chunk)
