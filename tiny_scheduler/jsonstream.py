"""One JSON object read from a stream in bounded memory, keeping only the members asked for.

The agent's final report carries a job's whole stdout and stderr in one PATCH body, whatever
their size, and the agent never sends it twice. A decoder that builds the whole document
(orjson) holds the body's size in memory, and so does an incremental one that hands over each
string value whole (ijson: its yajl parser buffers a string until its closing quote). Here a
string is decoded a piece at a time, and of the members the caller names only what it keeps is
kept: a string as at most its last `keep` UTF-8 bytes and its full length. Everything else is
checked and dropped as it is read.

The cost per byte is bounded whatever the body's shape. What Python steps through token by
token (brackets, commas, colons, quotes, numbers, literals, whitespace: all but the contents of
strings) may add up to MAX_STRUCTURE_BYTES; a body with more is refused as soon as a piece
past that is read. The contents of strings, which may be as large as the body, are scanned
and decoded by C code a piece at a time (a regular expression finds where a string ends or
where a piece may be cut; orjson decodes the piece), never a character or an escape at a
time. Read with the agent's report's `keep`, 30 MB bodies cost (CPU seconds, one sitting on a
shared 2-core machine; refused means 400 `failed to decode update`):

    body                          token by token   now              orjson.loads
    {"status":..,"x":[0,0,...]}   16.8             0.08 (refused)   0.32
    {"":0,"":0,...}               16.0             0.07 (refused)   0.48
    a string of \\" repeated       4.4              0.22             0.05
    a string of \\\\ repeated       2.2              0.19             0.08
    a valid report with escapes   0.35             0.33             0.25

It accepts exactly the documents orjson accepts (the pieces of each string are decoded by
orjson itself; tests/test_jsonstream.py holds the two side by side), with two exceptions: a
number longer than MAX_NUMBER_CHARS is refused, where orjson would read some of them as a float,
because holding it would mean holding the body; and a document with more than
MAX_STRUCTURE_BYTES outside its strings' contents is refused, where orjson would spend the CPU
on it. Of duplicate keys the last one wins, as with orjson. Nothing here knows about jobs, and
the only I/O is the `read` it is given.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import orjson

CHUNK_BYTES = 65536
"""Bytes asked of `read` at a time."""

MAX_DEPTH = 1024
"""Deepest nesting of arrays and objects (orjson's limit: one more is an error there too)."""

MAX_NUMBER_CHARS = 4096
"""Longest number accepted (Python's int() stops at 4300 digits for a similar reason)."""

MAX_STRUCTURE_BYTES = 64 * 1024
"""Bytes outside the contents of strings a document may have (see above): each costs a step
in Python. The agent's report has a few dozen."""

SMALL_OBJECT = -1
"""A `keep` value: the member's value is kept whole when it is an array or an object of at
most SMALL_OBJECT_BYTES of text (a report's `usage`); a larger one comes back empty, and a
string as None."""

SMALL_OBJECT_BYTES = 4096

_LONGEST_ESCAPE = 12  # the longest escape a piece's end may cut short: \ud83d\ude00
# The contents of a string up to its closing quote, whole characters and escapes only: runs
# of plain bytes, runs of escapes other than \u, a \u that is not a high surrogate, or a high
# surrogate with its low half. It stops at the closing quote, at the end of the bytes, or at
# a backslash that starts no complete escape (cut short by the end, or invalid). Only ever
# used with match() and nothing after it, so it never backtracks; a run of escapes is one step
# of the outer repeat. (Possessive repeats would be a little faster still: Python 3.11 only.)
_STRING_CONTENTS = re.compile(
    rb'[^"\\]*(?:(?:(?:\\[^u])+|\\u(?:(?![dD][89abAB])[0-9a-fA-F]{4}'
    rb'|[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}))[^"\\]*)*'
)
_WHITESPACE = re.compile(rb"[ \t\n\r]*")
_NUMBER_CHARS = re.compile(rb"[-+.eE0-9]*")  # nothing of these may follow a number in JSON
_LITERALS = ((b"true", True), (b"false", False), (b"null", None))
_QUOTE, _BACKSLASH, _COLON, _COMMA = 0x22, 0x5C, 0x3A, 0x2C
_OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_ARRAY, _CLOSE_ARRAY = 0x7B, 0x7D, 0x5B, 0x5D
_NUMBER_START = frozenset(b"-0123456789")
_END = -1


class DecodeError(ValueError):
    """The body is not one JSON object (or it holds a number longer than MAX_NUMBER_CHARS, or
    more than MAX_STRUCTURE_BYTES outside its strings)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Tail:
    """A string value longer than was kept: its last UTF-8 bytes and its full UTF-8 length."""

    data: bytes
    total: int


def read_object(
    read: Callable[[int], bytes], keep: Mapping[str, int], chunk: int = CHUNK_BYTES
) -> dict[str, Any]:
    """The members named in `keep` of the JSON object that `read(n)` gives in pieces (b"" at
    its end); raises DecodeError when the body is not one JSON object.

    A string value of member `name` comes back as a str when its UTF-8 form fits in
    `keep[name]` bytes, else as a `Tail` of that many bytes; an array or an object as an empty
    list or dict (its contents are checked, not kept) unless `keep[name]` is SMALL_OBJECT;
    numbers, booleans and null as themselves.
    """
    scanner = _Scanner(read, chunk)
    if scanner.peek() != _OPEN_OBJECT:
        raise DecodeError("not an object")
    scanner.pos += 1
    found: dict[str, Any] = {}
    # A key longer than every wanted name cannot be one of them: keep no more of it.
    key_bytes = max((len(name.encode()) for name in keep), default=0)
    if scanner.peek() == _CLOSE_OBJECT:
        scanner.pos += 1
    else:
        while True:
            if scanner.peek() != _QUOTE:
                raise DecodeError("expected a key")
            key = scanner.string(key_bytes)
            scanner.expect(_COLON)
            wanted = keep.get(key) if isinstance(key, str) else None
            value = scanner.value(wanted)
            if wanted is not None:
                found[key] = value  # type: ignore[index]  # key is a str when wanted is set
            byte = scanner.peek()
            scanner.pos += 1
            if byte == _CLOSE_OBJECT:
                break
            if byte != _COMMA:
                raise DecodeError("expected , or }")
    if scanner.peek() != _END:
        raise DecodeError("data after the object")
    return found


class _Kept:
    """A string's decoded pieces, kept whole up to `limit` UTF-8 bytes, beyond that its tail."""

    __slots__ = ("data", "limit", "total")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.total = 0

    def add(self, text: str) -> None:
        encoded = text.encode()
        self.total += len(encoded)
        self.data += encoded
        # Trim every few pieces rather than at each: a trim moves the kept bytes.
        if len(self.data) > self.limit + 4 * CHUNK_BYTES:
            del self.data[: len(self.data) - self.limit]

    def value(self) -> str | Tail:
        if self.total <= self.limit:
            return self.data.decode()
        del self.data[: len(self.data) - self.limit]
        return Tail(bytes(self.data), self.total)


class _Scanner:
    """A window on the body: `buf[pos:]` is read but not yet consumed."""

    def __init__(self, read: Callable[[int], bytes], chunk: int) -> None:
        self._read = read
        self._chunk = chunk
        self.buf = b""
        self.pos = 0
        self.dropped = 0  # bytes of the body consumed before buf
        self.text = 0  # bytes of strings' contents consumed
        # While a small container is kept (`small_container`): its bytes before buf, and
        # where in buf it (or buf itself) starts; None once it outgrew SMALL_OBJECT_BYTES.
        self.capture: bytearray | None = None
        self.capture_from = 0

    def more(self) -> bool:
        """Add the next piece of the body to the window; False at the body's end. Refuses a
        body past MAX_STRUCTURE_BYTES here, once a piece: between two checks Python steps
        through at most one piece's tokens."""
        if self.dropped + self.pos - self.text > MAX_STRUCTURE_BYTES:
            raise DecodeError("too much outside strings")
        data = self._read(self._chunk)
        if not data:
            return False
        if self.capture is not None:
            self.capture += self.buf[self.capture_from : self.pos]
            self.capture_from = 0
            if len(self.capture) > SMALL_OBJECT_BYTES:
                self.capture = None
        self.dropped += self.pos
        self.buf = self.buf[self.pos :] + data
        self.pos = 0
        return True

    def peek(self) -> int:
        """The next byte after any whitespace (not consumed), or _END."""
        while True:
            self.pos = _WHITESPACE.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return _END

    def expect(self, byte: int) -> None:
        if self.peek() != byte:
            raise DecodeError(f"expected {chr(byte)}")
        self.pos += 1

    def value(self, keep: int | None) -> Any:
        """One value; strings kept as `_Kept(keep)` says, or only checked when keep is None."""
        byte = self.peek()
        if byte in (_OPEN_OBJECT, _OPEN_ARRAY):
            if keep == SMALL_OBJECT:
                return self.small_container(byte)
            self.container()
            return {} if byte == _OPEN_OBJECT else []
        return self.scalar(byte, None if keep == SMALL_OBJECT else keep)

    def small_container(self, byte: int) -> Any:
        """An array or object kept whole when its text is at most SMALL_OBJECT_BYTES, else
        empty (checked all the same)."""
        self.capture, self.capture_from = bytearray(), self.pos
        try:
            self.container()
            captured = self.capture
            if captured is not None:
                captured += self.buf[self.capture_from : self.pos]
        finally:
            self.capture = None
        if captured is None or len(captured) > SMALL_OBJECT_BYTES:
            return {} if byte == _OPEN_OBJECT else []
        return orjson.loads(bytes(captured))

    def scalar(self, byte: int, keep: int | None) -> Any:
        if byte == _QUOTE:
            return self.string(keep)
        if byte in _NUMBER_START:
            return self.number()
        return self.literal()

    def container(self) -> None:
        """Check one array or object that starts at the next byte, keeping nothing of it.

        Iterative, with a stack of the closing bytes still expected: a deep body must not
        reach Python's recursion limit. It sits inside the top-level object (depth 1).
        """
        closers: list[int] = []
        while True:
            byte = self.peek()  # a value is expected here
            if byte in (_OPEN_OBJECT, _OPEN_ARRAY):
                self.pos += 1
                if 1 + len(closers) >= MAX_DEPTH:
                    raise DecodeError("nested too deeply")
                closer = _CLOSE_OBJECT if byte == _OPEN_OBJECT else _CLOSE_ARRAY
                closers.append(closer)
                if self.peek() != closer:
                    if closer == _CLOSE_OBJECT:
                        self.member_key()
                    continue
                self.pos += 1  # an empty one: a whole value
                closers.pop()
            else:
                self.scalar(byte, None)
            # After a value: a comma and the next one, or closing brackets.
            while closers:
                byte = self.peek()
                self.pos += 1
                if byte == _COMMA:
                    if closers[-1] == _CLOSE_OBJECT:
                        self.member_key()
                    break
                if byte != closers.pop():
                    raise DecodeError("expected , or a closing bracket")
            else:
                return

    def member_key(self) -> None:
        if self.peek() != _QUOTE:
            raise DecodeError("expected a key")
        self.string(None)
        self.expect(_COLON)

    def string(self, keep: int | None) -> str | Tail | None:
        """A string starting at the next byte (the quote), decoded piece by piece, each piece
        by orjson (which checks the escapes, the surrogates and the UTF-8). Kept as
        `_Kept(keep)` says, or only checked when keep is None."""
        kept = _Kept(keep) if keep is not None else None
        self.pos += 1
        while True:
            buf, start = self.buf, self.pos
            end = _STRING_CONTENTS.match(buf, start).end()  # type: ignore[union-attr]
            if end < len(buf) and buf[end] == _QUOTE:
                _add(kept, buf[start:end])
                self.text += end - start
                self.pos = end + 1
                return kept.value() if kept is not None else None
            if end < len(buf):
                # A backslash that starts no complete escape: the end of what has arrived
                # may cut it short, else it is no valid escape at all.
                if len(buf) - end > _LONGEST_ESCAPE:
                    raise DecodeError("invalid string")
                cut = end
            else:
                cut = _utf8_boundary(buf, start, end)
            if cut > start:
                _add(kept, buf[start:cut])
            self.text += cut - start
            self.pos = cut
            if not self.more():
                raise DecodeError("the body ends inside a string")

    def number(self) -> int | float:
        while True:
            end = _NUMBER_CHARS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if end - self.pos > MAX_NUMBER_CHARS:
                raise DecodeError("number too long")
            if end < len(self.buf) or not self.more():
                break
        token = self.buf[self.pos : end]
        self.pos = end
        try:
            value = orjson.loads(token)
        except orjson.JSONDecodeError:
            raise DecodeError("not a number") from None
        return value  # type: ignore[no-any-return]

    def literal(self) -> bool | None:
        while len(self.buf) - self.pos < 5 and self.more():
            pass
        for word, value in _LITERALS:
            if self.buf.startswith(word, self.pos):
                self.pos += len(word)
                return value
        raise DecodeError("not a JSON value")


def _add(kept: _Kept | None, piece: bytes) -> None:
    """Decode one piece of a string's content (complete escapes and characters only)."""
    if not piece:
        return
    try:
        text = orjson.loads(b'"' + piece + b'"')
    except orjson.JSONDecodeError:
        raise DecodeError("invalid string") from None
    if kept is not None:
        kept.add(text)


def _utf8_boundary(buf: bytes, start: int, end: int) -> int:
    """`end`, or the start of a UTF-8 sequence that `end` cuts short (never before `start`)."""
    for back in range(1, 4):
        index = end - back
        if index < start or buf[index] < 0x80:
            break
        if buf[index] >= 0xC0:  # the lead byte: its sequence is 2, 3 or 4 bytes long
            length = 2 if buf[index] < 0xE0 else 3 if buf[index] < 0xF0 else 4
            return index if back < length else end
    return end
