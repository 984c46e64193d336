"""Where a chunked request body ends, found as its bytes arrive, without decoding it.

The loop (reading.py) must know where a chunked body ends to hand the request over whole and
to find the next pipelined request; decoding it stays gunicorn's (its ChunkedReader, in the
request thread), so its verdict on a broken body stays gunicorn's too.
"""

from __future__ import annotations

_HEX_DIGITS = b"0123456789abcdefABCDEF"


class Malformed(Exception):
    """A chunked body's framing is broken: where it ends is unknown."""


class ChunkScanner:
    """Finds where a chunked body ends in the bytes fed to it, without decoding it: gunicorn's
    ChunkedReader decodes it in the request thread. Anything it cannot frame the way that
    reader would raises Malformed, and the reader then gives the verdict."""

    __slots__ = ("left", "line", "line_limit", "state", "trailer", "trailer_limit")

    def __init__(self, line_limit: int, trailer_limit: int) -> None:
        self.state = "size"  # size line, chunk data, CRLF after data, trailer lines
        self.left = 0
        self.line = b""
        self.line_limit = line_limit
        self.trailer = 0
        self.trailer_limit = trailer_limit

    def feed(self, data: bytes) -> int:
        """Take the next received bytes; the offset in `data` just past the body's end, or -1
        when the body goes on."""
        i, n = 0, len(data)
        while i < n:
            if self.state == "data":
                step = min(self.left, n - i)
                self.left -= step
                i += step
                if not self.left:
                    self.state = "crlf"
                continue
            end = data.find(b"\n", i)
            if end < 0:
                self.line += data[i:]
                self._check_partial()
                return -1
            line = self.line + data[i : end + 1]
            self.line = b""
            i = end + 1
            if self._line(line):
                return i
        return -1

    def _check_partial(self) -> None:
        limit = self.line_limit if self.state != "trailer" else self.trailer_limit - self.trailer
        if len(self.line) > limit + 2:
            raise Malformed

    def _line(self, line: bytes) -> bool:
        """Take one whole line; whether the body ends with it."""
        if not line.endswith(b"\r\n"):
            raise Malformed  # a bare LF
        if self.state == "crlf":
            if line != b"\r\n":
                raise Malformed
            self.state = "size"
            return False
        if self.state == "trailer":
            if line == b"\r\n":
                return True
            self.trailer += len(line)
            if self.trailer > self.trailer_limit:
                raise Malformed
            return False
        if len(line) > self.line_limit + 2:
            raise Malformed
        size, *extension = line[:-2].split(b";", 1)
        if extension:
            size = size.rstrip(b" \t")  # whitespace before an extension only, as gunicorn
        if not size or size.strip(_HEX_DIGITS):
            raise Malformed
        self.left = int(size, 16)
        self.state = "data" if self.left else "trailer"
        return False
