"""What the daemon says once when it starts: which version listens where (and where its
dashboard is), how many connections it holds (and the open-files limit it raised for them),
on which database,
asking which registry, with auth on or off and which loops running; and a warning when it
listens beyond loopback with auth off (anyone who reaches the port can run shell commands on
every node).

Only words from settings, every URL with its credentials hidden (`redaction`): the gunicorn
master logs them (`gunicorn_conf.when_ready`) once its socket listens, before the worker loads
the jobs.
"""

from __future__ import annotations

import logging
import os

from ..config import Settings
from ..logs import printable
from ..redaction import redacted
from ..version import version
from .connections import OpenFiles
from .preflight import ListenAddress

log = logging.getLogger(__name__)

EVERY_INTERFACE = ("", "0.0.0.0", "::")
"""Hosts that listen on every interface of the machine."""


def lines(settings: Settings, address: ListenAddress, files: OpenFiles | None = None) -> list[str]:
    """The banner: a title line, then one aligned `name  value` line per fact."""
    facts = [
        ("listening on", _listening(address)),
        ("connections", _connections(settings, files)),
        ("dashboard", dashboard_url(address)),
        ("database", _database(settings.db_path)),
        ("registry", redacted(settings.registry_url)),
        ("auth", _auth(settings)),
        ("timeout scan", f"every {settings.timeout_scan_interval_secs:g} s"),
        ("SQS ingestion", _peer(settings.sqs_url, "queue", settings.sqs_queue)),
        ("SNS events", _peer(settings.sns_url, "topic", settings.sns_topic)),
    ]
    width = max(len(name) for name, _ in facts)
    return [f"tiny-scheduler {version()} starting"] + [
        f"  {name:<{width}}  {value}" for name, value in facts
    ]


def exposure_warning(settings: Settings, address: ListenAddress) -> str | None:
    """The warning for a daemon that other machines can reach with no key asked; else None."""
    if settings.api_key is not None or not address.beyond_loopback:
        return None
    return (
        f"listening on {address} with auth off: anyone who can reach this port can run shell "
        "commands on every node. Set TINYAWS_API_KEY, or listen on loopback only "
        f"(SCHEDULER_BIND=127.0.0.1:{address.port})"
    )


def log_banner(settings: Settings, address: ListenAddress, files: OpenFiles | None = None) -> None:
    """Log the banner as one INFO record, then the warning if there is one.

    The block is the record's message, not an argument, because the log's filter escapes
    newlines in arguments; each line's values are escaped here instead."""
    block = "\n".join(printable(line) for line in lines(settings, address, files))
    log.info(block)  # no arguments: logging leaves the message as it is
    warning = exposure_warning(settings, address)
    if warning is not None:
        log.warning("%s", warning)


def _listening(address: ListenAddress) -> str:
    if address.host is None:
        return str(address)  # a Unix socket, or one gunicorn inherited
    if not address.beyond_loopback:
        where = "loopback only"
    elif address.host in EVERY_INTERFACE:
        where = "every interface"
    else:
        where = "reachable from other machines"
    return f"http://{address} ({where})"


def dashboard_url(address: ListenAddress) -> str:
    """Where a browser finds the dashboard: on this machine when the daemon listens on every
    interface (other machines use this one's name), else at the address it listens on."""
    if address.host is None:
        return f"/ui/ on {address}"
    host = "127.0.0.1" if address.host in EVERY_INTERFACE else address.host
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{address.port}/ui/"


def _connections(settings: Settings, files: OpenFiles | None) -> str:
    per_client = min(settings.max_connections_per_client, settings.max_connections)
    if files is None:
        return f"at most {settings.max_connections}, {per_client} per client address"
    held = files.connections
    text = f"at most {held}, {min(per_client, held)} per client address ({files.describe()}"
    if held < files.wanted:
        text += f"; too few for MAX_CONNECTIONS={files.wanted}"
    return text + ")"


def _database(path: str) -> str:
    if "://" not in path:
        return f"{os.path.abspath(path)} (SQLite)"
    return redacted(path)


def _auth(settings: Settings) -> str:
    if settings.api_key is None:
        return "off (TINYAWS_API_KEY is unset: no request needs a key)"
    if settings.agent_exempt:
        how = "auto" if settings.auth_agent_exempt is None else "1"
        return (
            "on (bearer key; the tiny-aws agent's poll for a listed node and its PATCH exempt: "
            f"AUTH_AGENT_EXEMPT={how})"
        )
    return "on (bearer key on every call, the agent's too)"


def _peer(url: str | None, what: str, name: str) -> str:
    return f"on ({redacted(url)}, {what} {name})" if url else "off"
