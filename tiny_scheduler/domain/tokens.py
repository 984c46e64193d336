"""Tokens: the credentials the scheduler issues, one user in one role each (`roles.py`).

A token's secret is made once (`new_secret`), shown once (the `POST /tokens` answer) and kept
only as its SHA-256 (`digest`): a stolen database holds no credential. A token is found by the
digest of what a request presents; it is good while it exists (a revoke deletes it) and, when
it has one, before its `expires_at`.

Pure: the token's declaration and wire shape, the request's checks, the secret and its digest.

Tests: `tests/test_tokens.py`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from typing import Any

from .. import errors
from . import jobs, users, validation
from .roles import ROLE_MESSAGE, Principal, Role

TOKEN_ID_PREFIX = "tok-"
SECRET_PREFIX = "tsk_"
"""Secrets start with this, so that one pasted where it should not be is easy to spot (and to
search for in logs)."""
SECRET_BYTES = 32

DECODE_TOKEN = "failed to decode token"
NODE_ID_MESSAGE = "node_id must be 1-253 characters of A-Za-z0-9._-"
NODE_MESSAGE = "node_id is required for an agent token, and only for one"
EXPIRES_MESSAGE = "expires_in_secs must be an integer of at least 1"
MAX_EXPIRES_SECS = 100 * 365 * 86400
TOKEN_NOT_FOUND = "token not found"
AUTH_OFF = "tokens need TINYAWS_API_KEY (auth is off)"


@dataclasses.dataclass(frozen=True, slots=True)
class Token:
    """A token as it is stored: never its secret, only the secret's digest."""

    seq: int  # N of tok-N, never reused
    user: str
    role: Role
    digest: str  # SHA-256 of the secret, hex
    created_at: int  # microseconds since the epoch
    node_id: str = ""  # an agent token's node
    expires_at: int | None = None  # None: never

    @property
    def token_id(self) -> str:
        return token_id_of(self.seq)

    def principal(self) -> Principal:
        return Principal(self.role, self.user, self.node_id, self.token_id)

    def is_live(self, now_us: int) -> bool:
        return self.expires_at is None or now_us < self.expires_at

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "token_id": self.token_id,
            "user": self.user,
            "role": self.role.value,
        }
        if self.node_id:
            out["node_id"] = self.node_id
        out["created_at"] = jobs.format_time(self.created_at)
        if self.expires_at is not None:
            out["expires_at"] = jobs.format_time(self.expires_at)
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class TokenRequest:
    """A valid `POST /tokens` body."""

    user: str
    role: Role
    node_id: str = ""
    expires_in_secs: int | None = None


def parse_token_request(body: bytes) -> TokenRequest:
    """The checked body of `POST /tokens`; BadRequest naming the field otherwise."""
    data = validation.decode_object(body, DECODE_TOKEN)
    user = data.get("user")
    if not users.is_valid_name(user):
        raise errors.BadRequest(users.NAME_MESSAGE)
    try:
        role = Role(data.get("role"))
    except ValueError:
        raise errors.BadRequest(ROLE_MESSAGE) from None
    node_id = data.get("node_id") or ""
    if not isinstance(node_id, str) or (node_id and not validation.is_node_id(node_id)):
        raise errors.BadRequest(NODE_ID_MESSAGE)
    if (role == Role.AGENT) != bool(node_id):
        raise errors.BadRequest(NODE_MESSAGE)
    expires = data.get("expires_in_secs")
    if expires is not None and (
        isinstance(expires, bool)
        or not isinstance(expires, int)
        or not 1 <= expires <= MAX_EXPIRES_SECS
    ):
        raise errors.BadRequest(EXPIRES_MESSAGE)
    assert isinstance(user, str)
    return TokenRequest(user, role, node_id, expires)


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def digest(secret: str) -> str:
    """The SHA-256 a secret is stored and looked up as."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def token_id_of(seq: int) -> str:
    return f"{TOKEN_ID_PREFIX}{seq}"


def parse_token_id(text: str) -> int | None:
    """N of a canonical `tok-N`, or None."""
    digits = text.removeprefix(TOKEN_ID_PREFIX)
    if digits == text or not digits.isascii() or not digits.isdigit() or digits[0] == "0":
        return None
    return int(digits) if len(digits) <= 18 else None
