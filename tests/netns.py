"""Network namespaces for the partition tests: a namespace, veth links to it that can be cut,
TCP relays in the root namespace, and a scheduler daemon run inside the namespace.

Every address is in 10.213.0.0/16 and exists only on the veth pairs made here: one end in the
root namespace, the other in the test's namespace. Nothing is ever sent anywhere else. A link
is cut with `ip link set DEV down` on its root end: packets are then dropped silently, the
hardest failure for a peer to notice (no reset, no refusal). `close()` removes the namespace
and its links; it is safe to call after a failure half-way.

Needs root and iproute2's `ip`; `why_unavailable()` says, in one line, what is missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.server.daemon_command import SERVE_ARGV

PREFIX = "10.213"
"""The private range used only on links made here."""

DAEMON_PORT = 9001
"""A daemon in a namespace has the namespace's ports to itself."""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def why_unavailable() -> str | None:
    """None when namespaces can be made here, else why not (one line)."""
    if os.geteuid() != 0:
        return "network namespace tests need root (ip netns add)"
    if shutil.which("ip") is None:
        return "network namespace tests need iproute2's `ip` command"
    probe = f"tsprobe{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or str(exc).encode()
        return f"cannot make a network namespace here: {detail.decode(errors='replace').strip()}"
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("netns", "del", probe)
    return None


@dataclasses.dataclass(frozen=True)
class Link:
    """A veth pair: `root_addr` on `root_dev` in the root namespace, `ns_addr` inside."""

    root_dev: str
    root_addr: str
    ns_addr: str


class Relay:
    """A TCP relay in the root namespace: accepts on (`host`, `port`), connects each client to
    `target` on loopback, and copies bytes both ways until either side closes."""

    def __init__(self, host: str, port: int, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server((host, port))
        self._sockets: list[socket.socket] = [self._listener]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked on it
            sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


class Namespace:
    """One network namespace of the test, its links and relays; `close()` removes all."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:5]
        self.name = f"tsha-{tag}"
        self._tag = tag
        self._links: list[Link] = []
        self._relays: list[Relay] = []
        self._claim = _claim_subnet(self.name)
        self._net = f"{PREFIX}.{self._claim.name}"
        _ip("netns", "add", self.name)
        _ip("-n", self.name, "link", "set", "lo", "up")

    def link(self) -> Link:
        """A new veth pair between the root namespace and this one, up, with a /30 each."""
        number = len(self._links)
        root_dev, ns_dev = f"th{self._tag}r{number}", f"th{self._tag}n{number}"
        base = 4 * number
        link = Link(root_dev, f"{self._net}.{base + 1}", f"{self._net}.{base + 2}")
        self._links.append(link)
        _ip("link", "add", root_dev, "type", "veth", "peer", "name", ns_dev)
        _ip("link", "set", ns_dev, "netns", self.name)
        _ip("addr", "add", f"{link.root_addr}/30", "dev", root_dev)
        _ip("-n", self.name, "addr", "add", f"{link.ns_addr}/30", "dev", ns_dev)
        _ip("-n", self.name, "link", "set", ns_dev, "up")
        _ip("link", "set", root_dev, "up")
        return link

    def relay(self, link: Link, port: int, target: tuple[str, int]) -> str:
        """Relay (`link.root_addr`, `port`) to `target`; returns "host:port" as seen from the
        namespace."""
        self._relays.append(Relay(link.root_addr, port, target))
        return f"{link.root_addr}:{port}"

    def cut(self, link: Link) -> None:
        _ip("link", "set", link.root_dev, "down")

    def heal(self, link: Link) -> None:
        _ip("link", "set", link.root_dev, "up")

    def close(self) -> None:
        for relay in self._relays:
            relay.close()
        for link in self._links:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("link", "del", link.root_dev)  # takes its peer along
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", self.name)
        self._claim.unlink(missing_ok=True)


CLAIMS = Path("/run/tiny-scheduler-netns")
"""One file per /24 of the range in use, naming the namespace that uses it: tests running at
the same time (pytest-xdist, two work trees) never share a subnet."""


def _claim_subnet(namespace: str) -> Path:
    """Claim a free 10.213.N.0/24 for `namespace` (a claim whose namespace is gone, left by
    a run that was killed, is taken over)."""
    CLAIMS.mkdir(parents=True, exist_ok=True)
    existing = set(
        subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    )
    for number in random.sample(range(1, 251), 250):
        claim = CLAIMS / str(number)
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            with contextlib.suppress(OSError):
                # Stale when its namespace is gone, and not just being made (a minute old).
                owner = claim.read_text().strip()
                if owner not in existing and time.time() - claim.stat().st_mtime > 60:
                    claim.unlink(missing_ok=True)  # free for the next namespace
            continue
        with os.fdopen(fd, "w") as file:
            file.write(namespace)
        return claim
    raise RuntimeError(f"no free /24 left in {PREFIX}.0.0/16 (see {CLAIMS})")


class NamespacedScheduler(SchedulerProcess):
    """A scheduler daemon run inside `namespace`, listening on its every address there and
    advertised (and reached by the test) at `address`."""

    def __init__(
        self,
        namespace: Namespace,
        address: str,
        db_url: str,
        env: Mapping[str, str],
        log_path: str,
    ) -> None:
        super().__init__(db_url, env=env, port=DAEMON_PORT, log_path=log_path)
        self.argv = ("ip", "netns", "exec", namespace.name, *SERVE_ARGV)
        self._bind = f"0.0.0.0:{DAEMON_PORT}"
        self.url = f"http://{address}:{DAEMON_PORT}"
