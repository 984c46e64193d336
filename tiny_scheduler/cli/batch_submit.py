"""`submit --from-file FILE` (`-` for stdin): many jobs in a few requests, without a loop.

Each line of the file is one job: a shell command as it is, or, when it starts with `{`, a
JSON object of job fields as `POST /jobs` takes them (`{"command": "…", "queue": "gpu"}`).
Blank lines and lines starting with `#` are skipped. The options given beside `--from-file`
(`--queue`, `--env`, `--priority`, …) are every line's defaults: a JSON line's own fields win,
and its `env_vars` are added to `--env`'s.

The whole file is read and checked first (a line that is not JSON says so before anything is
sent), then sent in batches of at most BATCH_JOBS jobs or BATCH_BYTES bytes, one
`POST /jobs/batch` each: a batch is created whole or not at all. Each job's id is printed as
soon as its batch is created, one per line (`--json`: each job as a JSON line), so that after
a refusal the ids above it are the jobs that exist; the refusal names the file's line.

Every batch carries an Idempotency-Key (`--idempotency-key K`: `K.0`, `K.1`, … for the
batches in order, so running the same file again with the same key creates nothing new).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import IO, Any

import click

from ..client import ApiError, Client
from .output import CliError

BATCH_JOBS = 1000
"""Jobs per request: large enough that a request's cost is spread thin, small enough that
a refused one is quick to redo."""

BATCH_BYTES = 1 << 20
"""The most JSON one request carries, well under the scheduler's MAX_REQUEST_BYTES
(4 MiB unless set)."""

_ITEM_ERROR = re.compile(r"job (\d+): (.*)", re.DOTALL)
"""How the scheduler names the item of a batch an error is about."""


def read_jobs(stream: IO[str], defaults: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """Each job of the file with its line number (from 1): its fields over `defaults`."""
    found = []
    for number, raw in enumerate(stream, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not line.startswith("{"):
            found.append((number, {**defaults, "command": line}))
            continue
        try:
            fields = json.loads(line)
        except ValueError:
            fields = None
        if not isinstance(fields, dict):
            raise CliError(f"line {number}: a line starting with {{ must be one JSON object")
        env = {**defaults.get("env_vars", {}), **(fields.get("env_vars") or {})}
        found.append((number, {**defaults, **fields, "env_vars": env}))
    return found


def batches(jobs: list[tuple[int, dict[str, Any]]]) -> list[list[tuple[int, dict[str, Any]]]]:
    """The jobs cut into requests of at most BATCH_JOBS jobs and BATCH_BYTES of JSON."""
    made: list[list[tuple[int, dict[str, Any]]]] = []
    size = 0
    for job in jobs:
        weight = len(json.dumps(job[1])) + 1
        if not made or len(made[-1]) >= BATCH_JOBS or size + weight > BATCH_BYTES:
            made.append([])
            size = 0
        made[-1].append(job)
        size += weight
    return made


def submit_from(
    client: Client, stream: IO[str], defaults: dict[str, Any], key: str | None, as_json: bool
) -> None:
    """Submit every job of `stream` and print each one's id (or JSON) as its batch is made."""
    jobs = read_jobs(stream, defaults)
    if not jobs:
        raise CliError("no jobs in the file: every line is blank or a # comment")
    base_key = key or f"cli-{uuid.uuid4().hex}"
    done = 0
    for index, batch in enumerate(batches(jobs)):
        try:
            made = client.submit_batch([fields for _, fields in batch], f"{base_key}.{index}")
        except ApiError as exc:
            raise CliError(_refusal(exc, batch, done)) from None
        for job in made:
            click.echo(json.dumps(job, ensure_ascii=False) if as_json else job["job_id"])
        done += len(made)


def _refusal(exc: ApiError, batch: list[tuple[int, dict[str, Any]]], done: int) -> str:
    """The scheduler's refusal of a batch, with the file's line for the item it names."""
    before = f" ({done} jobs submitted before it: the ids above)" if done else " (none submitted)"
    about = _ITEM_ERROR.fullmatch(exc.text)
    if about is not None and int(about.group(1)) < len(batch):
        line = batch[int(about.group(1))][0]
        return f"line {line}: {about.group(2)}{before}"
    return f"{exc.message}{before}"
