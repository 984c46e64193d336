"""The package's import graph reads top-down: no circles, the CLI at the top, and only the
service (and the app factory that builds it) reaching the table, the store and the registry
client.

The graph is read from the source: every `import` of a `tiny_scheduler` module, including
those inside functions, which close a circle at run time just the same. A circle passes
unnoticed as long as the modules happen to load in a lucky order, so a test that only
imported them would not see one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import tiny_scheduler

PACKAGE = Path(tiny_scheduler.__file__).parent


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The `tiny_scheduler` modules that module `name` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            if node.level:
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                # `from . import errors` imports the module `errors`; `from .jobs import X`
                # imports `jobs` for its name X.
                if f"{base}.{alias.name}" in known:
                    yield f"{base}.{alias.name}"
                elif base in known:
                    yield base


def import_graph() -> dict[str, set[str]]:
    names = module_names()
    known = set(names)
    return {name: set(imports_of(name, path, known)) - {name} for name, path in names.items()}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for other in graph[name]:
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in on_stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == name:
                    break
            if len(component) > 1:
                found.append(component)

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_the_graph_is_read_right() -> None:
    # A check of the reader itself, on imports known to be there: otherwise an empty graph
    # would pass every test below.
    graph = import_graph()
    assert "tiny_scheduler.client" in graph["tiny_scheduler.cli.job_commands"]
    assert "tiny_scheduler.cli.output" in graph["tiny_scheduler.cli.group"]
    assert "tiny_scheduler.server.daemon_command" in graph["tiny_scheduler.dev.daemon"]
    assert "tiny_scheduler.dev.cluster" in graph["tiny_scheduler.cli.dev_commands"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


COLLABORATORS = (
    "tiny_scheduler.cluster.leadership",
    "tiny_scheduler.state.table",
    "tiny_scheduler.storage",
    "tiny_scheduler.cluster.registry",
    "tiny_scheduler.domain.placement",
    "tiny_scheduler.state.schedule_table",
)
"""What only the service may use."""

MAY_USE_COLLABORATORS = {
    "tiny_scheduler",  # create_app wires them together
    "tiny_scheduler.service",  # and its parts, tiny_scheduler.service.*
    "tiny_scheduler.server.gunicorn_conf",  # checks the database before the worker starts
}
MAY_USE_PREFIXES = (
    "tiny_scheduler.service.",  # the service's parts
    "tiny_scheduler.simulate.",  # builds a scheduler in memory and reads histories, read-only
)


def test_only_the_service_reaches_its_collaborators() -> None:
    def collaborator(name: str) -> bool:
        return any(name == c or name.startswith(c + ".") for c in COLLABORATORS)

    def may_use(name: str) -> bool:
        return name in MAY_USE_COLLABORATORS or name.startswith(MAY_USE_PREFIXES)

    graph = import_graph()
    assert "tiny_scheduler.state.table" in graph["tiny_scheduler.service"]  # the reader works
    reaching = {
        name: sorted(filter(collaborator, imported))
        for name, imported in graph.items()
        if not may_use(name) and not collaborator(name)
    }
    assert {name: found for name, found in reaching.items() if found} == {}


def test_nothing_outside_the_cli_imports_it() -> None:
    # The CLI is the top of the graph: the demo, the dev cluster and the daemon get what they
    # share with it from `client`, `display` and `daemon_command`.
    def in_cli(name: str) -> bool:
        return name == "tiny_scheduler.cli" or name.startswith("tiny_scheduler.cli.")

    graph = import_graph()
    importers = {
        name for name, imported in graph.items() if not in_cli(name) and any(map(in_cli, imported))
    }
    assert importers == set()


LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),
    ("dev",),
    ("agent", "client", "display", "job_events", "plain_http"),
    ("server",),  # gunicorn's settings build the app: the worker is above it
    ("", "simulate"),  # `create_app`, the package itself; the replay wires one scheduler too
    ("api", "ui", "loops", "metrics"),
    ("service",),
    ("state", "storage", "cluster"),
    ("domain",),
    (
        "clock",
        "config",
        "errors",
        "jsonstream",
        "logs",
        "notify",
        "redaction",
        "version",
        # What a view may say to the worker's loop: "answer me on a thread", "park me".
        "server.inline",
        "server.waiting",
    ),
)
"""The packages top-down: a module may import its own layer's and the layers below, never one
above. Each entry names a part of `tiny_scheduler` (a package or a module); a module belongs
to the longest entry its name starts with."""


def layer_of(name: str) -> int:
    part = name.removeprefix("tiny_scheduler").removeprefix(".")
    best, best_len = None, -1
    for rank, entries in enumerate(LAYERS):
        for entry in entries:
            if (part == entry or part.startswith(entry + ".") or entry == "") and len(
                entry
            ) > best_len:
                best, best_len = rank, len(entry)
    assert best is not None and (best_len > 0 or part == ""), f"{name} is in no layer"
    return best


def test_every_module_has_a_layer_and_no_arrow_runs_up() -> None:
    graph = import_graph()
    assert layer_of("tiny_scheduler.server.worker") < layer_of("tiny_scheduler.api.jobs")
    assert layer_of("tiny_scheduler.server.inline") > layer_of("tiny_scheduler.domain.jobs")
    upward = sorted(
        f"{name} -> {other}"
        for name, imported in graph.items()
        for other in imported
        if layer_of(other) < layer_of(name)
    )
    assert upward == []


def test_few_modules_are_left_loose_at_the_top() -> None:
    loose = [p for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert len(loose) < 20, sorted(p.name for p in loose)
    for package in (p.parent for p in PACKAGE.glob("*/__init__.py")):
        assert ast.get_docstring(ast.parse((package / "__init__.py").read_text())), package


RULES = ("domain", "state", "cluster.lease", "cluster.node_book", "service.moves")
"""Where the scheduler's decisions live: each of these modules' tests are found from it."""


def test_each_rules_tests_are_found_from_the_rule() -> None:
    # A rule's tests are `tests/test_<module>.py`, or the module's docstring names them
    # ("Tests: `tests/test_x.py`"), each of which exists.
    tests = PACKAGE.parent / "tests"
    unfound = []
    for name, path in module_names().items():
        part = name.removeprefix("tiny_scheduler.")
        if path.name == "__init__.py" or not any(
            part == rule or part.startswith(rule + ".") for rule in RULES
        ):
            continue
        if (tests / f"test_{path.stem}.py").exists():
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        named = [word for word in docstring.split("`") if word.startswith("tests/test_")]
        if not named or not all((PACKAGE.parent / word).exists() for word in named):
            unfound.append(name)
    assert unfound == []
