"""GET /audit: the audit trail, oldest first, paged like /jobs (`limit`, `after`, a `Link`
to the next page); `since` (RFC 3339) and the exact filters `user`, `action`, `target`. The
admin's. The records are written by `access.record`."""

from __future__ import annotations

from urllib.parse import urlencode

from flask import Blueprint, Response, request

from ..domain import audit
from .replies import json_reply, scheduler

bp = Blueprint("audit", __name__)


@bp.get("/audit")
def list_audit() -> Response:
    query = audit.parse_query(request.args)
    found, next_after = scheduler().audit.page(query)
    headers = None
    if next_after is not None:
        following = dict(request.args.items(), after=str(next_after))
        headers = {"Link": f'<{request.path}?{urlencode(following)}>; rel="next"'}
    return json_reply([record.to_wire() for record in found], headers=headers)
