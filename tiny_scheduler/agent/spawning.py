"""The agent's side of its spawner (`spawner.py`): start it, ask it for owners, replace it.

`Spawner.spawn(folder)` asks the spawner to fork the owner of the job whose spec is in
`folder` and returns the owner's (pid, start time), or None when no owner came of it in
`timeout_secs`: the spawner is dead, hung, or could not fork. Then the caller starts the owner
as a process of its own, as without a spawner, so that no job is lost to a spawner's fault;
and a spawner that did not answer is killed, a new one taking its place at the next job. An
owner the old one forked late loses nothing either: the first owner to claim a folder
(`owner.claim`) runs its job, a second ends unused.

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

from . import owner, spawner

SPAWN_TIMEOUT_SECS = 2.0
"""How long a job's start waits for the spawner's answer before starting the owner itself."""

PID_FILE = "spawner.pid"

log = logging.getLogger("tiny_scheduler.agent")


class Spawner:
    """One agent's spawner process; safe to use from several threads (one request at a
    time: a fork takes about a millisecond)."""

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

    def spawn(self, folder: str) -> tuple[int, int] | None:
        """The (pid, start time) of the owner forked for `folder`, or None (see the module)."""
        with self._lock:
            channel = self._ensure()
            if channel is None:
                return None
            try:
                channel.sendall(os.fsencode(folder) + b"\n")
                reply = _read_line(channel)
                pid, started = (int(part) for part in reply.split())
            except (OSError, ValueError) as exc:
                log.warning("the spawner did not answer (%s): starting a new one", exc)
                self._end(kill=True)
                return None
            return (pid, started) if pid > 0 else None

    def close(self) -> None:
        """End the spawner (the owners it forked run on)."""
        with self._lock:
            self._end(kill=False)

    def _ensure(self) -> socket.socket | None:
        if self._proc is not None and self._proc.poll() is not None:
            log.warning("the spawner ended (status %s): starting a new one", self._proc.returncode)
            self._end(kill=False)
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

    def _end(self, kill: bool) -> None:
        if self._channel is not None:
            self._channel.close()  # the spawner reads the end of its input, and ends
            self._channel = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if kill:
            proc.kill()
        try:
            proc.wait(self.timeout_secs)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.work_dir, PID_FILE))


def _read_line(channel: socket.socket) -> bytes:
    """One answer; the channel's timeout bounds each read."""
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = channel.recv(64)
        if not chunk:
            raise OSError("the spawner closed its end")
        reply += chunk
    return reply
