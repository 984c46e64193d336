"""Tokens and roles across processes: a revoked token refused by the leader and through a
standby (PostgreSQL, real daemons) within one second, kept and refused alike by a new leader;
the CLI shows others' env values masked; `list --mine` and `whoami` use the token's user. The
rules themselves are tested on the harness (`test_roles.py`, `test_tokens.py`)."""

from __future__ import annotations

import json

import requests
from click.testing import CliRunner
from conftest import SchedulerFactory
from helpers import Api, expect_json, set_nodes, wait_for
from test_ha import Ha

from tiny_scheduler.cli import main
from tiny_scheduler.dev.registry import FakeRegistry

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
