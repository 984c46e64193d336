"""`submit --from-file` and `POST /jobs/batch` against a real key-protected daemon under
gunicorn: a file (or stdin) of commands and JSON lines becomes jobs, one id per line, in
batches made whole or not at all; a refusal names the file's line; the same key twice makes
nothing new; roles, owners and the audit trail are those of a submission; MAX_REQUEST_BYTES
bounds a batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from helpers import Api, expect_error, expect_json

from tiny_scheduler.cli import batch_submit, main
from tiny_scheduler.dev.daemon import SchedulerProcess

ROOT = Path(__file__).resolve().parent.parent
KEY = "batch-submit-key"
SCHEDULER_ENV = {"TINYAWS_API_KEY": KEY, "REGISTRY_CACHE_SECS": "0", "MAX_REQUEST_BYTES": "200000"}


def cli(url: str, *args: str, stdin: str = "", key: str = KEY) -> Result:
    env = {"SCHEDULER_URL": url, "TINYAWS_API_KEY": key}
    return CliRunner().invoke(main, list(args), input=stdin, env=env)


@pytest.fixture
def admin(scheduler: SchedulerProcess) -> Any:
    api = Api(scheduler.url, KEY)
    yield api
    api.close()


def test_a_file_of_commands_and_json_lines_becomes_jobs_one_id_a_line(
    scheduler: SchedulerProcess, admin: Api, node: str, tmp_path: Any
) -> None:
    jobs_file = tmp_path / "jobs.txt"
    jobs_file.write_text(
        "# nightly\n"
        "echo one\n"
        "\n"
        '{"command": "echo two", "priority": 70, "env_vars": {"B": "2"}}\n'
        "  echo three  \n"
    )
    done = cli(
        scheduler.url, "submit", "--from-file", str(jobs_file), "--queue", "q", "--env", "A=1"
    )
    assert done.exit_code == 0, done.output
    ids = done.stdout.split()
    assert len(ids) == 3 and done.stdout == "".join(f"{job_id}\n" for job_id in ids)
    made = [admin.job(job_id) for job_id in ids]
    assert [job["command"] for job in made] == ["echo one", "echo two", "echo three"]
    assert {job["queue"] for job in made} == {"q"}  # the options are every line's defaults
    assert [job["env_vars"] for job in made] == [{"A": "1"}, {"A": "1", "B": "2"}, {"A": "1"}]
    assert [job.get("priority", 50) for job in made] == [50, 70, 50]


def test_stdin_in_batches_with_json_out_and_the_key_makes_nothing_twice(
    scheduler: SchedulerProcess, admin: Api, node: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_submit, "BATCH_JOBS", 4)  # 10 lines: three requests
    lines = "".join(f"echo {n}\n" for n in range(10))
    args = ("submit", "--from-file", "-", "--json", "--idempotency-key", "nightly-7")
    first = cli(scheduler.url, *args, stdin=lines)
    assert first.exit_code == 0, first.output
    made = [json.loads(line) for line in first.stdout.splitlines()]
    assert [job["command"] for job in made] == [f"echo {n}" for n in range(10)]
    numbers = [int(job["job_id"].removeprefix("job-")) for job in made]
    assert numbers == list(range(numbers[0], numbers[0] + 10))
    again = cli(scheduler.url, *args, stdin=lines)
    assert again.exit_code == 0, again.output
    assert [json.loads(line)["job_id"] for line in again.stdout.splitlines()] == [
        job["job_id"] for job in made
    ]
    assert len(admin.listed(node_id=node)) == 10


def test_a_refused_line_is_named_and_its_batch_is_not_made(
    scheduler: SchedulerProcess, admin: Api, node: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_submit, "BATCH_JOBS", 3)
    lines = (
        "echo a\necho b\necho c\necho d\n# skip\n"
        + '{"command": "x", "port": 0, "timeout_secs": -1}\n'
    )
    refused = cli(scheduler.url, "submit", "--from-file", "-", stdin=lines)
    assert refused.exit_code == 1
    assert refused.stdout.split() == [job["job_id"] for job in admin.listed(node_id=node)]
    assert len(refused.stdout.split()) == 3  # the first batch; the second not at all
    assert refused.stderr.startswith("error: line 6: timeout_secs must be an integer"), (
        refused.stderr
    )
    assert "(3 jobs submitted before it: the ids above)" in refused.stderr
    not_json = cli(scheduler.url, "submit", "--from-file", "-", stdin="echo a\n{oops\n")
    assert not_json.exit_code == 1 and not_json.stdout == ""
    assert "line 2: a line starting with { must be one JSON object" in not_json.stderr
    assert len(admin.listed(node_id=node)) == 3


def test_roles_owner_and_audit_are_a_submissions(
    scheduler: SchedulerProcess, admin: Api, node: str
) -> None:
    tokens = {
        role: expect_json(admin.post("/tokens", {"user": f"{role}-b", "role": role}), 201)["token"]
        for role in ("user", "viewer")
    }
    viewer = Api(scheduler.url, tokens["viewer"])
    user = Api(scheduler.url, tokens["user"])
    try:
        refused = viewer.post("/jobs/batch", [{"command": "x"}])
        assert refused.status_code == 403
        over = user.post("/jobs/batch", [{"command": "x"}, {"command": "y", "priority": 90}])
        assert over.status_code == 403 and over.text.startswith("job 1: ")
        made = expect_json(user.post("/jobs/batch", [{"command": "x"}, {"command": "y"}]), 201)
        assert {job["owner"] for job in made} == {"user-b"}
        trail = expect_json(admin.get("/audit", params={"action": "submit batch"}), 200)
        assert trail[-1]["target"] == f"{made[0]['job_id']}..{made[1]['job_id']}"
        assert trail[-1]["user"] == "user-b"
    finally:
        viewer.close()
        user.close()


def test_a_batch_over_max_request_bytes_is_413_and_makes_nothing(
    scheduler: SchedulerProcess, admin: Api, node: str
) -> None:
    big = [{"command": "echo " + "x" * 1000}] * 250  # ~250 kB, over the module's 200000
    expect_error(admin.post("/jobs/batch", big), 413, "request body too large")
    assert admin.listed(node_id=node) == []


DOCUMENTED_PIPE = (
    'printf \'echo one\\n# a comment\\n{"command": "echo two", "priority": 70}\\n\''
    " | tiny-scheduler submit --from-file - --queue nightly"
)
"""The pipe docs/cli.md shows (tests/test_docs_commands.py names this test as its runner)."""


def test_the_documented_pipe(scheduler: SchedulerProcess, admin: Api, node: str) -> None:
    assert f"$ {DOCUMENTED_PIPE}\n" in (ROOT / "docs" / "cli.md").read_text()
    env = {**os.environ, "SCHEDULER_URL": scheduler.url, "TINYAWS_API_KEY": KEY}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    done = subprocess.run(
        ["bash", "-c", DOCUMENTED_PIPE], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    ids = done.stdout.split()
    made = [admin.job(job_id) for job_id in ids]
    assert [(job["command"], job["queue"]) for job in made] == [
        ("echo one", "nightly"),
        ("echo two", "nightly"),
    ]
    assert made[1]["priority"] == 70
