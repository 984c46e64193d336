"""A peer that answers slowly on purpose, shared by the tests of peer deadlines
(test_peer_deadlines.py) and the combined soak (test_soak_faults.py)."""

from __future__ import annotations

import socket
import threading
import time


class TricklingPeer:
    """A loopback HTTP server. While `trickling`, it sends its answer one byte every 0.2 s
    (status line and headers included), announcing far more body than it will ever send;
    otherwise it answers each path from `answers` at once. Flip `trickling` at any time: calls
    already being trickled go on trickling, the next ones see the new mode."""

    def __init__(self) -> None:
        self.trickling = True
        self.answers: dict[str, list[bytes]] = {}  # path prefix -> answers, the last repeats
        self.calls = 0
        self.trickled = 0  # of those calls, how many were answered a byte at a time
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = conn.recv(65536).decode("latin-1")
                self.calls += 1
                if self.trickling:
                    self.trickled += 1
                    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b" " * 100
                    for byte in reply:
                        if self._stop.is_set():
                            return
                        conn.sendall(bytes([byte]))
                        time.sleep(0.2)  # the fault under test: a peer sending slowly
                    return
                path = request.split(" ", 2)[1]
                body = self._body_for(path)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
            except OSError:
                return

    def _body_for(self, path: str) -> bytes:
        for prefix, queue in self.answers.items():
            if path.startswith(prefix):
                return queue.pop(0) if len(queue) > 1 else queue[0]
        return b"null"
