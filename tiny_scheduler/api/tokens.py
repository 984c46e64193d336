"""The /tokens resource (create, list, revoke: the admin's) and GET /whoami (who the
request's credential is: any role). The rules live in `domain/tokens.py` and the service."""

from __future__ import annotations

from flask import Blueprint, Response

from ..domain import tokens
from . import access
from .jobs import read_body
from .replies import json_reply, scheduler

bp = Blueprint("tokens", __name__)


@bp.post("/tokens")
def create_token() -> Response:
    """A new token (201), its secret in this answer only; 409 while auth is off."""
    request = tokens.parse_token_request(read_body(tokens.DECODE_TOKEN))
    token, secret = scheduler().tokens.create(request)
    return json_reply({**token.to_wire(), "token": secret}, 201)


@bp.get("/tokens")
def list_tokens() -> Response:
    """Every token, oldest first, without secrets."""
    return json_reply([token.to_wire() for token in scheduler().tokens.listing()])


@bp.delete("/tokens/<token_id>")
def revoke_token(token_id: str) -> Response:
    """Revoke a token at once (204); 404 for one that does not exist."""
    scheduler().tokens.revoke(token_id)
    return Response(status=204)


@bp.get("/whoami")
def whoami() -> Response:
    """`{"user","role","token_id","node_id"}` of the request's credential (empty ones left
    out: the shared key is `{"role":"admin"}`), and whether auth is on."""
    who = access.principal()
    body: dict[str, object] = {}
    if who.user:
        body["user"] = who.user
    body["role"] = who.role.value
    if who.token_id:
        body["token_id"] = who.token_id
    if who.node_id:
        body["node_id"] = who.node_id
    body["auth"] = bool(scheduler().settings.api_key)
    return json_reply(body)
