"""The agent's HTTP calls to the scheduler, across every URL it knows.

`Wire.call` sends one request to the scheduler daemons (a leader and its standbys, or one
daemon): the URL that answered last is tried first, a connection error or timeout moves on to
the next URL, and so does a standby's `503 no leader` (a takeover under way). A standby's
307/308 to the leader is followed by hand, so that the bearer key goes along (`requests`
drops it when a redirect changes host or port). Every call has short deadlines (`TIMEOUT`,
`REPORT_TIMEOUT`), so a frozen daemon is left for the next URL within seconds. When no URL
gives an answer, the call raises `Unreachable`; any answer (a 4xx or 5xx included) is the
caller's to judge.

It also counts the calls that reached no scheduler (`outages`): the agent compares the count
from before a job started with the one after it ended, to know whether the scheduler may have
given up on the job meanwhile.

The calls go over `plain_http.Pool`'s kept connections wherever it can carry them (plain
`http://`, no proxy in the environment): through `requests` and urllib3, a job's few calls (a
claim, a report, heartbeats) took a large share of the agent's CPU for the job, and a kept
connection also spares each call a connect. A TLS or proxied URL goes through a `requests`
session. Either way a call's reply is a `Reply`, which
answers what the agent asks of one (`status_code`, `ok`, `text`, `content`, `headers`,
`json()`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urljoin

import requests

from .. import plain_http
from ..client import session

TIMEOUT = (1.0, 3.0)
"""(connect, read) seconds for one request to one URL: a heartbeat, a poll, a claim, live
output, which a scheduler answers from memory or after one commit. Short, because a frozen
daemon (SIGSTOPped, or hung past its lease) still accepts connections in the kernel and then
answers nothing: the next URL (the new leader) must be asked well within the three heartbeat
periods a node stays healthy (15 s hangs once left a new leader with no healthy node)."""

REPORT_TIMEOUT = (1.0, 10.0)
"""The same for a final report, which carries up to two output tails of MAX_OUTPUT_BYTES to
read and store; one not answered in time stays in the spool and is sent again."""

MAX_REDIRECTS = 3
"""Redirects followed in one call: a standby points to the leader, which answers itself."""

_MOVED = (307, 308)

Reply = requests.Response | plain_http.Reply
"""A scheduler's answer, from whichever transport carried the call."""


class Unreachable(Exception):
    """No scheduler URL gave an answer."""


class Wire:
    """Calls to the schedulers at `urls`, with `key` as the bearer token when there is one."""

    def __init__(self, urls: Sequence[str], key: str | None = None) -> None:
        if not urls:
            raise ValueError("no scheduler URL")
        self.urls = [url.rstrip("/") for url in urls]
        self._key = key
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._pool = plain_http.Pool()
        self._session: requests.Session | None = None  # made when a URL needs `requests`
        self._lock = threading.Lock()
        self._first = 0  # index of the URL that answered last
        self.outages = 0  # calls that reached no scheduler, since start

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        timeout: tuple[float, float] = TIMEOUT,
    ) -> Reply:
        """One request, to the first URL that answers; raises Unreachable when none does."""
        with self._lock:
            first = self._first
        order = [(first + step) % len(self.urls) for step in range(len(self.urls))]
        waiting: Reply | None = None
        problem = "no URL"
        for index in order:
            try:
                reply = self._send(method, self.urls[index] + path, json, params, timeout)
            except (plain_http.NoAnswer, requests.RequestException) as exc:
                # NoAnswer says in a line what failed; a requests error's text is a paragraph.
                said = exc if isinstance(exc, plain_http.NoAnswer) else type(exc).__name__
                problem = f"{self.urls[index]}: {said}"
                continue
            if reply.status_code == 503 and reply.text.strip() == "no leader":
                waiting = reply  # a standby in a takeover: another URL may lead already
                continue
            with self._lock:
                self._first = index
            return reply
        if waiting is not None:
            return waiting
        with self._lock:
            self.outages += 1
        raise Unreachable(problem)

    def _send(
        self,
        method: str,
        url: str,
        json: Any,
        params: dict[str, str] | None,
        timeout: tuple[float, float],
    ) -> Reply:
        for _ in range(MAX_REDIRECTS + 1):
            reply = self._one(method, url, json, params, timeout)
            location = reply.headers.get("Location")
            if reply.status_code not in _MOVED or not location:
                return reply
            # The leader's URL carries the path and query already.
            url, params = urljoin(url, location), None
        return reply

    def _one(
        self,
        method: str,
        url: str,
        json: Any,
        params: dict[str, str] | None,
        timeout: tuple[float, float],
    ) -> Reply:
        if plain_http.usable_for(url):
            return self._pool.request(
                method, url, timeout=timeout, headers=self._headers, json=json, params=params
            )
        with self._lock:
            if self._session is None:
                self._session = session(self.urls[0], self._key)
            made = self._session
        return made.request(
            method, url, json=json, params=params, timeout=timeout, allow_redirects=False
        )

    def close(self) -> None:
        self._pool.close()
        with self._lock:
            if self._session is not None:
                self._session.close()
