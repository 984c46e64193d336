"""The storage contract, tested once: every backend, behind the group-committing writer, gives
back exactly what was saved, never reuses an id, and fails a write loudly rather than lying;
it keeps each job's output apart, loads jobs without it, and reads it back beside the writer,
one job at a time.

A backend joins by adding one entry to `BACKENDS` (huey's StorageTests, as a fixture); the
in-memory one of the decision tests' harness is held to the same contract.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from tiny_scheduler.clock import SYSTEM
from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.audit import AuditRecord
from tiny_scheduler.domain.jobs import Attempt, Job, Output, Usage
from tiny_scheduler.domain.nodes import NodeRecord
from tiny_scheduler.domain.queues import QueueSettings
from tiny_scheduler.domain.roles import Role
from tiny_scheduler.domain.schedules import Overlap, Schedule
from tiny_scheduler.domain.tokens import Token
from tiny_scheduler.domain.validation import JobRequest
from tiny_scheduler.errors import StoreError
from tiny_scheduler.storage import JobStore, OutboxEvent, Writer
from tiny_scheduler.storage.memory import MemoryDatabase, MemoryStore
from tiny_scheduler.storage.postgres import PostgresStore
from tiny_scheduler.storage.sqlite import SqliteStore

T0 = 1_764_498_030_123_456

OpenStore = Callable[[], Writer]


def _sqlite(request: pytest.FixtureRequest) -> Callable[[], JobStore]:
    path = request.getfixturevalue("tmp_path") / "jobs.db"
    return lambda: SqliteStore(str(path))


def _postgres(request: pytest.FixtureRequest) -> Callable[[], JobStore]:
    # A fresh database of the test's own (skipped, visibly, without a server).
    url = request.getfixturevalue("postgres_database").create()
    return lambda: PostgresStore(url)


def _memory(request: pytest.FixtureRequest) -> Callable[[], JobStore]:
    # The decision tests' harness stands on it: it must keep the same contract.
    database = MemoryDatabase()
    return lambda: MemoryStore(database)


BACKENDS: dict[str, Callable[[pytest.FixtureRequest], Callable[[], JobStore]]] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
    "memory": _memory,
}
"""Backend name -> (the test's fixtures -> a function opening that test's store)."""


@pytest.fixture(params=sorted(BACKENDS))
def open_store(request: pytest.FixtureRequest) -> Iterator[OpenStore]:
    """Open (and start) a store on the test's database; all are closed at the end."""
    open_backend = BACKENDS[request.param](request)
    opened: list[Writer] = []

    def open_() -> Writer:
        store = Writer(open_backend())
        store.start()
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def reopen(store: Writer, open_store: OpenStore) -> tuple[list[Job], int]:
    """Close the store, and what a new one on the same database loads (closed again: a SQLite
    file has one owner at a time)."""
    store.close()
    again = open_store()
    loaded = again.load()
    again.close()
    return loaded.jobs, loaded.last_seq


def full_job(seq: int = 1) -> Job:
    return Job(
        seq=seq,
        node_id="node-ä",
        command="echo 'hi' \"there\" && exit 3",
        created_at=T0 + 1,
        instance_id="i-1",
        deploy_url="http://store/app.zip",
        job_type=jobs.SERVICE,
        port=65535,
        env_vars={"A": "1", "UNICODE": "€ 𝄞", "EMPTY": ""},
        timeout_secs=3600,
        not_before=T0 - 1,
        schedule_id="sched-12",
        status=jobs.FAILED,
        reason=jobs.Reason.TIMEOUT,
        retry_count=2,
        exit_code=-1,
        stdout="out\n" * 3,
        stderr="err ✗",
        running_at=T0 + 999_999,
        finished_at=T0 + 1_000_001,
        # What it needs and where it may run (Resources and fit), and what each attempt used
        # (the latest on the job; an attempt without it, as an old agent's, has none).
        cpus=4,
        memory_mb=16_777_216,
        gpus=64,
        node_selector={"gpu": "a100", "zone": "ü", "empty": ""},
        node_ids=("node-c", "gpu.rack-1_a"),
        usage=Usage(cpu_secs=12.125, max_rss_mb=512.5, wall_secs=3600.001),
        attempts=(
            Attempt("node-a", 1, "o1", "e1", T0 + 2, T0 + 3, Usage(0.0, 0.125, 1.0)),
            Attempt("node-b", None, "", "", None, None),
        ),
        dedupe_key="http:key-1",
        holds_slot=True,
        moved_from="node-z",
        depends_on=(7, 3),
        dependency=jobs.Dependency.ANY,
        priority=0,
        queue="nightly.eu-1",
    )


def test_every_field_survives_a_round_trip(open_store: OpenStore) -> None:
    store = open_store()
    minimal = Job(seq=2, node_id="node-b", command="", created_at=T0, deploy_url="http://x")
    zero_exit = Job(seq=3, node_id="n", command="true", created_at=T0, exit_code=0)
    oom = Job(
        seq=4,
        node_id="n",
        command="x",
        created_at=T0,
        status=jobs.FAILED,
        reason=jobs.Reason.OUT_OF_MEMORY,
        exit_code=-9,
        cpus=1,
        memory_mb=64,
        usage=Usage(0.5, 64.0, 2.0),
    )
    saved = [full_job(1), minimal, zero_exit, oom]
    store.save(*saved)
    loaded, last_seq = reopen(store, open_store)
    assert loaded == [job.without_output() for job in saved]
    assert last_seq == 4
    # Equal is not enough: "timeout" == Reason.TIMEOUT and 1 == True.
    assert type(loaded[0].reason) is jobs.Reason and type(loaded[0].holds_slot) is bool
    assert (loaded[1].reason, loaded[1].holds_slot, loaded[1].moved_from) == (None, False, "")
    assert type(loaded[0].dependency) is jobs.Dependency and loaded[0].depends_on == (7, 3)
    assert (loaded[1].depends_on, loaded[1].dependency, loaded[1].priority, loaded[1].queue) == (
        (),
        "ok",
        50,
        "default",
    )
    # Resources: unset is unset (no request, no usage), and the types are the job's own.
    full, unset = loaded[0], loaded[1]
    assert (unset.cpus, unset.memory_mb, unset.gpus, unset.node_selector, unset.node_ids) == (
        0,
        0,
        0,
        None,
        (),
    )
    assert unset.usage is None and unset.attempts == ()
    assert type(full.node_ids) is tuple and type(full.node_selector) is dict
    assert list(full.node_selector or {}) == ["gpu", "zone", "empty"]  # the order given
    assert type(full.usage) is Usage and full.attempts[1].usage is None
    assert type(loaded[3].reason) is jobs.Reason
    store = open_store()
    assert [job.with_output(store.read_outputs(job.seq) or {}) for job in loaded] == saved


def test_output_is_kept_by_attempt_and_a_version_without_it_erases_nothing(
    open_store: OpenStore,
) -> None:
    store = open_store()
    failed = full_job(1)
    assert store.read_outputs(1) is None
    store.save(failed)
    expected = {0: Output("o1", "e1"), 2: Output("out\n" * 3, "err ✗")}
    assert store.read_outputs(1) == expected  # attempt 1 printed nothing: no entry
    # The table keeps jobs without output, and saves such versions (here: moved elsewhere).
    store.save(failed.without_output().evolve(node_id="node-c"))
    assert store.read_outputs(1) == expected
    quiet = Job(seq=2, node_id="n", command="true", created_at=T0)
    store.save(quiet)
    assert store.read_outputs(2) == {}
    loaded, _ = reopen(store, open_store)
    assert loaded[0] == failed.without_output().evolve(node_id="node-c")
    assert open_store().read_outputs(1) == expected


def printed(seq: int) -> Job:
    """A finished job with output in its current and its first attempt, without a dedupe key
    (so that many can be saved)."""
    return full_job(seq).evolve(dedupe_key=None)


def test_deleting_a_job_deletes_its_output(open_store: OpenStore) -> None:
    store = open_store()
    store.save(printed(1), printed(2))
    store.delete([1])
    assert store.read_outputs(1) is None
    assert store.read_outputs(2) == {0: Output("o1", "e1"), 2: Output("out\n" * 3, "err ✗")}
    assert list(store.read_latest_outputs([1, 2])) == [(2, Output("out\n" * 3, "err ✗"))]


def test_the_latest_outputs_of_a_page_come_in_order_leaving_out_deleted_jobs(
    open_store: OpenStore,
) -> None:
    store = open_store()
    done = [
        jobs.finish(
            jobs.start(Job(seq=s, node_id="n", command="x", created_at=T0), T0),
            jobs.DONE,
            0,
            f"out {s}",
            "",
            T0,
        )
        for s in range(1, 601)  # more than one query's worth
    ]
    retried = jobs.retry(printed(601), "node-b")  # pending again, output in its attempts
    silent = Job(seq=602, node_id="n", command="x", created_at=T0, status=jobs.DONE)
    store.save(*done, retried, silent)
    store.delete([7, 300])
    found = list(store.read_latest_outputs(range(1, 603)))
    wanted = [(s, Output(f"out {s}", "")) for s in range(1, 601) if s not in (7, 300)]
    assert found == [*wanted, (601, None), (602, None)]
    assert list(store.read_latest_outputs([])) == []


def test_a_read_in_progress_lets_writes_through(open_store: OpenStore) -> None:
    """A listing reads its page's outputs while the client takes its time: meanwhile every
    change must still commit, and the listing must still finish."""
    store = open_store()
    store.save(*(printed(s) for s in range(1, 600)))
    reading = store.read_latest_outputs(range(1, 600))
    assert next(reading)[0] == 1
    done = threading.Event()

    def write() -> None:
        store.save(printed(700))
        store.delete([2])
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(30)
    assert done.is_set(), "a write waited for a read"
    rest = [seq for seq, _ in reading]  # job-2 is there or not, as the read saw it
    assert rest == sorted(rest) and set(range(3, 600)) <= set(rest) <= set(range(2, 600))
    assert store.read_outputs(700) is not None


def test_any_text_comes_back_exactly(open_store: OpenStore) -> None:
    # A job's output is whatever its process printed: NUL (which PostgreSQL text cannot
    # hold), every other control character, the noncharacter U+FFFF, astral characters.
    weird = "".join(map(chr, range(32))) + "\x7f \uffff\uffff0 \U0001f600 \\0 end"
    job = Job(seq=1, node_id="n", command="x", created_at=T0)
    done = jobs.finish(jobs.start(job, T0), jobs.DONE, 0, weird, "\x00", T0)
    failed = jobs.finish(jobs.start(job.evolve(seq=2), T0), jobs.FAILED, 1, weird, "", T0)
    retried = jobs.retry(failed, "m").evolve(env_vars={"K": weird})
    store = open_store()
    store.save(done, retried)
    loaded, _ = reopen(store, open_store)
    assert loaded == [done.without_output(), retried.without_output()]
    store = open_store()
    assert [j.with_output(store.read_outputs(j.seq) or {}) for j in loaded] == [done, retried]
    assert list(store.read_latest_outputs([1, 2])) == [(1, Output(weird, "\x00")), (2, None)]


def _schedule(seq: int, name: str, **changes: object) -> Schedule:
    request = JobRequest(command="echo 'it' \"is\" time", env_vars={"A": "€"}, delay_secs=5)
    schedule = Schedule(
        seq, name, "0 3 * * *", "Europe/Berlin", request, Overlap.SKIP, False, False, T0
    )
    return schedule.evolve(**changes)


def test_schedules_survive_a_restart_and_their_ids_are_never_reused(open_store: OpenStore) -> None:
    store = open_store()
    nightly = _schedule(1, "nightly", next_run_at=T0 + 7, catch_up=True)
    hourly = _schedule(2, "hourly", paused=True, overlap=Overlap.ALLOW)
    # A schedule's job may say what it needs and where it may run, as any job.
    needs = JobRequest(
        command="train",
        cpus=4,
        memory_mb=8192,
        gpus=1,
        node_selector={"gpu": "a100", "zone": "ü"},
        node_ids=("node-c", "gpu.rack-1_a"),
    )
    gpu = _schedule(3, "gpu", job=needs)
    fired = Job(seq=1, node_id="n", command="x", created_at=T0, dedupe_key="sched:1:7")
    store.save_schedule(nightly)
    store.save_schedule(hourly.evolve(last_run_at=T0 + 1, last_job_seq=1), fired)
    store.save_schedule(gpu)
    store.delete_schedule(2)
    store.close()
    loaded = open_store().load()
    assert loaded.schedules == [nightly, gpu]
    assert loaded.last_schedule_seq == 3
    assert loaded.jobs == [fired]
    assert type(loaded.schedules[1].job.node_ids) is tuple


def test_nodes_survive_a_restart_and_a_later_record_replaces_an_earlier(
    open_store: OpenStore,
) -> None:
    store = open_store()
    labelled = NodeRecord(
        "node-b",
        8,
        (("gpu", "a100"), ("rack", "r1"), ("zone", "ü")),
        "1.2",
        False,
        T0,
        memory_mb=16_777_216,
        gpus=64,
        enforcement="cgroup-v1",
    )
    store.save_nodes(NodeRecord("node-a", 2, (), "", False, T0), labelled)
    # A later heartbeat's record: memory 0 is a number (not "unreported"), and its agent
    # could enforce nothing.
    later = NodeRecord("node-a", 4, (), "1.3", True, T0 + 5, 0, 0, "none")
    store.save_nodes(later)
    # A registry node's: nobody reported memory.
    plain = NodeRecord("node-c", 1, (), "", False, T0)
    store.save_nodes(plain)
    store.close()
    loaded = open_store().load().nodes
    assert loaded == [later, labelled, plain]
    assert (loaded[0].memory_mb, loaded[2].memory_mb, loaded[2].enforcement) == (0, None, "")


def test_timestamps_keep_every_microsecond(open_store: OpenStore) -> None:
    store = open_store()
    stamps = [T0, T0 + 1, SYSTEM.now_us(), 4_102_444_799_999_999]
    for seq, stamp in enumerate(stamps, 1):
        store.save(Job(seq=seq, node_id="n", command="x", created_at=stamp, running_at=stamp))
    loaded, _ = reopen(store, open_store)
    assert [(job.created_at, job.running_at) for job in loaded] == [(s, s) for s in stamps]


def test_saving_again_replaces_the_job(open_store: OpenStore) -> None:
    store = open_store()
    pending = Job(seq=1, node_id="n", command="x", created_at=T0)
    store.save(pending)
    running = jobs.start(pending, T0 + 5)
    store.save(running)
    loaded, _ = reopen(store, open_store)
    assert loaded == [running]


def test_the_highest_id_survives_deleting_its_job(open_store: OpenStore) -> None:
    store = open_store()
    store.save(*(Job(seq=s, node_id="n", command="x", created_at=T0) for s in (1, 2, 3)))
    store.delete([2, 3])
    loaded, last_seq = reopen(store, open_store)
    assert [job.seq for job in loaded] == [1]
    assert last_seq == 3

    store = open_store()
    store.delete([1])
    assert reopen(store, open_store) == ([], 3)


def test_a_new_file_starts_at_zero(open_store: OpenStore) -> None:
    loaded = open_store().load()
    assert (loaded.jobs, loaded.last_seq) == ([], 0)


def test_concurrent_saves_all_commit(open_store: OpenStore) -> None:
    store = open_store()
    errors: list[BaseException] = []

    def writer(first: int) -> None:
        try:
            for seq in range(first, first + 25):
                store.save(Job(seq=seq, node_id="n", command=str(seq), created_at=T0 + seq))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(1 + 25 * n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    loaded, last_seq = reopen(store, open_store)
    assert [job.seq for job in loaded] == list(range(1, 201))
    assert last_seq == 200


def test_a_failed_write_raises_and_marks_the_store_unhealthy_until_one_succeeds(
    open_store: OpenStore,
) -> None:
    store = open_store()
    store.save(Job(seq=1, node_id="n", command="x", created_at=T0, dedupe_key="k"))
    # A second job with the same dedupe key breaks the UNIQUE constraint.
    with pytest.raises(StoreError):
        store.save(Job(seq=2, node_id="n", command="x", created_at=T0, dedupe_key="k"))
    assert not store.healthy
    assert store.probe()
    assert store.healthy
    loaded, _ = reopen(store, open_store)
    assert [job.seq for job in loaded] == [1]


def test_a_closed_store_refuses_writes(open_store: OpenStore) -> None:
    store = open_store()
    store.close()
    with pytest.raises(StoreError):
        store.save(Job(seq=1, node_id="n", command="x", created_at=T0))


# --- the outbox ------------------------------------------------------------------------------


def event(seq: int, text: str = "") -> OutboxEvent:
    return OutboxEvent(seq, text or f'{{"job_id":"job-{seq}","status":"done"}}')


def test_events_are_stored_with_their_change_and_read_back_oldest_first(
    open_store: OpenStore,
) -> None:
    store = open_store()
    store.save(Job(seq=1, node_id="n", command="x", created_at=T0), events=[event(1)])
    store.save(
        Job(seq=2, node_id="n", command="x", created_at=T0),
        Job(seq=3, node_id="n", command="x", created_at=T0),
        events=[event(3, '€ 𝄞 "quoted"\n'), event(2)],
    )
    waiting = store.outbox(10)
    assert [(e.seq, e.message) for e in waiting] == [
        (1, event(1).message),
        (3, '€ 𝄞 "quoted"\n'),
        (2, event(2).message),
    ]
    assert len({e.id for e in waiting}) == 3
    assert store.events_waiting == 3
    assert [e.seq for e in store.outbox(2)] == [1, 3]


def test_delivered_events_leave_the_outbox_and_the_rest_survive_a_restart(
    open_store: OpenStore,
) -> None:
    store = open_store()
    for seq in (1, 2, 3):
        store.save(Job(seq=seq, node_id="n", command="x", created_at=T0), events=[event(seq)])
    first, second, third = store.outbox(10)
    store.delivered([first.id, third.id])
    assert store.outbox(10) == [second]
    assert store.events_waiting == 1
    store.close()

    store = open_store()
    assert store.load().events == 1
    assert store.events_waiting == 1
    assert store.outbox(10) == [second]
    # New events come after the ones still waiting, also after a restart.
    store.save(Job(seq=4, node_id="n", command="x", created_at=T0), events=[event(4)])
    assert [e.seq for e in store.outbox(10)] == [2, 4]


def test_an_event_is_stored_exactly_when_its_change_is(open_store: OpenStore) -> None:
    store = open_store()
    store.save(Job(seq=1, node_id="n", command="x", created_at=T0, dedupe_key="k"))
    # The job cannot be stored (its dedupe key is taken): neither is its event.
    with pytest.raises(StoreError):
        store.save(
            Job(seq=2, node_id="n", command="x", created_at=T0, dedupe_key="k"), events=[event(2)]
        )
    assert store.outbox(10) == []
    assert store.events_waiting == 0


def test_a_bad_change_does_not_take_its_neighbours_events_with_it(open_store: OpenStore) -> None:
    """Changes committed together (group commit) keep their events when one of them fails."""
    store = open_store()
    store.save(Job(seq=1, node_id="n", command="x", created_at=T0, dedupe_key="taken"))
    outcomes: dict[int, bool] = {}

    def save(seq: int, key: str | None) -> None:
        try:
            job = Job(seq=seq, node_id="n", command="x", created_at=T0, dedupe_key=key)
            store.save(job, events=[event(seq)])
            outcomes[seq] = True
        except StoreError:
            outcomes[seq] = False

    threads = [
        threading.Thread(target=save, args=(seq, "taken" if seq == 5 else None))
        for seq in range(2, 9)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert outcomes == {seq: seq != 5 for seq in range(2, 9)}
    assert sorted(e.seq for e in store.outbox(100)) == [2, 3, 4, 6, 7, 8]
    assert store.events_waiting == 6


def test_queue_settings_survive_a_restart_and_a_second_save_replaces_the_first(
    open_store: OpenStore,
) -> None:
    store = open_store()
    store.save_queue(QueueSettings("nightly", max_running=4))
    store.save_queue(QueueSettings("batch.eu-1", max_running=None, paused=True))
    store.save_queue(QueueSettings("nightly", max_running=2, paused=True))
    store.close()
    loaded = open_store().load()
    assert loaded.queues == [
        QueueSettings("batch.eu-1", None, True),
        QueueSettings("nightly", 2, True),
    ]
    assert type(loaded.queues[0].paused) is bool


def test_an_arrays_jobs_are_saved_in_one_batch_and_keep_their_comforts(
    open_store: OpenStore,
) -> None:
    """An array is one save of many jobs (Batch comforts): all of them or none, each with its
    name, place in the array, hold, retry count limit and the job it retries."""
    store = open_store()
    array = [
        Job(
            seq=seq,
            node_id=f"node-{seq % 3}",
            command="run.sh",
            created_at=T0,
            env_vars={"TINY_ARRAY_INDEX": str(seq - 1)},
            name="sweep ä",
            max_retries=0 if seq == 1 else 10,
            array_id=1,
            array_index=seq - 1,
            held=seq % 2 == 0,
            retry_of=seq + 5000,
        )
        for seq in range(1, 1001)
    ]
    store.save(*array)
    loaded, last_seq = reopen(store, open_store)
    assert loaded == array and last_seq == 1000
    first, second = loaded[0], loaded[1]
    assert (first.max_retries, first.array_index, first.held) == (0, 0, False)
    assert type(second.held) is bool and second.held and second.array_index == 1
    unset = Job(seq=1001, node_id="n", command="true", created_at=T0)
    store = open_store()
    store.save(unset)
    loaded, _ = reopen(store, open_store)
    assert (loaded[-1].max_retries, loaded[-1].array_index, loaded[-1].array_id) == (None, None, 0)


def test_tokens_and_audit_records_survive_a_restart_and_ids_are_never_reused(
    open_store: OpenStore,
) -> None:
    """Tokens (only their digests) and the audit trail are stored on every backend; a revoked
    token and a record past the retention are gone, and their ids stay taken."""
    store = open_store()
    kept = Token(1, "alice", Role.USER, "d1" * 32, 10, "", None)
    agent = Token(2, "agent-a", Role.AGENT, "d2" * 32, 11, "node-a", 99)
    revoked = Token(3, "mallory", Role.VIEWER, "d3" * 32, 12)
    for token in (kept, agent, revoked):
        store.save_token(token)
    store.delete_token(3)
    old = AuditRecord(1, 5, "", "admin", "10.0.0.1", "drain", "node-a", 200)
    new = AuditRecord(2, 50, "alice", "user", "10.0.0.2", "cancel", "job-7", 403)
    store.save_audit(old, new)
    store.delete_audit([1])
    assert store.read_token("d2" * 32) == agent
    assert store.read_token("d3" * 32) is None
    store.close()
    loaded = open_store().load()
    assert loaded.tokens == [kept, agent]
    assert loaded.last_token_seq == 3
    assert loaded.audit == [new]
    assert loaded.last_audit_id == 2
