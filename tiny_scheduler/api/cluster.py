"""GET /cluster: the daemons that share the job database, who leads, and in which epoch.

Any daemon answers it itself, a standby too (from what its last lease round read, so it
answers while the leader is gone or the database away); it needs the key like the API.
"""

from __future__ import annotations

from flask import Blueprint, Response, request

from ..domain.jobs import format_time
from .replies import json_reply, scheduler

bp = Blueprint("cluster", __name__)


@bp.get("/cluster")
def cluster() -> Response:
    """`{"leader", "epoch", "daemons": [{"id","url","role","version","started_at",
    "last_seen_at","alive"}...]}`, the leader first; `alive` is false for a daemon not seen
    for longer than a running one ever goes (killed, or cut off from the database)."""
    view = scheduler().terms.cluster(request.host_url.rstrip("/"))
    daemons = [
        {
            "id": daemon.id,
            "url": daemon.url,
            "role": daemon.role,
            "version": daemon.version,
            "started_at": format_time(daemon.started_at),
            "last_seen_at": format_time(daemon.last_seen_at),
            "alive": daemon.alive,
        }
        for daemon in view.daemons
    ]
    return json_reply({"leader": view.leader, "epoch": view.epoch, "daemons": daemons})
