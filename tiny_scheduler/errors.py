"""The errors the service raises, each carrying the HTTP status and the exact text clients see.

The API layer turns any `ServiceError` into a `text/plain` reply of its message plus a newline
(the wire contract); loops log them. Messages that the spec fixes are spelled out here once.
"""

from __future__ import annotations

import copy

DECODE_JOB = "failed to decode job"
DECODE_UPDATE = "failed to decode update"
COMMAND_REQUIRED = "command or deploy_url is required"
NOT_BEFORE_OR_DELAY = "use not_before or delay_secs, not both"
INVALID_STATUS = "invalid status"
JOB_NOT_FOUND = "job not found"
NOT_PENDING = "job is not pending"
NOT_FINISHED = "job is not finished"
DECODE_SCHEDULE = "failed to decode schedule"
SCHEDULE_NOT_FOUND = "schedule not found"
DECODE_QUEUE = "failed to decode queue settings"
DECODE_USER = "failed to decode user settings"
UNAUTHORIZED = "unauthorized"
REQUEST_TOO_LARGE = "request body too large"
STORE_UNAVAILABLE = "job store unavailable, nothing was changed; try again"
# For a change whose commit was sent but never answered (the connection died, the disk failed
# its flush): it may be stored, so the advice to try again would create a duplicate.
STORE_OUTCOME_UNKNOWN = (
    "job store unavailable, the change may or may not have been stored; check before retrying"
)


class ServiceError(Exception):
    """An error with an HTTP status and a message meant for the client."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def of_item(self, index: int) -> ServiceError:
        """The same error about item `index` of a batch: `job 3: <message>`, same status
        (and Retry-After)."""
        made = copy.copy(self)
        made.message = f"job {index}: {self.message}"
        made.args = (made.message,)
        return made


class BadRequest(ServiceError):
    status = 400


class Unauthorized(ServiceError):
    status = 401


class Forbidden(ServiceError):
    """The credential is good, but may not do this (the message starts `forbidden: `)."""

    status = 403


class NotFound(ServiceError):
    status = 404


class Conflict(ServiceError):
    status = 409


class TooLarge(ServiceError):
    status = 413


class Unavailable(ServiceError):
    """A dependency (registry, store) cannot do its part right now; nothing was changed, but
    where the message says otherwise (`STORE_OUTCOME_UNKNOWN`)."""

    status = 503

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds, sent as Retry-After


class PlacementError(Unavailable):
    """No node can take the job; the message is one of the spec's placement texts."""


class StoreError(Unavailable):
    """The store did not commit a change, or cannot tell whether it did (the message says
    which)."""

    def __init__(self, message: str = STORE_UNAVAILABLE) -> None:
        super().__init__(message)
