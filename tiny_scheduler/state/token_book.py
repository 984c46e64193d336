"""The tokens one daemon knows: by the digest a request presents, and by id.

The leader (or the one SQLite daemon) holds every stored token here, loaded at start-up and
at each term's start, and changed only after the store committed a change: so a revoke is
refused from the next request on. Thread-safe (its own small lock: a lookup is on every
request's path and must not wait for the job table).

Tests: `tests/test_tokens.py`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from ..domain.tokens import Token


class TokenBook:
    """Every stored token, and the high-water mark of token ids."""

    def __init__(self, tokens: Iterable[Token] = (), last_seq: int = 0) -> None:
        self._lock = threading.Lock()
        self._by_digest: dict[str, Token] = {}
        self._by_seq: dict[int, Token] = {}
        self._last_seq = last_seq
        for token in tokens:
            self._put(token)

    def _put(self, token: Token) -> None:
        self._by_digest[token.digest] = token
        self._by_seq[token.seq] = token
        self._last_seq = max(self._last_seq, token.seq)

    def find(self, digest: str) -> Token | None:
        with self._lock:
            return self._by_digest.get(digest)

    def get(self, seq: int) -> Token | None:
        with self._lock:
            return self._by_seq.get(seq)

    def all(self) -> list[Token]:
        with self._lock:
            return [self._by_seq[seq] for seq in sorted(self._by_seq)]

    def new_seq(self) -> int:
        """The next token id's N (taken: never handed out again, committed or not)."""
        with self._lock:
            self._last_seq += 1
            return self._last_seq

    def put(self, token: Token) -> None:
        with self._lock:
            self._put(token)

    def remove(self, seq: int) -> None:
        with self._lock:
            token = self._by_seq.pop(seq, None)
            if token is not None:
                self._by_digest.pop(token.digest, None)
