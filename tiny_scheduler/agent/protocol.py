"""The compute agent's side of the wire: how the real (Rust) agent reads a poll reply.

`parse_poll_reply` is as strict as the real agent: the body must be a JSON array; in each
element `job_id` and `command` must be strings, `deploy_url`, `instance_id` and `job_type`
optional strings, `port` an optional int 0-65535, `env_vars` an optional string map. One
`null` anywhere or one bad element makes the whole reply unreadable (the real agent then
silently does nothing), so this raises `ValueError` for it. The agent (`tiny_scheduler.agent`)
and the tests both use it, so they see replies exactly as a tiny-aws agent would.
`RUNNING_UPDATE` and `report_update` are the two PATCH bodies the real agent sends. What only
this project's agent reads (`retry_count`, `timeout_secs`, `cpus`, `memory_mb`, `gpus`) is read
leniently: a value of another shape counts as not given.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

RUNNING_UPDATE = {"status": "running", "exit_code": None, "stdout": "", "stderr": ""}
"""The exact claim body the real agent sends."""


def report_update(exit_code: int, stdout: str = "", stderr: str = "") -> dict[str, Any]:
    """The body of the one final report the real agent sends when a job's command ends:
    `done` for exit code 0, `failed` otherwise."""
    status = "done" if exit_code == 0 else "failed"
    return {"status": status, "exit_code": exit_code, "stdout": stdout, "stderr": stderr}


@dataclasses.dataclass(frozen=True)
class PolledJob:
    job_id: str
    command: str
    deploy_url: str | None = None
    instance_id: str | None = None
    job_type: str | None = None
    port: int | None = None
    env_vars: dict[str, str] | None = None
    # Read by this project's agent only (the tiny-aws one ignores them): the attempt it is
    # handed (to name it in its reports), the job's own timeout (enforced where it runs) and
    # what it needs (0: not asked; a `run` job counts as one CPU).
    retry_count: int | None = None
    timeout_secs: int = 0
    cpus: int = 0
    memory_mb: int = 0
    gpus: int = 0


def parse_poll_reply(body: bytes | str) -> list[PolledJob]:
    return parse_jobs(json.loads(body))


def parse_jobs(data: Any) -> list[PolledJob]:
    """Jobs as a poll reply lists them, already decoded (a waiting heartbeat's `jobs` too)."""
    if not isinstance(data, list):
        raise ValueError("poll reply is not a JSON array")
    return [_parse_job(element) for element in data]


def _parse_job(element: Any) -> PolledJob:
    if not isinstance(element, dict):
        raise ValueError(f"poll element is not an object: {element!r}")
    for name, value in element.items():
        if value is None:
            raise ValueError(f"null in field {name!r}")
    for name in ("job_id", "command"):
        if not isinstance(element.get(name), str):
            raise ValueError(f"{name} missing or not a string")
    for name in ("deploy_url", "instance_id", "job_type"):
        if name in element and not isinstance(element[name], str):
            raise ValueError(f"{name} is not a string")
    port = element.get("port")
    if port is not None and (
        not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535
    ):
        raise ValueError("port is not an int 0-65535")
    env = element.get("env_vars")
    if env is not None and (
        not isinstance(env, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise ValueError("env_vars is not a string map")
    retry_count, timeout = element.get("retry_count"), element.get("timeout_secs")
    return PolledJob(
        job_id=element["job_id"],
        command=element["command"],
        deploy_url=element.get("deploy_url"),
        instance_id=element.get("instance_id"),
        job_type=element.get("job_type"),
        port=port,
        env_vars=env,
        retry_count=retry_count if _is_count(retry_count) else None,
        timeout_secs=timeout if _is_count(timeout) else 0,
        **{name: _count(element.get(name)) for name in ("cpus", "memory_mb", "gpus")},
    )


def _count(value: Any) -> int:
    return value if _is_count(value) else 0


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
