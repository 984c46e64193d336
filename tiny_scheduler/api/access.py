"""Who makes a request, what that credential may do here, what it may see, and the audit
record of what it changed: the HTTP side of `domain/roles.py`, in one place.

- `identify`: the request's credential as a `Principal`: the shared key (the admin), or a
  token (`service.tokens.identify`); None when it presents none that is good. On the
  dashboard the key or a token may also come as the password of HTTP Basic.
- `admit`: the one check of the role table (`roles.RULES`) for the request's operation: the
  role's 403 from the head alone, then (for operations without a body to check first) the
  target's: the job or schedule in the path, 404 when there is none, then ownership's or the
  node binding's 403. Views whose body must be checked first (`Rule.body_first`) call
  `check_target` themselves after parsing it, and views that take a job request call
  `check_request` (a user's priority). No view asks which role a caller has.
- `shown`: a job's JSON as the caller may see it (`roles.sees_env`: others' env values
  masked, and a viewer's for every job).
- `record`: after the answer, the audit record of an operation the table names an action for
  (`created`: a view names the id it made, so the answer need not be read back for it).

`api/auth.py` decides whether a request needs a credential at all and calls `identify` and
`admit`; with auth off every request is the admin's (`roles.SHARED_KEY`).
"""

from __future__ import annotations

import hmac
import logging
import socket
from typing import Any
from urllib.parse import urlsplit

import orjson
from flask import Response, g, request

from .. import errors
from ..domain import roles, validation
from ..domain.roles import Principal, Reach
from .forward import CLIENT_ADDRESS, MARKER
from .replies import scheduler

log = logging.getLogger(__name__)

_BEARER = "bearer "  # the scheme, lower-cased, and the one space before the credential
_G_KEY = "tiny_scheduler_principal"
_G_CREATED = "tiny_scheduler_created"


# --- who ------------------------------------------------------------------------------------


def identify(api_key: str, basic_too: bool = False) -> Principal | None:
    """The principal of the request's credential: the bearer header (`Bearer` in any case,
    one space, the secret), or on the dashboard (`basic_too`) HTTP Basic's password. None
    when it carries none, or one that names nothing live (unknown, revoked, expired)."""
    secret = _bearer(request.headers.get("Authorization", ""))
    if secret is None and basic_too:
        credentials = request.authorization
        if credentials is not None and credentials.type == "basic":
            secret = credentials.password
    if not secret:
        return None
    # The key is compared in constant time; a token is found by its digest (a hash lookup
    # tells nothing of how much of a secret matched).
    if hmac.compare_digest(secret.encode("utf-8", "surrogateescape"), api_key.encode()):
        return roles.SHARED_KEY
    return scheduler().tokens.identify(secret)


def _bearer(header: str) -> str | None:
    scheme, given = header[: len(_BEARER)], header[len(_BEARER) :]
    # isascii: lower() maps a few non-ASCII letters onto ASCII ones; a scheme name is ASCII.
    if not scheme.isascii() or scheme.lower() != _BEARER:
        return None
    return given


def principal() -> Principal:
    """Who makes the current request (the admin when nobody was identified: auth is off, or
    an exempt call of the tiny-aws agent)."""
    who = g.get(_G_KEY)
    return who if who is not None else roles.SHARED_KEY


# --- may it ---------------------------------------------------------------------------------


def operation() -> tuple[str, str] | None:
    """The current request's (method, route) in `roles.RULES`; None for a path no route
    matches (its 404 or 405 comes from the routing)."""
    rule = request.url_rule
    if rule is None:
        return None
    route = rule.rule
    poll = route == "/jobs" and request.method == "GET"
    if poll and validation.agent_poll_node(request.args) is not None:
        route = roles.AGENT_POLL
    return request.method, route


def identified() -> bool:
    """Whether a credential was found for the current request (or auth is off)."""
    return g.get(_G_KEY) is not None


def assume(who: Principal) -> None:
    """`who` makes the current request, unchecked (auth is off: everyone is the admin)."""
    setattr(g, _G_KEY, who)


def admit(who: Principal) -> None:
    """Let `who` make the current request, or raise its 403 (or the target's 404)."""
    setattr(g, _G_KEY, who)
    op = operation()
    if op is None:
        return
    method, route = op
    args = request.view_args or {}
    path_node = args.get("node_id")
    if route == roles.AGENT_POLL:
        path_node = validation.agent_poll_node(request.args)
    refused = roles.refusal(who, method, route, path_node)
    if refused is not None:
        raise errors.Forbidden(refused)
    if not roles.rule_for(method, route).body_first:
        check_target()


def check_target(named_node: str | None = None) -> None:
    """The target's checks of the current request, after its body's: the job or schedule in
    the path must exist (404), and be the caller's (a user's own; for an agent, claimed on its
    node, and `named_node`, the node a report names, its own)."""
    op = operation()
    if op is None:
        return
    who = principal()
    reach = roles.target_reach(who, *op)
    args = request.view_args or {}
    service = scheduler()
    refused = None
    if reach == Reach.OWN_JOB:
        job = service.reads.find(args["job_id"])
        refused = roles.owner_refusal(job.job_id, job.owner, who)
    elif reach == Reach.NODE_JOB:
        refused = roles.node_job_refusal(who, service.reads.find(args["job_id"]), named_node)
    elif reach == Reach.OWN_SCHEDULE:
        schedule = service.schedules.get(args["schedule_id"])
        refused = roles.owner_refusal(schedule.schedule_id, schedule.owner, who)
    if refused is not None:
        raise errors.Forbidden(refused)


def check_request(job: validation.JobRequest) -> None:
    """The 403 for a job request the caller may not make (a user's priority above 50)."""
    refused = roles.submit_refusal(principal(), job.priority)
    if refused is not None:
        raise errors.Forbidden(refused)


def owner() -> str:
    """The owner of what the current request creates: the token's user ("" for the key)."""
    return principal().user


# --- what it sees ---------------------------------------------------------------------------


def shown(wire: dict[str, Any], owner_of: str | None = None) -> dict[str, Any]:
    """A job's (or a schedule's) JSON as the caller may see it: the values of its `env_vars`
    masked unless it may see them (`roles.sees_env`). `owner_of`: whose it is, when the JSON
    does not say (a schedule's job)."""
    env = wire.get("env_vars")
    if not env:
        return wire
    owner_name = wire.get("owner", "") if owner_of is None else owner_of
    if roles.sees_env(principal(), owner_name):
        return wire
    return {**wire, "env_vars": roles.masked_env(env)}


def shown_schedule(wire: dict[str, Any]) -> dict[str, Any]:
    """A schedule's JSON as the caller may see it: its job's env values masked likewise."""
    job = wire.get("job")
    if not isinstance(job, dict):
        return wire
    return {**wire, "job": shown(job, wire.get("owner", ""))}


# --- what it did ----------------------------------------------------------------------------


_TARGET_ARGS = ("job_id", "schedule_id", "node_id", "name", "token_id")
_CREATED_IDS = ("job_id", "schedule_id", "token_id")


def record(response: Response) -> Response:
    """After the answer: the audit record of the request's change, when the role table names
    an action for it and somebody was identified (a standby that forwarded the request has
    not: the leader records it)."""
    who = g.get(_G_KEY)
    op = operation()
    if who is None or op is None:
        return response
    rule = roles.rule_for(*op)
    if not rule.action:
        return response
    args = request.view_args or {}
    action = rule.action.format(**args) if "{" in rule.action else rule.action
    try:
        target = _target(args, response)
        scheduler().audit.record(who, client_address(), action, target, response.status_code)
    except errors.ServiceError as exc:
        log.error("audit record of %s %s not stored: %s", action, request.path, exc.message)
    return response


def created(target: str) -> None:
    """Name what the request created (its id), for its audit record: else the record reads
    it back out of the answer's JSON, which costs a submission more than the record."""
    setattr(g, _G_CREATED, target)


def _target(args: dict[str, Any], response: Response) -> str:
    for name in _TARGET_ARGS:
        if name in args:
            return str(args[name])
    named = g.get(_G_CREATED)
    if named is not None and response.status_code in (200, 201):
        return str(named)
    if response.status_code in (200, 201) and response.mimetype == "application/json":
        try:
            body = orjson.loads(response.get_data())
        except orjson.JSONDecodeError:
            return ""
        if isinstance(body, list) and body and isinstance(body[0], dict):
            # A batch: the first job it made and the last one it answers, `job-5..job-9`.
            first, last = body[0].get("job_id"), body[-1].get("job_id")
            return f"{first}..{last}" if first != last else str(first)
        if isinstance(body, dict):
            for name in _CREATED_IDS:
                if isinstance(body.get(name), str):
                    return body[name]
    return ""


def client_address() -> str:
    """The client's address: the peer's, or, for a request a standby forwarded, the one
    that standby says its client had (believed only from a daemon sharing the database, at
    the address it advertises)."""
    peer = request.remote_addr or ""
    forwarded = request.headers.get(CLIENT_ADDRESS)
    by = request.headers.get(MARKER)
    if forwarded and by and scheduler().terms.is_peer(by) and _is_host_of(peer, by):
        return forwarded
    return peer


def _is_host_of(address: str, url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == address:
        return True
    try:
        return address in {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
