"""The spawner: one long-lived process per agent that starts and owns the node's jobs.

An owner process per job (`owner.py` run on its own) costs more CPU than a short job's whole
run: an interpreter forked (or started) for it, its pages copied as it touches them, torn
down again. The spawner owns every job it starts instead: the agent starts it like an owner
(`python -I -S spawner.py FD JOBS_DIR`, the standard library only, in a session of its own)
and for each job writes the job's folder (one line) on FD, a stream socket the agent holds
the other end of. The spawner starts the job as `owner.OwnedJob` does for a single owner (it
claims the folder in `owner.pid`, so a single owner the agent started for the same folder
ends unused), looks after it (its stop order, its timeout, the fence) and writes its result,
exactly as a single owner would.

Its answer is its own "pid start-time" with, passed along it (SCM_RIGHTS), the read end of a
pipe whose write end the spawner closes once the job's result is written: the agent waits on
that. "0 0" and no pipe mean it took nothing (the agent then starts a single owner itself).

It outlives its agent, as an owner does: when the agent's end of the socket closes (the agent
died, or replaced it), the spawner takes no more jobs, and ends once the jobs it owns have
ended and their results are written. A SIGTERM (the agent's way of saying "a stop order is
in a job's folder") only makes it look at its jobs at once. Its own faults go to its log
(the agent's `spawner.log`); one job's fault ends that job's care, never the others': a job
it claimed and can give no result for (it could not start it, or not write its result) is
said so on the job's pipe (`GAVE_UP`), and the agent ends it. Jobs end on threads of their own
(`FINISHERS`): an end that takes seconds (a process stuck in its group, a slow disk) holds
up neither the other jobs' stop orders, timeouts and fence, nor the next start.

The price of one owner for many jobs: a spawner that dies (SIGKILL) takes the ownership of
its running jobs with it; the agent then ends them as jobs whose owner died, as it does for a
single owner's death. Its argv names no job: only a job's `sh -c` carries its command line.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import socket
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

if __package__:
    from . import owner
else:  # run as a script (`python -I -S spawner.py`): its modules are the files beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import owner  # type: ignore[no-redef]

OWNER_LOG = "owner.log"
"""File in a job's folder: what a single owner printed (its own faults, never the job's)."""

NO_CHILD = b"0 0\n"
"""The answer that says this spawner took nothing (the agent then starts a single owner)."""

FINISHERS = 4
"""Threads that end jobs (collect them, kill what they left, remove their groups, fsync and
write their results): an end can take seconds (a process stuck in its group, a slow disk),
and the loop must go on looking at the other jobs' fences and answering starts meanwhile."""


class _Jobs:
    """The jobs this spawner owns, by the descriptor that reads ready when each ends."""

    def __init__(self, poller: select.poll) -> None:
        self.poller = poller
        self.owned: dict[int, tuple[owner.OwnedJob, int]] = {}  # waiter -> (job, pipe's end)
        self.finishers = ThreadPoolExecutor(FINISHERS, thread_name_prefix="finish")

    def start(self, folder: str) -> int | None:
        """Start the job in `folder`; the read end of its pipe (closed on our side once its
        result is written: at once when it could not start, or had its owner already; with
        `owner.GAVE_UP` written first when we claimed it and can give no result), or None when we
        took nothing (the agent then starts a single owner)."""
        # Two descriptors per job owned, and the agent's socket: the usual soft limit of
        # 1024 is raised only once a node runs hundreds of jobs at once (a job inherits it).
        owner.raise_open_files(2 * len(self.owned) + 64)
        done_read, done_write = os.pipe()  # first: once the folder is claimed, no way back
        try:
            job = owner.OwnedJob.start(folder)
        except Exception:
            traceback.print_exc()
            if not owner.claimed_by_me(folder):
                os.close(done_read)
                os.close(done_write)
                return None
            os.write(done_write, owner.GAVE_UP)  # ours, and no result will come of it
            job = None
        finally:
            # The job's own directory was this process's to start it in (posix_spawn takes
            # none): leave it, so that nothing of ours holds a job's folder, nor passes for
            # one of the job's processes (they work in it).
            os.chdir("/")
        if job is None:
            os.close(done_write)  # its result is there already, or it is another owner's
        else:
            self.owned[job.waiter] = (job, done_write)
            self.poller.register(job.waiter, select.POLLIN)
        return done_read

    def end(self, waiter: int) -> None:
        """The job behind `waiter` has ended: a finisher collects it and writes its result."""
        job, done_write = self.owned.pop(waiter)
        self.poller.unregister(waiter)
        self.finishers.submit(_finish, job, done_write)

    def look(self) -> None:
        now = time.monotonic()
        # Every job reads the one node fence: read once a round, not once a job.
        fence = functools.lru_cache(maxsize=None)(owner.read_node_fence)
        for job, _ in list(self.owned.values()):
            try:
                job.look(now, node_fence=fence)
            except Exception:
                traceback.print_exc()


def _finish(job: owner.OwnedJob, done_write: int) -> None:
    try:
        job.finish()
    except BaseException:
        traceback.print_exc()
        # No result: the agent ends the job as one whose owner could not (and says so).
        with contextlib.suppress(OSError):
            os.write(done_write, owner.GAVE_UP)
    finally:
        os.close(done_write)


def serve(channel: int, jobs_dir: str) -> int:
    """Start and own a job for each folder the agent names on the socket `channel` (a
    descriptor) until the agent closes its end, then until the jobs owned have ended."""
    # Ctrl-C or a hangup meant for the agent's terminal is not ours.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the wakeup says it
    os.set_inheritable(channel, False)  # no job holds the agent's socket
    agent: socket.socket | None = socket.socket(fileno=channel)
    jobs_dir = os.path.realpath(jobs_dir) + os.sep
    poller = select.poll()  # not select(): descriptors may number more than 1024
    poller.register(woken, select.POLLIN)
    poller.register(channel, select.POLLIN)
    jobs = _Jobs(poller)
    me = f"{os.getpid()} {owner.start_time(os.getpid()) or 0}\n".encode()  # our answer
    os.chdir("/")
    pending = b""
    next_look = time.monotonic() + owner.LOOK_SECS
    while agent is not None or jobs.owned:
        wait = max(0.0, next_look - time.monotonic())
        look_now = False
        for fd, _ in poller.poll(wait * 1000):
            if fd == woken:
                os.read(woken, 512)
                look_now = True
            elif agent is not None and fd == channel:
                try:
                    chunk = agent.recv(4096)
                    pending += chunk
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        _answer(agent, jobs, os.fsdecode(line), jobs_dir, me)
                except OSError:
                    chunk = b""  # it went away between asking and our answer
                if not chunk:
                    # The agent is gone, or let us go: no more jobs; those owned, to the end.
                    poller.unregister(channel)
                    agent.close()
                    agent = None
            elif fd in jobs.owned:
                jobs.end(fd)
        if look_now or time.monotonic() >= next_look:
            jobs.look()
            next_look = time.monotonic() + owner.LOOK_SECS
    jobs.finishers.shutdown(wait=True)  # the last results written before we go
    return 0


def _answer(agent: socket.socket, jobs: _Jobs, folder: str, jobs_dir: str, me: bytes) -> None:
    """Take the job in `folder` and answer: `me` (our "pid start-time") with its pipe, or
    NO_CHILD."""
    # Only the agent holds the other end; still, nothing outside its jobs is run.
    done = jobs.start(folder) if os.path.realpath(folder).startswith(jobs_dir) else None
    if done is None:
        agent.sendall(NO_CHILD)
        return
    try:
        socket.send_fds(agent, [me], [done])
    finally:
        os.close(done)


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), sys.argv[2]))
