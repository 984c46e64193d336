"""Tokens as admins manage them (`POST/GET/DELETE /tokens`) and as every request is checked
against them (`identify`).

A token is stored before it is shown, and removed from the store before memory forgets it: a
revoke answered 204 is refused by the next request. Only the leader (or the one SQLite daemon)
holds tokens in memory; a standby forwards what it is asked to the leader, which checks. What
a standby answers itself (`/cluster`) it checks against the database (`store.read_token`), so a
revoke on the leader counts there too from its commit on.

Tests: `tests/test_tokens.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .. import errors
from ..domain import tokens
from ..domain.roles import Principal
from ..domain.tokens import Token, TokenRequest
from .core import Core

log = logging.getLogger("tiny_scheduler.service")


class TokenOps:
    """Creating, listing, revoking and looking up tokens."""

    def __init__(self, core: Core, serving: Callable[[], bool] | None = None) -> None:
        """`serving`: whether this daemon serves the API now (None: always, SQLite)."""
        self._core = core
        self._serving = serving

    def create(self, request: TokenRequest) -> tuple[Token, str]:
        """A new token, durable before this returns, and its secret (shown once, never kept).
        Conflict when auth is off: with no key, nothing asks for a token."""
        core = self._core
        if not core.settings.api_key:
            raise errors.Conflict(tokens.AUTH_OFF)
        secret = tokens.new_secret()
        now = core.now()
        expires = None
        if request.expires_in_secs is not None:
            expires = now + request.expires_in_secs * 1_000_000
        token = Token(
            seq=core.tokens.new_seq(),
            user=request.user,
            role=request.role,
            digest=tokens.digest(secret),
            created_at=now,
            node_id=request.node_id,
            expires_at=expires,
        )
        core.store.save_token(token)
        core.tokens.put(token)
        log.info("token %s created for %s (%s)", token.token_id, token.user, token.role)
        return token, secret

    def listing(self) -> list[Token]:
        return self._core.tokens.all()

    def revoke(self, token_id: str) -> Token:
        """Remove a token, at once; NotFound for one that does not exist (any more)."""
        core = self._core
        seq = tokens.parse_token_id(token_id)
        token = core.tokens.get(seq) if seq is not None else None
        if token is None:
            raise errors.NotFound(tokens.TOKEN_NOT_FOUND)
        core.store.delete_token(token.seq)
        core.tokens.remove(token.seq)
        log.info("token %s of %s revoked", token.token_id, token.user)
        return token

    def identify(self, secret: str) -> Principal | None:
        """Who presents `secret`: its token's principal while the token exists and has not
        expired; None otherwise. A daemon that does not serve (a standby) asks the database."""
        digest = tokens.digest(secret)
        core = self._core
        if self._serving is None or self._serving():
            token = core.tokens.find(digest)
        else:
            token = core.store.read_token(digest)
        if token is None or not token.is_live(core.now()):
            return None
        return token.principal()
