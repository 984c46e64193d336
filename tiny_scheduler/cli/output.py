"""What the command line prints: one job's fields, the output of its attempts, the jobs table,
JSON for scripts, and an error as one line on stderr.

Presentation only: the words for a job's state come from `display.py` (shared with the demo),
and nothing here calls the scheduler.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import click

from ..display import describe, format_table, one_line, short_time, status_text, waiting_for

COMMAND_WIDTH = 48
"""Characters of a job's command shown in a table row."""

NAME_WIDTH = 24
"""Characters of a job's name shown in a table row."""

JOB_COLUMNS = (
    *("JOB", "NAME", "STATUS", "EXIT", "NODE", "TYPE", "ATTEMPTS", "CREATED (UTC)"),
    *("WAITING FOR", "COMMAND"),
)
"""The header of `list`; the API's times are UTC, and the table says so. STATUS is the state
people read: `cancelled` and `timed out` apart from `failed` (`display.status_text`).

ATTEMPTS, not RETRIES: the runs of a job counted from 1, the word `logs` already numbers
them with (`attempt 2/2`) and the dashboard shows. A count of retries reads 0 for a job that
ran once, which people misread as "never ran"."""

HIDDEN = "***"
"""What an environment variable's value shows as without --show-env."""


class CliError(click.ClickException):
    """A failure shown as one line on stderr, exit status 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def attempts_of(job: dict[str, Any]) -> int:
    """How many times the job has been tried, the current (or pending) attempt included."""
    return int(job["retry_count"]) + 1


def print_status(
    job: dict[str, Any], show_env: bool = False, default_retries: int | None = None
) -> None:
    """One job as aligned `name  value` lines, empty fields left out; the environment's values
    hidden unless `show_env` (they are often secrets, and terminals get shared).
    `default_retries`: the scheduler's MAX_JOB_RETRIES (its `/health`), None when unknown."""
    env = " ".join(
        f"{k}={shlex.quote(v) if show_env else HIDDEN}"
        for k, v in (job.get("env_vars") or {}).items()
    )
    attempts = attempts_of(job)
    fields = [
        ("job", job["job_id"]),
        ("name", job.get("name", "")),
        ("status", describe(job)),
        ("type", job["job_type"] + (f" on port {job['port']}" if job.get("port") else "")),
        ("node", job["node_id"]),
        ("instance", job.get("instance_id", "")),
        ("command", job["command"]),
        ("deploy url", job.get("deploy_url", "")),
        ("env", env),
        ("timeout", f"{job['timeout_secs']}s" if job.get("timeout_secs") else ""),
        ("not before", job.get("not_before", "")),
        ("waiting for", job.get("waiting_for", "") if job["status"] == "pending" else ""),
        ("array", _array(job)),
        ("retry of", job.get("retry_of", "")),
        ("schedule", job.get("schedule_id", "")),
        ("after", _dependencies(job)),
        ("priority", str(job["priority"]) if "priority" in job else ""),
        ("queue", job.get("queue", "")),
        ("needs", needs_text(job)),
        ("on", _placement_limits(job)),
        ("created", job["created_at"]),
        ("running", job.get("running_at", "")),
        ("finished", job.get("finished_at", "")),
        ("used", usage_text(job.get("usage"))),
        (
            "attempts",
            f"{attempts} (every one's output: tiny-scheduler logs {job['job_id']})"
            if attempts > 1
            else "1",
        ),
        ("retries", _retries(job, default_retries)),
    ]
    rows = [(name, value) for name, value in fields if value]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        click.echo(f"{name.ljust(width)}  {value}")


def needs_text(job: dict[str, Any]) -> str:
    """What a job asked for beyond one CPU: `4 cpus, 8192 MiB, 1 gpu`; "" for a plain one."""
    parts = []
    if job.get("cpus", 1) > 1:
        parts.append(f"{job['cpus']} cpus")
    if job.get("memory_mb"):
        parts.append(f"{job['memory_mb']} MiB")
    if job.get("gpus"):
        parts.append(f"{job['gpus']} gpu{'s' if job['gpus'] > 1 else ''}")
    return ", ".join(parts)


def _placement_limits(job: dict[str, Any]) -> str:
    labels = ",".join(f"{k}={v}" for k, v in (job.get("node_selector") or {}).items())
    nodes = ", ".join(job.get("node_ids") or ())
    return "; ".join(part for part in (labels, f"nodes {nodes}" if nodes else "") if part)


def usage_text(usage: dict[str, Any] | None) -> str:
    """What an attempt used, as sacct shows it: `cpu 1.2s, max rss 30.5 MiB, wall 2.0s`."""
    if not usage:
        return ""
    return (
        f"cpu {usage['cpu_secs']:.1f}s, max rss {usage['max_rss_mb']:.1f} MiB,"
        f" wall {usage['wall_secs']:.1f}s"
    )


def _array(job: dict[str, Any]) -> str:
    """`job-5, index 3 (its jobs: tiny-scheduler list --array job-5)`."""
    if "array_id" not in job:
        return ""
    return (
        f"{job['array_id']}, index {job.get('array_index', 0)}"
        f" (its jobs: tiny-scheduler list --array {job['array_id']})"
    )


def _retries(job: dict[str, Any], default: int | None) -> str:
    """How often a failed attempt of this job is tried again, while it can still fail: its
    own `max_retries`, or the scheduler's default (`default`), which people are otherwise
    never told. A scheduler too old to say its default gets the variable's name, not a guess:
    the number it runs with may be anything."""
    if job["status"] in ("done", "failed"):
        return ""
    if "max_retries" in job:
        return f"up to {job['max_retries']} after a failed attempt (its own --retries)"
    if default is None:
        return "up to MAX_JOB_RETRIES after a failed attempt (the scheduler's default)"
    return f"up to {default} after a failed attempt (the scheduler's default, MAX_JOB_RETRIES)"


def _dependencies(job: dict[str, Any]) -> str:
    found = job.get("depends_on")
    if not found:
        return ""
    return ", ".join(found) + (" (any end)" if job.get("dependency") == "any" else "")


def print_streams(attempt: dict[str, Any]) -> bool:
    """An attempt's stdout and stderr, each under a `--- name ---` line; whether it had any."""
    shown = False
    for stream in ("stdout", "stderr"):
        text = attempt.get(stream, "")
        if text:
            click.echo(f"--- {stream} ---")
            click.echo(text, nl=not text.endswith("\n"))
            shown = True
    return shown


def print_attempts(job: dict[str, Any], attempts: list[dict[str, Any]]) -> None:
    """Every attempt of a job, the latest last, each under a `===` line saying how it ended."""
    total = len(attempts)
    for number, attempt in enumerate(attempts, 1):
        if number < total:
            outcome = f"failed (exit {attempt.get('exit_code', '?')})"
        else:
            outcome = describe({**job, **attempt}) + " (latest)"
        if number > 1:
            click.echo()
        click.echo(
            f"=== {job['job_id']} attempt {number}/{total} on {attempt['node_id']}: {outcome}"
        )
        if not print_streams(attempt):
            click.echo("(no output)")


def jobs_table(jobs: list[dict[str, Any]], now: str | None = None) -> str:
    """The `list` table; `now` (RFC 3339) leaves out a NOT BEFORE that has passed."""
    rows = [
        (
            job["job_id"],
            one_line(job.get("name", ""), NAME_WIDTH) or "-",
            status_text(job),
            str(job["exit_code"]) if "exit_code" in job else "-",
            job["node_id"],
            job["job_type"],
            str(attempts_of(job)),
            short_time(job["created_at"]),
            _waiting_cell(job, now),
            one_line(job["command"] or job.get("deploy_url", ""), COMMAND_WIDTH),
        )
        for job in jobs
    ]
    return format_table(JOB_COLUMNS, rows)


def _waiting_cell(job: dict[str, Any], now: str | None) -> str:
    what = waiting_for(job, now)
    if what.startswith("not before "):
        return "not before " + short_time(what.removeprefix("not before "))
    return what or "-"
