"""Roles (`domain/roles.py`, checked by `api/access.py`): every endpoint x every credential, the
check order, ownership, an agent's node, the masking of others' env values.

The exhaustive test is generated from the one role table and the app's own routes; a second,
hand-written list of cases (`CASES`) says the same things in other words, so the table cannot
be wrong in the same way twice. All of it on the harness's real app (Flask's test client, a
settable clock: an expired token is one the clock passed), no port; what crosses processes is
in `test_access_http.py`.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from flask.testing import FlaskClient
from harness import Harness

from tiny_scheduler.api import auth
from tiny_scheduler.domain import roles
from tiny_scheduler.domain.roles import Principal, Role

pytestmark = pytest.mark.quick

KEY = "the-shared-key"
NODE = "node-a"
OTHER_NODE = "node-b"

PENDING_ROUTES: set[tuple[str, str]] = set()
"""Rows for endpoints another branch brings, in the table before their routes (none now)."""


class World:
    """A harness with auth on, a token of each role, a job and a schedule of alice's on
    node-a, one of bob's, one of the shared key's."""

    def __init__(self) -> None:
        self.h = Harness(nodes=(NODE, OTHER_NODE), api_key=KEY, auth_agent_exempt=False)
        self.app = self.h.app()
        self.client: FlaskClient = self.app.test_client()
        self.secrets: dict[str, str] = {"key": KEY}
        for name, user, role, node in (
            ("admin", "root", "admin", ""),
            ("user", "alice", "user", ""),
            ("bob", "bob", "user", ""),
            ("viewer", "vera", "viewer", ""),
            ("agent", "agent-a", "agent", NODE),
            ("revoked", "mallory", "user", ""),
            ("expired", "eve", "user", ""),
        ):
            body: dict[str, Any] = {"user": user, "role": role}
            if node:
                body["node_id"] = node
            if name == "expired":
                body["expires_in_secs"] = 60
            made = self.call("key", "POST", "/tokens", body)
            assert made.status_code == 201, made.data
            self.secrets[name] = made.json["token"]
            if name == "revoked":
                assert self.call("key", "DELETE", f"/tokens/{made.json['token_id']}").status_code
        self.h.advance(61)  # the expired one has
        self.alice_job = self.submit("user", env_vars={"SECRET": "alice-s"})
        self.bob_job = self.submit("bob", env_vars={"SECRET": "bob-s"})
        self.key_job = self.submit("key", env_vars={"SECRET": "key-s"})
        self.alice_schedule = self.schedule("user", "alices")
        self.bob_schedule = self.schedule("bob", "bobs")

    def call(
        self, who: str | None, method: str, path: str, body: Any = None, buffered: bool = True
    ) -> Any:
        headers = {} if who is None else {"Authorization": f"Bearer {self.secrets[who]}"}
        data = None if body is None else orjson.dumps(body)
        return self.client.open(path, method=method, data=data, headers=headers, buffered=buffered)

    def submit(self, who: str, **fields: Any) -> str:
        self.h.set_nodes([NODE])
        reply = self.call(who, "POST", "/jobs", {"command": "true", **fields})
        self.h.set_nodes([NODE, OTHER_NODE])
        assert reply.status_code == 201, reply.data
        return str(reply.json["job_id"])

    def schedule(self, who: str, name: str) -> str:
        body = {"name": name, "cron": "@daily", "job": {"command": "true", "env_vars": {"S": "x"}}}
        reply = self.call(who, "POST", "/schedules", body)
        assert reply.status_code == 201, reply.data
        return str(reply.json["schedule_id"])


@pytest.fixture(scope="module")
def world() -> World:
    return World()


# --- the table and the app agree ------------------------------------------------------------


def app_operations(world: World) -> list[tuple[str, str]]:
    """Every (method, route) the app serves that needs a credential."""
    found = []
    for rule in world.app.url_map.iter_rules():
        # `static`: the harness's plain Flask app has one; the daemon's app does not.
        if rule.endpoint in auth._ALWAYS_OPEN or rule.endpoint == "static":
            continue
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            found.append((method, rule.rule))
    return sorted(found)


def test_every_route_of_the_app_has_a_row_in_the_role_table(world: World) -> None:
    missing = [op for op in app_operations(world) if op not in roles.RULES]
    assert missing == []


def test_every_row_of_the_role_table_is_a_route_of_the_app(world: World) -> None:
    served = set(app_operations(world)) | {("GET", roles.AGENT_POLL)}
    assert sorted(set(roles.RULES) - served - PENDING_ROUTES) == []


# --- every endpoint x every credential --------------------------------------------------------

CREDENTIALS = ("none", "revoked", "expired", "key", "admin", "user", "viewer", "agent")
PRINCIPALS = {
    "key": roles.SHARED_KEY,
    "admin": Principal(Role.ADMIN, "root"),
    "user": Principal(Role.USER, "alice"),
    "viewer": Principal(Role.VIEWER, "vera"),
    "agent": Principal(Role.AGENT, "agent-a", NODE),
}


def fill(world: World, route: str) -> str:
    """A path for `route` whose targets the user and the agent may reach (alice's job, on the
    agent's node; alice's schedule): the role's answer is what is left to see."""
    if route == roles.AGENT_POLL:
        return f"/jobs?node_id={NODE}&status=pending"
    values = {
        "job_id": world.alice_job,
        "schedule_id": world.alice_schedule,
        "node_id": NODE,
        "name": "somequeue",
        "token_id": "tok-999999",
        "path:filename": "ui.css",
        "action": "pause",
    }
    return re.sub(r"<([^>]+)>", lambda m: values[m.group(1)], route)


def expected(credential: str, method: str, route: str) -> tuple[int, str] | None:
    """The refusal the table says, or None when the call may go on (whatever it then says)."""
    if credential in ("none", "revoked", "expired"):
        return 401, "unauthorized"
    why = roles.refusal(PRINCIPALS[credential], method, route, NODE)
    return None if why is None else (403, why)


def every_call(world: World) -> list[tuple[str, str, str]]:
    ops = [*app_operations(world), ("GET", roles.AGENT_POLL)]
    return [(credential, method, route) for method, route in ops for credential in CREDENTIALS]


def test_every_endpoint_and_credential_gets_what_the_table_says() -> None:
    world = World()  # its own: the calls that are let through change things
    wrong = []
    calls = every_call(world)
    assert len(calls) >= 8 * 45
    for credential, method, route in calls:
        who = None if credential == "none" else credential
        body = None if method in ("GET", "DELETE") else {}
        # Unbuffered: an event stream let through is never read (it would not end).
        reply = world.call(who, method, fill(world, route), body, buffered=False)
        want = expected(credential, method, route)
        text = "" if reply.status_code not in (401, 403) else reply.get_data(as_text=True)
        reply.close()
        if want is None:
            ok = reply.status_code not in (401, 403)
        else:
            ok = (reply.status_code, text) == (want[0], want[1] + "\n")
        if not ok:
            wrong.append((credential, method, route, reply.status_code, text.strip()[:80]))
    assert wrong == []


# --- the same, said by hand -------------------------------------------------------------------

VIEWER_READS = "forbidden: viewer tokens may only read"
ADMIN_ONLY = "forbidden: only an admin may do this"
FOR_NODE_A = "forbidden: this token is for node-a"

CASES = [
    ("viewer", "POST", "/jobs", 403, VIEWER_READS),
    ("viewer", "GET", "/tokens", 403, ADMIN_ONLY),
    ("viewer", "GET", "/audit", 403, ADMIN_ONLY),
    ("viewer", "GET", "/users", 200, None),
    ("user", "POST", "/tokens", 403, ADMIN_ONLY),
    ("user", "PATCH", "/nodes/node-a", 403, ADMIN_ONLY),
    ("user", "PUT", "/users/alice", 403, ADMIN_ONLY),
    ("user", "PUT", "/queues/default", 403, ADMIN_ONLY),
    ("user", "PUT", "/nodes/node-a", 403, ADMIN_ONLY),
    ("user", "GET", "/jobs?node_id=node-a&status=pending", 403, ADMIN_ONLY),
    ("agent", "GET", "/jobs", 403, FOR_NODE_A),
    ("agent", "POST", "/jobs", 403, FOR_NODE_A),
    ("agent", "GET", "/jobs?node_id=node-b&status=pending", 403, FOR_NODE_A),
    ("agent", "GET", "/jobs?node_id=node-a&status=pending", 200, None),
    ("agent", "PUT", "/nodes/node-b", 403, FOR_NODE_A),
    ("agent", "GET", "/ui/", 403, FOR_NODE_A),
    ("revoked", "GET", "/jobs", 401, "unauthorized"),
    ("expired", "GET", "/whoami", 401, "unauthorized"),
    ("key", "DELETE", "/tokens/tok-999999", 404, "token not found"),
    ("admin", "GET", "/tokens", 200, None),
]


@pytest.mark.parametrize(("who", "method", "path", "status", "message"), CASES)
def test_hand_written_cases(
    world: World, who: str, method: str, path: str, status: int, message: str | None
) -> None:
    reply = world.call(who, method, path, None if method == "GET" else {})
    assert reply.status_code == status, reply.data
    if message is not None:
        assert reply.get_data(as_text=True) == message + "\n"


# --- ownership, the node binding, priority, and the order of the checks -----------------------


def test_a_user_changes_only_its_own_jobs(world: World) -> None:
    bob = world.call("user", "POST", f"/jobs/{world.bob_job}/cancel")
    assert bob.status_code == 403
    assert bob.data == f"forbidden: {world.bob_job} belongs to bob\n".encode()
    keys = world.call("user", "POST", f"/jobs/{world.key_job}/cancel")
    assert keys.data == f"forbidden: {world.key_job} belongs to no user\n".encode()
    own = world.submit("user")
    assert world.call("user", "POST", f"/jobs/{own}/cancel").status_code == 200
    # Finished now: the 409 comes after ownership's 403 (bob's 403 is unchanged by it).
    again = world.call("user", "POST", f"/jobs/{own}/cancel")
    assert again.status_code == 409
    assert world.call("bob", "POST", f"/jobs/{own}/cancel").data == (
        f"forbidden: {own} belongs to alice\n".encode()
    )
    # An unknown job is 404 before any ownership.
    assert world.call("user", "POST", "/jobs/job-999999/cancel").status_code == 404


def test_a_user_changes_only_its_own_schedules_and_the_body_is_checked_first(world: World) -> None:
    path = f"/schedules/{world.bob_schedule}"
    bad = world.call("user", "PATCH", path, {"cron": "never"})
    assert bad.status_code == 400, bad.data
    good = world.call("user", "PATCH", path, {"paused": True})
    assert good.data == f"forbidden: {world.bob_schedule} belongs to bob\n".encode()
    assert world.call("user", "DELETE", path).status_code == 403
    assert world.call("user", "POST", f"{path}/run").status_code == 403
    assert world.call("user", "PATCH", "/schedules/sched-999999", {}).status_code == 404
    mine = world.call("user", "PATCH", f"/schedules/{world.alice_schedule}", {"paused": True})
    assert mine.status_code == 200 and mine.json["owner"] == "alice"


def test_the_role_refusal_comes_before_the_body(world: World) -> None:
    refused = world.call("viewer", "POST", "/jobs", "not an object")
    assert refused.data == (VIEWER_READS + "\n").encode()
    assert world.call("user", "POST", "/tokens", "junk").status_code == 403
    assert world.call("agent", "PUT", "/nodes/node-b", "junk").status_code == 403


def test_a_users_priority_above_50_needs_an_admin(world: World) -> None:
    world.h.set_nodes([NODE])
    high = world.call("user", "POST", "/jobs", {"command": "true", "priority": 51})
    assert high.data == b"forbidden: priority above 50 needs an admin\n"
    # The body's 400 comes first.
    assert world.call("user", "POST", "/jobs", {"priority": 51}).status_code == 400
    at_50 = world.call("user", "POST", "/jobs", {"command": "true", "priority": 50})
    assert at_50.status_code == 201
    at_90 = world.call("admin", "POST", "/jobs", {"command": "true", "priority": 90})
    assert at_90.status_code == 201
    schedule = {"name": "hi", "cron": "@daily", "job": {"command": "true", "priority": 80}}
    assert world.call("user", "POST", "/schedules", schedule).status_code == 403
    world.h.set_nodes([NODE, OTHER_NODE])


def test_a_users_priority_above_50_is_refused_in_a_batch_and_a_schedule_patch(
    world: World,
) -> None:
    """The same rule where a job request comes another way: an item of `POST /jobs/batch`
    (named by its index, and nothing of the batch made) and the job of a schedule's PATCH
    (the schedule left as it was)."""
    world.h.set_nodes([NODE])
    before = len(world.call("key", "GET", "/jobs?owner=alice&limit=10000").json)
    batch = [{"command": "true", "priority": 50}, {"command": "true", "priority": 51}]
    refused = world.call("user", "POST", "/jobs/batch", batch)
    assert (refused.status_code, refused.data) == (
        403,
        b"job 1: forbidden: priority above 50 needs an admin\n",
    )
    assert len(world.call("key", "GET", "/jobs?owner=alice&limit=10000").json) == before
    assert world.call("user", "POST", "/jobs/batch", batch[:1]).status_code == 201
    assert world.call("admin", "POST", "/jobs/batch", batch).status_code == 201
    world.h.set_nodes([NODE, OTHER_NODE])
    # A schedule of its own: the ownership check passes, so the refusal is the priority's.
    path = f"/schedules/{world.schedule('user', 'alices-priority')}"
    was = world.call("key", "GET", path).json["job"]
    job = {"command": "true", "env_vars": {"S": "x"}}  # as `World.schedule` made it
    high = world.call("user", "PATCH", path, {"job": {**job, "priority": 51}})
    assert (high.status_code, high.data) == (
        403,
        b"forbidden: priority above 50 needs an admin\n",
    )
    assert world.call("key", "GET", path).json["job"] == was
    lower = world.call("user", "PATCH", path, {"job": {**job, "priority": 40}})
    assert lower.status_code == 200 and lower.json["job"]["priority"] == 40


def test_an_agent_reports_only_on_jobs_claimed_on_its_node(world: World) -> None:
    world.h.set_nodes([OTHER_NODE])
    on_b = world.call("key", "POST", "/jobs", {"command": "true"}).json["job_id"]
    world.h.set_nodes([NODE])
    on_a = world.call("key", "POST", "/jobs", {"command": "true"}).json["job_id"]
    world.h.set_nodes([NODE, OTHER_NODE])
    claim = {"status": "running", "exit_code": None, "stdout": "", "stderr": ""}
    # Body first (400), then the unknown job (404), then the node (403).
    assert world.call("agent", "PATCH", f"/jobs/{on_b}", {"status": "x"}).status_code == 400
    assert world.call("agent", "PATCH", "/jobs/job-999999", claim).status_code == 404
    refused = world.call("agent", "PATCH", f"/jobs/{on_b}", claim)
    assert (refused.status_code, refused.data) == (403, (FOR_NODE_A + "\n").encode())
    assert world.call("agent", "POST", f"/jobs/{on_b}/output", {"stdout": "x"}).status_code == 403
    assert world.call("agent", "GET", f"/jobs/{on_b}").status_code == 403
    # A report naming another node is refused even for a job of its own node.
    named_b = {**claim, "node_id": OTHER_NODE, "attempt": 0}
    assert world.call("agent", "PATCH", f"/jobs/{on_a}", named_b).status_code == 403
    assert world.call("agent", "PATCH", f"/jobs/{on_a}", claim).status_code == 200
    done = {"status": "done", "exit_code": 0, "stdout": "ok", "stderr": ""}
    assert world.call("agent", "POST", f"/jobs/{on_a}/output", {"stdout": "x"}).status_code == 204
    assert world.call("agent", "GET", f"/jobs/{on_a}").status_code == 200
    assert world.call("agent", "PATCH", f"/jobs/{on_a}", done).status_code == 200
    # It cannot submit, cancel or list.
    assert world.call("agent", "POST", f"/jobs/{on_a}/cancel").status_code == 403
    assert world.call("agent", "GET", "/jobs?limit=5").status_code == 403


def test_an_exempt_call_with_a_token_is_held_to_its_role() -> None:
    h = Harness(nodes=(NODE,), api_key=KEY)  # AUTH_AGENT_EXEMPT on (the default)
    client = h.app().test_client()
    bearer = {"Authorization": f"Bearer {KEY}"}
    made = client.post("/tokens", data=b'{"user":"v","role":"viewer"}', headers=bearer)
    viewer = {"Authorization": f"Bearer {made.json['token']}"}
    job = client.post("/jobs", data=b'{"command":"true"}', headers=bearer).json["job_id"]
    claim = b'{"status":"running","exit_code":null,"stdout":"","stderr":""}'
    assert client.patch(f"/jobs/{job}", data=claim, headers=viewer).status_code == 403
    # The keyless call of the tiny-aws agent stays exempt.
    assert client.get(f"/jobs?node_id={NODE}&status=pending").status_code == 200
    assert client.patch(f"/jobs/{job}", data=claim).status_code == 200


# --- what each may see ---------------------------------------------------------------------


def env_of(world: World, who: str, job_id: str) -> dict[str, str]:
    return dict(world.call(who, "GET", f"/jobs/{job_id}").json["env_vars"])


def test_others_env_values_are_masked_for_users_and_viewers(world: World) -> None:
    assert env_of(world, "user", world.alice_job) == {"SECRET": "alice-s"}
    assert env_of(world, "user", world.bob_job) == {"SECRET": "***"}
    assert env_of(world, "user", world.key_job) == {"SECRET": "***"}
    assert env_of(world, "viewer", world.alice_job) == {"SECRET": "***"}
    assert env_of(world, "admin", world.bob_job) == {"SECRET": "bob-s"}
    assert env_of(world, "key", world.bob_job) == {"SECRET": "bob-s"}
    listed = world.call("user", "GET", "/jobs?limit=1000").json
    shown = {job["job_id"]: job.get("env_vars") for job in listed}
    assert shown[world.alice_job] == {"SECRET": "alice-s"}
    assert shown[world.bob_job] == {"SECRET": "***"}
    unmasked = world.call("viewer", "GET", "/jobs?limit=1000&output=none").get_data(as_text=True)
    assert "bob-s" not in unmasked and "alice-s" not in unmasked
    schedules = world.call("bob", "GET", "/schedules").json
    jobs_env = {s["schedule_id"]: s["job"]["env_vars"] for s in schedules}
    assert jobs_env[world.alice_schedule] == {"S": "***"}
    assert jobs_env[world.bob_schedule] == {"S": "x"}


def test_a_viewer_named_like_the_jobs_owner_sees_its_env_values_masked(world: World) -> None:
    """A viewer token of alice's is not alice's user token: it reads alice's job, in the API
    and on the dashboard, with every env value masked."""
    made = world.call("key", "POST", "/tokens", {"user": "alice", "role": "viewer"})
    assert made.status_code == 201, made.data
    world.secrets["alice-viewer"] = made.json["token"]
    assert env_of(world, "alice-viewer", world.alice_job) == {"SECRET": "***"}
    listed = world.call("alice-viewer", "GET", "/jobs?owner=alice&limit=1000").json
    envs = {job["job_id"]: job.get("env_vars") for job in listed}
    assert envs[world.alice_job] == {"SECRET": "***"}
    schedules = world.call("alice-viewer", "GET", "/schedules").json
    jobs_env = {s["schedule_id"]: s["job"]["env_vars"] for s in schedules}
    assert jobs_env[world.alice_schedule] == {"S": "***"}
    page = world.client.get(
        f"/ui/jobs/{world.alice_job}?show_env=1",
        headers={"Authorization": f"Bearer {world.secrets['alice-viewer']}"},
    ).get_data(as_text=True)
    assert "alice-s" not in page and "***" in page


def test_the_dashboard_masks_them_too_and_says_who_is_signed_in(world: World) -> None:
    page = world.client.get(
        f"/ui/jobs/{world.bob_job}?show_env=1",
        headers={"Authorization": f"Bearer {world.secrets['viewer']}"},
    ).get_data(as_text=True)
    assert "bob-s" not in page and "***" in page
    assert "vera (viewer)" in page
    # A browser signs in with HTTP Basic, a token as the password.
    import base64

    basic = base64.b64encode(f"alice:{world.secrets['user']}".encode()).decode()
    mine = world.client.get(
        f"/ui/jobs/{world.alice_job}?show_env=1", headers={"Authorization": f"Basic {basic}"}
    ).get_data(as_text=True)
    assert "alice-s" in mine and 'id="my-jobs"' in mine and "owner=alice" in mine
    revoked = base64.b64encode(f"x:{world.secrets['revoked']}".encode()).decode()
    refused = world.client.get("/ui/", headers={"Authorization": f"Basic {revoked}"})
    assert refused.status_code == 401 and "Basic" in refused.headers["WWW-Authenticate"]


def test_the_dashboards_owner_filter_lists_only_that_owners_jobs(world: World) -> None:
    """`/ui/jobs?owner=alice` (the "My jobs" link) lists alice's jobs and nobody else's,
    where the unfiltered list shows bob's and the shared key's too."""
    key = {"Authorization": f"Bearer {KEY}"}

    def listed(query: str) -> set[str]:
        page = world.client.get(f"/ui/jobs{query}", headers=key)
        assert page.status_code == 200
        return set(re.findall(r'href="/ui/jobs/(job-\d+)"', page.get_data(as_text=True)))

    everyone = listed("?limit=200")
    assert {world.alice_job, world.bob_job, world.key_job} <= everyone
    alices = listed("?owner=alice&limit=200")
    assert world.alice_job in alices
    assert world.bob_job not in alices and world.key_job not in alices
    owners = {world.call("key", "GET", f"/jobs/{job_id}").json.get("owner") for job_id in alices}
    assert owners == {"alice"}


def test_job_events_carry_no_env_values(world: World) -> None:
    """The event stream's data is the job's id, status, node, reason and retry count alone:
    nothing of its environment, for anyone."""
    world.submit("bob", env_vars={"SECRET": "bob-event-secret"})
    found, _ = world.h.service.events.since(0, 10000)
    assert found and all(b"bob-event-secret" not in data for _, data in found)
    fields = {"job_id", "status", "node_id", "reason", "retry_count"}
    assert all(set(orjson.loads(data)) <= fields for _, data in found)


def test_owner_is_the_tokens_user_and_left_out_for_the_shared_key(world: World) -> None:
    assert world.call("key", "GET", f"/jobs/{world.alice_job}").json["owner"] == "alice"
    assert "owner" not in world.call("key", "GET", f"/jobs/{world.key_job}").json
    ran = world.call("user", "POST", f"/schedules/{world.alice_schedule}/run")
    assert ran.status_code == 201 and ran.json["owner"] == "alice"


# --- the pure rules -------------------------------------------------------------------------


def test_sees_env() -> None:
    alice = Principal(Role.USER, "alice")
    assert roles.sees_env(alice, "alice")
    assert not roles.sees_env(alice, "bob") and not roles.sees_env(alice, "")
    assert not roles.sees_env(Principal(Role.VIEWER, "alice"), "bob")
    # A viewer's env values are masked for every job: even one whose owner bears its name.
    assert not roles.sees_env(Principal(Role.VIEWER, "alice"), "alice")
    assert roles.sees_env(roles.SHARED_KEY, "bob")


def test_an_operation_not_in_the_table_is_the_admins() -> None:
    alice = Principal(Role.USER, "alice")
    assert roles.refusal(alice, "POST", "/nowhere") == ADMIN_ONLY
    assert roles.refusal(roles.SHARED_KEY, "POST", "/nowhere") is None
    assert roles.rule_for("HEAD", "/jobs") is roles.rule_for("GET", "/jobs")
