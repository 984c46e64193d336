"""What if? (issue 38): known outcomes of the replay on the in-memory path, the changes and
their errors, and `tiny-scheduler simulate` on a history the real SQLite store wrote.

The replay's decisions are the service's own (placement, fit, limits): the expectations here
are the ones the pure tests of those rules predict (tests/test_fit.py for the placements).
The replay of a history a real daemon and real agents made is tests/test_simulate_cluster.py.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tiny_scheduler.cli import main
from tiny_scheduler.domain.jobs import DONE, FAILED, Job
from tiny_scheduler.domain.nodes import NodeRecord
from tiny_scheduler.domain.queues import QueueSettings
from tiny_scheduler.simulate import changes, history, report
from tiny_scheduler.simulate.changes import ChangeError, Changes
from tiny_scheduler.simulate.history import History, Node, PastJob
from tiny_scheduler.simulate.replay import Outcome, Setup, replay
from tiny_scheduler.storage import Batch
from tiny_scheduler.storage.base import JobStore
from tiny_scheduler.storage.postgres import PostgresStore
from tiny_scheduler.storage.sqlite import SqliteStore

T0 = 1_800_000_000_000_000
US = 1_000_000
SINCE = "2027-01-01T00:00:00Z"  # before T0: every job of these histories


def burst(count: int, secs: float = 1.0, node: str = "node-0", **fields: Any) -> list[PastJob]:
    """`count` jobs all arriving at T0, each running `secs` (where and when they ran is
    unused here)."""
    run = round(secs * US)
    return [PastJob(n, T0, T0, T0 + run, node, **fields) for n in range(1, count + 1)]


def equal_nodes(count: int) -> list[Node]:
    return [Node(f"node-{n}", 1) for n in range(count)]


def makespan(outcome: Outcome) -> float:
    return (max(run.end for run in outcome.runs.values()) - T0) / US


# --- known outcomes -------------------------------------------------------------------------


def test_two_equal_nodes_run_a_hundred_one_second_jobs_in_fifty_seconds() -> None:
    past = history.build(burst(100), equal_nodes(2))
    outcome = replay(past.jobs, Setup(past.nodes))
    assert makespan(outcome) == 50.0
    assert len(outcome.runs) == 100 and outcome.overfilled == 0


def test_a_node_more_makes_it_thirty_four_seconds() -> None:
    past = history.build(burst(100), equal_nodes(2))
    setup = changes.setup_of(past, Changes(nodes="+1", claim_latency_secs=0))
    assert [node.node_id for node in setup.nodes] == ["node-0", "node-1", "node-0-copy-1"]
    assert makespan(replay(past.jobs, setup)) == 34.0


def test_a_queue_capped_at_one_runs_its_jobs_one_after_another() -> None:
    nightly = burst(10, queue="nightly")
    past = history.build(nightly, equal_nodes(3))
    free = replay(past.jobs, changes.as_it_was(past, 0))
    assert makespan(free) == 4.0  # 10 jobs on 3 nodes
    setup = changes.setup_of(past, Changes(queues={"nightly": 1}, claim_latency_secs=0))
    capped = replay(past.jobs, setup)
    starts = sorted(run.start for run in capped.runs.values())
    assert starts == [T0 + n * US for n in range(10)]  # serial: each starts as one ends


def test_a_user_capped_at_one_runs_one_job_at_a_time() -> None:
    past = history.build(burst(4, owner="ann"), equal_nodes(2))
    setup = changes.setup_of(past, Changes(users={"ann": 1}, claim_latency_secs=0))
    assert makespan(replay(past.jobs, setup)) == 4.0


def test_binpack_and_least_loaded_place_as_the_pure_placement_tests_predict() -> None:
    # tests/test_fit.py::test_binpack_fills_the_busiest_node_that_fits_and_least_loaded_spreads:
    # the same three nodes and three one-CPU jobs.
    nodes = [
        Node("small", 2, 4096),
        Node("big", 8, 32768, labels={"zone": "b"}),
        Node("gpu", 4, 16384, 2, {"gpu": "a100"}),
    ]
    past = history.build(burst(3, secs=5, node="small", timeout_secs=10), nodes)
    placed = {}
    for placement in ("binpack", "least-loaded"):
        setup = changes.setup_of(past, Changes(placement=placement, claim_latency_secs=0))
        runs = replay(past.jobs, setup).runs
        placed[placement] = [runs[seq].node_id for seq in (1, 2, 3)]
    assert placed == {"binpack": ["small", "small", "gpu"], "least-loaded": ["big", "gpu", "small"]}


def test_a_job_starts_only_after_the_job_it_depends_on_and_the_claim_latency() -> None:
    first = PastJob(1, T0, T0, T0 + 3 * US, "node-0")
    second = PastJob(2, T0, T0 + 3 * US, T0 + 4 * US, "node-0", depends_on=(1,))
    past = history.build([first, second], equal_nodes(2))
    runs = replay(past.jobs, changes.as_it_was(past, 0.25)).runs
    assert runs[1].start == T0 + US // 4
    assert runs[2].start == runs[1].end + US // 4  # not on the free node before that


def test_a_job_no_node_of_the_what_if_can_run_is_reported_with_its_dependents() -> None:
    past = history.build(
        [
            PastJob(1, T0, T0, T0 + US, "a", cpus=4),
            PastJob(2, T0, T0, T0 + US, "a", depends_on=(1,)),
        ],
        [Node("a", 4)],
    )
    outcome = replay(past.jobs, Setup([Node("b", 2)]))
    assert outcome.runs == {}
    assert outcome.refused[1].startswith("no node can run this job: needs 4 cpus")
    assert outcome.refused[2] == "depends on job-1, which could not run"


# --- the history's rules ----------------------------------------------------------------------


def test_the_claim_latency_is_what_the_history_shows() -> None:
    # On one node: each job starts 0.3 s after the previous one ended (or after it arrived).
    jobs = []
    for n in range(5):
        start = T0 + n * 1_300_000 + 300_000
        jobs.append(PastJob(n + 1, T0, start, start + US, "a"))
    assert changes.observed_latency(history.build(jobs, [Node("a", 1)])) == 0.3


def test_dependencies_outside_the_window_are_dropped_and_arrivals_follow_dependencies() -> None:
    outside = PastJob(5, T0 + 9 * US, T0 + 9 * US, T0 + 10 * US, "a", depends_on=(1,))
    early = PastJob(6, T0, T0 + 10 * US, T0 + 11 * US, "a", depends_on=(5,))
    past = history.build([early, outside])
    assert [(job.seq, job.depends_on, job.arrival) for job in past.jobs] == [
        (5, (), T0 + 9 * US),
        (6, (5,), T0 + 9 * US),
    ]
    assert past.nodes == [Node("a", 1)]  # no facts: the most CPUs it ran at once


def test_jobs_without_a_node_make_no_node_of_their_own() -> None:
    """Jobs drawn rather than run (no node yet, as the bench's week before its first replay)
    are sized onto the nodes given, not onto a node called "" as large as all of them."""
    drawn = [PastJob(n, T0, T0, T0 + US, "", cpus=4) for n in range(1, 11)]
    assert history.build(drawn, equal_nodes(2)).nodes == equal_nodes(2)


def test_a_summary_has_waits_per_queue_and_user_and_utilization() -> None:
    jobs = [
        PastJob(1, T0, T0, T0 + 2 * US, "a", queue="nightly", owner="ann"),
        PastJob(2, T0, T0 + 2 * US, T0 + 4 * US, "a", owner="bob"),
    ]
    past = history.build(jobs, [Node("a", 2)])
    summary = report.summarize(past.jobs, report.as_happened(past), past.nodes)
    assert summary.wait == {"p50": 0.0, "p95": 2.0, "p99": 2.0}
    assert summary.queues["nightly"] == {"jobs": 1, "p50": 0.0, "p95": 0.0, "p99": 0.0}
    assert summary.users["bob"]["p50"] == 2.0
    assert (summary.makespan_secs, summary.utilization) == (4.0, {"a": 0.5})


# --- changes that cannot apply ----------------------------------------------------------------


def small_history() -> History:
    return history.build(burst(2, queue="nightly", owner="ann"), equal_nodes(1))


def test_an_unknown_queue_or_user_is_an_error_naming_it() -> None:
    with pytest.raises(ChangeError, match=r"--queue nightlly: no queue of that name .*nightly"):
        changes.setup_of(small_history(), Changes(queues={"nightlly": 3}))
    with pytest.raises(ChangeError, match="--user bob: no user of that name"):
        changes.setup_of(small_history(), Changes(users={"bob": 1}))
    with pytest.raises(ChangeError, match="--queue 'nightly=0': N must be"):
        changes.limit_pairs("--queue", ["nightly=0"])


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ('[{"node_id": "a", "cpus": 4, "memroy_mb": 1}]', "node 1: unknown field 'memroy_mb'"),
        ('[{"node_id": "a", "cpus": "4"}]', "node 1: cpus must be int, not '4'"),
        ('[{"node_id": "a"}]', r"node 1 \(a\): cpus must be at least 1"),
        ('[{"node_id": "a b", "cpus": 1}]', "node 1: node_id must be"),
        ('{"node_id": "a"}', "must be a non-empty JSON list"),
        ("[{", "not JSON"),
    ],
)
def test_a_node_file_with_a_wrong_field_is_an_error_naming_it(
    tmp_path: Path, content: str, error: str
) -> None:
    file = tmp_path / "nodes.json"
    file.write_text(content)
    with pytest.raises(ChangeError, match=error):
        changes.setup_of(small_history(), Changes(nodes=str(file)))


def test_a_node_file_replaces_the_nodes(tmp_path: Path) -> None:
    file = tmp_path / "nodes.json"
    file.write_text('[{"node_id": "x", "cpus": 2, "labels": {"disk": "ssd"}}]')
    setup = changes.setup_of(small_history(), Changes(nodes=str(file)))
    assert setup.nodes == [Node("x", 2, labels={"disk": "ssd"})]


# --- the command, on a history the real SQLite store wrote -------------------------------------


def stored_job(seq: int, node: str, start_s: float, secs: float, **fields: Any) -> Job:
    start = T0 + round(start_s * US)
    return Job(
        seq,
        node,
        command="true",
        status=fields.pop("status", DONE),
        created_at=T0,
        running_at=start,
        finished_at=start + round(secs * US),
        **fields,
    )


def write_history(path: Path | str) -> JobStore:
    """Twenty one-second jobs of ann's on two one-CPU nodes, in order, the first ten in
    `nightly` (capped at 4), one failed, into a SQLite file (the store stays open: the
    daemon's lock held) or a PostgreSQL database."""
    store: JobStore = PostgresStore(path) if isinstance(path, str) else SqliteStore(str(path))
    store.load()
    jobs = [
        stored_job(
            n + 1,
            "a" if n % 2 == 0 else "b",
            n // 2,
            1,
            queue="nightly" if n < 10 else "default",
            owner="ann",
            status=FAILED if n == 3 else DONE,
        )
        for n in range(20)
    ]
    nodes = [NodeRecord("a", 1), NodeRecord("b", 1)]
    store.write(Batch(upserts=jobs, nodes=nodes, queue_settings=[QueueSettings("nightly", 4)]))
    return store


@pytest.fixture
def db(tmp_path: Path) -> Any:
    path = tmp_path / "scheduler.db"
    store = write_history(path)
    yield path
    store.close()


def simulate(*args: str) -> Result:
    return CliRunner().invoke(main, ["simulate", *args])


def test_simulate_with_no_changes_reproduces_the_history_beside_it(db: Path) -> None:
    # The store holds its lock file meanwhile, as a running daemon does: a reader takes none.
    done = simulate("--db", str(db), "--since", SINCE, "--json")
    assert done.exit_code == 0, done.output
    compared = json.loads(done.stdout)
    assert compared["history"] == compared["what_if"]
    assert compared["history"]["jobs"] == 20 and compared["history"]["makespan_secs"] == 10.0
    assert set(compared["history"]["wait"]) == {"p50", "p95", "p99"}
    assert compared["most_changed"] == [] and compared["claim_latency_secs"] == 0.0


def test_simulate_reads_a_postgresql_history(postgres_database: Any) -> None:
    url = postgres_database.create()
    write_history(url).close()
    done = simulate("--db", url, "--since", SINCE, "--json")
    assert done.exit_code == 0, done.output
    compared = json.loads(done.stdout)
    assert compared["history"]["jobs"] == 20 and compared["history"] == compared["what_if"]


def test_simulate_shows_a_what_if_side_by_side(db: Path) -> None:
    done = simulate("--db", str(db), "--since", SINCE, "--nodes", "+2")
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["history", "what", "if"]
    assert _row(lines, "makespan") == ["makespan", "10.0", "s", "5.0", "s"]
    assert _row(lines, "node a-copy-2 utilization")[:2] == ["node", "a-copy-2"]
    assert "waits that changed most:" in lines


def _row(lines: list[str], title: str) -> list[str]:
    return next(line for line in lines if line.startswith(title + " ")).split()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("--db", "missing.db"), "--db missing.db: no such file"),
        (("--db", "{notdb}"), "not a readable tiny-scheduler database"),
        (("--db", "{db}", "--queue", "nightlly=2"), "--queue nightlly: no queue of that name"),
        (("--db", "{db}", "--nodes", "+x"), "--nodes +x: give +N"),
        (("--db", "{db}", "--url", "http://x"), "give the history as --db FILE|URL or as --url"),
    ],
)
def test_bad_input_is_a_usage_error_naming_it(
    db: Path, tmp_path: Path, args: tuple[str, ...], error: str
) -> None:
    notdb = tmp_path / "notes.txt"
    notdb.write_text("not a database, only words " * 100)
    given = [arg.format(db=db, notdb=notdb) for arg in args]
    done = simulate(*given, "--since", SINCE)
    assert done.exit_code == 2, done.output
    assert error in done.stderr


DOC = Path(__file__).resolve().parent.parent / "docs" / "simulate.md"
DOC_DB = "/var/lib/tiny-scheduler/scheduler.db"
"""The database path docs/simulate.md shows, run here on the test's history."""


def documented_commands() -> list[str]:
    """The `tiny-scheduler simulate` lines of docs/simulate.md's shell blocks."""
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S)
    return [
        line
        for block in blocks
        for line in block.splitlines()
        if line.startswith("tiny-scheduler simulate")
    ]


def test_the_commands_docs_simulate_shows_run_on_a_history(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "nodes.json").write_text('[{"node_id": "x", "cpus": 4, "memory_mb": 8192}]')
    monkeypatch.chdir(tmp_path)
    commands = documented_commands()
    assert len(commands) == 4
    for command in commands:
        words = [str(db) if word == DOC_DB else word for word in shlex.split(command)[1:]]
        done = CliRunner().invoke(main, words)
        assert done.exit_code == 0, (command, done.output)
        assert "makespan" in done.stdout
