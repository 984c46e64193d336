"""The streaming reader of the agent's report, side by side with orjson: it accepts and refuses
the same bodies and keeps the same values, however the body is cut into pieces; and read as a
stream, a report gives the same update as read whole and then capped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny_scheduler import errors, jsonstream
from tiny_scheduler.domain import jobs, validation
from tiny_scheduler.jsonstream import MAX_DEPTH, DecodeError, Tail, read_object

PROPERTY = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

KEEP = {"status": 16, "exit_code": 0, "stdout": 10, "stderr": 3, "é\U0001f680": 8}
"""Small limits, so that generated strings are often longer than what is kept."""


def pieces(body: bytes, size: int) -> Callable[[int], bytes]:
    """A `read` that hands out `body` at most `size` bytes at a time, whatever is asked."""
    offset = 0

    def read(_: int) -> bytes:
        nonlocal offset
        piece = body[offset : offset + size]
        offset += len(piece)
        return piece

    return read


def expected(body: bytes, keep: dict[str, int]) -> dict[str, Any] | None:
    """What read_object must give, from orjson's reading of the whole body (None: refused)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    found: dict[str, Any] = {}
    for name, limit in keep.items():
        if name not in data:
            continue
        value = data[name]
        if isinstance(value, str):
            encoded = value.encode()
            if len(encoded) > limit:
                value = Tail(encoded[len(encoded) - limit :], len(encoded))
        elif isinstance(value, list | dict):
            value = type(value)()
        found[name] = value
    return found


def streamed(body: bytes, keep: dict[str, int], size: int) -> dict[str, Any] | None:
    try:
        return read_object(pieces(body, size), keep, chunk=size)
    except DecodeError:
        return None


def check(body: bytes, sizes: tuple[int, ...] = (1, 2, 3, 5, 7, 11, 64, 1 << 20)) -> None:
    want = expected(body, KEEP)
    for size in sizes:
        assert streamed(body, KEEP, size) == want, (body, size)


# --- generated documents ---------------------------------------------------------------------

AWKWARD = '"\\/\b\f\n\r\t\x00\x01\x1f\x7f\u00e9\u20ac\u2028\ud7ff\ue000\uffff\U0001f680\U0010ffff'
texts = st.text(alphabet=st.sampled_from(AWKWARD) | st.characters(codec="utf-8"), max_size=30)
names = st.sampled_from(sorted(KEEP)) | texts
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(names, inner, max_size=4),
    max_leaves=12,
)
objects = st.dictionaries(names, values, max_size=6)


def encode(value: Any, ascii_only: bool, spaced: bool) -> bytes:
    separators = (" , ", " : ") if spaced else (",", ":")
    return json.dumps(value, ensure_ascii=ascii_only, separators=separators).encode()


@PROPERTY
@given(value=objects | values, ascii_only=st.booleans(), spaced=st.booleans())
def test_generated_documents_read_as_orjson_reads_them(
    value: Any, ascii_only: bool, spaced: bool
) -> None:
    check(encode(value, ascii_only, spaced))


@PROPERTY
@given(
    value=objects,
    ascii_only=st.booleans(),
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from(["drop", "insert", "replace", "cut"]))
        | st.tuples(st.integers(0, 10**6), st.binary(min_size=1, max_size=3)),
        min_size=1,
        max_size=3,
    ),
)
def test_damaged_documents_are_refused_or_read_as_orjson_does(
    value: Any, ascii_only: bool, edits: list[tuple[int, Any]]
) -> None:
    body = bytearray(encode(value, ascii_only, False))
    for where, edit in edits:
        at = where % (len(body) + 1)
        if edit == "drop":
            del body[at : at + 1]
        elif edit == "cut":
            del body[at:]
        elif edit in ("insert", "replace"):
            # Bytes that matter to a JSON reader: structure, escapes, UTF-8 lead bytes.
            byte = b'"\\{}[],:u0eE.-\x00\xc3\xed\xf0\x80 '[where % 22 : where % 22 + 1]
            body[at : at + (edit == "replace")] = byte
        else:
            body[at:at] = edit
    check(bytes(body))


# --- cases chosen by hand ----------------------------------------------------------------------

CASES = [
    b"",
    b" ",
    b"{}",
    b" \t\r\n{ \t\r\n} \t\r\n",
    b"\x0c{}",
    b"\xef\xbb\xbf{}",
    b"[]",
    b"null",
    b'"stdout"',
    b'{"stdout":"x",}',
    b'{"stdout":"x"} x',
    b'{"stdout":"x"}{}',
    b'{"stdout" "x"}',
    b'{stdout:"x"}',
    b"{'stdout':'x'}",
    b'{"stdout":"x"',
    b'{"stdout":',
    b'{"a":[1,]}',
    b'{"a":[,1]}',
    b'{"a":{,}}',
    b'{"a":{"b"}}',
    b'{"a":{"b":1,}}',
    b'{"a":[1 2]}',
    b'{"a":[[]],"b":[{}],"c":{"d":{}}}',
    b'{"a":]',
    b'{"a":[}',
    b'{"a":tru}',
    b'{"a":True}',
    b'{"a":nulll}',
    b'{"a":truefalse}',
    b'{"exit_code":NaN}',
    b'{"exit_code":Infinity}',
    b'{"exit_code":-Infinity}',
    b'{"exit_code":01}',
    b'{"exit_code":-}',
    b'{"exit_code":1.}',
    b'{"exit_code":.5}',
    b'{"exit_code":1e}',
    b'{"exit_code":1e+}',
    b'{"exit_code":+1}',
    b'{"exit_code":1-2}',
    b'{"exit_code":-0}',
    b'{"exit_code":1E5}',
    b'{"exit_code":1e400}',
    b'{"exit_code":-1e400}',
    b'{"exit_code":1e-400}',
    b'{"exit_code":1.7976931348623157e308}',
    b'{"exit_code":1.7976931348623159e308}',
    b'{"exit_code":9223372036854775808}',
    b'{"exit_code":18446744073709551616}',
    b'{"exit_code":-9223372036854775809}',
    b'{"exit_code":' + b"9" * 400 + b"}",
    b'{"exit_code":0.' + b"0" * 4000 + b"1}",
    b'{"stdout":"\xff"}',
    b'{"stdout":"\xc3"}',
    b'{"stdout":"\xc3\xa9"}',
    b'{"stdout":"\xed\xa0\x80"}',
    b'{"stdout":"\xf4\x90\x80\x80"}',
    b'{"stdout":"\xc0\x80"}',
    b'{"stdout":"\xf0\x9f\x9a\x80\xf0\x9f\x9a\x80\xf0\x9f\x9a\x80"}',
    b'{"stdout":"\\ud800"}',
    b'{"stdout":"\\ud800x"}',
    b'{"stdout":"\\ud800\\u0041"}',
    b'{"stdout":"\\ud800\\ud800"}',
    b'{"stdout":"\\udc00"}',
    b'{"stdout":"\\ud83d\\ude80\\ud83d\\ude80\\ud83d\\ude80"}',
    b'{"stdout":"\\uD83D\\uDE80"}',
    b'{"stdout":"\\u00e9\\u00E9\\u0000\\u001f"}',
    b'{"stdout":"\\U00e9"}',
    b'{"stdout":"\\x41"}',
    b'{"stdout":"\\u12"}',
    b'{"stdout":"\\u12g4"}',
    b'{"stdout":"\\"}',
    b'{"stdout":"\\\\"}',
    b'{"stdout":"\\/\\b\\f\\n\\r\\t\\""}',
    b'{"stdout":"a\x01"}',
    b'{"stdout":"a\x1f"}',
    b'{"stdout":"a\x7f"}',
    b'{"stdout":"a\nb"}',
    b'{"\\u0073tdout":"escaped key"}',
    b'{"stdout":"first","stdout":"last"}',
    b'{"stdout":"first","stdout":["last"]}',
    b'{"stdout":{"nested":"x"},"stderr":[1,2,3]}',
    b'{"status":"running","exit_code":null,"stdout":"","stderr":""}',
    b'{"status":"done","exit_code":0,"stdout":"0123456789abcdef","stderr":"\xc3\xa9\xc3\xa9"}',
    b'{"' + b"k" * 300 + b'":1,"stdout":"x"}',
    b'{"\xff":1}',
    b'{"a":"\\ud800"}',
    b'{"a":"\x00"}',
    b"{" + b'"a":[' * 5 + b"]" * 5 + b"}",
]


@pytest.mark.parametrize("body", CASES, ids=range(len(CASES)))
def test_chosen_bodies_read_as_orjson_reads_them(body: bytes) -> None:
    check(body)


def nested(depth: int) -> bytes:
    """An object whose member holds containers nested `depth` deep in all (the object too)."""
    inner = depth - 1
    return b'{"a":' + b"[" * inner + b"]" * inner + b"}"


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 100_000])
def test_nesting_stops_where_orjson_stops(depth: int) -> None:
    body = nested(depth)
    assert (expected(body, KEEP) is not None) == (depth <= MAX_DEPTH)
    check(body, sizes=(3, 4096))
    objects_only = b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1)
    check(objects_only, sizes=(4096,))


def test_a_number_longer_than_the_limit_is_refused_where_orjson_reads_it() -> None:
    body = b'{"stdout":"x","n":0.' + b"0" * jsonstream.MAX_NUMBER_CHARS + b"1}"
    assert orjson.loads(body)["n"] == 0.0
    with pytest.raises(DecodeError):
        read_object(pieces(body, 1000), KEEP)


def test_a_string_is_kept_as_its_tail_and_length() -> None:
    text = "é" * 50 + "\U0001f680" * 10 + "the end"
    body = orjson.dumps({"stdout": text, "stderr": "ok"})
    encoded = text.encode()
    for size in (1, 3, 5, 4096):
        found = read_object(pieces(body, size), {"stdout": 20, "stderr": 2})
        assert found == {"stdout": Tail(encoded[-20:], len(encoded)), "stderr": "ok"}


# --- the report: streamed or whole, the same update ----------------------------------------


def update(body: bytes, cap: int) -> validation.JobUpdate | str:
    """The update read as a stream, or the message it was refused with."""
    try:
        return validation.read_update(pieces(body, 65536), cap)
    except errors.BadRequest as exc:
        return exc.message


def whole(body: bytes, cap: int) -> validation.JobUpdate | str:
    """The update as the whole body decodes, outputs capped as the service caps them."""
    try:
        found = validation.parse_update(body)
    except errors.BadRequest as exc:
        return exc.message
    return validation.JobUpdate(
        found.status,
        found.exit_code,
        jobs.cap_output(found.stdout, cap),
        jobs.cap_output(found.stderr, cap),
    )


BIG = 300_000  # over the reader's first two pieces: read as a stream


@pytest.mark.parametrize(
    "fields",
    [
        {"status": "done", "exit_code": 0, "stdout": "x" * BIG, "stderr": "é" * BIG},
        {"status": "failed", "exit_code": 3, "stdout": "\U0001f680" * BIG + "end"},
        {"status": "done", "exit_code": None, "stderr": "\x01\x1f" * BIG},  # 6-byte escapes
        {"status": "done", "stdout": "short", "padding": ["x" * 1000] * 300},
        {"status": "done", "stdout": "a" * BIG, "stdout ": 1, "stderr": None},
        {"status": "done" * BIG},
        {"status": "pending", "stdout": "y" * BIG},
        {"status": "done", "exit_code": 2**63, "stdout": "y" * BIG},
        {"status": "done", "exit_code": "0", "stdout": "y" * BIG},
        {"status": "done", "stdout": ["y" * BIG]},
        {"status": "done", "exit_code": 1.5, "stdout": "y" * BIG},
    ],
)
@pytest.mark.parametrize("ascii_only", [False, True])
def test_a_big_report_gives_the_update_its_whole_body_gives(
    fields: dict[str, Any], ascii_only: bool
) -> None:
    body = json.dumps(fields, ensure_ascii=ascii_only, separators=(",", ":")).encode()
    assert len(body) > 2 * jsonstream.CHUNK_BYTES
    for cap in (256, 1000, 1 << 20):
        assert update(body, cap) == whole(body, cap)


def test_a_big_body_that_is_not_json_is_refused_as_undecodable() -> None:
    body = b'{"status":"done","stdout":"' + b"x" * BIG + b'"'  # no closing brace
    assert update(body, 1000) == errors.DECODE_UPDATE


# --- bounded cost: token-dense bodies ---------------------------------------------------------

REPORT_KEEP = {"status": 16, "exit_code": 0, "stdout": 1 << 20, "stderr": 1 << 20}
"""What validation.read_update keeps of the agent's report."""

DENSE = 8 << 20  # bytes of each token-dense body: far past the structure allowed

TOKEN_DENSE = {
    "array": b'{"status":"done","x":[' + b"0," * (DENSE // 2) + b"0]}",
    "members": b"{" + b'"":0,' * (DENSE // 5) + b'"status":"done"}',
    "strings": b'{"status":"done","x":[' + b'"",' * (DENSE // 3) + b'""]}',
    "spaces": b'{"status":"done",' + b" " * DENSE + b'"stdout":""}',
}


class Counted:
    """A `read` over a body that counts the bytes handed out."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.given = 0

    def __call__(self, size: int) -> bytes:
        piece = self.body[self.given : self.given + size]
        self.given += len(piece)
        return piece


@pytest.mark.parametrize("shape", sorted(TOKEN_DENSE))
def test_a_token_dense_body_is_refused_early(shape: str) -> None:
    """orjson reads these, but each token costs a step in Python here: refused once the
    structure outside strings passes its allowance, without reading the rest."""
    body = TOKEN_DENSE[shape]
    read = Counted(body)
    with pytest.raises(DecodeError):
        read_object(read, REPORT_KEEP)
    assert read.given <= jsonstream.MAX_STRUCTURE_BYTES + 3 * jsonstream.CHUNK_BYTES
    assert update(body, 1 << 20) == errors.DECODE_UPDATE


def test_structure_within_the_allowance_reads_as_orjson_reads_it() -> None:
    count = jsonstream.MAX_STRUCTURE_BYTES // 4
    body = b'{"status":"done","x":[' + b"0," * count + b'0],"stdout":"' + b"y" * BIG + b'"}'
    assert read_object(Counted(body), REPORT_KEEP) == expected(body, REPORT_KEEP)


ESCAPED = '"quoted" \\ back\\slash\ttab\nnew line \x01 é € \U0001f680 \ud7ff \U0010ffff end'


@pytest.mark.parametrize("ascii_only", [False, True])
@pytest.mark.parametrize("size", [1, 5, 7, 13, 4099, 65536])
def test_a_huge_report_dense_with_escapes_keeps_the_exact_tails(
    ascii_only: bool, size: int
) -> None:
    """Escapes and surrogate pairs cut by every piece boundary still decode to exactly what
    orjson decodes: the kept tail and the full length."""
    # Through a few bytes at a time a smaller report does: it still crosses every cut.
    repeats = BIG // len(ESCAPED) if size > 1000 else 200
    stdout = ESCAPED * repeats + "the very end"
    stderr = '\\"' * (50 * repeats) + "\\"
    body = encode({"status": "done", "stdout": stdout, "stderr": stderr}, ascii_only, False)
    keep = {"status": 16, "stdout": 4099, "stderr": 3}
    found = read_object(pieces(body, size), keep, chunk=size)
    assert found == expected(body, keep)
    assert isinstance(found["stdout"], Tail)
    assert found["stdout"].data == stdout.encode()[-4099:]
