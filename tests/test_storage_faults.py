"""Storage faults under a running scheduler, and database files it must refuse at start-up.

The faults are real ones, made by the kernel, not simulated in Python:
- a full disk: the database lives on a small tmpfs, and a filler file takes the rest of it;
- a file system that turns read-only under the scheduler: the database lives on a loop-mounted
  ext4 mounted `errors=remount-ro`, and `/sys/fs/ext4/<dev>/trigger_fs_error` raises the same
  error a failing disk would, so the kernel remounts it read-only mid-flight.
(The tests run as root, and root ignores file modes: a chmod would prove nothing.)

While a fault lasts, writes must answer 503 with the store's message and change nothing,
/health must say unhealthy, reads must go on; afterwards every acknowledged change must be on
disk and no refused one. A full disk heals by itself once space is back. A read-only remount
cannot be undone under a running process (the kernel wants the file system checked and
mounted again), so that test repairs it as an operator would, and restarts.

These tests need `mount`, tmpfs and loop devices; where they are missing the tests fail: a
durability test that silently skips proves nothing.
"""

from __future__ import annotations

import errno
import hashlib
import os
import sqlite3
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import refused_scheduler, start_scheduler, stop_scheduler
from helpers import Agent, Api, expect_error, expect_json, wait_for, without_waiting_for

from tiny_scheduler import Settings, create_app, errors, stop_background, storage
from tiny_scheduler.config import STORE_STALL_SECS
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.domain.jobs import Job
from tiny_scheduler.storage import schema, sqlite

ENV = {"MAX_JOBS_PER_NODE": "4"}  # a running job must not hide the pending one from the poll


# --- real faults: mounts -----------------------------------------------------------------------


def run(*command: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{' '.join(command)} failed: {result.stderr}"
    return result


def unmount(path: Path) -> None:
    # Lazy, so that a test that failed with the scheduler still up cannot leave a mount behind.
    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=60)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a disk that is easy to fill."""
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    run("mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(mountpoint))
    yield mountpoint
    unmount(mountpoint)


class Ext4:
    """A loop-mounted ext4 that the kernel can be made to remount read-only."""

    def __init__(self, image: Path, mountpoint: Path) -> None:
        self.image = image
        self.mountpoint = mountpoint
        run("truncate", "-s", "32M", str(image))
        run("mkfs.ext4", "-q", "-F", str(image))
        self.mount()

    def mount(self) -> None:
        run("mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.mountpoint))

    def fail(self) -> None:
        """Raise a file-system error, as a failing disk would: the kernel remounts it ro."""
        device = run("findmnt", "-no", "SOURCE", str(self.mountpoint)).stdout.strip()
        trigger = Path("/sys/fs/ext4") / Path(device).name / "trigger_fs_error"
        trigger.write_text("tiny-scheduler storage fault test\n")
        with pytest.raises(OSError) as refused:
            (self.mountpoint / "probe").touch()
        assert refused.value.errno == errno.EROFS, refused.value

    def repair(self) -> None:
        """What an operator does: unmount, check the file system, mount it again."""
        run("umount", str(self.mountpoint))
        checked = subprocess.run(
            ["e2fsck", "-fy", str(self.image)], capture_output=True, text=True, timeout=60
        )
        assert checked.returncode in (0, 1), checked.stdout + checked.stderr  # 1: fixed
        self.mount()


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[Ext4]:
    mountpoint = tmp_path / "ext4"
    mountpoint.mkdir()
    fs = Ext4(tmp_path / "ext4.img", mountpoint)
    yield fs
    unmount(mountpoint)


def fill(disk: Path) -> Path:
    """Take every free byte of `disk` with one file; returns it."""
    filler = disk / "filler"
    chunk = b"\xff" * (64 * 1024)
    with open(filler, "wb", buffering=0) as out:
        for size in (len(chunk), 4096, 1):
            try:
                while True:
                    out.write(chunk[:size])
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    return filler


# --- what the clients were told ----------------------------------------------------------------


class Client:
    """Submits and reports as clients do, and remembers what was acknowledged or refused."""

    def __init__(self, url: str) -> None:
        self.api = Api(url)
        self.agent = Agent(url, "node-a")
        self.acknowledged: dict[str, dict[str, Any]] = {}  # job id -> latest 2xx reply
        self.refused_tokens: list[str] = []  # submissions answered 503

    def submit(self) -> tuple[int, dict[str, Any] | None]:
        token = uuid.uuid4().hex
        reply = self.api.post("/jobs", {"command": f"echo {token}"})
        if reply.status_code == 503:
            expect_error(reply, 503, errors.STORE_UNAVAILABLE)
            self.refused_tokens.append(token)
            return 503, None
        job = expect_json(reply, 201)
        self.acknowledged[job["job_id"]] = job
        return 201, job

    def on_node_a(self) -> dict[str, Any]:
        """A new job on node-a (the only healthy node in these tests)."""
        status, job = self.submit()
        assert status == 201 and job is not None
        assert job["node_id"] == "node-a"
        return job

    def claim(self, job_id: str) -> None:
        self.acknowledged[job_id] = expect_json(self.agent.claim(job_id), 200)

    def finish(self, job_id: str) -> None:
        reply = self.agent.report(job_id, 0, stdout="out")
        self.acknowledged[job_id] = expect_json(reply, 200)

    def check_refusals(self, pending: str, running: str) -> None:
        """Every kind of write answers 503 with the store's message, and changes nothing."""
        assert self.submit()[0] == 503
        expect_error(self.agent.claim(pending), 503, errors.STORE_UNAVAILABLE)
        expect_error(self.agent.report(running, 0), 503, errors.STORE_UNAVAILABLE)
        expect_error(self.api.post(f"/jobs/{pending}/cancel"), 503, errors.STORE_UNAVAILABLE)
        assert without_waiting_for(self.api.job(pending)) == self.acknowledged[pending]
        assert self.api.job(running) == self.acknowledged[running]

    def check_reads(self, pending: str) -> None:
        """Reads are served from memory: a failing disk does not stop them."""
        listed = {job["job_id"]: job for job in self.api.listed(limit=10000)}
        for job_id, job in self.acknowledged.items():
            assert listed[job_id] == job
            assert without_waiting_for(self.api.job(job_id)) == job
        assert pending in [job.job_id for job in self.agent.poll()]

    def check_unhealthy(self) -> None:
        reply = self.api.get("/health")
        body = expect_json(reply, 503)
        assert body["status"] == "unhealthy"
        assert body["error"].startswith("job store cannot be written"), body

    def check_on_disk(self, url: str) -> None:
        """After a restart: every acknowledged version is there, no refused submission is."""
        api = Api(url)
        listed = {job["job_id"]: job for job in api.listed(limit=10000)}
        api.close()
        for job_id, job in self.acknowledged.items():
            assert listed.get(job_id) == job, (job, listed.get(job_id))
        commands = {job["command"] for job in listed.values()}
        for token in self.refused_tokens:
            assert f"echo {token}" not in commands, "a refused submission was saved"

    def close(self) -> None:
        self.api.close()
        self.agent.close()


def only_node_a(registry: FakeRegistry) -> None:
    registry.remove_node("node-b")
    registry.remove_node("node-c")


# --- the faults ----------------------------------------------------------------------------------


def test_full_disk_refuses_writes_keeps_reads_and_heals_by_itself(
    small_disk: Path, tmp_path: Path, registry: FakeRegistry
) -> None:
    only_node_a(registry)
    db_path = small_disk / "scheduler.db"
    proc = start_scheduler(db_path, tmp_path / "scheduler.log", registry.url, ENV)
    client = Client(proc.url)
    try:
        running = client.on_node_a()["job_id"]
        client.claim(running)
        pending = client.on_node_a()["job_id"]
        filler = fill(small_disk)

        # The write-ahead log may still have room for a few commits: keep submitting until the
        # store runs out. Every job acknowledged on the way must survive.
        wait_for(lambda: client.submit()[0] == 503, timeout=60, message="a write to fail")
        client.check_refusals(pending, running)
        client.check_unhealthy()
        client.check_reads(pending)

        filler.unlink()
        wait_for(
            lambda: client.api.get("/health").status_code == 200,
            timeout=30,
            message="/health to recover once space is back",
        )
        assert expect_json(client.api.get("/health"), 200)["status"] == "healthy"
        client.on_node_a()
        client.claim(pending)
        client.finish(running)
    finally:
        stop_scheduler(proc)
    client.close()

    again = start_scheduler(db_path, tmp_path / "again.log", registry.url, ENV)
    try:
        client.check_on_disk(again.url)
    finally:
        stop_scheduler(again)


def test_file_system_turning_read_only_refuses_writes_and_loses_nothing(
    ext4: Ext4, tmp_path: Path, registry: FakeRegistry
) -> None:
    only_node_a(registry)
    db_path = ext4.mountpoint / "scheduler.db"
    proc = start_scheduler(db_path, tmp_path / "scheduler.log", registry.url, ENV)
    client = Client(proc.url)
    try:
        running = client.on_node_a()["job_id"]
        client.claim(running)
        pending = client.on_node_a()["job_id"]
        for _ in range(5):
            client.on_node_a()
        ext4.fail()
        client.check_refusals(pending, running)
        client.check_unhealthy()
        client.check_reads(pending)
        # Nothing heals a read-only remount from inside: it stays refused, and says so.
        client.check_refusals(pending, running)
        client.check_unhealthy()
    finally:
        stop_scheduler(proc)
    client.close()

    ext4.repair()
    again = start_scheduler(db_path, tmp_path / "again.log", registry.url, ENV)
    try:
        client.check_on_disk(again.url)
        api = Api(again.url)
        expect_json(api.post("/jobs", {"command": "after the repair"}), 201)
        api.close()
    finally:
        stop_scheduler(again)


# --- faults found while nobody writes: the health probe ---------------------------------------

PROBE_WITHIN = 15.0
"""Seconds /health may take to find a fault on an idle daemon (its probe runs every ~2 s)."""


def health(api: Api) -> tuple[int, dict[str, Any]]:
    reply = api.get("/health")
    return reply.status_code, expect_json(reply, reply.status_code)


def wait_unhealthy(api: Api, fault: str, timeout: float = PROBE_WITHIN) -> dict[str, Any]:
    """Wait for /health to say 503 after `fault`; prints how long it took (`pytest -s -n 0`)."""
    started = time.monotonic()
    wait_for(lambda: health(api)[0] == 503, timeout=timeout, message="/health to say 503")
    print(f"/health said unhealthy {time.monotonic() - started:.1f}s after {fault}")
    status, body = health(api)
    assert status == 503 and body["status"] == "unhealthy", body
    return body


def test_a_disk_that_fills_while_idle_turns_health_unhealthy(
    small_disk: Path, tmp_path: Path, registry: FakeRegistry
) -> None:
    """No request writes anything after the disk fills: only the probe can find out."""
    proc = start_scheduler(small_disk / "scheduler.db", tmp_path / "scheduler.log", registry.url)
    api = Api(proc.url)
    try:
        api.submit()
        assert health(api)[0] == 200
        filler = fill(small_disk)
        body = wait_unhealthy(api, "the disk filled while idle")
        assert "No space left on device" in body["error"] or "full" in body["error"], body
        filler.unlink()
        wait_for(lambda: health(api)[0] == 200, timeout=PROBE_WITHIN, message="/health to heal")
        api.submit()
    finally:
        api.close()
        stop_scheduler(proc)


def test_a_file_system_turning_read_only_while_idle_turns_health_unhealthy(
    ext4: Ext4, tmp_path: Path, registry: FakeRegistry
) -> None:
    proc = start_scheduler(ext4.mountpoint / "scheduler.db", tmp_path / "s.log", registry.url)
    api = Api(proc.url)
    try:
        api.submit()
        assert health(api)[0] == 200
        ext4.fail()
        wait_unhealthy(api, "a read-only remount while idle")
    finally:
        api.close()
        stop_scheduler(proc)


def test_a_disk_that_stops_answering_turns_health_unhealthy(
    ext4: Ext4, tmp_path: Path, registry: FakeRegistry
) -> None:
    """`fsfreeze` makes every write to the file system wait (as a hung disk or a stuck
    network volume would): the probe's commit hangs, and /health must not go on reporting the
    verdict from before. When the file system thaws, the commit completes and all is well."""
    proc = start_scheduler(ext4.mountpoint / "scheduler.db", tmp_path / "s.log", registry.url)
    api = Api(proc.url)
    try:
        api.submit()
        run("fsfreeze", "--freeze", str(ext4.mountpoint))
        try:
            body = wait_unhealthy(api, "fsfreeze", timeout=STORE_STALL_SECS + PROBE_WITHIN)
            assert "a write has waited" in body["error"], body
        finally:
            run("fsfreeze", "--unfreeze", str(ext4.mountpoint))
        wait_for(lambda: health(api)[0] == 200, timeout=PROBE_WITHIN, message="/health to heal")
        api.submit()
    finally:
        api.close()
        stop_scheduler(proc)


# --- files the scheduler must refuse at start-up --------------------------------------------


def make_database(db_path: Path, tmp_path: Path, registry: FakeRegistry, jobs: int) -> None:
    """A real database, written by a real scheduler: `jobs` jobs with long commands."""
    proc = start_scheduler(db_path, tmp_path / "maker.log", registry.url)
    try:
        api = Api(proc.url)
        for number in range(jobs):
            api.submit(command=f"echo {number} " + "x" * 2000)
        api.close()
    finally:
        stop_scheduler(proc)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_that_is_not_a_database_stops_start_up(
    tmp_path: Path, registry: FakeRegistry
) -> None:
    db_path = tmp_path / "scheduler.db"
    db_path.write_bytes(b"these are not the jobs you are looking for\n" * 200)
    before = digest(db_path)
    output = refused_scheduler(db_path, tmp_path, registry.url)
    assert f"tiny-scheduler: cannot open job database '{db_path}'" in output, output
    assert "file is not a database" in output, output
    assert digest(db_path) == before, "a refused file must be left as it was"


def test_a_database_with_a_damaged_page_stops_start_up(
    tmp_path: Path, registry: FakeRegistry
) -> None:
    db_path = tmp_path / "scheduler.db"
    make_database(db_path, tmp_path, registry, jobs=20)
    conn = sqlite3.connect(db_path)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'").fetchone()[0]
    conn.close()
    with open(db_path, "r+b") as f:  # scribble over the header of the jobs table's root page
        f.seek((root - 1) * page_size)
        f.write(b"\x00" * 16)
    output = refused_scheduler(db_path, tmp_path, registry.url)
    assert f"tiny-scheduler: job database '{db_path}' is corrupt" in output, output


def test_a_database_from_a_newer_scheduler_stops_start_up(
    tmp_path: Path, registry: FakeRegistry
) -> None:
    db_path = tmp_path / "scheduler.db"
    make_database(db_path, tmp_path, registry, jobs=1)
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("UPDATE schema_version SET version = ?", (schema.SCHEMA_VERSION + 1,))
    conn.close()
    before = digest(db_path)
    output = refused_scheduler(db_path, tmp_path, registry.url)
    newer = schema.SCHEMA_VERSION + 1
    assert f"has schema version {newer}, newer than the {schema.SCHEMA_VERSION}" in output, output
    assert "run a newer tiny-scheduler" in output
    assert digest(db_path) == before, "a newer scheduler's file must be left as it was"


def test_a_foreign_sqlite_file_stops_start_up_untouched(
    tmp_path: Path, registry: FakeRegistry
) -> None:
    db_path = tmp_path / "other.db"
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, amount INTEGER)")
        conn.execute("INSERT INTO invoices (amount) VALUES (42)")
    conn.close()
    before = digest(db_path)
    output = refused_scheduler(db_path, tmp_path, registry.url)
    assert "is a SQLite file but not a tiny-scheduler database" in output, output
    assert digest(db_path) == before


def test_a_database_on_a_read_only_file_system_stops_start_up(
    small_disk: Path, tmp_path: Path, registry: FakeRegistry
) -> None:
    db_path = small_disk / "scheduler.db"
    make_database(db_path, tmp_path, registry, jobs=1)
    run("mount", "-o", "remount,ro", str(small_disk))
    output = refused_scheduler(db_path, tmp_path, registry.url)
    # Found by the preflight check, before SQLite is asked (which would only say it cannot).
    assert (
        f"tiny-scheduler: SCHEDULER_DB: the directory {small_disk} for the database {db_path} "
        "is on a read-only file system"
    ) in output, output


UNREADABLE = {
    "invalid UTF-8": (
        "UPDATE jobs SET command = CAST(x'6563686f20ff' AS TEXT) WHERE seq = 2",
        "command is not valid UTF-8",
    ),
    "broken JSON": (
        """UPDATE jobs SET env_vars = '{"A": "1"' WHERE seq = 2""",
        "env_vars is not valid JSON",
    ),
}


@pytest.mark.parametrize("damage", sorted(UNREADABLE))
def test_a_row_that_cannot_be_read_stops_start_up_naming_file_job_and_reason(
    tmp_path: Path, registry: FakeRegistry, damage: str
) -> None:
    """Such a row passes `PRAGMA quick_check`; only reading it finds it. One line says which
    file, which job and what is wrong, without a traceback; the file is left as it was."""
    db_path = tmp_path / "scheduler.db"
    make_database(db_path, tmp_path, registry, jobs=3)
    statement, reason = UNREADABLE[damage]
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute(statement)
    conn.close()
    checkpoint(db_path)
    before = digest(db_path)
    output = refused_scheduler(db_path, tmp_path, registry.url)
    line = f"tiny-scheduler: job database '{db_path}': job job-2 cannot be read: {reason}"
    assert line in output, output
    assert "Worker failed to boot" not in output, output
    assert digest(db_path) == before


# --- older files are brought up to date ------------------------------------------------------


def test_an_empty_file_becomes_a_current_database(tmp_path: Path, registry: FakeRegistry) -> None:
    """Version 0 is the only older schema there has been: a file with no tables at all (what
    `touch` leaves, or SQLite before the first start). It is migrated, not refused."""
    db_path = tmp_path / "scheduler.db"
    db_path.touch()
    proc = start_scheduler(db_path, tmp_path / "scheduler.log", registry.url)
    try:
        api = Api(proc.url)
        assert api.submit()["job_id"] == "job-1"
        api.close()
    finally:
        stop_scheduler(proc)
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [
        (schema.SCHEMA_VERSION,)
    ]
    conn.close()


@pytest.fixture
def next_schema(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Pretend this scheduler is one schema version ahead of the files it finds: the way the
    migration path gets exercised before a real second version exists."""
    monkeypatch.setattr(schema, "SCHEMA_VERSION", schema.SCHEMA_VERSION + 1)
    yield


def test_a_file_of_the_previous_version_is_migrated_keeping_every_job(
    tmp_path: Path, registry: FakeRegistry, next_schema: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    db_path = tmp_path / "scheduler.db"
    make_database(db_path, tmp_path, registry, jobs=3)  # gunicorn runs the real, older one
    conn = sqlite3.connect(db_path)
    before = conn.execute("SELECT * FROM jobs ORDER BY seq").fetchall()
    conn.close()
    step = schema.Step(
        schema.SCHEMA_VERSION,
        sqlite=(
            "ALTER TABLE jobs ADD COLUMN note TEXT",
            "CREATE INDEX jobs_by_node ON jobs (node_id)",
        ),
    )
    monkeypatch.setattr(schema, "STEPS", (*schema.STEPS, step))

    # Not the make_app fixture: the app must be stopped (its file let go) before the file is
    # read back below.
    app = create_app(Settings(db_path=str(db_path), registry_url=registry.url))
    with app.test_client() as http:
        listed = http.get("/jobs").get_json()
    stop_background(app)

    assert [job["job_id"] for job in listed] == ["job-1", "job-2", "job-3"]
    conn = sqlite3.connect(db_path)
    version = conn.execute("SELECT version FROM schema_version").fetchall()
    after = conn.execute("SELECT * FROM jobs ORDER BY seq").fetchall()
    conn.close()
    assert version == [(schema.SCHEMA_VERSION,)]
    assert after == [(*row, None) for row in before], "a migration must keep every job"


def test_a_failing_migration_leaves_the_file_as_it_was(
    tmp_path: Path, registry: FakeRegistry, next_schema: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    db_path = tmp_path / "scheduler.db"
    make_database(db_path, tmp_path, registry, jobs=3)
    checkpoint(db_path)
    before = digest(db_path)
    step = schema.Step(
        schema.SCHEMA_VERSION,
        sqlite=(
            "ALTER TABLE jobs ADD COLUMN note TEXT",
            "ALTER TABLE no_such_table ADD COLUMN x TEXT",
        ),
    )
    monkeypatch.setattr(schema, "STEPS", (*schema.STEPS, step))
    with pytest.raises(storage.StoreOpenError, match="no such table"):
        storage.check(str(db_path))
    checkpoint(db_path)
    assert digest(db_path) == before, "half a migration was left in the file"


def checkpoint(db_path: Path) -> None:
    """Fold the write-ahead log into the file, so that the file's bytes say it all."""
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    assert not os.path.exists(f"{db_path}-wal") or os.path.getsize(f"{db_path}-wal") == 0


# --- a change the database cannot take -----------------------------------------------------


def save_within(db: storage.Writer, job: Job, timeout: float = 10.0) -> BaseException | None:
    """Save on another thread; the error it raised, None on success. A save that never
    returns (a turn to commit never passed on) fails the test instead of hanging it."""
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            db.save(job)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout)
    assert outcome, f"save of {job.job_id} never returned: the group commit is stuck"
    return outcome[0]


def test_a_change_sqlite_cannot_take_fails_alone_and_the_writer_goes_on(tmp_path: Path) -> None:
    """No HTTP request can carry text that is not valid Unicode (the decoder refuses lone
    surrogates), but other ways in (a peer's message id, a future field) might: one such
    change must fail on its own, not stop the group commit every write waits for."""
    db = storage.Writer(sqlite.SqliteStore(str(tmp_path / "scheduler.db")))
    db.start()
    try:
        bad = Job(seq=1, node_id="node-a", command="echo \ud800", created_at=1)
        error = save_within(db, bad)
        assert isinstance(error, errors.StoreError), error
        assert save_within(db, Job(seq=2, node_id="node-a", command="ok", created_at=2)) is None
        assert db.healthy, "a bad change is not a broken disk"
    finally:
        db.close()
    reopened = sqlite.SqliteStore(str(tmp_path / "scheduler.db"))
    try:
        loaded = reopened.load().jobs
    finally:
        reopened.close()
    assert [job.seq for job in loaded] == [2]
