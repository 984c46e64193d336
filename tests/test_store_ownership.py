"""One scheduler per SQLite file, under real gunicorn, and a file deleted or replaced under it.

- A second daemon on a file that one is using refuses to start, naming the first's pid, and
  the first goes on untouched (two daemons on one file each acknowledged `job-10`, and one of
  them was lost).
- gunicorn starting the worker again (after it died, or on a reload) never locks the daemon
  out of its own file, and loses nothing.
- A database file deleted or replaced while the daemon runs, busy or idle, makes it unhealthy
  at once; it acknowledges nothing more, reads go on from memory. A deleted file is written
  back to its empty path with everything acknowledged; a replaced one is left as it is and
  the daemon's copy saved beside it; after a restart ids go on above every id handed out
  (they started from job-1 again). The log and its index (`-wal`, `-shm`) and SIGKILLs right
  after a deletion are in tests/test_deleted_files.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import refused_scheduler, start_scheduler, stop_scheduler
from helpers import Agent, Api, expect_error, expect_json, wait_for

from tiny_scheduler import errors
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry

UNHEALTHY_WITHIN = 15.0
"""Seconds /health may take to notice a lost file (the probe runs every ~2 s when idle)."""


def worker_pid(proc: SchedulerProcess) -> int | None:
    """The pid of the gunicorn master's one worker, when it has one."""
    assert proc.proc is not None
    master = proc.proc.pid
    try:
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    except FileNotFoundError:
        return None
    return int(children[0]) if len(children) == 1 else None


def answers(proc: SchedulerProcess, worker: int) -> bool:
    """Whether a worker other than `worker` is up and answering."""
    current = worker_pid(proc)
    if current is None or current == worker:
        return False
    api = Api(proc.url)
    try:
        return api.get("/health").status_code == 200
    except OSError:
        return False
    finally:
        api.close()


def test_a_second_scheduler_on_the_same_file_refuses_to_start(
    tmp_path: Path, registry: FakeRegistry
) -> None:
    db_path = tmp_path / "scheduler.db"
    first = start_scheduler(db_path, tmp_path / "first.log", registry.url)
    api = Api(first.url)
    try:
        jobs = [api.submit(command=f"echo {n}") for n in range(3)]
        started = time.monotonic()
        output = refused_scheduler(db_path, tmp_path, registry.url)
        print(f"a second daemon on the file exited after {time.monotonic() - started:.1f}s")
        owner = worker_pid(first)
        assert owner is not None
        line = f"tiny-scheduler: database {db_path} is in use by another scheduler (pid {owner})"
        assert line in output, output
        # The first goes on as if nothing happened.
        jobs.append(api.submit(command="after the refusal"))
        assert jobs[-1]["job_id"] == "job-4"
        assert api.listed() == jobs
    finally:
        api.close()
        stop_scheduler(first)

    # Once the first has stopped, the file is free, and everything is in it.
    again = start_scheduler(db_path, tmp_path / "again.log", registry.url)
    api = Api(again.url)
    try:
        assert api.listed() == jobs
    finally:
        api.close()
        stop_scheduler(again)


@pytest.mark.parametrize("link", [os.symlink, os.link], ids=["symlink", "hard link"])
def test_a_second_scheduler_on_another_name_of_the_same_file_refuses_to_start(
    tmp_path: Path, registry: FakeRegistry, link: Callable[[Path, Path], None]
) -> None:
    """Ownership follows the file, not its name: a second daemon given a symbolic or a hard
    link to the first's database is refused too (the lock was `<name>.lock`, so each took
    its own, both handed out the same ids, and acknowledged jobs were lost)."""
    db_path = tmp_path / "scheduler.db"
    first = start_scheduler(db_path, tmp_path / "first.log", registry.url)
    api = Api(first.url)
    try:
        jobs = [api.submit(command=f"echo {n}") for n in range(3)]
        other_name = tmp_path / "elsewhere" / "other.db"
        other_name.parent.mkdir()
        link(db_path, other_name)
        output = refused_scheduler(other_name, tmp_path, registry.url)
        owner = worker_pid(first)
        assert owner is not None
        line = f"tiny-scheduler: database {other_name} is in use by another scheduler (pid {owner})"
        assert line in output, output
        jobs.append(api.submit(command="after the refusal"))
        assert jobs[-1]["job_id"] == "job-4"
        assert api.listed() == jobs
    finally:
        api.close()
        stop_scheduler(first)


def test_a_worker_started_again_by_gunicorn_takes_the_file_back(
    tmp_path: Path, registry: FakeRegistry
) -> None:
    """The worker dies (the OOM killer, say): its master starts another, which must open the
    file its predecessor held, with everything acknowledged; other daemons stay refused."""
    db_path = tmp_path / "scheduler.db"
    proc = start_scheduler(db_path, tmp_path / "scheduler.log", registry.url)
    api = Api(proc.url)
    try:
        jobs = [api.submit(command=f"echo {n}") for n in range(3)]
        worker = worker_pid(proc)
        assert worker is not None
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: answers(proc, worker), timeout=30, message="a new worker to answer")
        assert api.listed() == jobs
        assert api.submit(command="after")["job_id"] == "job-4"
        output = refused_scheduler(db_path, tmp_path, registry.url)
        assert f"pid {worker_pid(proc)})" in output, output
    finally:
        api.close()
        stop_scheduler(proc)


def test_a_reload_hands_the_file_to_the_new_worker(tmp_path: Path, registry: FakeRegistry) -> None:
    """SIGHUP: gunicorn starts a new worker while the old one finishes; the new one waits for
    the old one to let go of the file, then loads everything it wrote."""
    db_path = tmp_path / "scheduler.db"
    proc = start_scheduler(db_path, tmp_path / "scheduler.log", registry.url)
    api = Api(proc.url)
    try:
        jobs = [api.submit(command=f"echo {n}") for n in range(5)]
        worker = worker_pid(proc)
        assert worker is not None and proc.proc is not None
        os.kill(proc.proc.pid, signal.SIGHUP)
        wait_for(lambda: answers(proc, worker), timeout=60, message="the reloaded worker")
        assert api.listed() == jobs
        assert api.submit(command="after the reload")["job_id"] == "job-6"
    finally:
        api.close()
        stop_scheduler(proc)


class Served:
    """A daemon and what it acknowledged, to hold a lost file's consequences against."""

    def __init__(self, proc: SchedulerProcess) -> None:
        self.api = Api(proc.url)
        self.agent = Agent(proc.url, "node-a")
        self.jobs = [self.api.submit(command=f"echo {n}") for n in range(4)]
        for job in self.jobs[:2]:
            self.agent.claim(job["job_id"])
        self.pending = self.jobs[2]["job_id"]
        self.running = self.jobs[0]["job_id"]
        self.seen = {job["job_id"]: job for job in self.api.listed()}

    def check_refusing(self, cause: str) -> None:
        """Unhealthy, naming the cause; every write refused; reads as before."""

        def unhealthy() -> dict | None:
            reply = self.api.get("/health")
            return expect_json(reply, 503) if reply.status_code != 200 else None

        started = time.monotonic()
        body = wait_for(unhealthy, timeout=UNHEALTHY_WITHIN, message="/health to say unhealthy")
        print(f"/health said unhealthy {time.monotonic() - started:.1f}s after: {cause}")
        assert body["status"] == "unhealthy"
        assert body["error"].startswith("job store cannot be written: "), body
        assert cause in body["error"], body
        reply = self.api.post("/jobs", {"command": "into a lost file"})
        expect_error(reply, 503, errors.STORE_UNAVAILABLE)
        expect_error(self.agent.claim(self.pending), 503, errors.STORE_UNAVAILABLE)
        expect_error(self.agent.report(self.running, 0), 503, errors.STORE_UNAVAILABLE)
        expect_error(self.api.post(f"/jobs/{self.pending}/cancel"), 503, errors.STORE_UNAVAILABLE)
        assert {job["job_id"]: job for job in self.api.listed()} == self.seen
        pending = [job_id for job_id, job in self.seen.items() if job["status"] == "pending"]
        assert [job.job_id for job in self.agent.poll()] == pending[:2]  # 2 free slots

    def close(self) -> None:
        self.api.close()
        self.agent.close()


def only_node_a(registry: FakeRegistry) -> None:
    registry.remove_node("node-b")
    registry.remove_node("node-c")


ENV = {"MAX_JOBS_PER_NODE": "4"}  # two running jobs leave the pending one in the poll


def test_a_database_file_deleted_while_in_use_stops_acknowledging_and_ids_go_on(
    tmp_path: Path, registry: FakeRegistry
) -> None:
    only_node_a(registry)
    db_path = tmp_path / "scheduler.db"
    proc = start_scheduler(db_path, tmp_path / "scheduler.log", registry.url, ENV)
    served = Served(proc)
    try:
        db_path.unlink()  # nothing is written meanwhile: the watch must find it
        served.check_refusing(f"the database file {db_path} was deleted while in use")
        served.check_refusing(f"everything acknowledged was written back to {db_path}")
        assert db_path.exists()
    finally:
        served.close()
        stop_scheduler(proc)

    # The file the daemon still had open was written back to the empty path: nothing
    # acknowledged is lost, and no id the clients and agents saw is handed out again.
    again = start_scheduler(db_path, tmp_path / "again.log", registry.url, ENV)
    api = Api(again.url)
    try:
        assert {job["job_id"]: job for job in api.listed()} == served.seen
        assert api.submit(command="on the written-back file")["job_id"] == "job-5"
    finally:
        api.close()
        stop_scheduler(again)


def test_a_database_file_replaced_while_in_use_stops_acknowledging_and_ids_go_on(
    tmp_path: Path, registry: FakeRegistry
) -> None:
    """An operator restores a backup over the live file: the daemon must not write on into
    the file that is gone, and the restored one's ids continue above those handed out since."""
    only_node_a(registry)
    db_path = tmp_path / "scheduler.db"
    backup = tmp_path / "backup.db"
    proc = start_scheduler(db_path, tmp_path / "scheduler.log", registry.url, ENV)
    served = Served(proc)
    try:
        # A consistent copy of the live database, as `sqlite3 .backup` would take it.
        source, target = sqlite3.connect(db_path), sqlite3.connect(backup)
        source.backup(target)
        source.close()
        target.close()
        extra = served.api.submit(command="after the backup")
        served.seen[extra["job_id"]] = extra
        shutil.move(backup, db_path)
        served.check_refusing(f"the database file {db_path} was replaced by another file")
        # Never written over the restored file: the daemon's own copy is saved beside it.
        body = served.api.get("/health").json()
        assert (
            f"another file is at {db_path} now: what this scheduler held is saved in "
            in (body["error"])
        ), body
        (kept,) = tmp_path.glob("scheduler.db.saved-*")
        saved = sqlite3.connect(kept)
        try:
            ids = {row[0] for row in saved.execute("SELECT seq FROM jobs")}
        finally:
            saved.close()
        assert ids == {int(job_id.removeprefix("job-")) for job_id in served.seen}
    finally:
        served.close()
        stop_scheduler(proc)

    again = start_scheduler(db_path, tmp_path / "again.log", registry.url, ENV)
    api = Api(again.url)
    try:
        assert [job["job_id"] for job in api.listed()] == [job["job_id"] for job in served.jobs]
        assert api.submit(command="after the restore")["job_id"] == "job-6"
    finally:
        api.close()
        stop_scheduler(again)


def replace_with_empty_file(path: Path) -> None:
    empty = path.with_name(path.name + ".new")
    empty.write_bytes(b"")
    os.replace(empty, path)


@pytest.mark.parametrize(
    ("lose", "how"),
    [(Path.unlink, "deleted"), (replace_with_empty_file, "replaced by another file")],
    ids=["deleted", "replaced"],
)
def test_a_write_ahead_log_lost_while_in_use_stops_acknowledging_and_loses_nothing(
    tmp_path: Path, registry: FakeRegistry, lose: Callable[[Path], None], how: str
) -> None:
    """`rm scheduler.db-wal` under a running daemon (or a file put in its place): the commits
    since the last checkpoint live only in the unlinked file. The daemon went on acknowledging
    into it, and a crash lost every one of them, some acknowledged before the deletion. It
    must notice at its next write, refuse from then on, and keep everything it acknowledged
    through a SIGKILL."""
    only_node_a(registry)
    db_path = tmp_path / "scheduler.db"
    wal = Path(f"{db_path}-wal")
    proc = start_scheduler(db_path, tmp_path / "scheduler.log", registry.url, ENV)
    served = Served(proc)
    try:
        for n in range(20):
            job = served.api.submit(command=f"before the deletion {n}")
            served.seen[job["job_id"]] = job
        lose(wal)
        # Each write from now on is refused, or acknowledged only once it is stored for good.
        for n in range(10):
            reply = served.api.post("/jobs", {"command": f"after the deletion {n}"})
            if reply.status_code != 503:
                job = expect_json(reply, 201)
                served.seen[job["job_id"]] = job
        served.check_refusing(f"the write-ahead log {wal} was {how} while in use")
        proc.kill()  # a crash: nothing gets to clean up
    finally:
        served.close()
        stop_scheduler(proc)

    again = start_scheduler(db_path, tmp_path / "again.log", registry.url, ENV)
    api = Api(again.url)
    try:
        stored = {job["job_id"]: job for job in api.listed()}
        assert stored == served.seen
    finally:
        api.close()
        stop_scheduler(again)
