"""A database file, its write-ahead log or the log's index deleted under an idle daemon, then
a crash: nothing acknowledged is lost (issue 33: 20 jobs submitted, `rm jobs.db-wal`, SIGKILL
within 0.2-1.8 s, and none of the 20 was there after the restart; the loss was found only by
the next idle probe, up to 2 s later, and the daemon died first).

The store watches its files (`tiny_scheduler/storage/file_watch.py`: inotify, else `stat`
every 0.25 s) and saves at once what the files it still has open hold, then refuses writes and
says why in `/health`, the log and the dashboard:

- `-wal` or `-shm` deleted: the log is folded into the database file at the path;
- the database file deleted: it is written back to its empty path;
- SIGKILL once `/health` says so, restart: every acknowledged job is there.

The watch itself (inotify and the `stat` fallback) is tested in-process on temporary files.
The issue's own figure, SIGKILLs at fixed delays after the deletion, is the slow soak at the
end (`make soak`): it prints what each delay kept, and asserts the kills that came after
`/health` said so and those a second or more after the deletion.
"""

from __future__ import annotations

import html
import os
import threading
import time
from pathlib import Path

import pytest
from conftest import start_scheduler, stop_scheduler
from helpers import Api, expect_error, expect_json, wait_for

from tiny_scheduler import errors
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.storage import file_watch
from tiny_scheduler.storage.file_watch import FileWatch

NOTICED_WITHIN = 10.0
"""Seconds /health may take to say unhealthy after a deletion (a liveness bound: the watch
reacts in milliseconds; before it, the idle probe took up to 2 s and a crash came first)."""

JOBS = 20

LOST = {
    "wal": ("-wal", "the write-ahead log {path} was deleted while in use"),
    "shm": ("-shm", "the write-ahead log's index {path} was deleted while in use"),
    "db": ("", "the database file {path} was deleted while in use"),
}
"""Which file is deleted (the suffix to the database's path), and what /health says of it."""


# --- the watch ------------------------------------------------------------------------------


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "stat"])
def test_the_watch_calls_when_a_watched_file_goes_and_not_for_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inotify: bool
) -> None:
    if not inotify:
        monkeypatch.setattr(file_watch, "_inotify", lambda: None)
    watched, other = tmp_path / "jobs.db-wal", tmp_path / "unrelated"
    watched.write_bytes(b"x")
    other.write_bytes(b"y")
    calls = threading.Semaphore(0)
    watch = FileWatch([str(watched)], calls.release)
    try:
        assert watch.inotify is inotify
        other.unlink()
        (tmp_path / "another").write_bytes(b"z")
        assert not calls.acquire(timeout=file_watch.STAT_SECS * 3)  # not ours: no call
        watched.unlink()
        assert calls.acquire(timeout=NOTICED_WITHIN)
        watched.write_bytes(b"put back")  # a file put in its place counts too
        assert calls.acquire(timeout=NOTICED_WITHIN)
    finally:
        watch.close()


# --- a live daemon --------------------------------------------------------------------------


def submitted(api: Api, count: int = JOBS) -> dict[str, dict]:
    jobs = [api.submit(command=f"echo {n}") for n in range(count)]
    return {job["job_id"]: job for job in jobs}


def unhealthy(api: Api) -> dict | None:
    reply = api.get("/health")
    return expect_json(reply, 503) if reply.status_code != 200 else None


def restarted_jobs(db_path: Path, tmp_path: Path, registry: FakeRegistry) -> dict[str, dict]:
    again = start_scheduler(db_path, tmp_path / f"again-{time.monotonic_ns()}.log", registry.url)
    api = Api(again.url)
    try:
        return {job["job_id"]: job for job in api.listed(limit=1000)}
    finally:
        api.close()
        stop_scheduler(again)


@pytest.mark.parametrize("kind", sorted(LOST))
def test_a_file_deleted_under_an_idle_daemon_then_a_crash_loses_nothing(
    tmp_path: Path, registry: FakeRegistry, kind: str
) -> None:
    suffix, cause = LOST[kind]
    db_path = tmp_path / "jobs.db"
    lost = Path(f"{db_path}{suffix}")
    proc = start_scheduler(db_path, tmp_path / "scheduler.log", registry.url)
    api = Api(proc.url)
    try:
        acknowledged = submitted(api)
        lost.unlink()
        body = wait_for(lambda: unhealthy(api), timeout=NOTICED_WITHIN, message="unhealthy")
        assert cause.format(path=lost) in body["error"], body
        saved = "everything acknowledged was written back" if kind == "db" else "is saved in"
        assert saved in body["error"], body
        expect_error(api.post("/jobs", {"command": "x"}), 503, errors.STORE_UNAVAILABLE)
        # The dashboard and the log say why too.
        page = html.unescape(api.get("/ui/").text)
        assert "The job store cannot be written" in page and cause.format(path=lost) in page
        assert proc.log_path is not None
        assert cause.format(path=lost) in Path(proc.log_path).read_text()
        proc.kill()  # a crash: nothing gets to clean up
    finally:
        api.close()
        stop_scheduler(proc)
    assert restarted_jobs(db_path, tmp_path, registry) == acknowledged


# --- the issue's figure (make soak) ---------------------------------------------------------

KILL_DELAYS = (0.0, 0.05, 0.2, 0.5, 1.0, 1.8)
"""Seconds between the deletion and the SIGKILL (the issue's 0.2-1.8 s, and less)."""

ROUNDS = int(os.environ.get("DELETION_ROUNDS", "3"))
"""Rounds of each file and delay."""


def one_round(
    tmp_path: Path, registry: FakeRegistry, kind: str, delay: float | None, number: int
) -> tuple[int, int]:
    """Submit JOBS, delete the file, SIGKILL after `delay` (None: once /health says so), start
    again: (acknowledged, kept)."""
    folder = tmp_path / f"{kind}-{delay}-{number}"
    folder.mkdir()
    db_path = folder / "jobs.db"
    proc: SchedulerProcess = start_scheduler(db_path, folder / "scheduler.log", registry.url)
    api = Api(proc.url)
    try:
        acknowledged = submitted(api)
        Path(f"{db_path}{LOST[kind][0]}").unlink()
        if delay is None:
            wait_for(lambda: unhealthy(api), timeout=NOTICED_WITHIN, message="unhealthy")
        else:
            time.sleep(delay)  # the figure: a crash at this distance from the deletion
        proc.kill()
    finally:
        api.close()
        stop_scheduler(proc)
    stored = restarted_jobs(db_path, folder, registry)
    return len(acknowledged), sum(stored.get(job_id) == job for job_id, job in acknowledged.items())


@pytest.mark.slow
@pytest.mark.timeout(120 * ROUNDS + 300)  # 21 daemon starts a round
def test_the_issues_deletions_and_crashes(tmp_path: Path, registry: FakeRegistry) -> None:
    lines = []
    for kind in sorted(LOST):
        for delay in (*KILL_DELAYS, None):
            results = [one_round(tmp_path, registry, kind, delay, n) for n in range(ROUNDS)]
            acknowledged = sum(a for a, _ in results)
            kept = sum(k for _, k in results)
            when = "once /health said so" if delay is None else f"{delay:.2f} s after"
            lines.append(f"{kind:>3}: SIGKILL {when}: kept {kept} of {acknowledged}")
            # Asserted once /health said so, and for the issue's longer delays (20 times the
            # few tens of milliseconds the save takes); shorter ones show the window left.
            if delay is None or delay >= 1.0:
                assert kept == acknowledged, lines[-1]
    print("\n" + "\n".join(lines))
