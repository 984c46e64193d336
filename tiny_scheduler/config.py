"""Settings: the one place where the scheduler's knobs, their defaults and their units live.

`Settings.from_env()` reads every variable of the spec's configuration table once, at start-up.
A value that does not parse raises `ConfigError` naming the variable, so that a typo stops the
daemon instead of silently running with a default. Nothing else in the daemon reads
`os.environ` (the command line, a client, reads its own two: SCHEDULER_URL and
TINYAWS_API_KEY).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Literal

from .redaction import redacted

DEFAULT_BIND = "0.0.0.0:9001"
"""Listen address of the daemon (gunicorn `bind`)."""

DEFAULT_DB = "scheduler.db"
"""Path of the SQLite file, relative to the working directory."""

DEFAULT_REGISTRY_URL = "http://127.0.0.1:9000"
"""Base URL of the node registry."""

DEFAULT_REGISTRY_CACHE_SECS = 2.0
"""Seconds a fetched node list is reused before the registry is asked again."""

DEFAULT_MAX_JOBS_PER_NODE = 1
"""Running `run` jobs a node may have at once (services take no slot)."""

AUTO_SLOTS = "auto"
"""MAX_JOBS_PER_NODE value that gives each node as many slots as its registry `cpu_count`."""

LEAST_LOADED = "least-loaded"
ROUND_ROBIN = "round-robin"
BINPACK = "binpack"
PLACEMENTS = (LEAST_LOADED, ROUND_ROBIN, BINPACK)
"""Values PLACEMENT accepts; `least-loaded` is the default."""

OFFER_HOLD_SECS = 10.0
"""Seconds after a job appeared in its own node's poll answer during which no other node's
poll may take it: that node's agent may be about to claim it."""

DEFAULT_MAX_JOB_RETRIES = 1
"""How many times a failed attempt is retried before the job stays failed."""

DEFAULT_JOB_TIMEOUT_SECS = 3600
"""Seconds a `run` job may run, counted from `running_at`, unless it sets `timeout_secs`."""

DEFAULT_TIMEOUT_SCAN_INTERVAL_SECS = 10.0
"""Seconds between two timeout / lost-node / retention scans."""

SCHEDULE_TICK_SECS = 1.0
"""Seconds between two looks at the schedules: a fire happens within this of its time, and a
fire that found no node is tried again this often until the schedule's next fire time."""

DEFAULT_NODE_LOST_SECS = 60.0
"""Seconds a node may be gone or unhealthy before its running jobs fail with `node lost`."""

DEFAULT_JOB_RETENTION_SECS = 604800
"""Seconds finished jobs are kept (a week); 0 keeps them forever."""

DEFAULT_MAX_OUTPUT_BYTES = 1048576
"""Bytes kept of each of stdout and stderr (the tail, behind a marker)."""

DEFAULT_MAX_REQUEST_BYTES = 4194304
"""Largest request body in bytes; larger ones get 413."""

DEFAULT_THREADS = 32
"""Request threads of the one gunicorn worker (SCHEDULER_THREADS)."""

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
"""Values SCHEDULER_LOG_LEVEL accepts; `info` is the default."""

DEFAULT_SQS_QUEUE = "jobs"
"""Queue the SQS loop ingests."""

DEFAULT_SQS_POLL_INTERVAL_SECS = 5.0
"""Seconds between two SQS polls."""

DEFAULT_SNS_TOPIC = "job-status"
"""Topic that final job states are published to."""

DEFAULT_LEADER_LEASE_SECS = 5.0
"""Seconds a PostgreSQL leader's lease lasts without renewal; a standby takes over after it."""

MIN_LEADER_LEASE_SECS = 1.0
"""The shortest lease LEADER_LEASE_SECS accepts: renewals and checks run at fractions of it."""

BUILTIN_REGISTRY = "builtin"
"""REGISTRY_URL's value for a scheduler that is its own node registry (the nodes are the agents
that heartbeat)."""

DEFAULT_NODE_HEARTBEAT_SECS = 5.0
"""Seconds between two heartbeats asked of this project's agents."""

DEFAULT_KILL_GRACE_SECS = 10.0
"""Seconds an agent waits after SIGTERM before SIGKILL when it stops a job."""

DEFAULT_FAIRSHARE_HALF_LIFE_SECS = 3600.0
"""Seconds after which a user's past CPU time counts half in fair share (see fair_share)."""

DEFAULT_MAX_WAITERS = 64
"""Open output waits and event streams at most; more get 503."""

DEFAULT_MAX_CONNECTIONS = 10_000
"""Client connections the worker holds at most (server/admission.py says what is shed)."""

DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 2_000
"""Client connections one client address holds at most."""

REGISTRY_DEADLINE_SECS = 3.0
"""Seconds one registry call may take in all (connect, send, the whole answer) before the
request that needed it gets 503: a hung or trickling registry."""

SQS_DEADLINE_SECS = 5.0
"""Seconds one SQS call may take in all."""

SNS_DEADLINE_SECS = 3.0
"""Seconds one SNS publish may take in all."""

STORE_PROBE_INTERVAL_SECS = 2.0
"""Seconds without any write after which the store commits a probe of its own: what /health
says about the store is never older than this (plus one commit)."""

STORE_STALL_SECS = 10.0
"""Seconds one commit may wait on the disk before /health calls the store unhealthy (a disk
that stopped answering)."""

OWNER_WAIT_SECS = 5.0
"""Seconds a starting scheduler waits for the one that had its SQLite file open to let go (one
that is still exiting) before refusing to start because the file is in use."""


class ConfigError(ValueError):
    """A configuration variable is set to a value that does not parse."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the scheduler can be told, typed and validated."""

    bind: str = DEFAULT_BIND
    db_path: str = DEFAULT_DB
    registry_url: str = DEFAULT_REGISTRY_URL
    registry_cache_secs: float = DEFAULT_REGISTRY_CACHE_SECS
    api_key: str | None = None
    auth_agent_exempt: bool | None = None  # None: auto (on with a registry, off with builtin)
    max_jobs_per_node: int | Literal["auto"] = DEFAULT_MAX_JOBS_PER_NODE
    placement: str = LEAST_LOADED
    job_stealing: bool = True
    max_job_retries: int = DEFAULT_MAX_JOB_RETRIES
    job_timeout_secs: int = DEFAULT_JOB_TIMEOUT_SECS
    timeout_scan_interval_secs: float = DEFAULT_TIMEOUT_SCAN_INTERVAL_SECS
    node_lost_secs: float = DEFAULT_NODE_LOST_SECS
    job_retention_secs: int = DEFAULT_JOB_RETENTION_SECS
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    sqs_url: str | None = None
    sqs_queue: str = DEFAULT_SQS_QUEUE
    sqs_poll_interval_secs: float = DEFAULT_SQS_POLL_INTERVAL_SECS
    sns_url: str | None = None
    sns_topic: str = DEFAULT_SNS_TOPIC
    threads: int = DEFAULT_THREADS
    log_level: str = "info"
    advertise_url: str | None = None
    leader_lease_secs: float = DEFAULT_LEADER_LEASE_SECS
    node_heartbeat_secs: float = DEFAULT_NODE_HEARTBEAT_SECS
    kill_grace_secs: float = DEFAULT_KILL_GRACE_SECS
    max_waiters: int = DEFAULT_MAX_WAITERS
    fairshare_half_life_secs: float = DEFAULT_FAIRSHARE_HALF_LIFE_SECS
    ha_forward: bool = True
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT

    @property
    def builtin_registry(self) -> bool:
        """Whether the scheduler is its own node registry (REGISTRY_URL=builtin)."""
        return self.registry_url == BUILTIN_REGISTRY

    @property
    def agent_exempt(self) -> bool:
        """Whether the tiny-aws agent's poll and PATCH go without the key: only with a key set
        (else nothing needs one), and with AUTH_AGENT_EXEMPT=auto only where that agent may
        run, with a registry (a cluster of this project's agents, REGISTRY_URL=builtin,
        always sends the key)."""
        if self.api_key is None:
            return False
        if self.auth_agent_exempt is None:
            return not self.builtin_registry
        return self.auth_agent_exempt

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from the environment; an empty variable counts as unset."""
        env = _Env(os.environ if environ is None else environ)
        db_path = env.text("SCHEDULER_DB", DEFAULT_DB)
        advertise_url = env.optional_url("SCHEDULER_ADVERTISE_URL")
        if advertise_url is None and db_path.startswith(("postgresql://", "postgres://")):
            # Standbys send clients to the leader's advertised URL: without one they could not.
            raise ConfigError("SCHEDULER_ADVERTISE_URL must be set when SCHEDULER_DB is PostgreSQL")
        registry_url = env.url_or("REGISTRY_URL", DEFAULT_REGISTRY_URL, BUILTIN_REGISTRY)
        # A cluster of our own agents knows each node's CPUs from its heartbeat: there each
        # node's CPUs are its slots unless told otherwise (round four); a registry's stays 1.
        slots_default = (
            AUTO_SLOTS if registry_url == BUILTIN_REGISTRY else DEFAULT_MAX_JOBS_PER_NODE
        )
        return cls(
            bind=env.text("SCHEDULER_BIND", DEFAULT_BIND),
            db_path=db_path,
            registry_url=registry_url,
            registry_cache_secs=env.number("REGISTRY_CACHE_SECS", DEFAULT_REGISTRY_CACHE_SECS, 0),
            api_key=env.optional("TINYAWS_API_KEY"),
            auth_agent_exempt=env.flag_or_auto("AUTH_AGENT_EXEMPT"),
            max_jobs_per_node=env.slots("MAX_JOBS_PER_NODE", slots_default),
            placement=env.choice("PLACEMENT", PLACEMENTS, LEAST_LOADED),
            job_stealing=env.flag("JOB_STEALING", True),
            max_job_retries=env.integer("MAX_JOB_RETRIES", DEFAULT_MAX_JOB_RETRIES, 0),
            job_timeout_secs=env.integer("JOB_TIMEOUT_SECS", DEFAULT_JOB_TIMEOUT_SECS, 1),
            timeout_scan_interval_secs=env.number(
                "TIMEOUT_SCAN_INTERVAL_SECS", DEFAULT_TIMEOUT_SCAN_INTERVAL_SECS, 0.01
            ),
            node_lost_secs=env.number("NODE_LOST_SECS", DEFAULT_NODE_LOST_SECS, 0),
            job_retention_secs=env.integer("JOB_RETENTION_SECS", DEFAULT_JOB_RETENTION_SECS, 0),
            max_output_bytes=env.integer("MAX_OUTPUT_BYTES", DEFAULT_MAX_OUTPUT_BYTES, 256),
            max_request_bytes=env.integer("MAX_REQUEST_BYTES", DEFAULT_MAX_REQUEST_BYTES, 1024),
            sqs_url=env.optional_url("SQS_URL"),
            sqs_queue=env.text("SQS_QUEUE", DEFAULT_SQS_QUEUE),
            sqs_poll_interval_secs=env.number(
                "SQS_POLL_INTERVAL_SECS", DEFAULT_SQS_POLL_INTERVAL_SECS, 0.01
            ),
            sns_url=env.optional_url("SNS_URL"),
            sns_topic=env.text("SNS_TOPIC", DEFAULT_SNS_TOPIC),
            threads=env.integer("SCHEDULER_THREADS", DEFAULT_THREADS, 1),
            log_level=env.choice("SCHEDULER_LOG_LEVEL", LOG_LEVELS, "info"),
            advertise_url=advertise_url,
            leader_lease_secs=env.number(
                "LEADER_LEASE_SECS", DEFAULT_LEADER_LEASE_SECS, MIN_LEADER_LEASE_SECS
            ),
            node_heartbeat_secs=env.number("NODE_HEARTBEAT_SECS", DEFAULT_NODE_HEARTBEAT_SECS, 0.1),
            kill_grace_secs=env.number("KILL_GRACE_SECS", DEFAULT_KILL_GRACE_SECS, 0),
            max_waiters=env.integer("MAX_WAITERS", DEFAULT_MAX_WAITERS, 0),
            fairshare_half_life_secs=env.number(
                "FAIRSHARE_HALF_LIFE_SECS", DEFAULT_FAIRSHARE_HALF_LIFE_SECS, 1
            ),
            ha_forward=env.flag("HA_FORWARD", True),
            max_connections=env.integer("MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS, 64),
            max_connections_per_client=env.integer(
                "MAX_CONNECTIONS_PER_CLIENT", DEFAULT_MAX_CONNECTIONS_PER_CLIENT, 1
            ),
        )


class _Env:
    """Typed readers over an environment mapping; each error names its variable."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def optional(self, name: str) -> str | None:
        value = self._environ.get(name, "").strip()
        return value or None

    def text(self, name: str, default: str) -> str:
        return self.optional(name) or default

    def url(self, name: str, default: str) -> str:
        return self.optional_url(name) or default

    def url_or(self, name: str, default: str, word: str) -> str:
        """A URL, or the one `word` that stands for something else (`builtin`)."""
        raw = self.optional(name)
        if raw is not None and raw.lower() == word:
            return word
        return self.url(name, default)

    def optional_url(self, name: str) -> str | None:
        value = self.optional(name)
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            shown = redacted(value)  # a URL that is refused may still carry a password
            raise ConfigError(f"{name} must be an http:// or https:// URL, got {shown!r}")
        return value.rstrip("/")

    def integer(self, name: str, default: int, minimum: int) -> int:
        raw = self.optional(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
        if value < minimum:
            raise ConfigError(f"{name} must be at least {minimum}, got {raw!r}")
        return value

    def slots(self, name: str, default: int | Literal["auto"]) -> int | Literal["auto"]:
        raw = self.optional(name)
        if (raw is None and default == AUTO_SLOTS) or (
            raw is not None and raw.lower() == AUTO_SLOTS
        ):
            return AUTO_SLOTS
        try:
            return self.integer(name, default if isinstance(default, int) else 1, 1)
        except ConfigError:
            raise ConfigError(
                f"{name} must be an integer of at least 1 or {AUTO_SLOTS}, got {raw!r}"
            ) from None

    def number(self, name: str, default: float, minimum: float) -> float:
        raw = self.optional(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{name} must be a number, got {raw!r}") from None
        if not value >= minimum or value == float("inf"):
            raise ConfigError(f"{name} must be a finite number of at least {minimum}, got {raw!r}")
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        raw = self.optional(name)
        if raw is None:
            return default
        if raw.lower() not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
        return raw.lower()

    def flag_or_auto(self, name: str) -> bool | None:
        """A flag, or `auto` (None, as when unset): decided by the other settings."""
        raw = self.optional(name)
        if raw is None or raw.lower() == AUTO_SLOTS:
            return None
        try:
            return self.flag(name, True)
        except ConfigError:
            raise ConfigError(f"{name} must be 0, 1 or {AUTO_SLOTS}, got {raw!r}") from None

    def flag(self, name: str, default: bool) -> bool:
        raw = self.optional(name)
        if raw is None:
            return default
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name} must be 0 or 1, got {raw!r}")
