"""The daemon's gunicorn worker: `gthread`, except that a request thread only ever sees a
request that has arrived in full, and never waits on a client to write its answer.

gunicorn loads it by name (`tiny_scheduler.server.worker.BufferingWorker`, in
gunicorn_conf.py). It is one class made of four parts, one concern each:

- connections.py: the loop and the life of a connection (accepting, deadlines, keep-alive,
  sending what the write buffer holds, lingering close), the request threads, the size of
  the connection table, with admission.py deciding what to close when it is full;
- reading.py: reading a request in the loop until it has arrived whole, head and body;
- answering.py: answering a whole request, inline in the loop or on a thread, plain ones
  (fasthttp.py) without gunicorn's request and response objects: the fast path;
- parking.py: requests that wait on events (waiting.py) parked in the loop, and streams.

Every gunicorn internal they rely on is in gunicorn_private.py. The HTTP rules stay
gunicorn's: anything fasthttp does not call plain goes through gunicorn's parser and response
code as before, so malformed requests get its own 400/414/431 pages. Plain HTTP/1.x only:
TLS, HTTP/2 and the PROXY protocol are refused at start-up (the scheduler uses none of them; a
terminating proxy in front can).
"""

from __future__ import annotations

from typing import Any

from gunicorn.workers import gthread

from .admission import Admission
from .answering import Answering
from .connections import ConnectionLoop, Pool
from .parking import Parking, ParkingApp
from .reading import RequestReading


class BufferingWorker(ConnectionLoop, RequestReading, Answering, Parking, gthread.ThreadWorker):
    """gunicorn's `gthread` worker with the reading of requests moved into its event loop.

    Idle, slow and silent connections are held by the loop (a selector), never by the thread
    pool; a connection goes to a thread once a whole request (head and body) has arrived, and
    comes back to the loop for the next one. Its parts are mixins that share the worker's
    state, each setting up its own (`_init_*`); the methods gthread's loop would run are all
    replaced (`run`, `accept`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_connections()
        self._init_reading()
        self._init_answering()
        self._init_parking()

    def get_thread_pool(self) -> Pool:  # gunicorn's hook: gthread makes its tpool here
        return Pool(self.cfg.threads, self.log)

    @classmethod
    def check_config(cls, cfg: Any, log: Any) -> None:
        super().check_config(cfg, log)
        if cfg.is_ssl or "h2" in cfg.http_protocols or cfg.proxy_protocol != "off":
            raise RuntimeError(
                "tiny_scheduler.server.worker serves plain HTTP/1.x only: no TLS, HTTP/2 or PROXY "
                "protocol (terminate them in a proxy in front)"
            )

    def _wire_app(self) -> None:
        """Once the app is loaded (at the start of `run`): what it offers the loop, and the
        app wrapped so that its waiting bodies reach the loop (parking.py)."""
        self.answered_before_body = getattr(self.wsgi, "answered_before_body", None)
        per_client = getattr(self.wsgi, "connections_per_client", None)
        if per_client is not None:
            self.admission = Admission(self.worker_connections, per_client)
        self.inline = self.fast and bool(getattr(self.wsgi, "inline_requests", False))
        methods = getattr(self.wsgi, "inline_methods", None)  # None: any method may be
        self.inline_methods = frozenset(methods) if methods is not None else None
        self.wsgi = ParkingApp(self.wsgi, self.serving)
