"""The audit trail (`domain/audit.py`, `state/audit_log.py`, `service/audit_ops.py`,
`api/access.record`) on the harness: each change through the API recorded with who, when,
from where, what and how it was answered, refused ones too; never an env value or a secret;
nothing for agents' own calls; paged like /jobs; dropped with the retention; kept across a
restart."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from harness import Harness

from tiny_scheduler import errors
from tiny_scheduler.domain import audit

pytestmark = pytest.mark.quick

KEY = "k"
ADMIN = {"Authorization": f"Bearer {KEY}"}


def setup() -> tuple[Harness, Any, dict[str, str]]:
    h = Harness(nodes=("node-a",), api_key=KEY, auth_agent_exempt=False, job_retention_secs=3600)
    client = h.app().test_client()
    made = client.post("/tokens", data=b'{"user":"alice","role":"user"}', headers=ADMIN)
    alice = {"Authorization": f"Bearer {made.json['token']}"}
    return h, client, alice


def trail(client: Any, **params: str) -> list[dict[str, Any]]:
    reply = client.get("/audit", query_string=params, headers=ADMIN)
    assert reply.status_code == 200, reply.data
    return list(reply.json)


def test_every_change_is_recorded_with_its_answer_and_no_secret() -> None:
    h, client, alice = setup()
    body = orjson.dumps({"command": "true", "env_vars": {"PASSWORD": "hunter2"}})
    job = client.post("/jobs", data=body, headers=alice).json["job_id"]
    client.post(f"/jobs/{job}/cancel", headers=alice)
    client.post(f"/jobs/{job}/cancel", headers=alice)  # 409
    client.patch("/nodes/node-a", data=b'{"drain":true}', headers=alice)  # 403
    client.patch("/nodes/node-a", data=b'{"drain":true}', headers=ADMIN)
    client.put("/queues/q", data=b'{"max_running":2}', headers=ADMIN)
    client.put("/users/alice", data=b'{"max_running":2}', headers=ADMIN)
    client.get("/jobs", headers=alice)  # a read: not recorded
    client.get("/jobs?node_id=node-a&status=pending", headers=ADMIN)  # a poll: not recorded
    found = trail(client)
    assert [(r["action"], r.get("target"), r["status"], r.get("user")) for r in found] == [
        ("token.create", "tok-1", 201, None),
        ("submit", job, 201, "alice"),
        ("cancel", job, 200, "alice"),
        ("cancel", job, 409, "alice"),
        ("drain", "node-a", 403, "alice"),
        ("drain", "node-a", 200, None),
        ("queue", "q", 200, None),
        ("user", "alice", 200, None),
    ]
    assert found[1] == {
        "at": found[1]["at"],
        "user": "alice",
        "role": "user",
        "address": "127.0.0.1",
        "action": "submit",
        "target": job,
        "status": 201,
    }
    h.settle()  # the last record rides with the next commit: the prober's, in a daemon
    stored = repr(h.database.audit) + repr(found)
    assert "hunter2" not in stored and "tsk_" not in stored
    assert len(h.database.audit) == len(found)


def test_an_agents_calls_are_not_recorded() -> None:
    _, client, _ = setup()
    made = client.post(
        "/tokens", data=b'{"user":"a","role":"agent","node_id":"node-a"}', headers=ADMIN
    )
    agent = {"Authorization": f"Bearer {made.json['token']}"}
    job = client.post("/jobs", data=b'{"command":"true"}', headers=ADMIN).json["job_id"]
    before = len(trail(client))
    client.get("/jobs?node_id=node-a&status=pending", headers=agent)
    claim = b'{"status":"running","exit_code":null,"stdout":"","stderr":""}'
    assert client.patch(f"/jobs/{job}", data=claim, headers=agent).status_code == 200
    client.post(f"/jobs/{job}/output", data=b'{"stdout":"x"}', headers=agent)
    client.put("/nodes/node-a", data=b'{"cpu_count":1,"running":[]}', headers=agent)
    assert len(trail(client)) == before


def test_paged_filtered_since_and_kept_for_the_retention_across_a_restart() -> None:
    h, client, alice = setup()
    for _ in range(5):
        client.post("/jobs", data=b'{"command":"true"}', headers=alice)
    h.advance(1800)
    client.put("/queues/q", data=b"{}", headers=ADMIN)
    cut = trail(client)[-1]["at"]
    first = client.get("/audit?limit=4", headers=ADMIN)
    assert len(first.json) == 4
    link = first.headers["Link"]
    assert link.startswith("</audit?limit=4&after=4>") and link.endswith('; rel="next"')
    rest = client.get("/audit?limit=4&after=4", headers=ADMIN)
    assert [r["action"] for r in rest.json] == ["submit", "submit", "queue"]
    assert "Link" not in rest.headers
    assert [r["action"] for r in trail(client, since=cut)] == ["queue"]
    assert [r["action"] for r in trail(client, user="alice")] == ["submit"] * 5
    assert [r.get("target") for r in trail(client, action="queue")] == ["q"]
    h.settle()  # what a crash now would lose: the records of the last RIDE_SECS
    again = h.restart()
    client = again.app().test_client()
    assert len(trail(client)) == 7  # the reads of /audit are not changes
    again.advance(1800.5)
    again.scan.apply_retention()
    assert [r["action"] for r in trail(client)] == ["queue"]
    assert list(again.database.audit) == [7]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"since": "yesterday"}, audit.SINCE_MESSAGE),
        ({"after": "x"}, audit.AFTER_MESSAGE),
        ({"limit": "0"}, audit.LIMIT_MESSAGE),
        ({"limit": "10001"}, audit.LIMIT_MESSAGE),
    ],
)
def test_bad_audit_queries_are_400(query: dict[str, str], message: str) -> None:
    with pytest.raises(errors.BadRequest) as refused:
        audit.parse_query(query)
    assert refused.value.message == message
