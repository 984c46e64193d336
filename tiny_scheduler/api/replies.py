"""Reply shapes: compact JSON for success, `text/plain` message plus newline for errors.

Every error a client can get, including Flask's own (unknown route, wrong method, body too
large), leaves through here, so no HTML error page ever reaches an agent or a script.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from flask import Flask, Response, current_app, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from .. import errors
from ..service import Scheduler

log = logging.getLogger(__name__)

_EXTENSION = "tiny_scheduler"


def scheduler() -> Scheduler:
    """The service of the app handling the current request."""
    return current_app.extensions[_EXTENSION]


def attach(app: Flask, service: Scheduler) -> None:
    app.extensions[_EXTENSION] = service


def json_reply(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    # orjson writes compact JSON (no spaces after ':' or ','), which the original's smoke
    # scripts grep for.
    return Response(orjson.dumps(body), status=status, mimetype="application/json", headers=headers)


STREAM_CHUNK_BYTES = 1 << 20
"""A JSON array reply is built this many bytes at a time: one that fits is sent whole (with its
Content-Length), a longer one is streamed, so its memory does not grow with its size."""

_SLICE_BYTES = 256 * 1024
"""An item bigger than a chunk goes out in slices of this size: the server copies each piece
it sends (to frame it as a chunk), and a slice is a smaller copy than the whole item."""


def json_array_reply(items: Iterable[Any], headers: dict[str, str] | None = None) -> Response:
    """The items as one compact JSON array, the same bytes as `json_reply(list(items))`; each
    item is taken from `items` only when the reply gets to it."""
    chunks = _array_chunks(items, STREAM_CHUNK_BYTES)
    first = next(chunks)
    second = next(chunks, None)
    if second is None:
        return Response(first, mimetype="application/json", headers=headers)
    return Response(_resumed(first, second, chunks), mimetype="application/json", headers=headers)


def _resumed(first: bytes, second: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    """The chunks again from the start. A generator, so that closing the reply (the server
    does when the client goes away) closes `rest` too, and with it the reads of the store."""
    yield first
    yield second
    yield from rest


def _array_chunks(items: Iterable[Any], size: int) -> Iterator[bytes]:
    """A JSON array of `items` in pieces of at least `size` bytes (the last one may be less).
    Small items are gathered into one piece; a big one is not copied into a piece, but sent
    on its own, sliced."""
    parts = [b"["]
    held = 1
    for index, item in enumerate(items):
        if index:
            parts.append(b",")
            held += 1
        encoded = orjson.dumps(item)
        if len(encoded) >= size:
            yield b"".join(parts)
            parts, held = [], 0
            for start in range(0, len(encoded), _SLICE_BYTES):
                yield encoded[start : start + _SLICE_BYTES]
            continue
        parts.append(encoded)
        held += len(encoded)
        if held >= size:
            yield b"".join(parts)
            parts, held = [], 0
    parts.append(b"]")
    yield b"".join(parts)


def text_reply(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(
        message + "\n", status=status, content_type="text/plain; charset=utf-8", headers=headers
    )


def init_app(app: Flask) -> None:
    app.register_error_handler(errors.ServiceError, _service_error)
    app.register_error_handler(RequestEntityTooLarge, _too_large)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)


def _service_error(exc: errors.ServiceError) -> Response:
    headers = None
    if exc.status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="tiny-scheduler"'}
    elif isinstance(exc, errors.Unavailable) and exc.retry_after is not None:
        headers = {"Retry-After": str(exc.retry_after)}
    return text_reply(exc.message, exc.status, headers)


DRAIN_LIMIT_FACTOR = 4
"""A refused body up to this many times MAX_REQUEST_BYTES is read and dropped (see below)."""


def _too_large(exc: RequestEntityTooLarge) -> Response:
    # gunicorn answers keep-alive and then drops the connection when much of the body is left
    # unread, so a client reusing it fails on its next request. Reading a body of moderate size
    # to the end keeps the connection usable; a huge one is left for gunicorn to cut.
    length = request.content_length or 0
    if length <= DRAIN_LIMIT_FACTOR * (current_app.config["MAX_CONTENT_LENGTH"] or 0):
        stream = request.environ["wsgi.input"]
        with contextlib.suppress(OSError, ValueError):
            while length > 0 and (chunk := stream.read(min(length, 65536))):
                length -= len(chunk)
    return text_reply(errors.REQUEST_TOO_LARGE, 413)


def _http_error(exc: HTTPException) -> Response:
    status = exc.code or 500
    reply = text_reply((exc.name or "error").lower(), status)
    if status == 405 and exc.get_response().headers.get("Allow"):
        reply.headers["Allow"] = exc.get_response().headers["Allow"]
    return reply


def _unexpected(exc: Exception) -> Response:
    log.exception("unexpected error")
    return text_reply("internal error", 500)
