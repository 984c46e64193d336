"""Answering a request that has arrived whole: inline in the loop, or on a request thread.

The fast path for plain requests lives here. A plain head (fasthttp.py: parsed by httptools
in reading.py) is answered without gunicorn's request and response objects (`_answer`), with
the same environ and the same framing; any other request goes through gunicorn's own
`handle_request`, its body read by gunicorn's readers from what the loop received. A plain
request the app answers inline (inline.py: the agent poll, `/health`, a node's heartbeat) is
answered in the loop itself (`_hand_over`), with no hand-off to a thread and back, which cost
more than the poll; when the app finds it must wait after all (a commit, a peer, the disk), it
says so before changing anything, and the request runs again on a thread.

The worker's `fast_path` switches both off (worker.py): every request then goes through
gunicorn's parser and response code, on a thread, with the loop's buffering alone.

Whatever the outcome, the connection goes back to the loop through `_served`: to wait for its
next request, to close, to be parked, or to stream (parking.py).
"""

from __future__ import annotations

import errno
import io
import os
from typing import IO, Any

from . import fasthttp, gunicorn_private, inline
from .connections import BUSY, WRITING, Conn
from .gunicorn_private import Request
from .parking import Park, Streaming, ToThread

TO_THREAD = "to a thread"
"""What `_serve` returns when an inline request needs a thread after all."""


class Answering:
    """Serving whole requests (a mixin of BufferingWorker, worker.py).

    Called by reading.py (`_hand_over`) and parking.py (`_serve_and_return`); calls the loop's
    `_finish`, `_close` and `_unwatch` (connections.py) and parking's `_park` and
    `_start_stream`; uses gthread's `handle_request` and `tpool` and Worker's `handle_error`."""

    fast_path = True
    """Whether plain requests take the fast path (httptools, no gunicorn objects, inline
    answers). Off, the worker is gunicorn's parser and response code on our loop's buffering:
    the benchmark's middle row (benchmarks/worker_floor.py)."""

    def _init_answering(self) -> None:
        # Plain requests skip gunicorn's request and response objects (fasthttp.py), unless
        # an access log is asked for: gunicorn writes its lines from those objects.
        self.fast = self.fast_path and not self.cfg.accesslog
        self.base_environ: dict[str, Any] = gunicorn_private.base_environ(self.cfg)
        self.script_name = os.environ.get("SCRIPT_NAME", "")
        # Whether the app answers plain requests in the loop, and of which methods (None:
        # any); set by _wire_app (inline.py).
        self.inline = False
        self.inline_methods: frozenset[str] | None = None

    def _hand_over(self, conn: Conn) -> None:
        """The whole request has arrived: answer it here if it is a plain request the app
        answers inline (inline.py), else give it to a thread."""
        req = conn.req
        assert req is not None
        if conn.spool is not None:
            try:
                conn.spool.seek(0)  # writes out what its buffer holds
            except OSError as exc:
                self._no_room(conn, exc)
                self._body_done(conn)
                return
        plain = req.__class__ is fasthttp.Head
        if not plain and (conn.chunks is not None or conn.length):
            gunicorn_private.give_body(
                req, bytes(conn.body), conn.spool, conn.chunks is not None, conn.length
            )
        conn.state = BUSY
        # Not HEAD: werkzeug drops a HEAD answer's body, and with it NEEDS_THREAD. Not a body
        # in a file: a second run needs it from the start, and the first one closes it.
        methods = self.inline_methods
        if (
            plain
            and self.inline
            and req.method != "HEAD"
            and (methods is None or req.method in methods)
            and conn.spool is None
        ):
            # The socket stays registered meanwhile: nothing else runs in the loop until
            # this returns, and a kept-alive connection is then watched as it was.
            with inline.answering():
                outcome = self._serve(conn, req)
            if outcome is not TO_THREAD:
                self._served(conn, outcome, req)
                return
        self._unwatch(conn)
        try:
            self.tpool.submit(self._serve_and_return, conn, req)
        except RuntimeError:  # the pool is shut down: the worker is exiting
            self._close(conn)

    def _serve_and_return(
        self, conn: Conn, req: Request | fasthttp.Head, waited: float | None = None
    ) -> None:
        """In a thread: answer the request, then give the connection back to the loop.
        `waited`: the deadline of the parked wait after which it runs again."""
        keep: bool | Park | Streaming | str = False
        self.serving.waited = waited
        try:
            keep = self._serve(conn, req)
        finally:
            self.serving.waited = None
            self.method_queue.defer(self._served, conn, keep, req)

    def _serve(self, conn: Conn, req: Request | fasthttp.Head) -> bool | Park | Streaming | str:
        """Answer one request (in a thread, or inline in the loop); whether the connection
        may serve another, or the waiting the app asked for (the loop takes the connection
        over), or TO_THREAD: an inline request needs a thread after all."""
        try:
            if req.__class__ is fasthttp.Head:
                return self._answer(conn, req)  # type: ignore[arg-type]
            keep = self.handle_request(req, conn.answering)
            return bool(keep) and not gunicorn_private.body_failed(req)  # type: ignore[arg-type]
        except ToThread:
            return TO_THREAD
        except Park as park:
            return park
        except Streaming as streaming:
            try:
                streaming.resp.send_headers()  # at once: the client sees the stream open
            except OSError:
                streaming.stream.close()
                return False
            return streaming
        except gunicorn_private.NoMoreData as exc:
            self.log.debug("Ignored premature client disconnection. %s", exc)
        except StopIteration as exc:
            self.log.debug("Closing connection. %s", exc)
        except BrokenPipeError:  # the write buffer gave up: the client did not read its answers
            self.log.debug("Client %s did not read its answer in time", conn.client)
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                self.log.debug("Ignoring socket error: %s", exc)
            else:
                self.log.exception("Socket error processing request.")
        except Exception as exc:
            # gunicorn's 500 page (its log line names a request it parsed itself).
            self.handle_error(req if isinstance(req, Request) else None, conn.out, conn.client, exc)
        finally:
            if conn.spool is not None:
                conn.spool.close()
        return False

    def _answer(self, conn: Conn, head: fasthttp.Head) -> bool | Park | Streaming:
        """Answer a plain request (fasthttp.py): gunicorn's `handle_request` without its
        request and response objects; whether the connection may serve another."""
        if conn.spool is not None:
            body: IO[bytes] = conn.spool
        else:
            body = io.BytesIO(conn.body)
        environ = fasthttp.environ(
            head, self.base_environ, body, conn.client, conn.server, self.script_name
        )
        environ["gunicorn.socket"] = conn.out
        # The request count, the restart after max_requests and the keep-alive decision, as
        # gthread's handle_request makes them.
        self.nr += 1
        if self.nr >= self.max_requests and self.alive:
            self.log.info("Autorestarting worker after current request.")
            self.alive = False
        if (
            not self.alive
            or not self.cfg.keepalive
            or len(self.keepalived_conns) >= self.max_keepalived
        ):
            head.must_close = True
        reply = fasthttp.Reply(head, conn.out.sendall)
        respiter = self.wsgi(environ, reply.start_response)
        try:
            for item in respiter:
                reply.write(item)
            reply.close()
        except OSError:
            raise
        except Exception:
            if not reply.headers_sent:
                raise  # gunicorn's 500 page (_serve)
            # Part of the answer is out: a 500 now would garble it. Close instead.
            self.log.exception("Error handling request")
            return False
        finally:
            close = getattr(respiter, "close", None)
            if close is not None:
                close()
        return not reply.should_close()

    def _served(
        self, conn: Conn, keep: bool | Park | Streaming | str, req: Request | fasthttp.Head
    ) -> None:
        """Back from the thread (in the loop): once the answer is out, wait for the next
        request, or close; or park the request, or write its stream."""
        try:
            conn.state = WRITING  # no thread has it any more
            if conn.out.closed:
                if isinstance(keep, Park):
                    keep.ask.release()
                elif isinstance(keep, Streaming):
                    keep.stream.close()
                self._close(conn)
            elif isinstance(keep, Park):
                self._park(conn, req, keep.ask)
            elif isinstance(keep, Streaming):
                self._start_stream(conn, keep.resp, keep.stream)
            else:
                self._finish(conn, keep)
        except Exception:
            # Raised here it would also hold up the other callbacks queued with this one.
            self.log.exception("Error in the connection loop")
            self._close(conn)
