"""For the dev cluster only: the agent's calls to a (dev) registry.

Until the scheduler keeps its own node list (`REGISTRY_URL=builtin`), the dev cluster's
scheduler learns its nodes from the dev registry, so the agent started with `--registry URL`
registers its node there and heartbeats, and registers each service job it starts
(`POST /services`), as the tiny-aws agent does. A production agent beside a real registry
leaves that to the tiny-aws agent and runs without `--registry`.
"""

from __future__ import annotations

import logging

import requests

from ..client import session

log = logging.getLogger(__name__)

TIMEOUT = (2.0, 10.0)


class DevRegistry:
    def __init__(self, url: str, node_id: str, cpu_count: int, key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.node_id = node_id
        self.cpu_count = cpu_count
        self._session = session(self.url, key)
        self._registered = False

    def heartbeat(self) -> None:
        """Register the node the first time, heartbeat after that; failures are logged."""
        path = "/nodes/heartbeat" if self._registered else "/nodes/register"
        body = {
            "id": self.node_id,
            "hostname": self.node_id,
            "addr": "127.0.0.1",
            "cpu_count": self.cpu_count,
            "role": "compute",
        }
        try:
            reply = self._session.post(self.url + path, json=body, timeout=TIMEOUT)
        except requests.RequestException as exc:
            log.warning("%s: registry %s: %s", self.node_id, path, exc)
            return
        if reply.ok:
            self._registered = True
        else:
            log.warning("%s: registry %s answered %d", self.node_id, path, reply.status_code)

    def register_service(self, job_id: str, port: int | None) -> None:
        body = {
            "name": job_id,
            "job_id": job_id,
            "node_id": self.node_id,
            "addr": "127.0.0.1",
            "port": port or 0,
        }
        try:
            reply = self._session.post(self.url + "/services", json=body, timeout=TIMEOUT)
        except requests.RequestException as exc:
            log.warning("%s: POST /services: %s", self.node_id, exc)
            return
        if not reply.ok:
            log.warning("%s: POST /services answered %d", self.node_id, reply.status_code)
