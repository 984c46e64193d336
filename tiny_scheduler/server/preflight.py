"""Start-up checks that run before the daemon creates anything: the listen address parses, and
the SQLite file's place can hold a database. Each problem is one line naming the variable or the
path, and the exact cause (a missing directory, one that is not writable, a path that is a
directory, a read-only file system), where SQLite would say only "unable to open database file".

The checks only look (stat, access, statvfs): they create no file, open no database and bind no
socket. Opening the database is the store's check, which runs after these pass; binding is
gunicorn's.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import pwd

from ..config import ConfigError, Settings

BIND_FORMS = "HOST:PORT, [IPV6]:PORT, unix:PATH or fd://N"
"""The forms SCHEDULER_BIND takes (gunicorn's bind syntax, with the port required)."""

LOOPBACK_NAMES = ("localhost",)
"""Host names that mean the loopback interface without being an address."""


class PreflightError(Exception):
    """The daemon cannot start as configured; the message is one line naming what to fix."""


@dataclasses.dataclass(frozen=True)
class ListenAddress:
    """Where the daemon listens: a TCP host and port, a Unix socket, or an inherited socket."""

    text: str  # as SCHEDULER_BIND gave it
    host: str | None = None  # TCP: "" means every interface
    port: int | None = None
    unix_path: str | None = None
    fd: int | None = None

    @property
    def beyond_loopback(self) -> bool:
        """Whether other machines may reach it: any TCP address but a loopback one. A Unix
        socket is local; an inherited socket (fd://) is whatever its creator made it."""
        if self.host is None:
            return False
        if self.host.lower() in LOOPBACK_NAMES:
            return False
        try:
            return not ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return True  # every interface (""), or a host name that resolves to who knows

    def __str__(self) -> str:
        if self.unix_path is not None:
            return f"unix:{self.unix_path}"
        if self.fd is not None:
            return f"fd://{self.fd}"
        host = self.host or "0.0.0.0"
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{self.port}"


def check(settings: Settings) -> ListenAddress:
    """Every check, in the order start-up needs them; the parsed listen address."""
    address = parse_bind(settings.bind)
    check_database_path(settings.db_path)
    return address


def parse_bind(value: str) -> ListenAddress:
    """SCHEDULER_BIND parsed; ConfigError naming the variable when it does not parse."""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"SCHEDULER_BIND must be {BIND_FORMS}, got {value!r}: {why}")

    if value.startswith("unix:"):
        path = value.removeprefix("unix:").removeprefix("//")
        if not path:
            raise bad("the socket path is empty")
        return ListenAddress(value, unix_path=path)
    if value.startswith("fd://"):
        fd = value.removeprefix("fd://")
        if not (fd.isascii() and fd.isdigit()):
            raise bad(f"{fd!r} is not a file descriptor number")
        return ListenAddress(value, fd=int(fd))
    netloc = value.removeprefix("tcp://")
    if netloc.startswith("["):
        host, bracket, rest = netloc[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise bad("an IPv6 address in brackets needs :PORT after it")
        port_text = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad(f"{host!r} is not an IPv6 address") from None
    else:
        host, colon, port_text = netloc.rpartition(":")
        if not colon:
            raise bad("no port")
        if ":" in host:
            raise bad("write an IPv6 address in brackets, e.g. [::1]:9001")
    if not (port_text.isascii() and port_text.isdigit() and 1 <= int(port_text) <= 65535):
        raise bad(f"the port {port_text!r} is not a number from 1 to 65535")
    return ListenAddress(value, host=host, port=int(port_text))


def check_database_path(path: str) -> None:
    """PreflightError when the SQLite file at `path` cannot be created or written: SQLite
    writes the file and, beside it, its -wal and -shm files, so the directory must take them."""
    if path == ":memory:" or "://" in path:
        return  # not a file (a URL belongs to another store, which checks its own)
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise PreflightError(
            f"SCHEDULER_DB: {full} is a directory; name the database file in it, "
            f"e.g. {os.path.join(full, 'scheduler.db')}"
        )
    folder = os.path.dirname(full)
    if not os.path.exists(folder):
        raise PreflightError(
            f"SCHEDULER_DB: the directory {folder} for the database {full} does not exist; "
            "create it or choose another path"
        )
    if not os.path.isdir(folder):
        raise PreflightError(
            f"SCHEDULER_DB: {folder} is not a directory, so the database {full} cannot be in it"
        )
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        raise PreflightError(
            f"SCHEDULER_DB: the directory {folder} for the database {full} is on a read-only "
            "file system"
        )
    if not os.access(folder, os.W_OK | os.X_OK, effective_ids=_can_use_effective_ids()):
        raise PreflightError(
            f"SCHEDULER_DB: the directory {folder} for the database {full} is not writable by "
            f"{_who()}; the database and its -wal and -shm files are created there"
        )
    if os.path.exists(full) and not os.access(
        full, os.R_OK | os.W_OK, effective_ids=_can_use_effective_ids()
    ):
        raise PreflightError(
            f"SCHEDULER_DB: the database {full} is not readable and writable by {_who()}"
        )


def _can_use_effective_ids() -> bool:
    # Ask as the user the daemon runs as (its effective ids), where the platform can.
    return os.access in os.supports_effective_ids


def _who() -> str:
    uid = os.geteuid()
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
