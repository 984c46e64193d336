"""The `tiny-scheduler` command line against a live scheduler.

The scheduler runs under real gunicorn with a key set, in a dev cluster of one real agent
process, so `--wait` sees jobs actually run. Commands run through click's CliRunner: the real
command code, in this process, talking HTTP to the real server. The commands that run until
Ctrl-C (`list --watch`, `dev registry`) run as real processes and get a real SIGINT.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import importlib.metadata
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner, Result
from helpers import Api, wait_for

from tiny_scheduler.cli import main
from tiny_scheduler.client import Client, wait_for_job
from tiny_scheduler.dev.cluster import ClusterConfig, DevCluster
from tiny_scheduler.display import describe
from tiny_scheduler.domain.jobs import FINAL_STATUSES
from tiny_scheduler.domain.validation import MAX_PAGE

KEY = "cli-test-key"
IDLE_NODE = "idle-node"
"""A healthy node no agent serves: jobs pinned to its instance stay pending."""

SCHEDULER_ENV = {
    "MAX_JOB_RETRIES": "1",
    "MAX_JOBS_PER_NODE": "1",
    "JOB_RETENTION_SECS": "0",
    "SQS_URL": "",
    "SNS_URL": "",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    work = tmp_path_factory.mktemp("cli-cluster")
    config = ClusterConfig.quick(
        agents=1,
        api_key=KEY,
        work_dir=str(work),
        scheduler_env=SCHEDULER_ENV,
        # Instances, registered services and registry faults are the tiny-aws registry's.
        dev_registry=True,
        # Tests add a node and use it at once.
        registry_cache_secs=0,
    )
    with DevCluster(config) as started:
        yield started


@pytest.fixture
def idle_instance(cluster: DevCluster) -> Iterator[str]:
    """An instance on a healthy node without an agent; removed again after the test."""
    registry = cluster.registry
    assert registry is not None
    registry.set_node(IDLE_NODE)
    registry.set_instance("i-idle", IDLE_NODE)
    yield "i-idle"
    registry.instances.pop("i-idle", None)
    registry.remove_node(IDLE_NODE)


def cli(target: DevCluster | str, *args: str, key: str | None = KEY) -> Result:
    """Run `tiny-scheduler ARGS` with SCHEDULER_URL and TINYAWS_API_KEY set (None: unset)."""
    url = target if isinstance(target, str) else target.scheduler_url
    env = {"SCHEDULER_URL": url, "TINYAWS_API_KEY": key}
    return CliRunner().invoke(main, list(args), env=env)


def submitted_id(cluster: DevCluster, *args: str) -> str:
    result = cli(cluster, "submit", "-q", *args)
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


def one_error_line(result: Result) -> str:
    """The error a failed command printed: exactly one line on stderr, nothing on stdout."""
    assert result.exit_code != 0
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr.rstrip("\n")


def fields_and_output(stdout: str) -> tuple[dict[str, str], str]:
    """What `status` (or `--wait`) printed: the `name  value` fields, and what follows them
    (the job's output after `--wait`)."""
    head, marker, output = stdout.partition("--- ")
    fields = dict(line.split(None, 1) for line in head.splitlines())
    return fields, marker + output


def is_cancelled(job: dict[str, Any]) -> bool:
    """A cancelled job, whether the scheduler says so by status or (issue 13) by reason."""
    return job["status"] in FINAL_STATUSES and "cancelled" in (job["status"], job.get("reason"))


@pytest.fixture(scope="module")
def server(cluster: DevCluster) -> Iterator[Api]:
    """The scheduler's API itself, to check what the commands did (or did not do)."""
    client = Api(cluster.scheduler_url, KEY)
    yield client
    client.close()


@contextlib.contextmanager
def spawned(*args: str, env: dict[str, str]) -> Iterator[Spawned]:
    """`tiny-scheduler ARGS` as a process of its own; killed at the end if still running."""
    running = Spawned(args, env)
    try:
        yield running
    finally:
        if running.proc.poll() is None:
            running.proc.kill()
            running.proc.wait(10)


class Spawned:
    """A running `tiny-scheduler` process; its stdout is read line by line on a thread."""

    def __init__(self, args: tuple[str, ...], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tiny_scheduler.cli", *args],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.seen: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def line(self, wanted: Callable[[str], bool], timeout: float = 20.0) -> str:
        """The next line of stdout for which `wanted` holds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                raise AssertionError(f"no such line within {timeout}s; saw {self.seen}") from None
            if line is None:
                raise AssertionError(f"stdout ended; saw {self.seen}")
            self.seen.append(line)
            if wanted(line):
                return line

    def interrupt(self) -> tuple[int, str]:
        """Ctrl-C: the exit status and what it wrote on stderr."""
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=20)
        return self.proc.returncode, err


# --- submit and wait ------------------------------------------------------------------------


def test_submit_wait_runs_the_job_and_exits_0(cluster: DevCluster) -> None:
    result = cli(
        cluster,
        *("submit", "--wait", "--interval", "0.1", "--env", "WHO=cli", "--env", "N=a=b"),
        'echo "hi $WHO $N"',
    )
    assert result.exit_code == 0, result.stderr
    fields, output = fields_and_output(result.stdout)
    job_id = fields["job"]
    assert fields["status"] == "done (exit 0)"
    # Env values are often secrets: hidden unless asked for.
    assert fields["env"] == "WHO=*** N=***"
    shown = cli(cluster, "status", "--show-env", job_id)
    assert fields_and_output(shown.stdout)[0]["env"] == "WHO=cli N=a=b"
    # The job's output follows, as `logs` would show it: no second command needed.
    assert output == "--- stdout ---\nhi cli a=b\n"
    # Progress went to stderr, each change with the seconds since the wait began.
    progress = result.stderr.splitlines()
    # A pending job says what it waits for, as the scheduler tells it. (Whether the first look
    # still finds it pending is the agent's race to win: on a busy machine it may be running
    # already. test_wait_says_now_and_then_that_the_job_still_waits checks the text itself.)
    pending = rf"\[ *\d+\.\ds\] {job_id} pending on node-1, waiting for .+ node-1.*"
    for line in progress:
        if " pending " in line:
            assert re.fullmatch(pending, line), progress
    assert re.fullmatch(rf"\[ *\d+\.\ds\] {job_id} done \(exit 0\)", progress[-1]), progress

    logs = cli(cluster, "logs", job_id)
    assert logs.exit_code == 0, logs.stderr
    assert "hi cli a=b\n" in logs.stdout
    assert "attempt 1/1" in logs.stdout


def test_wait_exits_with_the_jobs_exit_code(cluster: DevCluster) -> None:
    result = cli(cluster, "submit", "--wait", "--json", "--interval", "0.1", "echo bad >&2; exit 7")
    assert result.exit_code == 7, result.stderr
    job = json.loads(result.stdout)
    assert (job["status"], job["exit_code"], len(job["attempts"])) == ("failed", 7, 1)
    # The retry shows as the job's second attempt: one word, attempts, everywhere.
    assert re.search(rf"{job['job_id']} \S+ .*\(attempt 2\)$", result.stderr, re.M), result.stderr
    assert fields_and_output(cli(cluster, "status", job["job_id"]).stdout)[0][
        "attempts"
    ].startswith("2 ")

    # Already final: status --wait answers at once, with the same exit code, and shows the
    # failure's output without a second command.
    again = cli(cluster, "status", "--wait", job["job_id"])
    assert again.exit_code == 7
    fields, output = fields_and_output(again.stdout)
    assert fields["status"] == "failed (exit 7)"
    assert output == "--- stderr ---\nbad\n"

    quiet = cli(cluster, "status", "--wait", "--no-logs", job["job_id"])
    assert quiet.exit_code == 7
    assert "--- " not in quiet.stdout
    assert fields_and_output(quiet.stdout)[0] == fields


def test_wait_says_now_and_then_that_the_job_still_waits(
    cluster: DevCluster, idle_instance: str
) -> None:
    client = Client(cluster.scheduler_url, KEY)
    job_id = submitted_id(cluster, "--instance", idle_instance, "echo never")
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if " still " in line:
            client.cancel(job_id)  # seen the reminder: end the wait

    job = wait_for_job(client, job_id, interval=0.05, progress=progress, remind_secs=0.2)
    assert is_cancelled(job)
    stamp = r"\[ *\d+\.\ds\]"
    # Both say what the job waits for, in the scheduler's words.
    why = f", waiting for the agent on {IDLE_NODE} to take it"
    assert re.fullmatch(rf"{stamp} {job_id} pending on {IDLE_NODE}{why}", lines[0]), lines
    assert re.fullmatch(rf"{stamp} {job_id} still pending on {IDLE_NODE}{why}", lines[1]), lines
    assert re.fullmatch(rf"{stamp} {job_id} {re.escape(describe(job))}", lines[-1]), lines


def test_logs_show_every_attempt(cluster: DevCluster) -> None:
    job_id = submitted_id(cluster, 'echo "out on $TINY_NODE_ID"; echo oops >&2; exit 3')
    assert cli(cluster, "status", "--wait", "--interval", "0.1", job_id).exit_code == 3

    text = cli(cluster, "logs", job_id)
    assert text.exit_code == 0, text.stderr
    assert "attempt 1/2 on node-1: failed (exit 3)" in text.stdout
    assert "attempt 2/2 on node-1: failed (exit 3) (latest)" in text.stdout
    assert text.stdout.count("--- stdout ---\nout on node-1\n") == 2
    assert text.stdout.count("--- stderr ---\noops\n") == 2

    data = json.loads(cli(cluster, "logs", "--json", job_id).stdout)
    assert [(a["exit_code"], a["stdout"], a["stderr"]) for a in data["attempts"]] == [
        (3, "out on node-1\n", "oops\n")
    ] * 2
    # Every attempt says how it ended: the earlier one failed, and so did the latest.
    assert [a["status"] for a in data["attempts"]] == ["failed", "failed"]


def test_submit_sends_every_option(cluster: DevCluster, idle_instance: str) -> None:
    result = cli(
        cluster,
        *("submit", "--json", "--service", "--port", "8080", "--instance", idle_instance),
        *("--timeout", "5", "--deploy-url", "http://store/app.zip"),
        *("--", "python3", "-c", "print('a b')"),
    )
    assert result.exit_code == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["command"] == "python3 -c 'print('\"'\"'a b'\"'\"')'"
    expected = {
        "job_type": "service",
        "port": 8080,
        "instance_id": idle_instance,
        "node_id": IDLE_NODE,
        "timeout_secs": 5,
        "deploy_url": "http://store/app.zip",
        "status": "pending",
    }
    assert {name: job.get(name) for name in expected} == expected
    assert cli(cluster, "cancel", job["job_id"]).exit_code == 0


def test_idempotency_key_returns_the_first_job(cluster: DevCluster) -> None:
    first = submitted_id(cluster, "--idempotency-key", "cli-once", "echo once")
    second = submitted_id(cluster, "--idempotency-key", "cli-once", "echo once")
    assert first == second


def final(server: Api, job_id: str) -> dict[str, Any]:
    """The job once it is final (a service that ran to its end)."""
    return wait_for(
        lambda: (job := server.job(job_id))["status"] in FINAL_STATUSES and job,
        message=f"{job_id} final",
    )


def test_wait_for_a_service_returns_once_it_runs(cluster: DevCluster) -> None:
    result = cli(
        cluster,
        "submit",
        "--service",
        "--port",
        "8090",
        "--wait",
        "--interval",
        "0.1",
        "exec sleep 600",
    )
    assert result.exit_code == 0, result.stdout + result.stderr
    fields, output = fields_and_output(result.stdout)
    assert fields["status"] == "running on node-1"
    assert output == ""
    # Asked again while it runs: answered at once, a success.
    again = cli(cluster, "status", "--wait", "--json", fields["job"])
    assert again.exit_code == 0
    assert json.loads(again.stdout)["status"] == "running"


def test_services_are_registered_and_reported_when_they_exit(
    cluster: DevCluster, server: Api
) -> None:
    ok = cli(cluster, "submit", "--service", "--port", "8081", "--wait", "--json", "true")
    assert ok.exit_code == 0, ok.stderr
    job = final(server, json.loads(ok.stdout)["job_id"])
    assert (job["status"], job["exit_code"], job["job_type"]) == ("done", 0, "service")
    assert cluster.registry is not None
    assert {"job_id": job["job_id"], "node_id": "node-1", "port": 8081}.items() <= next(
        s for s in cluster.registry.services if s.get("job_id") == job["job_id"]
    ).items()

    failing_id = submitted_id(cluster, "--service", "--port", "8082", "exit 4")
    final(server, failing_id)
    failing = cli(cluster, "status", "--wait", failing_id)
    assert failing.exit_code == 4
    assert fields_and_output(failing.stdout)[0]["status"] == "failed (exit 4)"


@pytest.fixture(scope="module")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A loopback HTTP server for deploy zips: app.zip holds a start.sh, junk.zip is no zip."""
    folder = tmp_path_factory.mktemp("store")
    with zipfile.ZipFile(folder / "app.zip", "w") as archive:
        archive.writestr("start.sh", 'echo "started $(cat version.txt) with $WHO"\n')
        archive.writestr("version.txt", "v7")
    (folder / "junk.zip").write_bytes(b"not a zip")
    handler = functools.partial(_QuietFiles, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_deploy_url_runs_the_zips_start_sh(cluster: DevCluster, object_store: str) -> None:
    ran = cli(
        cluster,
        *("submit", "--wait", "--json", "--interval", "0.1", "--env", "WHO=cli"),
        *("--deploy-url", f"{object_store}/app.zip"),
    )
    assert ran.exit_code == 0, ran.stderr
    job = json.loads(ran.stdout)
    assert (job["command"], job["stdout"]) == ("", "started v7 with cli\n")

    for name, error in (("missing.zip", "download error: "), ("junk.zip", "extract failed: ")):
        failed = cli(
            cluster,
            *("submit", "--wait", "--json", "--interval", "0.1"),
            *("--deploy-url", f"{object_store}/{name}"),
        )
        assert failed.exit_code == 1
        job = json.loads(failed.stdout)
        assert (job["status"], job["exit_code"]) == ("failed", -1)
        assert job["stderr"].startswith(error), job["stderr"]


# --- list, status, cancel -------------------------------------------------------------------


def test_list_prints_an_aligned_table(cluster: DevCluster) -> None:
    ids = [submitted_id(cluster, f"echo row-{i}") for i in range(2)]
    for job_id in ids:
        assert cli(cluster, "status", "--wait", "--interval", "0.1", job_id).exit_code == 0

    table = cli(cluster, "list", "--status", "done", "--node", "node-1")
    assert table.exit_code == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    # The API's times are UTC, and the header says so.
    columns = "JOB NAME STATUS EXIT NODE TYPE ATTEMPTS CREATED (UTC) WAITING FOR COMMAND"
    assert header.split() == columns.split()
    for column in ("NAME", "STATUS", "EXIT", "NODE", "COMMAND"):
        start = header.index(column)
        for row in rows:
            assert row[start - 2 : start] == "  " and row[start] != " ", (column, row)
    listed = {row.split()[0]: row for row in rows}
    assert set(ids) <= set(listed)
    assert listed[ids[0]].endswith("echo row-0")

    as_json = json.loads(cli(cluster, "list", "--json", "--status", "done").stdout)
    assert {job["status"] for job in as_json} == {"done"}
    assert set(ids) <= {job["job_id"] for job in as_json}


def listed_ids(result: Result) -> list[str]:
    assert result.exit_code == 0, result.stderr
    return [row.split()[0] for row in result.stdout.splitlines()[1:]]


def test_list_shows_the_newest_first(cluster: DevCluster) -> None:
    ids = [submitted_id(cluster, "true") for _ in range(4)]
    newest = cli(cluster, "list", "--limit", "3")
    assert listed_ids(newest) == ids[:0:-1]
    assert newest.stderr == (
        "older jobs not shown: raise --limit, or list from the first with --oldest\n"
    )
    # After a given job: the newest of those that came after it.
    assert listed_ids(cli(cluster, "list", "--limit", "1", "--after", ids[0])) == [ids[-1]]


def test_list_oldest_points_at_the_next_page(cluster: DevCluster) -> None:
    submitted_id(cluster, "true")
    submitted_id(cluster, "true")
    first = cli(cluster, "list", "--oldest", "--limit", "1")
    assert listed_ids(first) == ["job-1"]
    assert first.stderr == "more jobs follow: add --after job-1\n"
    following = cli(cluster, "list", "--oldest", "--limit", "1", "--after", "job-1")
    assert listed_ids(following) == ["job-2"]


def test_newest_agrees_with_the_whole_listing(cluster: DevCluster, idle_instance: str) -> None:
    # Jobs of the idle node are a thin slice of all jobs: the search for the newest of them
    # has to step over long runs of others.
    assert cluster.registry is not None
    cluster.registry.set_instance("i-worker", "node-1")  # so that `true` is not sent to idle-node
    ids = []
    for _ in range(3):
        done = cli(
            cluster, "submit", "--wait", "--instance", "i-worker", "--interval", "0.1", "true"
        )
        assert done.exit_code == 0, done.stderr
        ids.append(submitted_id(cluster, "--instance", idle_instance, "echo never"))
    cluster.registry.instances.pop("i-worker")
    client = Client(cluster.scheduler_url, KEY)
    for filters in ({}, {"node_id": IDLE_NODE}, {"status": "done"}):
        everything, following = client.page(MAX_PAGE, **filters)
        assert following is None
        newest_first = [job["job_id"] for job in everything[::-1]]
        assert len(newest_first) >= 3, filters
        for limit in (1, 2, 3, len(newest_first), len(newest_first) + 1):
            jobs, left_out = client.newest(limit, **filters)
            assert [job["job_id"] for job in jobs] == newest_first[:limit], (filters, limit)
            assert left_out == (len(newest_first) > limit), (filters, limit)
        jobs, left_out = client.newest(1, newest_first[2], **filters)
        assert ([job["job_id"] for job in jobs], left_out) == ([newest_first[0]], True)
    for job_id in ids:
        client.cancel(job_id)


def test_pending_jobs_of_a_node_and_cancel(
    cluster: DevCluster, idle_instance: str, server: Api
) -> None:
    ids = [submitted_id(cluster, "--instance", idle_instance, "echo never") for _ in range(2)]

    # All of the node's queue, although the agent poll would answer only its free slot.
    pending = cli(cluster, "list", "--node", IDLE_NODE, "--status", "pending", "--json")
    assert [job["job_id"] for job in json.loads(pending.stdout)] == ids[::-1]
    oldest = cli(cluster, "list", "--oldest", "--node", IDLE_NODE, "--status", "pending", "--json")
    assert [job["job_id"] for job in json.loads(oldest.stdout)] == ids

    cancelled = cli(cluster, "cancel", ids[0])
    assert cancelled.exit_code == 0
    assert cancelled.stdout == f"{ids[0]} {describe(server.job(ids[0]))}\n"
    assert "cancelled" in cancelled.stdout
    as_json = json.loads(cli(cluster, "cancel", "--json", ids[1]).stdout)
    assert is_cancelled(as_json)
    empty = cli(cluster, "list", "--node", IDLE_NODE, "--status", "pending")
    assert (empty.exit_code, empty.stdout, empty.stderr) == (0, "", "no jobs\n")

    # A cancelled job is not a success.
    assert cli(cluster, "status", "--wait", ids[0]).exit_code == 1
    # Cancelling twice: the scheduler's 409 text, verbatim.
    refused = server.post(f"/jobs/{ids[0]}/cancel")
    assert refused.status_code == 409
    assert one_error_line(cli(cluster, "cancel", ids[0])) == f"error: {refused.text.strip()}"


def test_status_shows_the_job(cluster: DevCluster) -> None:
    job_id = submitted_id(cluster, "--env", "A=1", "echo status")
    assert cli(cluster, "status", "--wait", "--interval", "0.1", job_id).exit_code == 0
    number = job_id.removeprefix("job-")
    shown = cli(cluster, "status", number)  # a bare number is a job id too
    assert shown.exit_code == 0, shown.stderr
    fields = dict(line.split(None, 1) for line in shown.stdout.splitlines())
    assert fields["job"] == job_id
    assert fields["command"] == "echo status"
    assert fields["node"] == "node-1"
    as_json = json.loads(cli(cluster, "status", "--json", job_id).stdout)
    assert (as_json["job_id"], as_json["stdout"]) == (job_id, "status\n")


# --- errors ---------------------------------------------------------------------------------


def test_unknown_job_is_named(cluster: DevCluster) -> None:
    for command in ("status", "logs", "cancel"):
        result = cli(cluster, command, "999999")
        assert result.exit_code == 1
        assert one_error_line(result) == "error: job job-999999 not found"


def test_without_the_key_401_says_what_to_set(cluster: DevCluster) -> None:
    missing = cli(cluster, "list", key=None)
    assert missing.exit_code == 1
    assert one_error_line(missing) == (
        "error: unauthorized (set TINYAWS_API_KEY to the scheduler's key)"
    )
    wrong = cli(cluster, "submit", "true", key="not-the-key")
    assert one_error_line(wrong) == (
        "error: unauthorized (the scheduler rejected the key in TINYAWS_API_KEY)"
    )


def test_server_messages_are_shown_with_what_they_are_about(cluster: DevCluster) -> None:
    empty = cli(cluster, "submit", "")
    assert one_error_line(empty) == "error: command or deploy_url is required"
    # A 503 says which scheduler answered it, and the instance it is about.
    nowhere = cli(cluster, "submit", "--instance", "i-missing", "true")
    assert one_error_line(nowhere) == (
        f"error: instance i-missing not found (HTTP 503 from the scheduler at"
        f" {cluster.scheduler_url})"
    )


def test_a_registry_failure_names_the_scheduler_and_where_to_look(cluster: DevCluster) -> None:
    registry = cluster.registry
    assert registry is not None
    registry.fault = "error"  # node heartbeats still pass: the nodes stay healthy
    try:
        # A registry fetch already under way when the fault began (the scan's, another
        # request's) is shared with the submission and may still succeed: on a busy machine
        # that is likely. The next one meets the fault.
        result = wait_for(
            lambda: (answer := cli(cluster, "submit", "true")).exit_code != 0 and answer,
            timeout=30,
            message="a submission that meets the registry's fault",
        )
    finally:
        registry.fault = None
    assert one_error_line(result) == (
        f"error: failed to reach registry (HTTP 503 from the scheduler at"
        f" {cluster.scheduler_url}; check the registry at its REGISTRY_URL)"
    )


def test_scheduler_down(unused_port: int) -> None:
    url = f"http://127.0.0.1:{unused_port}"
    for args in (("status", "job-1"), ("submit", "--wait", "true"), ("list",)):
        result = cli(url, *args)
        assert result.exit_code == 1
        assert one_error_line(result).startswith(f"error: cannot reach the scheduler at {url}")


def test_url_without_a_scheme_is_http(cluster: DevCluster) -> None:
    job_id = submitted_id(cluster, "true")
    bare = cluster.scheduler_url.removeprefix("http://")
    result = cli(bare, "status", "--json", job_id)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["job_id"] == job_id

    wrong = cli("ftp://127.0.0.1:21", "list")
    assert one_error_line(wrong) == (
        "error: SCHEDULER_URL / --url: 'ftp://127.0.0.1:21' is not an http:// or https:// URL"
    )


def test_bad_usage_exits_2(cluster: DevCluster) -> None:
    assert cli(cluster, "submit", "--env", "NOEQUALS", "true").exit_code == 2
    assert cli(cluster, "submit").exit_code == 2
    assert cli(cluster, "submit", "--port", "0", "--service", "true").exit_code == 2
    assert cli(cluster, "list", "--watch", "--json").exit_code == 2


def test_port_needs_service(cluster: DevCluster, server: Api) -> None:
    before = [job["job_id"] for job in server.jobs(limit=MAX_PAGE)]
    result = cli(cluster, "submit", "--port", "8080", "true")
    assert result.exit_code == 2
    assert "Invalid value for '--port': only a service has a port: add --service" in result.stderr
    # Nothing was submitted (earlier jobs may move on meanwhile: the cluster's agents run them).
    assert [job["job_id"] for job in server.jobs(limit=MAX_PAGE)] == before


def test_version_and_bare_command() -> None:
    version = CliRunner().invoke(main, ["--version"])
    assert (version.exit_code, version.stdout) == (
        0,
        f"tiny-scheduler {importlib.metadata.version('tiny-scheduler')}\n",
    )
    bare = CliRunner().invoke(main, [])
    assert bare.exit_code == 0
    assert bare.stdout.startswith("Usage: ")
    assert "\nCommands:\n" in bare.stdout


def test_status_text_shows_the_reason() -> None:
    # The reason a failed job carries (issue 13) says more than its exit code of -1; a cancel
    # and a timeout are states of their own for people (issue 36), as Slurm's CANCELLED and
    # TIMEOUT, though the wire says failed.
    job = {"job_id": "job-1", "node_id": "n", "status": "failed", "exit_code": -1}
    assert describe({**job, "reason": "cancelled"}) == "cancelled"
    assert describe({**job, "reason": "timeout"}) == "timed out"
    assert describe({**job, "reason": "node_lost"}) == "failed (node lost)"
    assert describe({**job, "exit_code": 3, "reason": "exit"}) == "failed (exit 3)"
    assert describe(job) == "failed (exit -1)"


def test_dev_work_dir_that_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    work_dir = tmp_path / "file" / "work"
    result = CliRunner().invoke(main, ["dev", "--work-dir", str(work_dir)])
    assert result.exit_code == 1
    assert result.stderr == f"error: cannot use {work_dir} as the work dir: Not a directory\n"


# --- commands that run until Ctrl-C -----------------------------------------------------------


def test_list_watch_redraws_until_ctrl_c(cluster: DevCluster) -> None:
    env = {"SCHEDULER_URL": cluster.scheduler_url, "TINYAWS_API_KEY": KEY}
    # A frame has a table only once there is a job: this test may be the module's first.
    submitted_id(cluster, "echo before the watch")
    with spawned("list", "--watch", "0.2", "--limit", "3", env=env) as watch:

        def top_row() -> str:
            """The first row of the next frame drawn."""
            watch.line(lambda line: line.startswith("tiny-scheduler list"))
            assert watch.line(lambda line: line.startswith("JOB")).split() == [
                *("JOB", "NAME", "STATUS", "EXIT", "NODE", "TYPE", "ATTEMPTS", "CREATED", "(UTC)"),
                *("WAITING", "FOR", "COMMAND"),
            ]
            return watch.line(lambda line: True)

        top_row()
        title = watch.seen[0]
        assert re.fullmatch(
            r"tiny-scheduler list \(newest first\), every 0\.2s, at \d\d:\d\d:\d\d UTC;"
            r" Ctrl-C ends",
            title,
        )
        # A job submitted now shows up in a later frame, at the top.
        job_id = submitted_id(cluster, "echo watched")
        wait_for(lambda: top_row().startswith(f"{job_id} "), timeout=20, message=job_id)
        code, err = watch.interrupt()
    assert code == 0, err


def test_dev_registry_serves_a_real_daemon(
    tmp_path: Path, scheduler_factory: Callable[..., Any], unused_port: int
) -> None:
    port = unused_port
    env = {"TINYAWS_API_KEY": ""}
    args = ("dev", "registry", "--port", str(port), "--node", "node-a", "--node", "node-b:4")
    with spawned(*args, env=env) as registry:
        url = f"http://127.0.0.1:{port}"
        assert registry.line(lambda line: line.startswith("registry")) == f"registry  {url}"
        assert registry.line(lambda line: line.startswith("nodes")) == (
            "nodes     node-a (1 cpu), node-b (4 cpus)"
        )
        listing = requests.get(f"{url}/nodes?role=compute", timeout=10).json()
        assert {n: (v["status"], v["cpu_count"]) for n, v in listing.items()} == {
            "node-a": ("healthy", 1),
            "node-b": ("healthy", 4),
        }
        daemon = scheduler_factory(registry_url=url)
        client = Api(daemon.url)
        try:
            placed = {client.submit(command="true")["node_id"] for _ in range(2)}
        finally:
            client.close()
        assert placed == {"node-a", "node-b"}
        code, err = registry.interrupt()
    assert code == 0, err
    assert err.endswith("stopped.\n")


def test_dev_registry_usage_errors() -> None:
    runner = CliRunner()
    wrong_cpus = runner.invoke(main, ["dev", "registry", "--node", "node-a:0"])
    assert wrong_cpus.exit_code == 2
    assert "'node-a:0' is not ID or ID:CPUS" in wrong_cpus.stderr
    # Options of the cluster given to the registry: said, not silently dropped.
    misplaced = runner.invoke(main, ["dev", "--agents", "2", "registry"])
    assert misplaced.exit_code == 2
    assert "--agents: options of the dev cluster, not of `dev registry`" in misplaced.stderr


def test_a_timed_out_job_exits_1(cluster: DevCluster) -> None:
    # Last in the module: like the real agent, ours sits on the command until the cluster
    # stops, long after the scheduler has timed the job out.
    result = cli(
        cluster, "submit", "--wait", "--json", "--interval", "0.1", "--timeout", "1", "sleep 30"
    )
    assert result.exit_code == 1, result.stdout + result.stderr
    job = json.loads(result.stdout)
    assert (job["status"], job["exit_code"], job["stderr"]) == ("failed", -1, "job timed out")
