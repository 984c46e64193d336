"""Tokens and roles across processes: a revoked token refused by the leader and through a
standby (PostgreSQL, real daemons) within one second, kept and refused alike by a new leader;
the audit record of a change made through a standby holds the client's address; the CLI shows
others' env values masked; `list --mine` and `whoami` use the token's user; `token list` shows
ids, users and roles but never a secret, and `token create --expires-in` stores its expiry.
The rules themselves are tested on the harness (`test_roles.py`, `test_tokens.py`: an expired
token's refusal, to the microsecond)."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import requests
from click.testing import CliRunner
from conftest import SchedulerFactory
from helpers import Api, expect_json, set_nodes, wait_for
from test_ha import Ha

from tiny_scheduler.cli import main
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.domain import jobs

KEY = "access-test-key"
REVOKE_SECS = 1.0
"""The contract: a revoke counts at once on every daemon; the test allows a second."""


def status_of(url: str, secret: str, path: str = "/whoami") -> int:
    reply = requests.get(url + path, headers={"Authorization": f"Bearer {secret}"}, timeout=5)
    return reply.status_code


def test_a_revoked_token_is_refused_by_the_leader_and_through_a_standby(ha: Ha) -> None:
    first = ha.start(env={"TINYAWS_API_KEY": KEY})
    second = ha.start(env={"TINYAWS_API_KEY": KEY})
    assert ha.wait_leader() is first
    admin = Api(first.url, key=KEY)
    kept = expect_json(admin.post("/tokens", {"user": "alice", "role": "user"}), 201)
    gone = expect_json(admin.post("/tokens", {"user": "bob", "role": "viewer"}), 201)
    # Through the standby (forwarded) and at its own /cluster (checked against the database).
    for url, path in ((first.url, "/whoami"), (second.url, "/whoami"), (second.url, "/cluster")):
        assert wait_for(lambda u=url, p=path: status_of(u, gone["token"], p) == 200), (url, path)
    assert admin.request("DELETE", f"/tokens/{gone['token_id']}").status_code == 204
    for url, path in ((first.url, "/whoami"), (second.url, "/whoami"), (second.url, "/cluster")):
        wait_for(
            lambda u=url, p=path: status_of(u, gone["token"], p) == 401,
            timeout=REVOKE_SECS,
            message=f"{url}{path} refusing the revoked token",
        )
    assert status_of(second.url, kept["token"]) == 200
    # The revoke is recorded once, by the leader (the standby forwarded it).
    trail = expect_json(admin.get("/audit", params={"action": "token.revoke"}), 200)
    assert [(r["target"], r["status"]) for r in trail] == [(gone["token_id"], 204)]
    admin.close()
    # A new leader loads the tokens: the kept one works, the revoked one does not.
    first.stop()
    assert ha.wait_leader([second]) is second
    assert status_of(second.url, kept["token"]) == 200
    assert status_of(second.url, gone["token"]) == 401


def call_from(
    address: str, url: str, method: str, path: str, body: bytes, headers: dict[str, str]
) -> int:
    """Make one call from the loopback `address` (127.0.0.x) and return its status: the
    daemons all listen and forward from 127.0.0.1, so a client on another address is told
    apart from the standby that forwards for it."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(
        parts.hostname or "127.0.0.1", parts.port, timeout=10, source_address=(address, 0)
    )
    try:
        conn.request(method, path, body=body, headers=headers)
        answer = conn.getresponse()
        answer.read()
        return answer.status
    finally:
        conn.close()


def test_a_change_through_a_standby_is_audited_with_the_clients_address(
    ha: Ha, registry: FakeRegistry
) -> None:
    set_nodes(registry, ["node-1"])
    first = ha.start(env={"TINYAWS_API_KEY": KEY})
    second = ha.start(env={"TINYAWS_API_KEY": KEY})
    assert ha.wait_leader() is first
    admin = Api(first.url, key=KEY)
    # The leader believes a standby's word only once its lease round has read the standby
    # into the roster (what its /cluster lists): until then it records the standby's address.
    wait_for(
        lambda: (
            second.url in {d["url"] for d in expect_json(admin.get("/cluster"), 200)["daemons"]}
        ),
        message="the leader listing the standby",
    )
    alice = expect_json(admin.post("/tokens", {"user": "alice", "role": "user"}), 201)
    bearer = {"Authorization": f"Bearer {alice['token']}", "Content-Type": "application/json"}
    # A client's own X-Forwarded-Client is dropped by the standby, which sends its client's.
    spoofed = {**bearer, "X-Forwarded-Client": "203.0.113.9"}
    submit = b'{"command":"true"}'
    assert call_from("127.0.0.7", second.url, "POST", "/jobs", submit, spoofed) == 201
    # Sent straight to the leader, the headers are not believed: the peer is no daemon.
    posing = {**spoofed, "X-Forwarded-By": second.url}
    assert call_from("127.0.0.8", first.url, "POST", "/jobs", submit, posing) == 201
    trail = expect_json(admin.get("/audit", params={"action": "submit"}), 200)
    assert [(r["user"], r["address"], r["status"]) for r in trail] == [
        ("alice", "127.0.0.7", 201),
        ("alice", "127.0.0.8", 201),
    ]
    admin.close()


def test_the_cli_masks_others_env_and_lists_mine(
    scheduler_factory: SchedulerFactory, registry: FakeRegistry
) -> None:
    set_nodes(registry, ["node-1"])
    proc = scheduler_factory(env={"TINYAWS_API_KEY": KEY})
    admin = Api(proc.url, key=KEY)
    secrets = {
        user: expect_json(admin.post("/tokens", {"user": user, "role": role}), 201)["token"]
        for user, role in (("alice", "user"), ("bob", "user"), ("vera", "viewer"))
    }

    def cli(who: str, *args: str) -> str:
        env = {"SCHEDULER_URL": proc.url, "TINYAWS_API_KEY": secrets.get(who, KEY)}
        result = CliRunner().invoke(main, list(args), env=env)
        assert result.exit_code == 0, result.output
        return result.output

    job = cli("alice", "submit", "-q", "--env", "PASSWORD=hunter2", "true").strip()
    assert json.loads(cli("alice", "status", "--json", job))["env_vars"] == {"PASSWORD": "hunter2"}
    for other in ("bob", "vera"):
        assert json.loads(cli(other, "status", "--json", job))["env_vars"] == {"PASSWORD": "***"}
    assert "hunter2" not in cli("vera", "list", "--json")
    assert json.loads(cli("admin", "status", "--json", job))["owner"] == "alice"
    assert cli("alice", "whoami").startswith("alice (user), token tok-1")
    assert cli("admin", "whoami").startswith("admin (the shared key)")
    mine = json.loads(cli("alice", "list", "--mine", "--json"))
    assert job in {found["job_id"] for found in mine}
    refused = CliRunner().invoke(
        main, ["list", "--mine"], env={"SCHEDULER_URL": proc.url, "TINYAWS_API_KEY": KEY}
    )
    assert refused.exit_code == 1 and "--mine needs a token with a user" in refused.output
    made = cli("admin", "token", "create", "--user", "carol", "--role", "agent", "--node", "n1")
    assert made.splitlines()[0].startswith("tsk_")
    assert "tok-4: carol (agent for n1)" in made
    cli("admin", "token", "revoke", "tok-4")
    assert "tok-4" not in cli("admin", "token", "list")
    trail = cli("admin", "audit", "--since", "1h", "--target", job)
    assert "submit" in trail and "alice" in trail
    admin.close()


def test_token_list_shows_ids_users_and_roles_and_create_stores_its_expiry(
    scheduler_factory: SchedulerFactory,
) -> None:
    proc = scheduler_factory(env={"TINYAWS_API_KEY": KEY})

    def cli(*args: str, key: str = KEY) -> str:
        result = CliRunner().invoke(
            main, list(args), env={"SCHEDULER_URL": proc.url, "TINYAWS_API_KEY": key}
        )
        assert result.exit_code == 0, result.output
        return result.output

    expiring = json.loads(
        cli("token", "create", "--user", "ci", "--role", "viewer", "--expires-in", "30d", "--json")
    )
    lasts = jobs.parse_time(expiring["expires_at"]) - jobs.parse_time(expiring["created_at"])
    assert lasts == 30 * 24 * 3600 * 1_000_000
    user = cli("token", "create", "--user", "alice", "--role", "user").splitlines()[0]
    agent = cli("token", "create", "--user", "agent-n1", "--role", "agent", "--node", "n1")
    secrets = [expiring["token"], user, agent.splitlines()[0]]
    assert all(secret.startswith("tsk_") for secret in secrets)
    assert cli("whoami", key=expiring["token"]).startswith("ci (viewer), token tok-1")

    table = cli("token", "list")
    header, *lines = table.splitlines()
    assert header.split() == ["TOKEN", "USER", "ROLE", "NODE", "CREATED", "EXPIRES"]
    rows = {line.split()[0]: line.split() for line in lines}
    assert rows["tok-1"][:4] == ["tok-1", "ci", "viewer", "-"]
    assert rows["tok-1"][4:] == [expiring["created_at"], expiring["expires_at"]]
    assert rows["tok-2"][:4] == ["tok-2", "alice", "user", "-"] and rows["tok-2"][5] == "never"
    assert rows["tok-3"][:4] == ["tok-3", "agent-n1", "agent", "n1"]
    assert sorted(rows) == ["tok-1", "tok-2", "tok-3"]
    listed = cli("token", "list", "--json")
    assert [t["token_id"] for t in json.loads(listed)] == ["tok-1", "tok-2", "tok-3"]
    for shown in (table, listed):
        assert "tsk_" not in shown and not any(secret in shown for secret in secrets)
