"""GET /: a redirect to the dashboard, so that the address the daemon prints, opened in a
browser as it is, shows something useful instead of `404 not found`."""

from __future__ import annotations

from flask import Blueprint, Response, redirect

bp = Blueprint("root", __name__)


@bp.get("/")
def root() -> Response:
    # Relative, so that it also holds behind a proxy that serves us under a path prefix.
    return redirect("ui/", 302)
