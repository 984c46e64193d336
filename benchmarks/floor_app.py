"""The floor: what Flask on our gunicorn costs when the app does nothing.

One route per hot call shape of the scheduler, each doing the least a Flask view can: the poll
shape (a GET answering a small JSON array: one pending job, as an agent's poll gets it), the
submission shape (a POST reading a small JSON body) and the report shape (a PATCH reading a
small JSON body). Served by `floor_conf.py` with exactly the daemon's gunicorn settings, so
the scheduler's CPU per request divided by this one's is a ratio that does not depend on the
machine.
"""

from __future__ import annotations

import orjson
from flask import Flask, Response, request

app = Flask(__name__)

_POLL_REPLY = orjson.dumps(
    [
        {
            "job_id": "job-1",
            "node_id": "node-00",
            "command": "echo hello from the benchmark",
            "job_type": "run",
            "env_vars": {"N": "1"},
            "status": "pending",
            "retry_count": 0,
            "created_at": "2026-11-30T10:20:30.123456Z",
        }
    ]
)
_SMALL_REPLY = b'{"job_id":"job-1","status":"pending"}'


@app.get("/health")
def health() -> Response:
    return Response(b'{"status":"healthy"}', mimetype="application/json")


@app.get("/jobs")
def poll() -> Response:
    return Response(_POLL_REPLY, mimetype="application/json")


@app.post("/jobs")
def submit() -> Response:
    orjson.loads(request.get_data())
    return Response(_SMALL_REPLY, status=201, mimetype="application/json")


@app.patch("/jobs/<job_id>")
def report(job_id: str) -> Response:
    orjson.loads(request.get_data())
    return Response(_SMALL_REPLY, mimetype="application/json")
