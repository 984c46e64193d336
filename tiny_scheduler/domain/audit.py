"""The audit trail's record: who changed what through the API, when, from where, and how it
was answered.

One record per change a person or service asks for (submit, cancel, hold, release, retry,
drain, queue and user settings, schedule changes and runs, tokens: the actions `roles.RULES`
names), refused ones included: `status` is the HTTP status of the answer. It never holds a
request's body, so never an env value, and never a token's secret; agents' heartbeats, polls,
claims, reports and output are not recorded (their rules name no action).

Pure: the declaration, its wire shape and the `GET /audit` query's checks.

Tests: `tests/test_audit.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .. import errors
from . import jobs, validation

DEFAULT_PAGE = 1000
MAX_PAGE = 10000
SINCE_MESSAGE = "since must be an RFC 3339 time such as 2026-11-30T10:20:30Z"
AFTER_MESSAGE = "after must be the number of an audit record"
LIMIT_MESSAGE = f"limit must be an integer between 1 and {MAX_PAGE}"


@dataclasses.dataclass(frozen=True, slots=True)
class AuditRecord:
    """One change asked for through the API. `id` orders the trail (never reused)."""

    id: int
    at: int  # microseconds since the epoch
    user: str  # the token's user; "" for the shared key (and with auth off)
    role: str
    address: str  # the client's address (through a standby: still the client's)
    action: str  # `roles.Rule.action`
    target: str  # the job, node, queue, user, schedule or token it is about ("" when none)
    status: int  # the HTTP status it was answered with

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"at": jobs.format_time(self.at)}
        if self.user:
            out["user"] = self.user
        out.update(role=self.role, address=self.address, action=self.action)
        if self.target:
            out["target"] = self.target
        out["status"] = self.status
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class AuditQuery:
    """The filters of `GET /audit`: records at or after `since`, after record `after`, at most
    `limit`; `user`, `action` and `target` match exactly when given."""

    since: int = 0
    after: int = 0
    limit: int = DEFAULT_PAGE
    user: str | None = None
    action: str | None = None
    target: str | None = None

    def matches(self, record: AuditRecord) -> bool:
        return (
            record.at >= self.since
            and (self.user is None or record.user == self.user)
            and (self.action is None or record.action == self.action)
            and (self.target is None or record.target == self.target)
        )


def parse_query(args: Mapping[str, str]) -> AuditQuery:
    since = 0
    if text := args.get("since"):
        parsed = validation.parse_rfc3339(text)
        if parsed is None:
            raise errors.BadRequest(SINCE_MESSAGE)
        since = parsed
    return AuditQuery(
        since=since,
        after=_number(args.get("after"), AFTER_MESSAGE, 0, 1 << 62) or 0,
        limit=_number(args.get("limit"), LIMIT_MESSAGE, 1, MAX_PAGE) or DEFAULT_PAGE,
        user=args.get("user") if "user" in args else None,
        action=args.get("action") or None,
        target=args.get("target") or None,
    )


def _number(text: str | None, message: str, low: int, high: int) -> int | None:
    if not text:
        return None
    if not text.isascii() or not text.isdigit() or len(text) > 19 or not low <= int(text) <= high:
        raise errors.BadRequest(message)
    return int(text)
