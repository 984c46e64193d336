"""The spawner: one long-lived process per agent that forks a ready owner for each job.

Starting an owner as a fresh interpreter (`python -I -S owner.py JOB_DIR`) costs more CPU than
the owner's whole work for a short job: the interpreter's start, its imports, compiling the
file. The spawner pays that once: the agent starts it like an owner (`python -I -S
spawner.py FD`, the standard library only, in a session of its own), with `owner` already
imported, and for each job writes the job's folder (one line) on FD, a stream socket the
agent holds the other end of. The spawner forks; the child becomes exactly the owner that
`owner.py` is when started on its own (`become_owner`): a session of its own, no descriptor
of the spawner's, the signal dispositions of a fresh interpreter, its output to `owner.log`
in the folder. The spawner answers with the child's "pid start-time" (or "0 0" when it could
not fork) and reaps its children as they end.

The owners do not depend on the spawner: one that dies (or is killed) leaves them running, as
an agent that dies does. The spawner ends when the agent does: its end of the socket reads
as closed. Its argv names no job: only a job's `sh -c` carries the job's command line.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys

if __package__:
    from . import owner
else:  # run as a script (`python -I -S spawner.py`): its modules are the files beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import owner  # type: ignore[no-redef]

OWNER_LOG = "owner.log"
"""File in a job's folder: what its owner printed (its own faults, never the job's output)."""

NO_CHILD = b"0 0\n"


def serve(channel: int, jobs_dir: str) -> int:
    """Fork an owner for each folder the agent names on the socket `channel` (a descriptor:
    plain reads and writes need no `socket` module, nor the pages it takes in every owner),
    until the agent closes its end."""
    signal.signal(signal.SIGCHLD, _reap)
    # Ctrl-C or a hangup meant for the agent's terminal is not ours: the agent ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    jobs_dir = os.path.realpath(jobs_dir) + os.sep
    # What is loaded now, the garbage collector of each owner leaves alone: it would touch,
    # and so copy, pages the owner otherwise shares with the spawner.
    gc.freeze()
    pending = b""
    while True:
        chunk = os.read(channel, 4096)
        if not chunk:
            return 0  # the agent is gone (or replaced us): the owners run on without us
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            folder = os.fsdecode(line)
            # Only the agent holds the other end; still, nothing outside its jobs is run.
            if not os.path.realpath(folder).startswith(jobs_dir):
                os.write(channel, NO_CHILD)
                continue
            os.write(channel, _fork_owner(folder, channel))  # a few bytes: written whole


def _fork_owner(folder: str, channel: int) -> bytes:
    try:
        pid = os.fork()
    except OSError:
        return NO_CHILD  # the agent starts this one as a process of its own
    if pid == 0:
        become_owner(folder, channel)
    # A child is reaped only by _reap, after this look: until then it is at worst a zombie,
    # whose start time still reads.
    return f"{pid} {owner.start_time(pid) or 0}\n".encode()


def become_owner(folder: str, channel: int) -> None:
    """In the forked child: shed what is the spawner's, then run the job's owner; never
    returns."""
    code = 1
    try:
        # First: our reaper would otherwise take the job's exit status from the owner's wait4.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        os.setsid()
        os.close(channel)
        log = os.open(
            os.path.join(folder, OWNER_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        code = owner.run(folder)
    except BaseException:
        with contextlib.suppress(BaseException):
            sys.excepthook(*sys.exc_info())  # the interpreter's own traceback, to owner.log
            sys.stderr.flush()
    finally:
        os._exit(code)


def _reap(signum: int, frame: object) -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), sys.argv[2]))
