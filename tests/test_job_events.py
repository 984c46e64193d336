"""The CLI's event-stream follower (`tiny_scheduler/job_events.py`) when the scheduler refuses
the stream: a 503 with Retry-After is asked again only after that many seconds (a little more,
twice as long each time), with the waiter polling meanwhile; any other refusal means polling
for good; `close` ends a wait at once. (Issue 33: a reconnect storm of 32 event-stream
clients got 6,603 503s.) Pure: the requests are a function the test hands in, the waits are
recorded rather than slept; the stream against a live daemon is in test_cli_usability.py."""

from __future__ import annotations

import threading
from typing import Any

from helpers import wait_for

from tiny_scheduler.job_events import BACKOFF_MAX_SECS, JobEvents


class Refused(Exception):
    def __init__(self, retry_after: float | None) -> None:
        super().__init__("refused")
        self.retry_after = retry_after


class Stream:
    """A response whose body is one event about job-1."""

    def __init__(self) -> None:
        self.closed = False

    def iter_content(self, chunk_size: Any = None) -> Any:
        yield b'event: job\ndata: {"job_id":"job-1"}\n\n'

    def close(self) -> None:
        self.closed = True


def test_a_refusal_with_retry_after_is_asked_again_later_and_later() -> None:
    calls: list[dict[str, Any]] = []
    pauses: list[float] = []
    stream = Stream()

    def request(method: str, path: str, **kwargs: Any) -> Stream:
        calls.append(kwargs)
        if len(calls) <= 3:
            raise Refused(retry_after=5.0)
        return stream

    events = JobEvents(request, "job-1", pause=lambda secs: bool(pauses.append(secs)))
    wait_for(lambda: stream.closed, message="the stream to be read and closed")
    assert len(calls) == 4
    assert all(call["follow_retry_after"] is False for call in calls)
    # Retry-After, then twice and four times as long, each up to half as much again.
    for pause, least in zip(pauses, (5.0, 10.0, 20.0), strict=True):
        assert least <= pause <= least * 1.5
    assert not events.live  # the stream ended: the waiter polls from now on


def test_the_wait_is_capped() -> None:
    pauses: list[float] = []
    done = threading.Event()

    def request(method: str, path: str, **kwargs: Any) -> Stream:
        if len(pauses) >= 8:
            done.set()
            raise Refused(retry_after=None)
        raise Refused(retry_after=5.0)

    JobEvents(request, "job-1", pause=lambda secs: bool(pauses.append(secs)))
    assert done.wait(10)
    assert max(pauses) <= BACKOFF_MAX_SECS * 1.5


def test_any_other_refusal_means_polling_without_asking_again() -> None:
    calls: list[str] = []

    def request(method: str, path: str, **kwargs: Any) -> Stream:
        calls.append(path)
        raise Refused(retry_after=None)

    events = JobEvents(request, "job-1", pause=lambda secs: False)
    assert not events.live
    assert calls == ["/events"]


def test_close_ends_a_wait_at_once() -> None:
    asked = threading.Event()

    def request(method: str, path: str, **kwargs: Any) -> Stream:
        asked.set()
        raise Refused(retry_after=BACKOFF_MAX_SECS)

    events = JobEvents(request, "job-1")  # the real pause: until closed
    assert asked.wait(10)
    threads = [t for t in threading.enumerate() if t.name == "job-events"]
    events.close()
    for thread in threads:
        thread.join(5)
        assert not thread.is_alive()
