"""Roles: who may do what, as one table of data, and the pure rules that read it.

Every credential the API accepts is a `Principal`: the shared key (`TINYAWS_API_KEY`) is the
`admin` with no user; a token is one user in one role (`tokens.py`), an `agent` token also
bound to one node. `RULES` says, for every endpoint and method (`Operation`), which roles may
call it and how far (`Reach`): anything, only their own jobs or schedules, only their node's
calls. Nothing else in the code asks which role a caller has: the API's one check
(`api/access.py`) reads this table and these functions, and the tests generate every endpoint
x every role from the same table (and hold it against a hand-written list of cases).

The checks come in the order the contract fixes: the role's 403 first (decided from the head
alone, `refusal`), then the body's 400 and the 404 (the views' and the service's), then the
ownership's 403 (`job_refusal`, `schedule_refusal`, `submit_refusal`), then the 409.

Tests: `tests/test_roles.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import Enum

from . import jobs


class Role(str, Enum):
    __str__ = str.__str__

    ADMIN = "admin"
    USER = "user"
    VIEWER = "viewer"
    AGENT = "agent"


ROLE_MESSAGE = "role must be admin, user, viewer or agent"


class Reach(str, Enum):
    """How far a role's permission goes on one operation."""

    __str__ = str.__str__

    ANY = "any"  # every target
    OWN_JOB = "own job"  # the job in the path is the caller's (its owner)
    OWN_SCHEDULE = "own schedule"  # the schedule in the path is the caller's
    PATH_NODE = "path node"  # the node in the path is the agent's own
    POLL_NODE = "poll node"  # the agent poll names the agent's own node
    NODE_JOB = "node job"  # the job in the path was claimed on the agent's node


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    """Who makes a request: a role, its user ("" for the shared key) and, for an agent, the
    node it is for."""

    role: Role
    user: str = ""
    node_id: str = ""
    token_id: str = ""  # "" for the shared key

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN


SHARED_KEY = Principal(Role.ADMIN)
"""The shared key, and everyone when auth is off: the admin, no user."""


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """Which roles may do an operation, and how far; `action` names it in the audit trail
    ("" for calls that change nothing, or only agents' work: not audited)."""

    may: Mapping[Role, Reach]
    action: str = ""
    body_first: bool = False  # the ownership check waits for the body's 400 (the view's)


Operation = tuple[str, str]
"""(HTTP method, the route as Flask writes it, e.g. `/jobs/<job_id>/cancel`)."""

AGENT_POLL = "/jobs (agent poll)"
"""The route of the agent poll in `RULES`: `GET /jobs` with exactly `node_id` and
`status=pending` is an operation of its own (an agent's), not a listing."""

MAX_USER_PRIORITY = 50
"""The highest `priority` a `user` may give a job; above it needs an admin."""

_A, _U, _V, _G = Role.ADMIN, Role.USER, Role.VIEWER, Role.AGENT
ANY = Reach.ANY


def _read() -> dict[Role, Reach]:
    return {_A: ANY, _U: ANY, _V: ANY}


def _admin(action: str = "") -> Rule:
    return Rule({_A: ANY}, action)


def _own(reach: Reach, action: str, *, body_first: bool = False) -> Rule:
    return Rule({_A: ANY, _U: reach}, action, body_first)


def _agent(reach: Reach, *, read: bool = False, body_first: bool = False) -> Rule:
    may = _read() if read else {_A: ANY}
    may[_G] = reach
    return Rule(may, body_first=body_first)


READ = Rule(_read())

RULES: dict[Operation, Rule] = {
    # Jobs.
    ("POST", "/jobs"): Rule({_A: ANY, _U: ANY}, "submit"),
    ("POST", "/jobs/batch"): Rule({_A: ANY, _U: ANY}, "submit batch"),
    ("GET", "/jobs"): READ,
    ("GET", AGENT_POLL): _agent(Reach.POLL_NODE),
    # The agent reads a job it ran to tell whether its report is still wanted.
    ("GET", "/jobs/<job_id>"): _agent(Reach.NODE_JOB, read=True),
    ("PATCH", "/jobs/<job_id>"): _agent(Reach.NODE_JOB, body_first=True),
    ("POST", "/jobs/<job_id>/cancel"): _own(Reach.OWN_JOB, "cancel"),
    ("POST", "/jobs/<job_id>/hold"): _own(Reach.OWN_JOB, "hold"),
    ("POST", "/jobs/<job_id>/release"): _own(Reach.OWN_JOB, "release"),
    ("POST", "/jobs/<job_id>/retry"): _own(Reach.OWN_JOB, "retry"),
    ("POST", "/jobs/<job_id>/output"): _agent(Reach.NODE_JOB, body_first=True),
    ("GET", "/jobs/<job_id>/output"): READ,
    ("GET", "/events"): READ,
    ("GET", "/schedule"): READ,
    # Schedules.
    ("POST", "/schedules"): Rule({_A: ANY, _U: ANY}, "schedule.create"),
    ("GET", "/schedules"): READ,
    ("GET", "/schedules/<schedule_id>"): READ,
    ("PATCH", "/schedules/<schedule_id>"): _own(
        Reach.OWN_SCHEDULE, "schedule.change", body_first=True
    ),
    ("DELETE", "/schedules/<schedule_id>"): _own(Reach.OWN_SCHEDULE, "schedule.delete"),
    ("POST", "/schedules/<schedule_id>/run"): _own(Reach.OWN_SCHEDULE, "schedule.run"),
    # Nodes, queues, users, the cluster.
    ("GET", "/nodes"): READ,
    ("GET", "/nodes/<node_id>"): READ,
    ("PUT", "/nodes/<node_id>"): _agent(Reach.PATH_NODE),
    ("PATCH", "/nodes/<node_id>"): _admin("drain"),
    ("GET", "/queues"): READ,
    ("PUT", "/queues/<name>"): _admin("queue"),
    ("GET", "/users"): READ,
    ("PUT", "/users/<name>"): _admin("user"),
    ("GET", "/cluster"): READ,
    # Credentials and the trail: the admin's.
    ("POST", "/tokens"): _admin("token.create"),
    ("GET", "/tokens"): _admin(),
    ("DELETE", "/tokens/<token_id>"): _admin("token.revoke"),
    ("GET", "/audit"): _admin(),
    ("GET", "/whoami"): Rule({_A: ANY, _U: ANY, _V: ANY, _G: ANY}),
    # The dashboard: its pages are reads; its buttons are the API's changes.
    ("GET", "/ui/"): READ,
    ("GET", "/ui/nodes"): READ,
    ("GET", "/ui/nodes/<node_id>"): READ,
    ("GET", "/ui/jobs"): READ,
    ("GET", "/ui/jobs/<job_id>"): READ,
    ("GET", "/ui/jobs/<job_id>/output"): READ,
    ("GET", "/ui/events"): READ,
    ("GET", "/ui/schedules"): READ,
    ("GET", "/ui/schedules/<schedule_id>"): READ,
    ("GET", "/ui/queues"): READ,
    ("GET", "/ui/static/<path:filename>"): READ,
    ("POST", "/ui/jobs/<job_id>/cancel"): _own(Reach.OWN_JOB, "cancel"),
    ("POST", "/ui/jobs/<job_id>/retry"): _own(Reach.OWN_JOB, "retry"),
    ("POST", "/ui/jobs/<job_id>/hold"): _own(Reach.OWN_JOB, "hold"),
    ("POST", "/ui/jobs/<job_id>/release"): _own(Reach.OWN_JOB, "release"),
    ("POST", "/ui/nodes/<node_id>/drain"): _admin("drain"),
    ("POST", "/ui/queues/<name>"): _admin("queue"),
    # `{action}`: the path's own (pause, resume, run, delete).
    ("POST", "/ui/schedules/<schedule_id>/<action>"): _own(Reach.OWN_SCHEDULE, "schedule.{action}"),
}
"""Every authenticated operation. One missing here is the admin's alone (`rule_for`), and the
tests fail for every route of the app that has no row."""

DEFAULT_RULE = _admin()


def rule_for(method: str, route: str) -> Rule:
    """The rule of an operation; an unknown one is the admin's (HEAD reads as GET)."""
    return RULES.get(("GET" if method == "HEAD" else method, route), DEFAULT_RULE)


def refusal(who: Principal, method: str, route: str, path_node: str | None = None) -> str | None:
    """The role's 403 for `who` calling an operation, decided from the request's head alone
    (`path_node`: the node the path or the poll names); None when it may go on."""
    reach = rule_for(method, route).may.get(who.role)
    if reach is None:
        return _not_allowed(who, method)
    if reach in (Reach.PATH_NODE, Reach.POLL_NODE) and path_node != who.node_id:
        return node_message(who)
    return None


def target_reach(who: Principal, method: str, route: str) -> Reach:
    """How far `who` may go on this operation (call after `refusal` let it through)."""
    return rule_for(method, route).may.get(who.role, Reach.ANY)


def _not_allowed(who: Principal, method: str) -> str:
    if who.role == Role.VIEWER and method not in ("GET", "HEAD"):
        return "forbidden: viewer tokens may only read"
    if who.role == Role.AGENT:
        return node_message(who)
    return "forbidden: only an admin may do this"


def node_message(who: Principal) -> str:
    return f"forbidden: this token is for {who.node_id}"


def owner_refusal(target: str, owner: str, who: Principal) -> str | None:
    """Ownership's 403 for a user acting on `target` (a job or schedule id) owned by
    `owner`; None when it is the user's own."""
    if owner == who.user:
        return None
    if not owner:
        return f"forbidden: {target} belongs to no user"
    return f"forbidden: {target} belongs to {owner}"


def node_job_refusal(who: Principal, job: jobs.Job, named_node: str | None = None) -> str | None:
    """The agent's 403 for a job it reports on or reads: the job must have been claimed on
    the agent's node (its current node, or the node of one of its attempts: a late report of
    an attempt that was retried elsewhere gets its own answer, the stale report's 409), and a
    report that names a node must name the agent's."""
    if named_node is not None and named_node != who.node_id:
        return node_message(who)
    nodes = {job.node_id, *(attempt.node_id for attempt in job.attempts)}
    return None if who.node_id in nodes else node_message(who)


def submit_refusal(who: Principal, priority: int) -> str | None:
    """The 403 for a job request `who` may not make (a `user`'s priority above 50)."""
    if who.role == Role.USER and priority > MAX_USER_PRIORITY:
        return f"forbidden: priority above {MAX_USER_PRIORITY} needs an admin"
    return None


def sees_env(who: Principal, owner: str) -> bool:
    """Whether `who` may see the values of the `env_vars` of a job owned by `owner`: the admin
    always, an agent for the jobs it is handed, a user only its own, a viewer never."""
    if who.role in (Role.ADMIN, Role.AGENT):
        return True
    # A viewer never submits, so no job is its own: a job owned by a user of the same name
    # belongs to that user's `user` token, whose secrets a read-only token must not show.
    return who.role == Role.USER and bool(who.user) and owner == who.user


MASK = "***"


def masked_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment with every value hidden (names kept: they tell what a job needs)."""
    return dict.fromkeys(env, MASK)
