"""The agent's side of its spawner (`spawner.py`): start it, hand it jobs, replace it.

`Spawner.spawn(folder)` asks the spawner to start and own the job whose spec is in `folder`
and returns a `Spawned`: the spawner's (pid, start time) and the descriptor that reads as
closed once the job's result is written (or the spawner died); or None when the spawner did
not take the job within `timeout_secs`: it is dead, hung, or failed. Then the caller starts a
single owner as a process of its own, so that no job is lost to a spawner's fault; and a
spawner that did not answer is let go (not killed: it owns its running jobs to their ends),
a new one taking its place at the next job. A job the old one started late loses nothing
either: the first owner to claim a folder (`owner.claim`) runs its job, a second ends unused.

`spawner.pid` in the work directory names the live spawner ("pid start-time"), for whoever
measures or inspects the node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
from typing import NamedTuple

from . import owner, spawner

SPAWN_TIMEOUT_SECS = 2.0
"""How long a job's start waits for the spawner's answer before starting the owner itself."""

PID_FILE = "spawner.pid"

log = logging.getLogger("tiny_scheduler.agent")


class Spawned(NamedTuple):
    """A job the spawner took: its owner (the spawner: pid, start time) and `done`, a
    descriptor (the caller's to close) that reads as closed once the job's result is written."""

    pid: int
    started: int
    done: int


class Spawner:
    """One agent's spawner process; safe to use from several threads (one request at a
    time: a job's start takes well under a millisecond)."""

    def __init__(self, work_dir: str, timeout_secs: float = SPAWN_TIMEOUT_SECS) -> None:
        self.work_dir = work_dir
        self.timeout_secs = timeout_secs
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._channel: socket.socket | None = None

    @property
    def pid(self) -> int | None:
        """The live spawner's pid, or None while there is none."""
        with self._lock:
            proc = self._proc
            return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        """Start the spawner unless one runs; a start that fails leaves jobs to the fallback."""
        with self._lock:
            self._ensure()

    def spawn(self, folder: str) -> Spawned | None:
        """The job in `folder`, as the spawner took it, or None (see the module)."""
        with self._lock:
            channel = self._ensure()
            if channel is None:
                return None
            fds: list[int] = []
            try:
                channel.sendall(os.fsencode(folder) + b"\n")
                reply = _read_answer(channel, fds)
                pid, started = (int(part) for part in reply.split())
            except (OSError, ValueError) as exc:
                for fd in fds:
                    os.close(fd)
                log.warning("the spawner did not answer (%s): starting a new one", exc)
                self._end()
                return None
            if pid > 0 and len(fds) == 1:
                return Spawned(pid, started, fds[0])
            for fd in fds:
                os.close(fd)
            return None

    def close(self) -> None:
        """Let the spawner go: it takes no more jobs, and ends once the jobs it owns have
        ended (at once when it owns none)."""
        with self._lock:
            self._end()

    def _ensure(self) -> socket.socket | None:
        if self._proc is not None and self._proc.poll() is not None:
            log.warning("the spawner ended (status %s): starting a new one", self._proc.returncode)
            self._end()
        if self._channel is not None:
            return self._channel
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        jobs_dir = os.path.join(self.work_dir, "jobs")
        try:
            os.makedirs(jobs_dir, exist_ok=True)
            with open(os.path.join(self.work_dir, "spawner.log"), "ab") as out:
                self._proc = subprocess.Popen(
                    # As an owner is started: the standard library only, nothing from the
                    # environment; a session of its own, out of reach of the agent's signals.
                    [sys.executable, "-I", "-S", spawner.__file__, str(theirs.fileno()), jobs_dir],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    start_new_session=True,
                )
        except OSError as exc:
            log.warning("cannot start the spawner (%s): owners start on their own", exc)
            ours.close()
            return None
        finally:
            theirs.close()
        ours.settimeout(self.timeout_secs)
        self._channel = ours
        with contextlib.suppress(OSError):
            pid = self._proc.pid
            owner.write_atomically(
                self.work_dir, PID_FILE, f"{pid} {owner.start_time(pid)}\n".encode()
            )
        return ours

    def _end(self) -> None:
        """Let the spawner go, never kill it: one that was only slow (a disk that took
        seconds over a result's fsync) owns running jobs, which stay its own; it takes no
        more (its end of the socket reads as closed) and ends after them. One that answers
        late starts nothing a single owner took first (`owner.claim`)."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        # It may own jobs for hours yet: reaped whenever it ends.
        threading.Thread(target=proc.wait, name="spawner-reaper", daemon=True).start()
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.work_dir, PID_FILE))


def _read_answer(channel: socket.socket, fds: list[int]) -> bytes:
    """One answer; the descriptors passed with it go into `fds` as they come (the caller's
    to close, also when this raises). The channel's timeout bounds each read."""
    reply = b""
    while not reply.endswith(b"\n"):
        chunk, more, _, _ = socket.recv_fds(channel, 64, 1, socket.MSG_CMSG_CLOEXEC)
        fds += more
        if not chunk:
            raise OSError("the spawner closed its end")
        reply += chunk
    return reply
