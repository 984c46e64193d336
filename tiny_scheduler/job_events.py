"""The client side of `GET /events`: a thread that reads the scheduler's event stream and
wakes whoever waits for one job when that job changes.

`--wait` used to look at the job once a second; with the stream it looks again as soon as
the job changes, and between changes only rarely (a safety net should an event go missing).
When the stream cannot be opened (an older scheduler: 404; too many waiters: 503) or ends,
`live` turns false and the waiter goes back to looking every interval: same answers, only
later. Nothing here decides when a wait is over; `client.wait_for_job` does.
"""

from __future__ import annotations

import contextlib
import json
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


class JobEvents:
    """Follows GET /events for one job, on a daemon thread of its own."""

    def __init__(self, request: Callable[..., requests.Response], job_id: str) -> None:
        """`request` is `Client.request` of a client used by this thread alone (a requests
        session is not meant to be shared between threads); taken as a function so that
        this module and `client` do not import each other."""
        self._request = request
        self._job_id = job_id
        self._opened = threading.Event()
        self._changed = threading.Event()
        self._response: requests.Response | None = None
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
        response = self._response
        connection = getattr(response.raw, "connection", None) if response is not None else None
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _run(self) -> None:
        try:
            self._response = self._request(
                "GET", "/events", stream=True, timeout=(OPEN_SECS, READ_SECS)
            )
            self.live = True
            self._opened.set()
            self._read(self._response)
        except Exception:  # any failure means: no stream, poll instead
            pass
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
