"""Helpers shared by the tests: bounded waiting, an HTTP client for the scheduler, the checks
of the wire contract's reply shapes, and an agent that speaks exactly like the real one.

Tests never sleep to synchronize: they `wait_for` a condition with a deadline.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import requests

from tiny_scheduler.agent.protocol import RUNNING_UPDATE, PolledJob, parse_poll_reply, report_update
from tiny_scheduler.dev.registry import FakeRegistry

T = TypeVar("T")

DEFAULT_NODES = ("node-a", "node-b", "node-c")
"""The healthy compute nodes a fresh test registry lists."""

REQUEST_TIMEOUT = 10.0
"""Seconds any test request may take; the spec wants answers within a few seconds, never hangs."""

JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"

# The job's wire shape as the spec writes it, spelled out here rather than taken from
# tiny_scheduler.jobs, so that a change there cannot quietly change what the tests expect.
WIRE_ORDER = (
    *("job_id", "node_id", "instance_id", "command", "deploy_url", "job_type", "port"),
    *("env_vars", "timeout_secs", "not_before", "schedule_id", "status", "reason"),
    *("retry_count", "exit_code", "stdout", "stderr"),
    *("created_at", "running_at", "finished_at", "attempts"),
)
"""Every field a job may show, in the order the spec gives them on the wire."""

ALWAYS_PRESENT = ("job_id", "node_id", "command", "job_type", "status", "retry_count", "created_at")
"""The fields every job shows, whatever its state (in wire order)."""


def in_wire_order(fields: Iterable[str]) -> list[str]:
    """The known ones of `fields`, in the order the spec puts them on the wire."""
    wanted = set(fields)
    return [field for field in WIRE_ORDER if field in wanted]


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Call `predicate` until it returns something truthy, and return that.

    Raises AssertionError naming `message` (a string, or a callable giving one, for details
    known only at the end) when `timeout` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout}s waiting for {text}")
        time.sleep(interval)


def compact(body: Any) -> bytes:
    """JSON as the scheduler and the real clients write it: compact UTF-8, no spaces."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


class Api:
    """A small client of one scheduler: a `requests.Session` with a base URL and timeouts.

    Methods return the raw `requests.Response`, so tests can check status, headers and the
    exact body bytes.
    """

    def __init__(self, base_url: str, key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        self.session.trust_env = False
        if key is not None:
            self.session.headers["Authorization"] = f"Bearer {key}"

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", REQUEST_TIMEOUT)
        return self.session.request(method, self.base_url + path, **kwargs)

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> requests.Response:
        """POST `body` as compact JSON (a str or bytes body is sent as it is)."""
        return self.request("POST", path, data=_encode(body), **kwargs)

    def patch(self, path: str, body: Any = None, **kwargs: Any) -> requests.Response:
        return self.request("PATCH", path, data=_encode(body), **kwargs)

    def submit(self, **fields: Any) -> dict[str, Any]:
        """POST /jobs that must succeed with 201; returns the job."""
        fields.setdefault("command", "true")
        return expect_json(self.post("/jobs", fields), 201)

    def job(self, job_id: str) -> dict[str, Any]:
        return expect_json(self.get(f"/jobs/{job_id}"), 200)

    def jobs(self, **params: Any) -> list[dict[str, Any]]:
        return expect_json(self.get("/jobs", params=params), 200)

    def listed(self, **params: Any) -> list[dict[str, Any]]:
        """`jobs()` as the submissions showed them: without the `waiting_for` a listing adds
        to a pending job (issue 36), to compare with what was acknowledged."""
        return [without_waiting_for(job) for job in self.jobs(**params)]

    def close(self) -> None:
        """Close the kept-alive connections now: an open one makes gunicorn's graceful stop
        wait for it (and this urllib3's `Session.close()` leaves them to the GC)."""
        for adapter in self.session.adapters.values():
            pools = getattr(adapter, "poolmanager", None)
            if pools is not None:
                for key in list(pools.pools.keys()):
                    pool = pools.pools.get(key)
                    if pool is not None:
                        pool.close()
        self.session.close()


def _encode(body: Any) -> bytes | None:
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return compact(body)


def expect_json(response: requests.Response, status: int) -> Any:
    """Check a success reply: the status, the JSON content type, compact JSON; return it."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["Content-Type"] == JSON_TYPE
    body = json.loads(response.content)
    assert response.content == compact(body), "reply JSON is not compact"
    return body


def expect_error(response: requests.Response, status: int, message: str) -> None:
    """Check an error reply: the status, text/plain, and exactly the message plus a newline."""
    assert (response.status_code, response.text) == (status, message + "\n")
    assert response.headers["Content-Type"] == TEXT_TYPE


def assert_no_nulls(value: Any) -> None:
    """The real agent rejects a reply with a `null` anywhere in it."""
    if isinstance(value, dict):
        for item in value.values():
            assert_no_nulls(item)
    elif isinstance(value, list):
        for item in value:
            assert_no_nulls(item)
    else:
        assert value is not None


_node_numbers = itertools.count(1)


def unique_node(prefix: str = "node") -> str:
    """A node id no other test uses, so tests sharing one scheduler keep out of each
    other's queues."""
    return f"{prefix}-{next(_node_numbers)}"


def set_nodes(
    registry: FakeRegistry, healthy: Iterable[str], unhealthy: Iterable[str] = ()
) -> None:
    """Make the registry list exactly these compute nodes."""
    healthy, unhealthy = list(healthy), list(unhealthy)
    for node_id in registry.nodes_listing():
        if node_id not in healthy and node_id not in unhealthy:
            registry.remove_node(node_id)
    for node_id in healthy:
        registry.set_node(node_id)
    for node_id in unhealthy:
        registry.set_node(node_id, status="unhealthy")


class Agent:
    """A compute agent of one node, speaking as the real (Rust) agent does.

    Polls are read with the strict parser that holds the real agent's rules, so a reply the
    real agent would silently drop fails the test instead. Like the real agent it sends no
    Authorization header.
    """

    def __init__(self, base_url: str, node_id: str) -> None:
        self.api = Api(base_url)
        self.node_id = node_id

    def poll(self) -> list[PolledJob]:
        response = self.api.get("/jobs", params={"node_id": self.node_id, "status": "pending"})
        assert response.status_code == 200, (response.status_code, response.text)
        return parse_poll_reply(response.content)

    def claim(self, job_id: str) -> requests.Response:
        """PATCH the exact claim body the real agent sends."""
        return self.api.patch(f"/jobs/{job_id}", compact(RUNNING_UPDATE))

    def report(
        self, job_id: str, exit_code: int, stdout: str = "", stderr: str = ""
    ) -> requests.Response:
        """The final report: done for exit 0, failed otherwise."""
        return self.api.patch(f"/jobs/{job_id}", report_update(exit_code, stdout, stderr))

    def close(self) -> None:
        self.api.close()


def without_waiting_for(job: dict[str, Any]) -> dict[str, Any]:
    """A job as GET /jobs/{id} shows it, without the `waiting_for` it adds while the job is
    pending (issue 25): what the other replies for the job show."""
    return {key: value for key, value in job.items() if key != "waiting_for"}


DEPLOY = Path(__file__).parent.parent / "deploy"
"""The deployment files (systemd units, example settings)."""


def unit_settings(name: str) -> tuple[dict[str, str], dict[str, str]]:
    """A systemd unit of deploy/: its [Service] settings (the last of each) and its
    Environment= variables."""
    settings: dict[str, str] = {}
    env: dict[str, str] = {}
    section = ""
    for line in (DEPLOY / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            settings[key] = value
            if key == "Environment":
                variable, _, assigned = value.partition("=")
                env[variable] = assigned
    return settings, env
