"""The command line's batch comforts (issue 36), each the gap a newcomer hit: names (`submit
-J`, a NAME column, `list --name`), arrays (`submit --array`, `list --array`), `hold`,
`release` and `retry`, per-job retries (`--retries`, and `status` saying how many a job gets),
`list --queue`, WAITING FOR in `list` for every reason a job waits, cancelled and timed-out
jobs shown as such, and an error that names the URL it came from.

Against a real key-protected daemon under gunicorn; the agent is played by the test
(`helpers.Agent`), so that the test decides when a job starts and ends.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result
from helpers import Agent, Api

from tiny_scheduler.cli import main
from tiny_scheduler.cli.output import print_status
from tiny_scheduler.dev.daemon import SchedulerProcess

KEY = "batch-cli-key"
# MAX_JOB_RETRIES not at its default of 1, so a number `status` shows is the daemon's own, not
# one the command line assumed.
SCHEDULER_ENV = {"TINYAWS_API_KEY": KEY, "REGISTRY_CACHE_SECS": "0", "MAX_JOB_RETRIES": "3"}


def cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"SCHEDULER_URL": url, "TINYAWS_API_KEY": KEY})


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.output)
    return result.stdout


def rows(table: str) -> list[dict[str, str]]:
    """The `list` table as one dict a row, cut at the header's column starts."""
    header, *lines = table.splitlines()
    names = ["JOB", "NAME", "STATUS", "EXIT", "NODE", "TYPE", "ATTEMPTS", "CREATED (UTC)"]
    names += ["WAITING FOR", "COMMAND"]
    starts = [header.index(name) for name in names]
    ends = [*starts[1:], None]
    return [
        {
            name: line[start:end].strip()
            for name, start, end in zip(names, starts, ends, strict=True)
        }
        for line in lines
    ]


@pytest.fixture
def keyed(scheduler: SchedulerProcess) -> Any:
    api = Api(scheduler.url, KEY)
    yield api
    api.close()


def test_name_an_array_and_list_it_by_array_and_by_name(
    scheduler: SchedulerProcess, node: str
) -> None:
    url = scheduler.url
    said = ok(
        cli(url, "submit", "-J", "sweep-42", "--array", "3", "--", "echo", "$TINY_ARRAY_INDEX")
    )
    first = said.split()[0]
    assert said.strip() == (
        f"{first} pending on {node}: the first of an array of 3"
        f" (list them: tiny-scheduler list --array {first})"
    )
    listed = rows(ok(cli(url, "list", "--array", first)))
    number = int(first.removeprefix("job-"))
    assert [row["JOB"] for row in listed] == [f"job-{number + i}" for i in range(3)]  # by index
    assert {row["NAME"] for row in listed} == {"sweep-42"}
    assert [row["JOB"] for row in rows(ok(cli(url, "list", "--name", "sweep-42")))] == [
        f"job-{number + i}" for i in (2, 1, 0)
    ]
    status = ok(cli(url, "status", f"job-{number + 2}"))
    assert "name         sweep-42" in status
    assert f"array        {first}, index 2 (its jobs: tiny-scheduler list --array {first})" in (
        status
    )
    assert "up to 3 after a failed attempt (the scheduler's default, MAX_JOB_RETRIES)" in status
    bad = cli(url, "submit", "--array", "3", "--wait", "true")
    assert bad.exit_code == 2 and "--wait follows one job" in bad.stderr


def test_retries_of_a_job_of_its_own(scheduler: SchedulerProcess, node: str) -> None:
    url = scheduler.url
    job_id = ok(cli(url, "submit", "-q", "--retries", "2", "false")).strip()
    assert "up to 2 after a failed attempt (its own --retries)" in ok(cli(url, "status", job_id))
    as_json = json.loads(ok(cli(url, "status", "--json", job_id)))
    assert as_json["max_retries"] == 2
    refused = cli(url, "submit", "--retries", "11", "false")
    assert refused.exit_code == 2 and "0<=x<=10" in refused.stderr


def test_status_names_the_variable_when_the_scheduler_does_not_say_its_number(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A scheduler from before `/health` said `max_job_retries`: a guessed number could be
    # wrong (it runs with whatever it was given), so the variable is named instead.
    job = {"job_id": "job-1", "node_id": "node-a", "command": "false", "job_type": "run"}
    job |= {"status": "pending", "retry_count": 0, "created_at": "2026-12-07T07:00:00Z"}
    print_status(job, default_retries=None)
    shown = capsys.readouterr().out
    assert "up to MAX_JOB_RETRIES after a failed attempt (the scheduler's default)\n" in shown


def test_hold_release_and_retry(scheduler: SchedulerProcess, node: str) -> None:
    url = scheduler.url
    agent = Agent(url, node)
    held, other = (ok(cli(url, "submit", "-q", "true")).strip() for _ in range(2))
    assert ok(cli(url, "hold", held, other)) == (
        f"{held} pending on {node}, held\n{other} pending on {node}, held\n"
    )
    assert [job.job_id for job in agent.poll()] == []
    by_job = {row["JOB"]: row for row in rows(ok(cli(url, "list", "--node", node)))}
    assert by_job[held]["WAITING FOR"] == "held"
    assert ok(cli(url, "release", other)).startswith(f"{other} pending on {node}")
    assert [job.job_id for job in agent.poll()] == [other]
    assert agent.claim(other).status_code == 200
    # One that cannot be held is told, and the others are still done; the exit says so.
    mixed = cli(url, "hold", other, held)
    assert mixed.exit_code == 1
    assert mixed.stderr == f"error: {other}: job is not pending\n"
    assert mixed.stdout == f"{held} pending on {node}, held\n"
    assert agent.report(other, 0).status_code == 200
    again = ok(cli(url, "retry", other)).strip()
    new = again.split()[0]
    assert again == f"{new} pending on {node}: a retry of {other}"
    assert cli(url, "retry", held).stderr == f"error: {held}: job is not finished\n"
    missing = cli(url, "retry", "job-999999")
    assert (missing.exit_code, missing.stderr) == (1, "error: job job-999999 not found\n")
    agent.close()


def test_list_says_why_each_job_waits(scheduler: SchedulerProcess, node: str, keyed: Api) -> None:
    url = scheduler.url
    queue = f"serial-{node}"
    first = keyed.submit(command="./first.sh")
    after = keyed.submit(command="./after.sh", depends_on=[first["job_id"]])
    assert keyed.request("PUT", f"/queues/{queue}", json={"paused": True}).status_code == 200
    paused = keyed.submit(command="./paused.sh", queue=queue)
    table = {row["JOB"]: row for row in rows(ok(cli(url, "list", "--node", node)))}
    assert table[after["job_id"]]["WAITING FOR"] == f"dependencies: {first['job_id']}"
    assert table[paused["job_id"]]["WAITING FOR"] == f"queue {queue} paused"
    assert table[first["job_id"]]["WAITING FOR"] == f"the agent on {node} to take it"
    # list --queue, beside the API's ?queue=
    only = rows(ok(cli(url, "list", "--queue", queue)))
    assert [row["JOB"] for row in only] == [paused["job_id"]]


def test_cancelled_and_timed_out_jobs_are_shown_as_such(
    scheduler: SchedulerProcess, node: str, keyed: Api
) -> None:
    url = scheduler.url
    agent = Agent(url, node)
    cancelled = keyed.submit(command="sleep 60")
    assert ok(cli(url, "cancel", cancelled["job_id"])).strip() == f"{cancelled['job_id']} cancelled"
    timed = keyed.submit(command="sleep 60", timeout_secs=1)
    assert agent.claim(timed["job_id"]).status_code == 200
    report = {"status": "failed", "exit_code": -1, "stdout": "", "stderr": "", "reason": "timeout"}
    assert agent.api.patch(f"/jobs/{timed['job_id']}", report).status_code == 200
    table = {row["JOB"]: row for row in rows(ok(cli(url, "list", "--node", node)))}
    assert table[cancelled["job_id"]]["STATUS"] == "cancelled"
    assert table[timed["job_id"]]["STATUS"] == "timed out"
    agent.close()


def test_an_error_from_a_wrong_url_names_the_url(scheduler: SchedulerProcess) -> None:
    wrong = f"{scheduler.url}/api"
    failed = cli(wrong, "list")
    assert failed.exit_code == 1
    assert failed.stderr == (
        f"error: not found (HTTP 404 from {wrong}/jobs; is {wrong} the scheduler's base URL"
        " (no path after the port)?)\n"
    )
