"""Tokens (`domain/tokens.py`, `state/token_book.py`, `service/token_ops.py`) on the harness:
made with a secret shown once and kept as its SHA-256, good until revoked or expired (to the
microsecond of the harness's clock), kept across a restart, refused while auth is off."""

from __future__ import annotations

import hashlib

import orjson
import pytest
from harness import Harness

from tiny_scheduler import errors
from tiny_scheduler.cli.delays import parse_duration
from tiny_scheduler.domain import jobs, tokens
from tiny_scheduler.domain.roles import Principal, Role
from tiny_scheduler.domain.tokens import TokenRequest

pytestmark = pytest.mark.quick


def test_a_token_is_stored_as_the_digest_of_its_secret_only() -> None:
    h = Harness(api_key="k")
    token, secret = h.service.tokens.create(TokenRequest("alice", Role.USER))
    assert token.token_id == "tok-1" and secret.startswith("tsk_") and len(secret) > 40
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest()
    stored = [batch.tokens for batch in h.commits if batch.tokens]
    assert stored == [(token,)]
    assert secret not in repr(h.database)
    assert h.service.tokens.identify(secret) == Principal(Role.USER, "alice", "", "tok-1")
    assert h.service.tokens.identify(secret + "x") is None


def test_expiry_and_revocation_count_at_once() -> None:
    h = Harness(api_key="k")
    _, secret = h.service.tokens.create(TokenRequest("eve", Role.VIEWER, "", 60))
    h.advance(59.999999)
    assert h.service.tokens.identify(secret) is not None
    h.advance(0.000001)
    assert h.service.tokens.identify(secret) is None
    other, kept = h.service.tokens.create(TokenRequest("bob", Role.USER))
    h.service.tokens.revoke(other.token_id)
    assert h.service.tokens.identify(kept) is None
    with pytest.raises(errors.NotFound, match="token not found"):
        h.service.tokens.revoke(other.token_id)


def test_a_token_made_with_the_clis_expiry_is_refused_over_http_from_that_instant() -> None:
    """`token create --expires-in 90s` sends `expires_in_secs` as `parse_duration` reads it
    (its daemon test, `test_access_http.py`, checks what the CLI sends and shows): the token
    is listed with that expiry and is refused from the microsecond it is reached."""
    h = Harness(api_key="k")
    client = h.app().test_client()
    key = {"Authorization": "Bearer k"}
    body = {"user": "ci", "role": "viewer", "expires_in_secs": parse_duration("90s")}
    made = client.post("/tokens", data=orjson.dumps(body), headers=key)
    assert made.status_code == 201, made.data
    expires_at = jobs.parse_time(made.json["expires_at"])
    assert expires_at - jobs.parse_time(made.json["created_at"]) == 90 * 1_000_000
    [listed] = client.get("/tokens", headers=key).json
    assert listed["expires_at"] == made.json["expires_at"]
    bearer = {"Authorization": f"Bearer {made.json['token']}"}
    h.advance(89.999999)
    assert client.get("/whoami", headers=bearer).status_code == 200
    h.advance(0.000001)
    refused = client.get("/whoami", headers=bearer)
    assert (refused.status_code, refused.data) == (401, b"unauthorized\n")
    assert h.clock.now_us() == expires_at


def test_tokens_survive_a_restart_and_ids_are_never_reused() -> None:
    h = Harness(api_key="k")
    _, secret = h.service.tokens.create(TokenRequest("alice", Role.USER))
    gone, _ = h.service.tokens.create(TokenRequest("agent-a", Role.AGENT, "node-a"))
    h.service.tokens.revoke(gone.token_id)
    again = h.restart()
    assert again.service.tokens.identify(secret) == Principal(Role.USER, "alice", "", "tok-1")
    made, _ = again.service.tokens.create(TokenRequest("carol", Role.USER))
    assert made.token_id == "tok-3"


def test_tokens_need_auth_on() -> None:
    h = Harness()
    with pytest.raises(errors.Conflict, match=r"tokens need TINYAWS_API_KEY \(auth is off\)"):
        h.service.tokens.create(TokenRequest("alice", Role.USER))
    reply = h.app().test_client().post("/tokens", data=b'{"user":"alice","role":"user"}')
    assert (reply.status_code, reply.data) == (409, b"tokens need TINYAWS_API_KEY (auth is off)\n")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], tokens.DECODE_TOKEN),
        ({"role": "user"}, "user must be 1 to 64 characters of A-Za-z0-9._@-"),
        ({"user": "a b", "role": "user"}, "user must be 1 to 64 characters of A-Za-z0-9._@-"),
        ({"user": "a", "role": "root"}, "role must be admin, user, viewer or agent"),
        ({"user": "a", "role": "agent"}, tokens.NODE_MESSAGE),
        ({"user": "a", "role": "user", "node_id": "n"}, tokens.NODE_MESSAGE),
        ({"user": "a", "role": "agent", "node_id": "n/1"}, tokens.NODE_ID_MESSAGE),
        ({"user": "a", "role": "user", "expires_in_secs": 0}, tokens.EXPIRES_MESSAGE),
        ({"user": "a", "role": "user", "expires_in_secs": True}, tokens.EXPIRES_MESSAGE),
        ({"user": "a", "role": "user", "expires_in_secs": "1"}, tokens.EXPIRES_MESSAGE),
    ],
)
def test_bad_token_requests_are_400_naming_the_field(body: object, message: str) -> None:
    with pytest.raises(errors.BadRequest) as refused:
        tokens.parse_token_request(orjson.dumps(body))
    assert refused.value.message == message


def test_the_wire_shape() -> None:
    h = Harness(api_key="k")
    client = h.app().test_client()
    made = client.post(
        "/tokens",
        data=b'{"user":"agent-a","role":"agent","node_id":"node-a","expires_in_secs":3600}',
        headers={"Authorization": "Bearer k"},
    )
    assert made.status_code == 201
    assert list(made.json) == [
        "token_id", "user", "role", "node_id", "created_at", "expires_at", "token"
    ]  # fmt: skip
    listed = client.get("/tokens", headers={"Authorization": "Bearer k"}).json
    assert listed == [{k: v for k, v in made.json.items() if k != "token"}]
    who = client.get("/whoami", headers={"Authorization": f"Bearer {made.json['token']}"})
    assert who.json == {
        "user": "agent-a", "role": "agent", "token_id": "tok-1", "node_id": "node-a", "auth": True
    }  # fmt: skip
    assert client.get("/whoami", headers={"Authorization": "Bearer k"}).json == {
        "role": "admin",
        "auth": True,
    }
    assert client.delete("/tokens/tok-1", headers={"Authorization": "Bearer k"}).status_code == 204
    assert client.delete("/tokens/bad", headers={"Authorization": "Bearer k"}).status_code == 404
