"""Finished jobs' output lives on disk, not in the worker's memory: the real daemon under
gunicorn, many jobs of 1 MiB stdout and 1 MiB stderr each. The worker stays small (also right
after a restart, which does not read the output back), a listing over all of them is streamed
with the same bytes as before and barely raises the worker's peak memory, even three at once,
and the agent's poll does not touch the disk at all.

Memory figures are the worker's own, from /proc (VmRSS, and VmHWM for peaks). The issue's
figure is 10,000 such jobs (`make soak` runs it: test_the_issues_figure_10000_jobs); the
ordinary run uses fewer, enough that memory following the output (300 MiB of it) could not
pass the same bounds.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

import pytest
import requests
from conftest import SchedulerFactory, stop_scheduler
from helpers import Agent, Api, compact, expect_error, expect_json

from tiny_scheduler import errors
from tiny_scheduler.config import DEFAULT_MAX_OUTPUT_BYTES
from tiny_scheduler.dev.daemon import SchedulerProcess, memory_bytes, reset_peak_memory
from tiny_scheduler.domain.validation import DEFAULT_PAGE

MB = 1_000_000
WORKER_BOUND = 150 * MB
"""Worker resident size with every job finished (the issue's figure)."""

LISTING_BOUND = 64 * MB
"""How much a listing over all of them may raise the worker's peak (the issue's figure)."""

CLIENTS = 4


def output(seq: int, stream: str) -> str:
    """1 MiB (MAX_OUTPUT_BYTES: kept whole) of text that says whose it is."""
    line = f"{stream} of job {seq:07d}: " + "x" * 36 + "\n"
    text = line * (DEFAULT_MAX_OUTPUT_BYTES // len(line) + 1)
    return text[:DEFAULT_MAX_OUTPUT_BYTES]


def finish_jobs(daemon: SchedulerProcess, node: str, count: int) -> list[dict[str, Any]]:
    """`count` jobs, each claimed and reported done with 1 MiB of stdout and of stderr, by
    CLIENTS agents at once. The replies to the reports, in id order, their output replaced
    by None (`output()` gives it back; the test does not hold gigabytes)."""
    api = Api(daemon.url)
    ids = [api.submit(command=f"noisy {n}")["job_id"] for n in range(count)]
    api.close()
    replies: dict[str, dict[str, Any]] = {}
    failures: list[BaseException] = []

    def work(share: list[str]) -> None:
        agent = Agent(daemon.url, node)
        try:
            for job_id in share:
                expect_json(agent.claim(job_id), 200)
                seq = int(job_id.removeprefix("job-"))
                stdout, stderr = output(seq, "out"), output(seq, "err")
                done = expect_json(agent.report(job_id, 0, stdout=stdout, stderr=stderr), 200)
                assert (done["stdout"], done["stderr"]) == (stdout, stderr)
                done["stdout"] = done["stderr"] = None  # in place: the keys keep their order
                replies[job_id] = done
        except BaseException as exc:
            failures.append(exc)
        finally:
            agent.close()

    threads = [threading.Thread(target=work, args=(ids[n::CLIENTS],)) for n in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    return [replies[job_id] for job_id in ids]


def expected_listing(replies: list[dict[str, Any]]) -> str:
    """The sha256 of a listing of these jobs as the contract writes it: the compact JSON of
    each job exactly as the reply to its report showed it."""
    digest = hashlib.sha256(b"[")
    for index, reply in enumerate(replies):
        seq = int(reply["job_id"].removeprefix("job-"))
        job = {**reply, "stdout": output(seq, "out"), "stderr": output(seq, "err")}
        digest.update((b"," if index else b"") + compact(job))
    digest.update(b"]")
    return digest.hexdigest()


def streamed_listing(url: str, params: dict[str, str]) -> str:
    """The sha256 of a listing's body, read a piece at a time (the test holds none of it)."""
    digest = hashlib.sha256()
    with requests.get(f"{url}/jobs", params=params, stream=True, timeout=120) as response:
        assert response.status_code == 200, response.text[:200]
        assert response.headers["Content-Type"] == "application/json"
        for piece in response.iter_content(1 << 20):
            digest.update(piece)
    return digest.hexdigest()


def listings_peak(
    daemon: SchedulerProcess, params: dict[str, str], at_once: int
) -> tuple[int, list[str]]:
    """How far `at_once` listings read together raise the worker's peak memory, and the
    sha256 of each one's body."""
    pid = daemon.worker_pid
    before = memory_bytes(pid, "VmRSS")
    reset_peak_memory(pid)
    digests: list[str] = []
    failures: list[BaseException] = []

    def read() -> None:
        try:
            digests.append(streamed_listing(daemon.url, params))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=read) for _ in range(at_once)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    return memory_bytes(pid, "VmHWM") - before, digests


def check_daemon(
    daemon: SchedulerProcess, node: str, count: int, everything: str, first_page: str
) -> None:
    """The worker is small, and listings give the expected bodies (`everything`: all the
    jobs; `first_page`: the default page) while raising its peak but little."""
    rss = memory_bytes(daemon.worker_pid, "VmRSS")
    print(f"worker VmRSS with {count} jobs of 2 MiB output: {rss / MB:.0f} MB")
    assert rss < WORKER_BOUND
    growth, digests = listings_peak(daemon, {"node_id": node, "limit": "10000"}, at_once=1)
    print(f"GET /jobs?limit=10000 raised the worker's peak by {growth / MB:.1f} MB")
    assert digests == [everything]
    assert growth < LISTING_BOUND
    growth, digests = listings_peak(daemon, {"node_id": node}, at_once=3)
    print(f"three default listings at once raised it by {growth / MB:.1f} MB")
    assert digests == [first_page] * 3
    assert growth < LISTING_BOUND


def run_figures(factory: SchedulerFactory, node: str, count: int) -> None:
    daemon = factory()
    replies = finish_jobs(daemon, node, count)
    expected = (expected_listing(replies), expected_listing(replies[:DEFAULT_PAGE]))
    check_daemon(daemon, node, count, *expected)

    stop_scheduler(daemon)
    restarted = factory()
    rss = memory_bytes(restarted.worker_pid, "VmRSS")
    print(f"worker VmRSS right after a restart: {rss / MB:.0f} MB")
    assert rss < WORKER_BOUND
    check_daemon(restarted, node, count, *expected)


@pytest.mark.timeout(600)
def test_output_stays_on_disk_and_listings_stream_it(
    scheduler_factory: SchedulerFactory, node: str
) -> None:
    run_figures(scheduler_factory, node, count=100)


@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)
def test_the_issues_figure_10000_jobs(scheduler_factory: SchedulerFactory, node: str) -> None:
    """10,000 jobs x 2 MiB: 20 GiB of output on disk; run by `make soak`."""
    run_figures(scheduler_factory, node, count=10_000)


def test_earlier_attempts_output_comes_back_from_disk(
    scheduler_factory: SchedulerFactory, node: str
) -> None:
    daemon = scheduler_factory({"MAX_JOB_RETRIES": "2"})
    agent = Agent(daemon.url, node)
    job_id = agent.api.submit(command="flaky")["job_id"]
    expected = []
    for attempt in range(3):
        expect_json(agent.claim(job_id), 200)
        out, err = f"out {attempt} " * 50_000, f"err {attempt}\n" * 70_000
        reply = expect_json(agent.report(job_id, 1, stdout=out, stderr=err), 200)
        expected.append((out, err))
    assert reply["status"] == "failed"
    shown = agent.api.job(job_id)
    assert [(a["stdout"], a["stderr"]) for a in shown["attempts"]] == expected[:2]
    assert (shown["stdout"], shown["stderr"]) == expected[2]
    assert {key: value for key, value in shown.items() if key != "attempts"} == reply
    agent.close()


def test_the_poll_reads_nothing_from_disk(scheduler_factory: SchedulerFactory, node: str) -> None:
    """With the database file gone, reading output fails; the poll, which shows none, does
    not notice."""
    daemon = scheduler_factory()
    agent = Agent(daemon.url, node)
    done = agent.api.submit(command="first")["job_id"]
    expect_json(agent.claim(done), 200)
    expect_json(agent.report(done, 0, stdout="kept on disk"), 200)
    retried = agent.api.submit(command="second")["job_id"]
    expect_json(agent.claim(retried), 200)
    expect_json(agent.report(retried, 1, stderr="first try"), 200)  # pending again
    waiting = agent.api.submit(command="third")["job_id"]

    for suffix in ("", "-wal", "-shm"):
        os.unlink(f"{daemon.db_path}{suffix}")
    expect_error(agent.api.get(f"/jobs/{done}"), 503, errors.STORE_UNAVAILABLE)
    for _ in range(3):
        assert [job.job_id for job in agent.poll()] == [retried]  # one slot, FIFO
    # A listing of pending jobs (limit: not the poll's query) shows no output either.
    listing = agent.api.jobs(node_id=node, status="pending", limit=10)
    assert [job["job_id"] for job in listing] == [retried, waiting]
    agent.close()
