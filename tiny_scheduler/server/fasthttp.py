"""The usual request, read by a C parser and answered without gunicorn's per-request objects.

Nearly every request the daemon serves is plain: an agent's poll, its report, a submission,
`/health`. For those the worker (worker.py) skips gunicorn's pure-Python request parser, its
environ builder and its response writer, which cost more CPU than the poll itself:

- `parse_head` reads a whole head with `httptools` (llhttp, the parser uvicorn and Node use),
  in C. It returns None for anything that is not plain (a parse error, a chunked body,
  `Expect`, an absolute or odd request target, a header name with an underscore, a second
  `Content-Type`, a proxy's scheme header, a head over gunicorn's limits...): the worker then
  hands the same bytes to gunicorn's parser, which gives its own verdict (400, 414, 431) or
  serves it the old way. So what is refused, and how, stays gunicorn's; only the plain case
  is fast, and it gets the same environ gunicorn would build (`environ`).
- `Reply` writes the answer with gunicorn's framing rules (its `Response`: `Server`, `Date`,
  `Connection`, chunked when there is no length, no body for HEAD, 1xx, 204 and 304), the
  head and a body that fits in one `sendall`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote_to_bytes

import httptools
from gunicorn import util

SERVER = "gunicorn"
"""The `Server` header gunicorn sends (clients and tests see no difference)."""

PLAIN_METHODS = frozenset({b"GET", b"POST", b"PUT", b"PATCH", b"DELETE", b"HEAD", b"OPTIONS"})

# Header names (lower case) that make a head not plain: gunicorn decides about those.
_NOT_PLAIN = frozenset(
    {
        b"transfer-encoding",
        b"expect",
        b"upgrade",
        # gunicorn's secure_scheme_headers: trusted from some addresses, they change the scheme
        b"x-forwarded-proto",
        b"x-forwarded-protocol",
        b"x-forwarded-ssl",
    }
)
# Response headers gunicorn never passes on (hop-by-hop): the framing is the server's.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)


class Head:
    """A plain request head: what `environ` and `Reply` need of it."""

    __slots__ = (
        "content_length",
        "headers",
        "keep_alive",
        "method",
        "must_close",
        "target",
        "version",
    )

    def __init__(self) -> None:
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.method = ""
        self.version = "1.1"
        self.content_length = 0
        self.keep_alive = True
        self.must_close = False  # the worker's say: the answer closes the connection


class _Collector:
    """httptools' callbacks: the target and the headers of one head."""

    __slots__ = ("head",)

    def __init__(self, head: Head) -> None:
        self.head = head

    def on_url(self, url: bytes) -> None:
        self.head.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head.headers.append((name, value))


def parse_head(
    data: bytes | bytearray, end: int, line_limit: int, field_limit: int, fields_limit: int
) -> Head | None:
    """The head in `data[:end]` (which ends with its blank line) if it is plain, else None.
    The limits are gunicorn's (`limit_request_line`, `_field_size`, `_fields`): a head past
    one of them is not plain, so gunicorn's parser refuses it as it always did."""
    if data.find(b"\r\n", 0, line_limit + 2) < 0:
        return None
    head = Head()
    parser = httptools.HttpRequestParser(_Collector(head))
    piece = data[:end] if end < len(data) else data
    try:
        parser.feed_data(piece if isinstance(piece, bytes) else bytes(piece))
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):
        return None
    method = parser.get_method()
    version = parser.get_http_version()
    target = head.target
    if (
        method not in PLAIN_METHODS
        or version not in ("1.1", "1.0")
        or not target.startswith(b"/")
        or b"#" in target
        or len(head.headers) > fields_limit
    ):
        return None
    length: bytes | None = None
    content_type = False
    # gunicorn's rule (its Request.should_close): the first Connection header decides when it
    # says close or keep-alive, else the version does.
    keep_alive: bool | None = None
    for name, value in head.headers:
        if len(name) + len(value) + 2 > field_limit or b"_" in name:
            return None
        lower = name.lower()
        if lower in _NOT_PLAIN:
            return None
        if lower == b"content-length":
            length = value  # llhttp refuses a second one, and any but digits
        elif lower == b"content-type":
            if content_type:
                return None  # ambiguous: gunicorn refuses it
            content_type = True
        elif lower == b"connection" and keep_alive is None:
            said = value.strip(b" \t").lower()
            keep_alive = True if said == b"keep-alive" else False if said == b"close" else None
            if keep_alive is None:
                keep_alive = version != "1.0"
    head.method = method.decode("ascii")
    head.version = version
    head.keep_alive = version != "1.0" if keep_alive is None else keep_alive
    if length is not None:
        head.content_length = int(length)
    return head


def environ(
    head: Head,
    base: dict[str, Any],
    body: Any,
    client: Any,
    server: Any,
    script_name: str,
) -> dict[str, Any]:
    """The WSGI environ gunicorn's `wsgi.create` builds for this head (TCP listeners only);
    `base`: gunicorn's `base_environ`, built once."""
    target = head.target.decode("latin-1")
    path, _, query = target.partition("?")
    env = base.copy()
    env["wsgi.input"] = body
    env["wsgi.multithread"] = True
    env["wsgi.url_scheme"] = "http"  # plain HTTP only: the worker refuses TLS at start
    env["REQUEST_METHOD"] = head.method
    env["QUERY_STRING"] = query
    env["RAW_URI"] = target
    env["SERVER_PROTOCOL"] = "HTTP/" + head.version
    repeated: dict[str, list[str]] = {}
    for raw_name, raw_value in head.headers:
        name = raw_name.decode("latin-1").upper()
        value = raw_value.decode("latin-1").strip(" \t")
        if name == "CONTENT-TYPE":
            env["CONTENT_TYPE"] = value
            continue
        if name == "CONTENT-LENGTH":
            env["CONTENT_LENGTH"] = value
            continue
        key = "HTTP_" + name.replace("-", "_")
        if key in env:
            repeated.setdefault(key, [env[key]]).append(value)
        else:
            env[key] = value
    for key, values in repeated.items():
        env[key] = ",".join(values)
    env["REMOTE_ADDR"] = client[0]
    env["REMOTE_PORT"] = str(client[1])
    env["SERVER_NAME"] = str(server[0])
    env["SERVER_PORT"] = str(server[1])
    if script_name:
        if not path.startswith(script_name):
            raise ValueError(f"request path {path!r} does not start with SCRIPT_NAME")
        path = path[len(script_name) :]
    env["PATH_INFO"] = unquote_to_bytes(path).decode("latin-1") if "%" in path else path
    env["SCRIPT_NAME"] = script_name
    return env


_date = ["", 0]


def http_date() -> str:
    """The `Date` header's value (gunicorn's formatting), made once a second, not per answer."""
    now = int(time.time())
    if _date[1] != now:
        _date[0] = util.http_date(now)
        _date[1] = now
    return _date[0]


class Reply:
    """One answer's writer: WSGI's `start_response`, then the body, onto `sendall`."""

    __slots__ = (
        "chunked",
        "code",
        "head",
        "headers",
        "headers_sent",
        "length",
        "omits_body",
        "sendall",
        "sent",
        "status",
    )

    def __init__(self, head: Head, sendall: Callable[[bytes], None]) -> None:
        self.head = head
        self.sendall = sendall
        self.status: str | None = None
        self.code = 0
        self.headers: list[str] = []
        self.headers_sent = False
        self.length: int | None = None
        self.chunked = False
        self.omits_body = False
        self.sent = 0

    def start_response(
        self, status: str, headers: Iterable[tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], None]:
        if exc_info is not None:
            if self.headers_sent:
                raise exc_info[1].with_traceback(exc_info[2])
        elif self.status is not None:
            raise AssertionError("Response headers already set!")
        code = int(status[:3])
        lines: list[str] = []
        length: int | None = None
        for name, value in headers:
            if "\n" in value or "\r" in value:
                raise ValueError(f"invalid value of response header {name!r}")
            lower = name.lower()
            if lower == "content-length":
                length = int(value)
            elif lower in _HOP_BY_HOP:
                continue
            lines.append(f"{name}: {value}\r\n")
        self.omits_body = self.head.method == "HEAD" or code in (204, 304) or code < 200
        if length is not None and (code == 204 or code < 200):
            lines = [line for line in lines if not line.lower().startswith("content-length:")]
            length = None
        self.status, self.code, self.headers, self.length = status, code, lines, length
        self.chunked = length is None and self.head.version == "1.1" and not self.omits_body
        return self.write

    def should_close(self) -> bool:
        """Whether the connection closes after this answer (gunicorn's rule)."""
        if self.head.must_close or not self.head.keep_alive:
            return True
        if self.length is not None or self.chunked or self.head.method == "HEAD":
            return False
        return not (self.code < 200 or self.code in (204, 304))

    def _head_bytes(self) -> bytes:
        self.headers_sent = True
        connection = "close" if self.should_close() else "keep-alive"
        chunked = "Transfer-Encoding: chunked\r\n" if self.chunked else ""
        return (
            f"HTTP/{self.head.version} {self.status}\r\nServer: {SERVER}\r\n"
            f"Date: {http_date()}\r\nConnection: {connection}\r\n{chunked}"
            f"{''.join(self.headers)}\r\n"
        ).encode("latin-1")

    def send_headers(self) -> None:
        if not self.headers_sent:
            self.sendall(self._head_bytes())

    def write(self, data: bytes) -> None:
        """Send body bytes (with the head, the first time): never more than the length said."""
        if not isinstance(data, bytes):
            raise TypeError(f"{data!r} is not a byte string")
        head = b"" if self.headers_sent else self._head_bytes()
        if self.omits_body or not data:
            if head:
                self.sendall(head)
            return
        if self.length is not None:
            room = self.length - self.sent
            if room <= 0:
                if head:
                    self.sendall(head)
                return
            if len(data) > room:
                data = data[:room]
        self.sent += len(data)
        if self.chunked:
            data = b"%X\r\n%s\r\n" % (len(data), data)
        self.sendall(head + data if head else data)

    def close(self) -> None:
        """The body is over: the head if nothing was sent, the last chunk if chunked."""
        if not self.headers_sent:
            self.sendall(self._head_bytes() + (b"0\r\n\r\n" if self.chunked else b""))
        elif self.chunked:
            self.sendall(b"0\r\n\r\n")
