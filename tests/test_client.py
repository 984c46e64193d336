"""The HTTP client the CLI uses (`tiny_scheduler/client.py`) against stand-in daemons on
loopback: it leaves a frozen daemon fast and asks the next one, a submission retried there is
the same submission (one Idempotency-Key on every URL), a call that may have arrived is never
sent twice, and a 503 that says when to come back is followed rather than turned into an error
or a tight retry loop (issue 33: 32 event-stream clients reconnecting got 6,603 503s).
Every test runs twice: through `requests`, and through `plain_http` (a quick command's calls).

The stand-ins are real HTTP servers (threads of this process): one that accepts connections and
never answers (a SIGSTOPped daemon: the kernel still completes the handshake), and one that
answers as told and records what it was sent.
"""

from __future__ import annotations

import functools
import http.server
import json
import socket
import threading
from collections.abc import Iterator

import pytest

from tiny_scheduler import client as client_module
from tiny_scheduler.client import Client, Unreachable


class Frozen:
    """A listening socket nobody accepts from: connections complete in the kernel's backlog,
    requests are never read, nothing is ever answered."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()


class Answering:
    """A daemon that answers each request with the next of `answers` (status, headers, body),
    the last one for ever after, and records every request's method, path and headers."""

    def __init__(self, answers: list[tuple[int, dict[str, str], bytes]]) -> None:
        self.answers = list(answers)
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                owner.seen.append((self.command, self.path, dict(self.headers)))
                status, headers, body = owner.answers[0]
                if len(owner.answers) > 1:
                    owner.answers.pop(0)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


JOB = {"job_id": "job-1", "node_id": "n", "command": "x", "status": "pending"}
CREATED = (201, {"Content-Type": "application/json"}, json.dumps(JOB).encode())
TEXT = {"Content-Type": "text/plain; charset=utf-8"}


@pytest.fixture(autouse=True, params=[False, True], ids=["requests", "plain_http"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Each test through either transport: every Client the test makes is `plain` or not."""
    made = functools.partialmethod(Client.__init__, plain=request.param)
    monkeypatch.setattr(Client, "__init__", made)
    return request.param


def test_the_key_goes_as_the_bearer_token() -> None:
    live = Answering([CREATED])
    try:
        Client(live.url, "sesame").submit({"command": "x"})
        ((_, _, headers),) = live.seen
        assert headers["Authorization"] == "Bearer sesame"
    finally:
        live.close()


@pytest.fixture
def frozen() -> Iterator[Frozen]:
    made = Frozen()
    yield made
    made.close()


@pytest.fixture
def short_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second per daemon, so the tests wait seconds, not the real deadlines."""
    monkeypatch.setattr(client_module, "FAILOVER_TIMEOUT", (1.0, 1.0))


def test_a_submission_leaves_a_frozen_daemon_for_the_next_with_the_same_key(
    frozen: Frozen, short_deadlines: None
) -> None:
    live = Answering([CREATED])
    try:
        client = Client(f"{frozen.url},{live.url}")
        assert client.submit({"command": "x"})["job_id"] == "job-1"
        ((method, path, headers),) = live.seen
        assert (method, path) == ("POST", "/jobs")
        key = headers["Idempotency-Key"]
        assert key.startswith("cli-")
        # The frozen one got the same request first: its bytes are in the kernel's backlog.
        accepted, _ = frozen.sock.accept()
        with accepted:
            accepted.settimeout(5)
            sent = accepted.recv(65536).decode("latin-1")
        assert f"Idempotency-Key: {key}" in sent
        # The next call asks the daemon that answered first.
        assert client.base_url == live.url
    finally:
        live.close()


def test_each_submission_has_a_key_of_its_own_and_a_given_one_is_kept() -> None:
    live = Answering([CREATED])
    try:
        client = Client(live.url)
        client.submit({"command": "x"})
        client.submit({"command": "x"})
        client.submit({"command": "x"}, idempotency_key="mine")
        keys = [headers["Idempotency-Key"] for _, _, headers in live.seen]
        assert keys[0] != keys[1] and keys[2] == "mine"
    finally:
        live.close()


def test_a_call_that_may_have_arrived_is_not_sent_again(
    frozen: Frozen, short_deadlines: None
) -> None:
    """A cancel without a key of its own: the frozen daemon has it and may act on it when it
    wakes up; sending it to another could do it twice."""
    live = Answering([(200, {"Content-Type": "application/json"}, json.dumps(JOB).encode())])
    try:
        client = Client(f"{frozen.url},{live.url}")
        with pytest.raises(Unreachable) as caught:
            client.cancel("job-1")
        assert f"the scheduler at {frozen.url} did not answer within 1s" in caught.value.message
        assert live.seen == []
    finally:
        live.close()


def test_a_single_daemon_is_waited_for_with_the_long_deadline(frozen: Frozen) -> None:
    """With nothing else to ask, a slow answer is better than none: the read deadline stays
    HTTP_TIMEOUT's, and it is named when it passes."""
    assert client_module.HTTP_TIMEOUT[1] > client_module.FAILOVER_TIMEOUT[1]
    with pytest.raises(Unreachable) as caught:
        Client(frozen.url).request("GET", "/health", timeout=(1.0, 2.0))
    assert caught.value.message == f"the scheduler at {frozen.url} did not answer within 2s"


@pytest.mark.parametrize(
    "refusal", [b"too many connections\n", b"too many waiting requests; try again\n"]
)
def test_a_503_with_retry_after_is_followed_not_returned(refusal: bytes) -> None:
    live = Answering([(503, {**TEXT, "Retry-After": "1"}, refusal), CREATED])
    try:
        client = Client(live.url)
        assert client.submit({"command": "x"})["job_id"] == "job-1"
        assert len(live.seen) == 2  # one wait of a second or so, then the same call
        first, second = (headers["Idempotency-Key"] for _, _, headers in live.seen)
        assert first == second
    finally:
        live.close()


def test_a_503_without_retry_after_is_the_answer() -> None:
    live = Answering([(503, TEXT, b"failed to reach registry\n")])
    try:
        with pytest.raises(client_module.ApiError) as caught:
            Client(live.url).submit({"command": "x"})
        assert caught.value.text == "failed to reach registry"
        assert len(live.seen) == 1
    finally:
        live.close()


def test_retry_after_is_followed_only_so_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "RETRY_AFTER_SECS", 1.5)
    live = Answering([(503, {**TEXT, "Retry-After": "1"}, b"too many connections\n")])
    try:
        with pytest.raises(client_module.ApiError) as caught:
            Client(live.url).request("GET", "/health")
        assert caught.value.text == "too many connections"
        assert 1 <= len(live.seen) <= 2
    finally:
        live.close()
