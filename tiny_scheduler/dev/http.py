"""A small threaded HTTP server on loopback, the base of the stand-in peers.

Each stand-in (registry, SQS, SNS) subclasses `PeerServer` and declares its endpoints as
werkzeug `Rule`s in `routes`; the base matches each request to one, and serves it with
keep-alive, Nagle off (else every keep-alive reply waits 40 ms for a delayed ACK), and the
failure modes the tests need: `fault` set to "slow" (answer after `slow_secs`), "hang" (answer
nothing until released), "error" (500) or "garbage" (200 with non-JSON).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, unquote, urlsplit

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, PathConverter, Rule


@dataclasses.dataclass
class Request:
    method: str
    path: str  # decoded, without a trailing slash
    query: dict[str, str]
    body: bytes
    headers: Any
    # What the server's `routes` make of it: the endpoint (None: no rule takes it), and the
    # rule's arguments. Matched once, when the request arrives.
    endpoint: str | None = None
    args: dict[str, Any] = dataclasses.field(default_factory=dict)

    def json(self) -> Any:
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None


@dataclasses.dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"

    @classmethod
    def json(cls, status: int, data: Any) -> Reply:
        return cls(status, json.dumps(data).encode())

    @classmethod
    def text(cls, status: int, message: str) -> Reply:
        return cls(status, (message + "\n").encode(), "text/plain; charset=utf-8")


class _Rest(PathConverter):
    """`<rest:name>`: the rest of the path, whatever it holds (`a/b`, `/a`); werkzeug's
    `path` will not start with a slash."""

    regex = ".+"
    part_isolating = False  # it spans slashes (werkzeug guesses from a `/` in the regex)


def peer_routes(*rules: Rule) -> Map:
    """A stand-in's URL map. Paths are matched as they come, `//` included, like the real
    peers' routers do (werkzeug would otherwise merge slashes with a redirect)."""
    return Map(list(rules), merge_slashes=False, converters={"rest": _Rest})


class PeerServer:
    """Serve `handle()` on a loopback port from a background thread."""

    routes: ClassVar[Map] = peer_routes()
    """The stand-in's endpoints. Each rule's endpoint names the method that answers it, called
    with the request and the rule's arguments."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.fault: str | None = None
        self.slow_secs = 0.5
        self.requests = 0
        self._release = threading.Event()
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> PeerServer:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def release(self) -> None:
        """Let requests stuck in the `hang` fault finish (with a 500)."""
        self._release.set()

    def route(self, request: Request) -> None:
        """Set the request's endpoint and arguments from the rule that takes it; the endpoint
        stays None when no rule takes its path, or not with its method."""
        try:
            request.endpoint, request.args = self.routes.bind("peer").match(
                request.path, request.method
            )
        except HTTPException:
            request.endpoint, request.args = None, {}

    def handle(self, request: Request) -> Reply:
        """Call the endpoint of the request's rule; 404 `not found` when there is none, which
        is what the real peers answer for any path or method they do not serve."""
        if request.endpoint is None:
            return Reply.text(404, "not found")
        return getattr(self, request.endpoint)(request, **request.args)

    def exempt_from_faults(self, request: Request) -> bool:
        """Requests that answer normally whatever the fault (a health check, say)."""
        return False

    def _serve(self, request: Request) -> Reply | None:
        self.requests += 1
        fault = self.fault
        if fault is None or self.exempt_from_faults(request):
            return self.handle(request)
        if fault == "slow":
            time.sleep(self.slow_secs)
            return self.handle(request)
        if fault == "hang":
            self._release.wait(120)
            return Reply.text(500, "released")
        if fault == "error":
            return Reply.text(500, "internal error")
        return Reply(200, b"<html>definitely not json", "text/html")


def _handler_for(server: PeerServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._dispatch()

        def do_POST(self) -> None:
            self._dispatch()

        def do_DELETE(self) -> None:
            self._dispatch()

        def do_PUT(self) -> None:
            self._dispatch()

        def _dispatch(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            request = Request(
                method=self.command,
                path=unquote(parts.path).rstrip("/") or "/",
                query={k: v[0] for k, v in parse_qs(parts.query).items()},
                body=self.rfile.read(length) if length else b"",
                headers=self.headers,
            )
            server.route(request)
            reply = server._serve(request)
            if reply is None:
                return
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(reply.body)

    return Handler
