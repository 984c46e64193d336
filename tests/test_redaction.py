"""`redaction.redacted`: a URL as the banner, the log and error messages show it, with its
secrets hidden and everything else as it was (an operator still needs to see which host)."""

from __future__ import annotations

import socket
import threading

import pytest

from tiny_scheduler.cluster.peers import Peer
from tiny_scheduler.config import ConfigError, Settings
from tiny_scheduler.redaction import redacted


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
        ("http://user:secret@127.0.0.1:9000", "http://user:***@127.0.0.1:9000"),
        ("https://user:secret@registry/v1/", "https://user:***@registry/v1/"),
        ("http://secret@registry:9000/x", "http://***@registry:9000/x"),  # a lone token
        ("http://user:se@cret@registry/", "http://user:***@registry/"),  # '@' in the password
        ("http://user:secret@[::1:9000/x", "http://user:***@[::1:9000/x"),  # urllib refuses it
        ("user:secret@registry:9000", "user:***@registry:9000"),  # the scheme forgotten
        (
            "postgresql://sched:secret@db:5432/jobs?sslmode=require",
            "postgresql://sched:***@db:5432/jobs?sslmode=require",
        ),
        (
            "postgresql://db/jobs?password=secret&sslpassword=secret&keepalives=1#x",
            "postgresql://db/jobs?password=***&sslpassword=***&keepalives=1#x",
        ),
        ("https://sqs/q?X-Amz-Signature=secret&a=1", "https://sqs/q?X-Amz-Signature=***&a=1"),
        ("http://registry/path@with-at", "http://registry/path@with-at"),  # not user info
    ],
)
def test_secrets_are_hidden_and_the_rest_is_kept(url: str, shown: str) -> None:
    assert redacted(url) == shown


def test_a_refused_url_is_named_without_its_password() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"REGISTRY_URL": "ftp://user:secret@registry:9000"})
    assert "secret" not in str(refused.value)
    assert "ftp://user:***@registry:9000" in str(refused.value)


def test_a_peer_is_not_sent_the_credentials_in_its_host_header() -> None:
    """The Host header names the host and port only: user info there is not HTTP, and a
    peer or a proxy in front of it logs the header as it came."""
    heads: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def answer_once() -> None:
            conn, _ = server.accept()
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(4096)
                heads.append(head)  # before the answer, so the call returns after this
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]")

        threading.Thread(target=answer_once, daemon=True).start()
        peer = Peer("registry", f"http://user:secret@127.0.0.1:{port}", 5.0)
        assert peer.call("GET", "/nodes", "nodes") == (200, b"[]")
    assert b"secret" not in heads[0]
    assert f"\r\nHost: 127.0.0.1:{port}\r\n".encode() in heads[0]
