"""The workflow commands of the command line (issue 25) against a real daemon: `submit
--after/--after-any/--priority/--queue`, `queues`, `queue set|pause|resume`, and `status`
saying why a job waits. Commands run through click's CliRunner (the real command code in
this process, talking HTTP to the real server); no agent runs, so jobs stay where the
commands put them."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result

from tiny_scheduler.cli import main
from tiny_scheduler.dev.daemon import SchedulerProcess

KEY = "workflow-cli-key"
SCHEDULER_ENV = {"TINYAWS_API_KEY": KEY}


def cli(scheduler: SchedulerProcess, *args: str) -> Result:
    env = {"SCHEDULER_URL": scheduler.url, "TINYAWS_API_KEY": KEY}
    return CliRunner().invoke(main, list(args), env=env)


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def test_submit_with_dependencies_priority_and_queue(
    scheduler: SchedulerProcess, node: str
) -> None:
    first = ok(cli(scheduler, "submit", "-q", "true")).strip()
    second = ok(cli(scheduler, "submit", "-q", "true")).strip()
    number = second.removeprefix("job-")
    job = json.loads(
        ok(
            cli(
                scheduler,
                "submit",
                "--after",
                f"{first},{number}",
                "--after-any",
                "--priority",
                "80",
                "--queue",
                "nightly",
                "--json",
                "--",
                "make",
                "report",
            )
        )
    )
    assert (job["depends_on"], job["dependency"], job["priority"], job["queue"]) == (
        [first, second],
        "any",
        80,
        "nightly",
    )
    shown = ok(cli(scheduler, "status", job["job_id"]))
    assert f"after        {first}, {second} (any end)\n" in shown
    assert f"waiting for  dependencies: {first}, {second}\n" in shown


def test_submit_after_a_job_that_does_not_exist_fails_with_the_apis_text(
    scheduler: SchedulerProcess, node: str
) -> None:
    result = cli(scheduler, "submit", "--after", "job-999999", "true")
    assert (result.exit_code, result.stderr) == (1, "error: depends_on: job-999999 not found\n")


def test_queue_settings_from_the_command_line(scheduler: SchedulerProcess, node: str) -> None:
    ok(cli(scheduler, "submit", "-q", "--queue", "cli-q", "true"))
    assert ok(cli(scheduler, "queue", "set", "cli-q", "--max-running", "4")) == (
        "cli-q: running, limit 4, 1 pending, 0 running\n"
    )
    paused = json.loads(ok(cli(scheduler, "queue", "pause", "cli-q", "--json")))
    assert paused == {
        "queue": "cli-q",
        "pending": 1,
        "running": 0,
        "max_running": 4,  # kept: pausing changes only that
        "paused": True,
    }
    table = ok(cli(scheduler, "queues")).splitlines()
    assert table[0].split() == ["QUEUE", "PENDING", "RUNNING", "LIMIT", "PAUSED"]
    assert ["cli-q", "1", "0", "4", "yes"] in [line.split() for line in table[1:]]
    assert ok(cli(scheduler, "queue", "resume", "cli-q")) == (
        "cli-q: running, limit 4, 1 pending, 0 running\n"
    )
    assert ok(cli(scheduler, "queue", "set", "cli-q", "--no-limit")) == (
        "cli-q: running, limit -, 1 pending, 0 running\n"
    )
    listed = json.loads(ok(cli(scheduler, "queues", "--json")))
    assert {"queue": "cli-q", "pending": 1, "running": 0, "max_running": None, "paused": False} in (
        listed
    )
