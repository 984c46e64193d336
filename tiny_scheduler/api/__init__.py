"""The HTTP API: blueprints for jobs, nodes, queues, users, tokens, the audit trail, schedule,
schedules, health, the leader, the OpenAPI document, the redirect from `/` to the dashboard,
authentication with the role table (`auth`, `access`), and error replies.

Views only translate between HTTP and the service: read the request, call one service method,
shape the reply. Every rule lives in the service or below it.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, current_app, request

from .. import errors
from ..server import inline
from . import (
    audit,
    auth,
    cluster,
    events,
    health,
    jobs,
    leader,
    metrics,
    next_node,
    nodes,
    openapi,
    output,
    queues,
    replies,
    root,
    schedules,
    tokens,
    users,
)


def init_app(app: Flask) -> None:
    """Register the blueprints, the auth check and the error handlers on `app`."""
    replies.init_app(app)
    leader.init_app(app)  # first: a standby sends every request on, the leader checks the key
    auth.init_app(app)
    app.register_blueprint(health.bp)
    app.register_blueprint(leader.bp)
    app.register_blueprint(cluster.bp)
    app.register_blueprint(next_node.bp)
    app.register_blueprint(jobs.bp)
    app.register_blueprint(schedules.bp)
    app.register_blueprint(queues.bp)
    app.register_blueprint(users.bp)
    app.register_blueprint(tokens.bp)
    app.register_blueprint(audit.bp)
    app.register_blueprint(nodes.bp)
    app.register_blueprint(output.bp)
    app.register_blueprint(events.bp)
    app.register_blueprint(openapi.bp)
    app.register_blueprint(metrics.bp)
    app.register_blueprint(root.bp)


def init_inline(app: Flask) -> None:
    """Let the worker answer the views marked `@inline.answers_inline` in its event loop, and
    no other (see inline.py). Called once every other hook is registered: this one runs
    first, so a request it sends to a thread has run no hook yet."""
    app.before_request_funcs.setdefault(None, []).insert(0, _thread_unless_marked)
    app.register_error_handler(inline.NeedsThread, _needs_thread)
    # The methods of the routes an inline view answers: the worker gives a request of any
    # other method (a submission, a report) to a thread at once, instead of running Flask
    # once in the loop only for the first hook to send it there.
    app.inline_methods = frozenset(  # type: ignore[attr-defined]
        method
        for rule in app.url_map.iter_rules()
        if inline.may_answer_inline(app.view_functions.get(rule.endpoint))
        for method in rule.methods or ()
    )


def _thread_unless_marked() -> None:
    if inline.active() and not inline.may_answer_inline(
        current_app.view_functions.get(request.endpoint or "")
    ):
        raise inline.NeedsThread


def _needs_thread(exc: inline.NeedsThread) -> Response:
    # Not an answer: the worker sees this body and runs the request again on a thread.
    return Response(inline.NEEDS_THREAD, direct_passthrough=True)


def answered_before_body(app: Flask, environ: dict[str, Any]) -> bool:
    """Whether the request whose head `environ` describes gets an answer its body cannot
    change: a standby's 503 or 307, a refused key, or a declared body over MAX_REQUEST_BYTES
    (on any endpoint but those in jobs.UNLIMITED_BODIES). A request a standby forwards is
    never answered before its body: the leader answers it, body and all.

    The worker asks before it sends `100 Continue`: such a client gets its final answer
    instead of an invitation to send a body that would be read only to be refused. The same
    checks as the request's own (its before-request hooks, werkzeug's limit) decide, so the
    answer it then gets is the one this predicts.
    """
    # Asked in the worker's loop: a check that would wait (a fresh node list) gives no verdict.
    with app.request_context(environ), inline.answering():
        try:
            reply, leader_url = leader.standby_reply()
            if reply is not None:
                return True
            if leader_url is not None:
                return False  # forwarded: the body goes to the leader, whose answer counts
            if auth.check() is not None:
                return True
        except errors.ServiceError:
            return True
        except inline.NeedsThread:
            return False
        limit = app.config["MAX_CONTENT_LENGTH"]
        length = request.content_length
        return (
            limit is not None
            and length is not None
            and length > limit
            and request.endpoint not in jobs.UNLIMITED_BODIES
        )
