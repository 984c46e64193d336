"""Fixtures: a real registry on loopback, and real schedulers under real gunicorn.

- `registry`: a FakeRegistry listing node-a, node-b and node-c as healthy. One server per test
  module, reset to that state before each test, so a test may change nodes, instances and
  faults freely.
- `scheduler`: one scheduler process per test module, on that module's registry. A module
  may set `SCHEDULER_ENV = {...}` to start it with other settings. Tests sharing it stay
  independent by working on their own nodes (`helpers.unique_node`) and their own jobs.
- `scheduler_factory`: starts dedicated schedulers (other settings, restarts, a registry of
  their own), each stopped when the test ends.
- `api`: a client of the module's scheduler.
- `node`: a fresh node id, made the registry's only healthy node for the test.
- `unused_port`: a TCP port held for the test alone (a daemon that is down, or one the test
  starts on a port of its choosing).
- `postgres_url`: a PostgreSQL server's URL (`TEST_POSTGRES_URL`, else the local default);
  `postgres_database`: makes fresh databases on it (`.create()`), dropped when the test ends.

Tests that need something the machine may lack (a browser, PostgreSQL) call `unavailable()`:
one skip line saying how to get it, or a failure where `.ci/run` says it must be there.

Every scheduler gets a log file; when a test fails, the tail of each running scheduler's log
is added to its report.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import sys
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from flask import Flask
    from test_ha import Ha

# The checks in helpers.py are plain asserts: have pytest explain them when they fail.
pytest.register_assert_rewrite("helpers")

from helpers import DEFAULT_NODES, Agent, Api, set_nodes, unique_node  # noqa: E402

from tiny_scheduler import Settings, create_app, stop_background  # noqa: E402
from tiny_scheduler.dev.daemon import PortReservation, SchedulerProcess  # noqa: E402
from tiny_scheduler.dev.registry import FakeRegistry  # noqa: E402

# A suite started in the background (nohup, `cmd &` in a script) inherits SIGINT ignored, and so
# would every process the tests start: a test's Ctrl-C would then do nothing and the command
# would never stop. The tests press Ctrl-C as a terminal would, so its default comes back here
# (each xdist worker runs this too; a handler, unlike "ignored", is not inherited across exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

START_TIMEOUT = 30.0
"""Seconds a scheduler may take to answer /health (the machine is shared: be generous)."""

BASE_ENV = {
    # Tests change the registry and expect the next request to see it.
    "REGISTRY_CACHE_SECS": "0",
    # The timeout / lost-node / retention scans would move and expire jobs under the feet of
    # tests of the API; the loops have tests of their own that turn them on.
    "TIMEOUT_SCAN_INTERVAL_SECS": "3600",
    "JOB_RETENTION_SECS": "0",
    # Tests sharing one scheduler leave waiting jobs on nodes that then leave the registry, and
    # an idle node's poll would take them over; the tests of moving work turn it on.
    "JOB_STEALING": "0",
    # Whatever the developer's shell holds, these peers and auth are off unless a test says so
    # (an empty variable counts as unset).
    "TINYAWS_API_KEY": "",
    "AUTH_AGENT_EXEMPT": "",
    "SQS_URL": "",
    "SNS_URL": "",
    "SCHEDULER_THREADS": "16",
}

SchedulerFactory = Callable[..., SchedulerProcess]

_live: list[SchedulerProcess] = []  # schedulers running now, for the log tails of failures


REFUSAL_TIMEOUT = 30.0
"""Seconds a scheduler that must refuse to start has to exit by itself."""


def refused_scheduler(db_path: Path, folder: Path, registry_url: str) -> str:
    """Start a scheduler on `db_path` that must exit non-zero by itself, with a clear line and
    no traceback; returns its output (logged to a new file in `folder`)."""
    log_path = folder / f"refused-{uuid.uuid4().hex[:6]}.log"
    proc = SchedulerProcess(
        str(db_path), env={**BASE_ENV, "REGISTRY_URL": registry_url}, log_path=str(log_path)
    )
    proc.start(wait=False)
    assert proc.proc is not None
    try:
        code = proc.proc.wait(REFUSAL_TIMEOUT)
    finally:
        proc.kill()
    output = log_path.read_text(errors="replace")
    assert code != 0, output
    assert "Traceback" not in output, f"a refusal is one clear line, not a traceback: {output}"
    return output


def start_scheduler(
    db_path: Path,
    log_path: Path,
    registry_url: str,
    env: Mapping[str, str] | None = None,
    port: int | None = None,
) -> SchedulerProcess:
    """Start a scheduler on `db_path` with the test defaults plus `env`; wait until ready.
    Without `port` it gets one of its own; a test restarting a daemon where its clients
    already point passes the port it holds (a `PortReservation`)."""
    proc = SchedulerProcess(
        str(db_path),
        env={**BASE_ENV, "REGISTRY_URL": registry_url, **(env or {})},
        port=port,
        log_path=str(log_path),
    )
    _live.append(proc)
    try:
        proc.start(timeout=START_TIMEOUT)
    except BaseException:
        stop_scheduler(proc)
        raise
    return proc


def stop_scheduler(proc: SchedulerProcess) -> int | None:
    """SIGTERM it and wait; returns the exit code."""
    try:
        return proc.stop()
    finally:
        if proc in _live:
            _live.remove(proc)


def log_tail(proc: SchedulerProcess, size: int = 4000) -> str:
    if not proc.log_path or not Path(proc.log_path).exists():
        return ""
    return Path(proc.log_path).read_bytes()[-size:].decode("utf-8", "replace")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    fold_unavailable(report)
    if report.failed:
        for proc in _live:
            report.sections.append((f"scheduler log {proc.url}", log_tail(proc)))


REAL_PARTS = frozenset(
    {
        "scheduler",
        "scheduler_factory",
        "api",
        "agent",
        "node",
        "registry",
        "registry_server",
        "make_app",
        "unused_port",
        "postgres_url",
        "postgres_database",
        "ha",
    }
)
"""Fixtures that start or reach a real process, port or database."""

SPAWNS = (
    "subprocess",
    "Popen",
    "start_scheduler",
    "DevCluster",
    "webdriver",
    "netns",
    "tiny_scheduler.dev.",
)
"""Words in a test module's source that mean its tests start processes or servers of their own
(`tiny_scheduler.dev.`: the stand-in peers, real HTTP servers on loopback)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `quick` every test that runs on the harness or on pure functions alone: no real
    process, port or database (`make test-quick` runs those, in well under a minute)."""
    spawning: dict[Path, bool] = {}
    for item in items:
        path = item.path
        if path not in spawning:
            source = path.read_text()
            spawning[path] = any(word in source for word in SPAWNS)
        if not spawning[path] and not REAL_PARTS & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.quick)


def reset_registry(registry: FakeRegistry) -> None:
    """Back to the default cluster: three healthy nodes, no instances, no fault."""
    registry.fault = None
    registry.slow_secs = 0.5
    registry.instances.clear()
    registry.services.clear()
    set_nodes(registry, DEFAULT_NODES)


@pytest.fixture(scope="module")
def registry_server(request: pytest.FixtureRequest) -> Iterator[FakeRegistry]:
    """The module's registry; a module may set `REGISTRY_KEY` to make it require a bearer."""
    registry = FakeRegistry(key=getattr(request.module, "REGISTRY_KEY", None))
    registry.start()
    reset_registry(registry)
    yield registry
    registry.stop()


AppFactory = Callable[..., "Flask"]


@pytest.fixture
def make_app(tmp_path: Path, registry: FakeRegistry) -> Iterator[AppFactory]:
    """`make_app(name="scheduler", **settings)`: an in-process app (no gunicorn, loops not
    started) on `tmp_path/<name>.db` and the module's registry, for narrow tests with Flask's
    test client. Every app made is stopped and its store closed when the test ends."""
    made: list[Flask] = []

    def make(name: str = "scheduler", **settings: object) -> Flask:
        defaults = {"db_path": str(tmp_path / f"{name}.db"), "registry_url": registry.url}
        app = create_app(Settings(**{**defaults, **settings}))
        made.append(app)
        return app

    yield make
    for app in made:
        stop_background(app)


@pytest.fixture
def registry(registry_server: FakeRegistry) -> FakeRegistry:
    """The module's registry, reset to node-a, node-b, node-c healthy."""
    reset_registry(registry_server)
    return registry_server


@pytest.fixture
def node(registry: FakeRegistry) -> str:
    """A node id of this test's own, made the registry's only healthy node: every job the
    test submits lands on it and no other test's jobs do."""
    node_id = unique_node()
    set_nodes(registry, [node_id])
    return node_id


@pytest.fixture
def agent(scheduler: SchedulerProcess, node: str) -> Iterator[Agent]:
    """The agent of the test's own node, on the module's scheduler."""
    played = Agent(scheduler.url, node)
    yield played
    played.close()


@pytest.fixture
def unused_port() -> Iterator[int]:
    """A TCP port no other test gets while this one runs, in this process or any other (tests
    run in parallel): a connection to it is refused, and a server the test starts that binds
    it with SO_REUSEADDR (gunicorn, http.server) may listen on it, on any interface."""
    with PortReservation("0.0.0.0") as port:
        yield port


@pytest.fixture(scope="module")
def scheduler(
    request: pytest.FixtureRequest,
    registry_server: FakeRegistry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SchedulerProcess]:
    """The module's scheduler, with the module's `SCHEDULER_ENV` if it has one."""
    env = getattr(request.module, "SCHEDULER_ENV", {})
    folder = tmp_path_factory.mktemp("scheduler")
    proc = start_scheduler(
        folder / "scheduler.db", folder / "scheduler.log", registry_server.url, env
    )
    yield proc
    stop_scheduler(proc)


@pytest.fixture
def api(scheduler: SchedulerProcess) -> Iterator[Api]:
    client = Api(scheduler.url)
    yield client
    client.close()


@pytest.fixture
def scheduler_factory(tmp_path: Path, registry: FakeRegistry) -> Iterator[SchedulerFactory]:
    """`start(env=None, db_path=None, registry_url=None)`: a started dedicated scheduler.

    Without `db_path` it uses the test's own `tmp_path/scheduler.db`, so starting again after
    a stop continues on the same database (restart tests). Without `registry_url` it uses the
    module's registry. All still running are stopped when the test ends.
    """
    started: list[SchedulerProcess] = []
    counter = itertools.count(1)

    def start(
        env: Mapping[str, str] | None = None,
        db_path: Path | None = None,
        registry_url: str | None = None,
    ) -> SchedulerProcess:
        log_path = tmp_path / f"scheduler-{next(counter)}.log"
        proc = start_scheduler(
            db_path or tmp_path / "scheduler.db", log_path, registry_url or registry.url, env
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        stop_scheduler(proc)


# --- what the machine may lack: a browser, PostgreSQL ------------------------------------------


_unavailable: dict[str, tuple[str, int]] = {}  # skip message -> where unavailable() was called


def unavailable(reason: str, required_by: str) -> NoReturn:
    """Skip the test because `reason` (which says how to get the thing); or fail it when the
    variable `required_by` is 1 (`.ci/run` sets it: there a missing tool is a broken CI)."""
    if os.environ.get(required_by, "").strip() == "1":
        pytest.fail(f"{reason} [{required_by}=1: required]", pytrace=False)
    message = f"{reason} [{required_by}=1 makes this a failure]"
    caller = sys._getframe(1)
    _unavailable[message] = (caller.f_code.co_filename, caller.f_lineno)
    pytest.skip(message)


def fold_unavailable(report: pytest.TestReport) -> None:
    """Give every test skipped for the same missing tool the location of the check that found
    it missing, so `-ra` folds them into one summary line with their count (pytest would give
    each test its own line)."""
    if report.skipped and isinstance(report.longrepr, tuple):
        message = report.longrepr[2]
        where = _unavailable.get(message.removeprefix("Skipped: "))
        if where is not None:
            report.longrepr = (*where, message)


POSTGRES_DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
"""The server the PostgreSQL tests use when `TEST_POSTGRES_URL` is unset (the spec's)."""

POSTGRES_PROBE_SECS = 1.0
"""Seconds the TCP probe waits for the server to accept a connection."""


def postgres_address(url: str) -> tuple[str, int]:
    """Host (or socket directory) and port a libpq URL connects to."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    host = query.get("host", [parts.hostname or "localhost"])[0]
    return host, int(query.get("port", [parts.port or 5432])[0])


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """A PostgreSQL server that accepts connections: `TEST_POSTGRES_URL`, else the spec's
    default. Only probed (a TCP connect), so no driver is needed to find out."""
    url = os.environ.get("TEST_POSTGRES_URL", "").strip() or POSTGRES_DEFAULT_URL
    try:
        host, port = postgres_address(url)
    except ValueError as exc:
        pytest.fail(f"TEST_POSTGRES_URL does not parse ({exc}): {url}", pytrace=False)
    family = socket.AF_UNIX if host.startswith("/") else socket.AF_INET
    target: str | tuple[str, int] = (
        f"{host}/.s.PGSQL.{port}" if family == socket.AF_UNIX else (host, port)
    )
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(POSTGRES_PROBE_SECS)
            probe.connect(target)
    except OSError as exc:
        unavailable(
            f"no PostgreSQL answers at {host}:{port} ({exc.strerror or exc}): start one there "
            "or set TEST_POSTGRES_URL to run the PostgreSQL tests",
            "TEST_REQUIRE_POSTGRES",
        )
    return url


class PostgresDatabases:
    """Fresh databases on one PostgreSQL server, each dropped by `drop()` or at `close()`."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self._names: list[str] = []

    def create(self) -> str:
        """The URL of a new, empty database of a name no other test run uses."""
        name = f"ts_test_{uuid.uuid4().hex[:16]}"
        self._admin(f'CREATE DATABASE "{name}"')
        self._names.append(name)
        return database_url(self.server_url, name)

    def drop(self, url: str) -> None:
        """Drop a database `create()` made, with whatever connections are still open to it."""
        name = urllib.parse.urlsplit(url).path.lstrip("/")
        self._names.remove(name)
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        for name in list(self._names):
            self.drop(database_url(self.server_url, name))

    def _admin(self, statement: str) -> None:
        import psycopg  # only the PostgreSQL tests pay for the driver's import

        # CREATE and DROP DATABASE cannot run inside a transaction block.
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            admin.execute(statement)


@pytest.fixture
def postgres_database(postgres_url: str) -> Iterator[PostgresDatabases]:
    """Makes fresh databases on the test server (`.create()` gives a URL); every one still
    there is dropped when the test ends."""
    databases = PostgresDatabases(postgres_url)
    yield databases
    databases.close()


@pytest.fixture
def ha(
    tmp_path: Path, registry: FakeRegistry, postgres_database: PostgresDatabases
) -> Iterator[Ha]:
    """Daemons sharing one fresh PostgreSQL database (test_ha.Ha), stopped when the test ends."""
    from test_ha import Ha  # here: conftest is imported before any test module

    cluster = Ha(postgres_database.create(), tmp_path, registry.url)
    yield cluster
    cluster.stop()


def database_url(server_url: str, name: str) -> str:
    """`server_url` pointing at the database `name` instead (query options kept)."""
    parts = urllib.parse.urlsplit(server_url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))
