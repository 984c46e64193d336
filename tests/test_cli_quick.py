"""The quick `submit` (`cli/quick.py`): the plain forms of a submission, read and sent without
click, must mean exactly what click's `submit` makes of the same words, and everything else
must be left to click.

- Its reading of the words against click's own (`submit.make_context`), over plain forms.
- Its table of options against click's declarations (names, flags, repeatable, ranges), so a
  change to one cannot leave the other behind.
- The forms it leaves to click (None, nothing sent).
- Against a real daemon: the same words sent by the quick path and by click make the same job,
  and a failure reads the same; a plain `submit` imports no click at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import click
import pytest
from click.testing import CliRunner
from helpers import Api

from tiny_scheduler.cli import main, quick
from tiny_scheduler.cli.job_commands import submit
from tiny_scheduler.cli.submission import env_pair
from tiny_scheduler.dev.daemon import SchedulerProcess

CLI = os.path.join(os.path.dirname(sys.executable), "tiny-scheduler")

PLAIN_FORMS = [
    ["true"],
    ["echo", "two words", "$HOME"],
    ["-q", "echo $HOME"],
    ["--quiet", "-J", "nightly-report", "--queue", "q1", "--", "ls", "-la"],
    ["--name=n", "--priority", "0", "--timeout=1", "--retries", "10", "sleep 1"],
    ["--env", "A=1", "--env", "B=two words", "--env=C=", "--env", "A=3", "printf %s $A"],
    ["--idempotency-key", "k-1", "--priority", "100", "-"],
]

LEFT_TO_CLICK = [
    [],
    ["--"],
    ["--help"],
    ["--wait", "true"],
    ["--json", "true"],
    ["--port", "80", "true"],
    ["--priority", "101", "true"],
    ["--priority", "-1", "true"],
    ["--priority", "+5", "true"],
    ["--timeout", "0", "true"],
    ["--retries", "11", "true"],
    ["--env", "NOEQUALS", "true"],
    ["--env", "=value", "true"],
    ["ls", "-la"],  # an option after the command: click says to put the command after --
    ["true", "-q"],
    ["--name"],
    ["--name", "--queue", "q", "true"],
    ["-Jname", "true"],
    ["-qJ", "n", "true"],
    ["--quiet=1", "true"],
    ["--name", "a", "--name", "b", "true"],
    ["--after", "job-1", "true"],
    ["--cpus", "2", "true"],
]


def clicks_reading(args: list[str]) -> dict[str, Any]:
    """What click's `submit` gets for these words, in quick's terms: the parameters given."""
    ctx = submit.make_context("submit", list(args))
    given = {
        name: value
        for name, value in ctx.params.items()
        if name in {param for param, _ in quick.OPTIONS.values()} | {"command"}
        and value is not None
        and value is not False  # an unset flag (a priority of 0 is given)
        and value != ()
    }
    if "env" in given:
        given["env"] = [env_pair(pair) for pair in given["env"]]
    return given


@pytest.mark.parametrize("args", PLAIN_FORMS, ids=" ".join)
def test_a_plain_form_is_read_as_click_reads_it(args: list[str]) -> None:
    assert quick.parse(args) == clicks_reading(args)


@pytest.mark.parametrize("args", LEFT_TO_CLICK, ids=lambda args: " ".join(args) or "nothing")
def test_every_other_form_is_left_to_click(args: list[str]) -> None:
    assert quick.parse(args) is None


def test_the_options_are_clicks_own() -> None:
    declared = {
        opt: param
        for param in submit.params
        if isinstance(param, click.Option)
        for opt in param.opts
    }
    for opt, (name, kind) in quick.OPTIONS.items():
        param = declared[opt]
        assert param.name == name, opt
        assert param.is_flag == (kind == quick.FLAG), opt
        assert param.multiple == (kind == quick.PAIRS), opt
        if isinstance(kind, tuple):
            assert isinstance(param.type, click.IntRange), opt
            assert (param.type.min, param.type.max) == kind, opt
            assert not (param.type.min_open or param.type.max_open), opt
        else:
            assert not isinstance(param.type, click.IntRange), opt
    # Every spelling of an option quick reads is read, not only some.
    for opt in quick.OPTIONS:
        assert set(declared[opt].opts) <= set(quick.OPTIONS), opt


def test_other_commands_and_group_options_are_left_to_click() -> None:
    assert quick.quick_submit(["--version"]) is None
    assert quick.quick_submit(["list"]) is None
    assert quick.quick_submit(["--url"]) is None
    assert quick.quick_submit(["--url", "not a url at all://x", "submit", "true"]) is None


# --- against a real daemon ------------------------------------------------------------------


def cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SCHEDULER_URL": url, "TINYAWS_API_KEY": ""}
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=60)


REQUEST_FIELDS = ("command", "job_type", "env_vars", "name", "queue", "priority")


def test_the_quick_path_and_click_make_the_same_job(
    scheduler: SchedulerProcess, api: Api, node: str
) -> None:
    words = ["-J", "same", "--queue", "q-same", "--priority", "70", "--env", "A=1 2"]
    words += ["--timeout", "30", "--retries", "2", "--", "printf", "%s", "$A"]
    quick_run = cli("submit", "-q", *words, url=scheduler.url)
    assert quick_run.returncode == 0, quick_run.stderr
    # --json is click's: the same words through click's `submit`.
    click_run = CliRunner().invoke(
        main, ["--url", scheduler.url, "submit", "--json", *words], env={"TINYAWS_API_KEY": ""}
    )
    assert click_run.exit_code == 0, click_run.output
    quick_job = api.get(f"/jobs/{quick_run.stdout.strip()}").json()
    click_job = api.get(f"/jobs/{json.loads(click_run.output)['job_id']}").json()
    fields = (*REQUEST_FIELDS, "timeout_secs", "max_retries")
    assert {f: quick_job.get(f) for f in fields} == {f: click_job.get(f) for f in fields}
    assert quick_job["command"] == "printf %s '$A'" and quick_job["env_vars"] == {"A": "1 2"}
    assert quick_job["job_id"] != click_job["job_id"]


def test_the_quick_path_prints_what_click_prints(scheduler: SchedulerProcess, node: str) -> None:
    """One node, no agent: both jobs wait on it, and each line says so the same way."""
    shown = cli("submit", "echo hi", url=scheduler.url)
    assert shown.returncode == 0, shown.stderr
    by_click = CliRunner().invoke(
        main, ["--url", scheduler.url, "submit", "echo hi"], env={"TINYAWS_API_KEY": ""}
    )
    assert by_click.exit_code == 0, by_click.output
    quick_id, quick_rest = shown.stdout.strip().split(" ", 1)
    click_id, click_rest = by_click.output.strip().split(" ", 1)
    assert quick_id != click_id and quick_id.startswith("job-")
    assert quick_rest == click_rest == f"pending on {node}"


def test_an_idempotency_key_makes_one_job_however_often_it_is_sent(
    scheduler: SchedulerProcess, node: str
) -> None:
    first = cli("submit", "-q", "--idempotency-key", "quick-once", "true", url=scheduler.url)
    again = cli("submit", "-q", "--idempotency-key", "quick-once", "true", url=scheduler.url)
    assert first.returncode == again.returncode == 0, (first.stderr, again.stderr)
    assert first.stdout == again.stdout


def test_a_failure_reads_as_clicks_and_a_plain_submit_imports_no_click() -> None:
    dead = "http://127.0.0.1:9"  # nothing listens there
    quick_run = cli("submit", "-q", "true", url=dead)
    click_run = cli("submit", "--json", "true", url=dead)
    assert quick_run.returncode == click_run.returncode == 1
    assert quick_run.stderr == click_run.stderr
    assert quick_run.stderr.startswith(f"error: cannot reach the scheduler at {dead}")
    traced = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tiny_scheduler.cli", "submit", "true"],
        capture_output=True,
        text=True,
        env={"SCHEDULER_URL": dead, "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    modules = {line.rsplit("|", 1)[1].strip() for line in traced.stderr.splitlines() if "|" in line}
    assert "tiny_scheduler.cli.quick" in modules
    assert not {name for name in modules if name.split(".")[0] == "click"}
    assert "tiny_scheduler.domain.jobs" not in modules
