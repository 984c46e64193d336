"""The client side of `GET /events`: a thread that reads the scheduler's event stream and
wakes whoever waits for one job when that job changes.

`--wait` used to look at the job once a second; with the stream it looks again as soon as
the job changes, and between changes only rarely (a safety net should an event go missing).
When the stream cannot be opened (an older scheduler: 404) or ends, `live` turns false and
the waiter goes back to looking every interval: same answers, only later. A scheduler with
too many waiting already answers 503 with `Retry-After`: then the waiter looks every interval
meanwhile, and the stream is asked for again after that many seconds (a little more, and
twice as long each time it is refused again, up to `BACKOFF_MAX_SECS`), never at once: a
crowd of waiters refused together does not come back together. Nothing here decides when a
wait is over; `client.wait_for_job` does.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import requests

OPEN_SECS = 3.0
"""Seconds the stream may take to open before the wait starts without it."""

READ_SECS = 35.0
"""Seconds without a byte after which the stream counts as dead: the scheduler sends a comment
at least every 15 s."""

BACKOFF_MAX_SECS = 60.0
"""The longest wait before asking again for a stream that was refused with Retry-After."""


class JobEvents:
    """Follows GET /events for one job, on a daemon thread of its own."""

    def __init__(
        self,
        request: Callable[..., requests.Response],
        job_id: str,
        pause: Callable[[float], bool] | None = None,
    ) -> None:
        """`request` is `Client.request` of a client used by this thread alone (a requests
        session is not meant to be shared between threads); taken as a function so that
        this module and `client` do not import each other. `pause(seconds)` waits before
        the stream is asked for again and says whether to give up (the default: until
        `close`; tests hand in one that only records)."""
        self._request = request
        self._job_id = job_id
        self._opened = threading.Event()
        self._changed = threading.Event()
        self._response: requests.Response | None = None
        self._closed = threading.Event()
        self._pause = pause or self._closed.wait
        self.live = False
        threading.Thread(target=self._run, name="job-events", daemon=True).start()
        # The caller reads the job only after this: a change after the stream opened cannot
        # fall between that read and the first event.
        self._opened.wait(OPEN_SECS)

    def wait(self, timeout: float) -> None:
        """Return when the job changed (or the stream ended), at the latest after `timeout`."""
        self._changed.wait(timeout)
        self._changed.clear()

    def close(self) -> None:
        """End the stream. The reading thread holds the response's buffer lock while it waits
        for bytes, so closing the response from here would wait for the next keep-alive
        comment (up to 15 s); shutting the socket down ends that read at once, and the
        thread closes the response itself."""
        self._closed.set()  # also ends a wait to ask again
        response = self._response
        connection = getattr(response.raw, "connection", None) if response is not None else None
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _run(self) -> None:
        backoff = 1.0
        try:
            while not self._closed.is_set():
                try:
                    self._response = self._request(
                        "GET",
                        "/events",
                        stream=True,
                        timeout=(OPEN_SECS, READ_SECS),
                        follow_retry_after=False,  # followed here, with the waiter polling
                    )
                except Exception as exc:
                    asked = getattr(exc, "retry_after", None)
                    if asked is None:
                        return  # any other failure means: no stream, poll instead
                    self._opened.set()  # the waiter polls meanwhile
                    wait = min(asked * backoff, BACKOFF_MAX_SECS) * random.uniform(1.0, 1.5)
                    backoff *= 2
                    if self._pause(wait):
                        return
                    continue
                if self._closed.is_set():
                    return
                self.live = True
                self._opened.set()
                self._changed.set()  # the stream is on: the waiter looks once, then waits
                with contextlib.suppress(Exception):  # a stream cut, or closed: poll instead
                    self._read(self._response)
                return
        finally:
            if self._response is not None:
                self._response.close()
            self.live = False
            self._opened.set()
            self._changed.set()  # the waiter should look now, and poll from here on

    def _read(self, response: requests.Response) -> None:
        """Dispatch each event (lines up to a blank one): ours, or a reset, wakes the waiter."""
        kind, data, pending = "", "", b""
        # chunk_size=None: each piece as it arrives. iter_lines would wait for 512 bytes, and
        # an event is a hundred: the wait would end with the next keep-alive comment, 15 s on.
        for piece in response.iter_content(chunk_size=None):
            pending += piece
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace").rstrip("\r")
                if line:
                    name, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if name == "event":
                        kind = value
                    elif name == "data":
                        data = value
                    continue
                if kind == "reset" or (kind == "job" and _job_of(data) == self._job_id):
                    self._changed.set()
                kind, data = "", ""


def _job_of(data: str) -> Any:
    try:
        return json.loads(data).get("job_id")
    except (ValueError, AttributeError):
        return None
