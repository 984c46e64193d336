"""The command line a newcomer meets in the second hour (issue 26): `version`, `nodes`,
`node drain`, `stop`, `logs -f`, `--wait` woken by the event stream, what a delayed job
waits for, and input errors that say what is wrong.

Against a real key-protected daemon under gunicorn; the agent is played by the test
(`helpers.Agent`, the real agent's own requests), so that the test decides when a job starts
and ends. Commands that run until the job ends run as real processes.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import SchedulerFactory
from helpers import Agent, Api, wait_for

from tiny_scheduler.cli import main
from tiny_scheduler.client import Client, wait_for_job
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.display import waiting_for

KEY = "usability-key"
MAX_OUTPUT = 1000
SCHEDULER_ENV = {
    "TINYAWS_API_KEY": KEY,
    "REGISTRY_CACHE_SECS": "0",  # a node the test adds is used at once
    "MAX_OUTPUT_BYTES": str(MAX_OUTPUT),
    "MAX_JOB_RETRIES": "0",
}
VERSION = importlib.metadata.version("tiny-scheduler")


def cli(scheduler: SchedulerProcess | str, *args: str) -> Result:
    url = scheduler if isinstance(scheduler, str) else scheduler.url
    return CliRunner().invoke(main, list(args), env={"SCHEDULER_URL": url, "TINYAWS_API_KEY": KEY})


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.output)
    return result.stdout


@pytest.fixture
def keyed(scheduler: SchedulerProcess) -> Iterator[Api]:
    api = Api(scheduler.url, KEY)
    yield api
    api.close()


def spawn(scheduler: SchedulerProcess, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "SCHEDULER_URL": scheduler.url, "TINYAWS_API_KEY": KEY}
    return subprocess.Popen(
        [sys.executable, "-m", "tiny_scheduler.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def first_stderr_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stderr is not None
    return proc.stderr.readline()


# --- version, nodes, drain ----------------------------------------------------------------------


def test_version_names_client_and_server(scheduler: SchedulerProcess) -> None:
    both = json.loads(ok(cli(scheduler, "version", "--json")))
    assert both == {"client": VERSION, "server": VERSION}
    assert ok(cli(scheduler, "version")) == f"client  {VERSION}\nserver  {VERSION}\n"
    # A scheduler out of reach is not an error: the client's version is still the answer.
    alone = cli("http://127.0.0.1:9", "version", "--json")
    assert alone.exit_code == 0
    shown = json.loads(alone.stdout)
    assert (shown["client"], shown["server"]) == (VERSION, None)
    assert "cannot reach the scheduler at http://127.0.0.1:9" in shown["error"]


def test_nodes_and_drain(scheduler: SchedulerProcess, keyed: Api, node: str) -> None:
    # GET /nodes shows the registry's list as last fetched: have it fetched.
    assert keyed.get("/schedule").status_code == 200
    listed = json.loads(ok(cli(scheduler, "nodes", "--json")))
    mine = next(n for n in listed if n["node_id"] == node)
    assert (mine["health"], mine["drain"]) == ("healthy", False)
    header, *rows = ok(cli(scheduler, "nodes")).splitlines()
    assert header.split()[:7] == [
        "NODE",
        "HEALTH",
        "SOURCE",
        "SLOTS",
        "RUNNING",
        "PENDING",
        "DRAIN",
    ]
    assert any(row.split()[:2] == [node, "healthy"] for row in rows)

    drained = json.loads(ok(cli(scheduler, "node", "drain", node, "--json")))
    assert drained["drain"] is True
    row = next(r for r in ok(cli(scheduler, "nodes")).splitlines() if r.startswith(node + " "))
    assert row.split()[6] == "yes"
    assert ok(cli(scheduler, "node", "undrain", node)) == f"{node} takes new jobs again\n"
    assert (
        next(n for n in json.loads(ok(cli(scheduler, "nodes", "--json"))) if n["node_id"] == node)[
            "drain"
        ]
        is False
    )
    unknown = cli(scheduler, "node", "drain", "no-such-node")
    assert (unknown.exit_code, unknown.stderr) == (1, "error: node not found\n")


# --- stop -------------------------------------------------------------------------------------


def test_stop_ends_a_running_job_as_cancel_does(
    scheduler: SchedulerProcess, keyed: Api, agent: Agent
) -> None:
    job = keyed.submit(command="sleep 600")
    assert agent.claim(job["job_id"]).status_code == 200
    stopped = json.loads(ok(cli(scheduler, "stop", "--json", job["job_id"])))
    assert (stopped["status"], stopped["reason"], stopped["exit_code"]) == (
        "failed",
        "cancelled",
        -1,
    )
    assert "stops running jobs too" in ok(cli(scheduler, "--help")).replace("\n", " ") or (
        "running or pending" in ok(cli(scheduler, "stop", "--help"))
    )
    pending = keyed.submit(command="true")
    assert ok(cli(scheduler, "cancel", pending["job_id"])).startswith(
        f"{pending['job_id']} cancelled"
    )


# --- logs -f ----------------------------------------------------------------------------------


def test_logs_follow_prints_output_as_it_comes_and_exits_with_the_job(
    scheduler: SchedulerProcess, keyed: Api, agent: Agent
) -> None:
    job_id = keyed.submit(command="work")["job_id"]
    follow = spawn(scheduler, "logs", "-f", job_id)
    try:
        assert agent.claim(job_id).status_code == 200
        sent = keyed.post(f"/jobs/{job_id}/output", {"stdout": "first line\n", "stderr": "warn\n"})
        assert sent.status_code == 204, sent.text
        assert follow.stdout is not None
        assert follow.stdout.readline() == "first line\n"  # while the job still runs
        more = keyed.post(f"/jobs/{job_id}/output", {"stdout": "second line\n"})
        assert more.status_code == 204
        assert follow.stdout.readline() == "second line\n"
        report = agent.report(job_id, 3, stdout="first line\nsecond line\n", stderr="warn\n")
        assert report.status_code == 200
        out, err = follow.communicate(timeout=60)
    finally:
        follow.kill()
    assert follow.returncode == 3  # the job's exit status, as `status --wait` gives
    assert out == ""
    assert err == "warn\n"


def test_logs_follow_says_how_many_bytes_the_cap_dropped(
    scheduler: SchedulerProcess, keyed: Api, agent: Agent
) -> None:
    job_id = keyed.submit(command="chatty")["job_id"]
    assert agent.claim(job_id).status_code == 200
    text = "".join(f"line {n:05d}\n" for n in range(300))  # 3,300 bytes, over the cap
    assert keyed.post(f"/jobs/{job_id}/output", {"stdout": text}).status_code == 204
    assert agent.report(job_id, 0, stdout=text).status_code == 200
    follow = spawn(scheduler, "logs", "-f", job_id)
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 0, err
    skipped = len(text.encode()) - len(out.encode())
    assert skipped > 0
    assert f"[tiny-scheduler: {skipped} bytes skipped]\n" in err
    assert text.endswith(out.split("\n", 1)[1])  # the tail, from its first whole line


def test_logs_follow_goes_on_with_a_retry_under_its_header_and_logs_shows_running_output(
    scheduler_factory: SchedulerFactory,
) -> None:
    """Issue 31: `logs -f` of a job that fails and is retried prints the first attempt's
    output, then a header line for the retry, then the retry's output from its start (not
    the first attempt's offsets again); `logs` of a running job shows its output so far."""
    scheduler = scheduler_factory(
        {**SCHEDULER_ENV, "MAX_JOB_RETRIES": "1", "REGISTRY_URL": "builtin"}
    )
    api = Api(scheduler.url, KEY)
    try:
        for node in ("node-x", "node-y"):
            beat = {"cpu_count": 2, "running": []}
            assert api.request("PUT", f"/nodes/{node}", json=beat).status_code == 200
        job_id = api.submit(command="flaky")["job_id"]
        follow = spawn(scheduler, "logs", "-f", job_id)
        try:
            first = api.patch(f"/jobs/{job_id}", {"status": "running"}).json()
            assert api.post(f"/jobs/{job_id}/output", {"stdout": "try one\n"}).status_code == 204
            assert follow.stdout is not None and follow.stdout.readline() == "try one\n"
            shown = ok(cli(scheduler, "logs", job_id))
            assert "try one" in shown and "(no output)" not in shown, shown
            failed = {"status": "failed", "exit_code": 3, "stdout": "try one\n"}
            retried = api.patch(f"/jobs/{job_id}", failed).json()
            assert (retried["status"], retried["retry_count"]) == ("pending", 1)
            assert retried["node_id"] != first["node_id"]
            assert api.patch(f"/jobs/{job_id}", {"status": "running"}).status_code == 200
            assert api.post(f"/jobs/{job_id}/output", {"stdout": "try two\n"}).status_code == 204
            assert follow.stdout.readline() == "try two\n"
            done = {"status": "done", "exit_code": 0, "stdout": "try two\n"}
            assert api.patch(f"/jobs/{job_id}", done).status_code == 200
            out, err = follow.communicate(timeout=60)
        finally:
            follow.kill()
    finally:
        api.close()
    assert follow.returncode == 0, err
    assert out == ""
    assert err == f"=== attempt 2/2 on {retried['node_id']} (retry after exit 3) ===\n"


# --- --wait and the event stream --------------------------------------------------------------


def test_status_wait_wakes_on_the_event_stream(
    scheduler: SchedulerProcess, keyed: Api, agent: Agent
) -> None:
    """With a poll interval of ten minutes, only the event stream can end the wait soon."""
    job_id = keyed.submit(command="x")["job_id"]
    waiting = spawn(scheduler, "status", "--wait", "--interval", "600", job_id)
    try:
        assert " pending on " in first_stderr_line(waiting)
        assert agent.claim(job_id).status_code == 200
        assert agent.report(job_id, 5, stdout="out\n").status_code == 200
        ended_at = time.monotonic()
        out, _ = waiting.communicate(timeout=60)
        took = time.monotonic() - ended_at
    finally:
        waiting.kill()
    assert waiting.returncode == 5
    assert "--- stdout ---\nout\n" in out
    print(f"status --wait ended {took:.2f}s after the job's final report (process exit included)")


def test_wait_falls_back_to_polling_without_the_stream(
    scheduler_factory: SchedulerFactory, node: str
) -> None:
    # No waiter allowed: GET /events answers 503, as an overloaded scheduler would.
    other = scheduler_factory(env={**SCHEDULER_ENV, "MAX_WAITERS": "0"})
    api, played = Api(other.url, KEY), Agent(other.url, node)
    try:
        job_id = api.submit(command="x")["job_id"]
        assert api.get("/events").status_code == 503
        lines: list[str] = []

        def finish() -> None:
            wait_for(lambda: lines, message="the wait to start")
            assert played.claim(job_id).status_code == 200
            assert played.report(job_id, 0).status_code == 200

        helper = threading.Thread(target=finish)
        helper.start()
        job = wait_for_job(Client(other.url, KEY), job_id, interval=0.05, progress=lines.append)
        helper.join()
        assert job["status"] == "done"
        result = cli(other, "status", "--wait", job_id)
        assert result.exit_code == 0
    finally:
        api.close()
        played.close()


# --- delayed jobs say what they wait for --------------------------------------------------------


def test_a_delayed_job_says_until_when_it_waits(scheduler: SchedulerProcess, node: str) -> None:
    said = ok(cli(scheduler, "submit", "--in", "1h", "echo later"))
    job_id = said.split()[0]
    job = json.loads(ok(cli(scheduler, "status", "--json", job_id)))
    assert said == f"{job_id} pending on {job['node_id']}, not before {job['not_before']}\n"
    row = next(r for r in ok(cli(scheduler, "list")).splitlines() if r.startswith(job_id + " "))
    assert f"not before {job['not_before'][:19].replace('T', ' ')}" in row

    # Waiting for it says so, and keeps saying so; the test cancels it once it has.
    client = Client(scheduler.url, KEY)
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if " still " in line:
            client.cancel(job_id)

    wait_for_job(client, job_id, interval=0.05, progress=progress, remind_secs=0.2)
    assert lines[0].endswith(
        f"{job_id} pending on {job['node_id']}, not before {job['not_before']}"
    )
    assert any(
        line.endswith(f"{job_id} still pending on {job['node_id']} until {job['not_before']}")
        for line in lines
    ), lines


def test_waiting_for_shows_the_schedulers_reason_when_there_is_one() -> None:
    job: dict[str, Any] = {"status": "pending", "waiting_for": "job-3 (depends_on)"}
    assert waiting_for(job) == "job-3 (depends_on)"
    assert waiting_for({**job, "status": "running"}) == ""
    delayed = {"status": "pending", "not_before": "2030-01-01T00:00:00.000000Z"}
    assert waiting_for(delayed) == "not before 2030-01-01T00:00:00.000000Z"
    assert waiting_for(delayed, now="2030-01-02T00:00:00.000000Z") == ""


# --- input errors -------------------------------------------------------------------------------


def test_at_in_the_past_is_refused_with_the_time_it_read(scheduler: SchedulerProcess) -> None:
    refused = cli(scheduler, "submit", "--at", "2020-01-02T03:04:05Z", "true")
    assert refused.exit_code == 2
    assert (
        "'2020-01-02T03:04:05Z' is in the past: it reads as 2020-01-02T03:04:05.000000Z (UTC)"
        in refused.stderr
    )


def test_a_service_needs_its_port(scheduler: SchedulerProcess) -> None:
    refused = cli(scheduler, "submit", "--service", "run-server")
    assert refused.exit_code == 2
    assert "a service needs its port: add --port N" in refused.stderr


def test_the_jobs_own_options_get_a_hint_to_use_dashes(scheduler: SchedulerProcess) -> None:
    refused = cli(scheduler, "submit", "--env", "A=1", "ls", "-la")
    assert refused.exit_code == 2
    assert (
        "No such option '-l'. Options after the command are the command's own: put it after"
        " --: tiny-scheduler submit --env A=1 -- ls -la" in refused.stderr
    ), refused.stderr


# --- every command speaks JSON; dev --help speaks words -----------------------------------------


NO_JSON = {"serve", "dev", "dev registry", "agent", "list --watch"}
"""Commands that run something rather than answer: nothing for a script to parse."""


def test_every_client_command_has_json() -> None:
    def walk(command: Any, path: str) -> Iterator[tuple[str, Any]]:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, f"{path} {name}".strip())
        if (path and not hasattr(command, "commands")) or path == "dev":
            yield path, command

    missing = [
        path
        for path, command in walk(main, "")
        if path not in NO_JSON and "--json" not in {o for p in command.params for o in p.opts}
    ]
    assert missing == []


def test_dev_options_are_described_in_words() -> None:
    dev = main.commands["dev"]
    for param in dev.params:
        if param.name in ("help",) or not hasattr(param, "help"):
            continue
        assert param.help and len(param.help.split()) >= 3, param.name
