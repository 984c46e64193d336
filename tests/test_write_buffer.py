"""The write buffer (tiny_scheduler/server/write_buffer.py) on a real connected socket pair:
what the kernel does not take waits in order, a writer never waits for a client within the
bound, and a writer past the bound is released when the connection is given up. The live
daemon's side of it (clients that never read) is in tests/test_slow_clients.py."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from helpers import wait_for

from tiny_scheduler.server.write_buffer import OUTPUT_BUFFER_BYTES, RESPONSE_WRITE_SECS, WriteBuffer


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        yield ours, theirs


def read_all(sock: socket.socket, size: int) -> bytes:
    sock.settimeout(10)
    data = bytearray()
    while len(data) < size:
        piece = sock.recv(size - len(data))
        assert piece, "closed early"
        data += piece
    return bytes(data)


def test_what_the_kernel_does_not_take_waits_in_order_without_holding_the_writer(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)  # the kernel takes little
    wakes: list[int] = []
    out = WriteBuffer(ours, lambda: wakes.append(1), loop_thread=-1)
    # Distinct bytes, more than the pair's buffers take: nobody reads yet.
    pieces = [bytes([i]) * 4096 for i in range(1, 60)]
    for piece in pieces:
        out.sendall(bytearray(piece))  # a buffer the caller may reuse: copied when kept
    assert out.pending_bytes > 0, "the kernel took it all: the test needs more"
    assert out.pending_bytes <= OUTPUT_BUFFER_BYTES
    assert wakes == [1]  # the loop is woken once, when bytes first wait
    expected = b"".join(pieces)
    received = bytearray()
    while not out.flush():  # what the loop does each time the socket is writable
        received += theirs.recv(1 << 20)
    received += read_all(theirs, len(expected) - len(received))
    assert bytes(received) == expected


def test_a_writer_past_the_bound_waits_until_the_connection_is_given_up(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, _ = pair
    out = WriteBuffer(ours, lambda: None, loop_thread=-1)
    failure: list[BaseException] = []

    def write() -> None:
        try:
            out.sendall(b"x" * (4 * OUTPUT_BUFFER_BYTES))
        except BaseException as exc:
            failure.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    wait_for(lambda: out.pending_bytes > OUTPUT_BUFFER_BYTES, message="bytes waiting")
    assert writer.is_alive()  # waiting for room
    now = out.progress_at
    assert not out.stalled(now + RESPONSE_WRITE_SECS - 1)
    assert out.stalled(now + RESPONSE_WRITE_SECS)
    out.fail()  # what the loop does to a stalled connection
    writer.join(10)
    assert not writer.is_alive()
    assert [type(exc) for exc in failure] == [BrokenPipeError]
    with pytest.raises(BrokenPipeError):
        out.sendall(b"more")
