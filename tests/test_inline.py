"""Requests answered in the worker's event loop (inline.py) on a real daemon: the agent poll,
`/health` and a heartbeat that changes nothing stored need no request thread, and a poll that
must commit runs on a thread, once."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import BASE_ENV, SchedulerFactory
from helpers import Api, expect_json, wait_for

from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.server.daemon_command import SERVE_ARGV

ONE_THREAD = {"SCHEDULER_THREADS": "1", "REGISTRY_CACHE_SECS": "0"}


def test_polls_health_and_heartbeats_are_answered_while_the_only_thread_waits(
    scheduler_factory: SchedulerFactory, registry: FakeRegistry
) -> None:
    proc = scheduler_factory(ONE_THREAD)
    api, other = Api(proc.url), Api(proc.url)
    job = api.submit(command="echo inline")
    beat = b'{"cpu_count":2,"running":[]}'
    expect_json(api.request("PUT", "/nodes/beating", data=beat), 200)  # stored: a commit
    registry.fault = "hang"
    seen = registry.requests
    try:
        with ThreadPoolExecutor(1) as pool:
            # A submission asks the (hung) registry for the nodes, in the one request thread.
            stuck = pool.submit(other.post, "/jobs", {"command": "x"})
            wait_for(lambda: registry.requests > seen, message="the registry call")
            health = api.get("/health")
            poll = api.get("/jobs", params={"node_id": job["node_id"], "status": "pending"})
            again = api.request("PUT", "/nodes/beating", data=beat)  # the same facts
            # Answered while the thread still waits (up to the registry deadline, 3 s): the
            # old worker would have queued them all behind the submission.
            assert not stuck.done()
            assert health.status_code == 200, health.text
            assert expect_json(again, 200)["node_id"] == "beating"
            assert [j["job_id"] for j in expect_json(poll, 200)] == [job["job_id"]]
            registry.release()
            assert stuck.result().status_code == 503
    finally:
        registry.fault = None
        registry.release()
        api.close()
        other.close()


def polls_timed(api: Api) -> int:
    """How many agent polls the daemon's metrics have timed, with any answer."""
    counts = re.findall(
        r"^tiny_scheduler_http_request_duration_seconds_count\{(.*)\} (\S+)$",
        api.get("/metrics").text,
        re.MULTILINE,
    )
    return sum(int(float(n)) for labels, n in counts if 'endpoint="jobs.list_jobs"' in labels)


def test_a_poll_that_must_commit_runs_on_a_thread_and_counts_once(
    scheduler_factory: SchedulerFactory, node: str
) -> None:
    api = Api(scheduler_factory().url)
    job = api.submit(command="sleep 600")
    claim = {"status": "running", "exit_code": None, "stdout": "", "stderr": ""}
    expect_json(api.patch(f"/jobs/{job['job_id']}", claim), 200)
    before = polls_timed(api)
    # A key-less poll from a node whose agent does not heartbeat, more than a second after a
    # claim there, proves the claim lost (reliability.md): the poll fails the job, a commit,
    # which an inline poll cannot make. 1.1 s is that rule's own threshold, not a wait for
    # something to happen.
    time.sleep(1.1)
    poll = api.get("/jobs", params={"node_id": node, "status": "pending"})  # no key
    retried = expect_json(api.get(f"/jobs/{job['job_id']}"), 200)
    assert poll.status_code == 200
    assert retried["status"] == "pending", retried
    assert retried["attempts"][0]["stderr"] == "lost by its agent"
    assert polls_timed(api) == before + 1
    api.close()


def test_a_daemon_on_a_unix_socket_answers_plain_requests(tmp_path: Path) -> None:
    """A UNIX socket's client has no (host, port): such connections keep gunicorn's path."""
    sock_path = tmp_path / "ts.sock"
    env = {
        **os.environ,
        **BASE_ENV,
        "SCHEDULER_BIND": f"unix:{sock_path}",
        "SCHEDULER_DB": str(tmp_path / "jobs.db"),
        "REGISTRY_URL": "builtin",
    }
    proc = subprocess.Popen(
        SERVE_ARGV,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(sock_path.exists, timeout=30, message="the daemon's socket")
        health = wait_for(lambda: unix_get(sock_path, "/health"), message="an answer")
        poll = unix_get(sock_path, "/jobs?node_id=n1&status=pending")
        assert health.startswith(b"HTTP/1.1 200 "), health
        assert poll.startswith(b"HTTP/1.1 200 ") and poll.endswith(b"\r\n\r\n[]"), poll
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def unix_get(path: Path, target: str) -> bytes | None:
    """One GET over the UNIX socket at `path` (None while nothing answers there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        try:
            sock.connect(str(path))
        except OSError:
            return None
        sock.sendall(
            f"GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_only_methods_an_inline_view_answers_are_tried_in_the_loop(tmp_path: Path) -> None:
    """A submission or a report (POST, PATCH) goes to a thread at once: running Flask in the
    loop only for its first hook to ask for a thread cost each of them a second pass."""
    import tiny_scheduler
    from tiny_scheduler.config import Settings

    env = {**BASE_ENV, "SCHEDULER_DB": str(tmp_path / "jobs.db"), "REGISTRY_URL": "builtin"}
    app = tiny_scheduler.create_app(Settings.from_env(env))
    try:
        assert app.inline_methods == {"GET", "HEAD", "OPTIONS", "PUT"}  # type: ignore[attr-defined]
    finally:
        app.extensions["tiny_scheduler.store"].close()
