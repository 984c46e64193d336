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
    assert "tiny_scheduler.cli.output" in graph["tiny_scheduler.cli"]
    assert "tiny_scheduler.daemon_command" in graph["tiny_scheduler.dev.daemon"]
    assert "tiny_scheduler.dev.cluster" in graph["tiny_scheduler.cli.dev_commands"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


COLLABORATORS = (
    "tiny_scheduler.leadership",
    "tiny_scheduler.table",
    "tiny_scheduler.storage",
    "tiny_scheduler.registry",
    "tiny_scheduler.placement",
    "tiny_scheduler.schedule_table",
)
"""What only the service may use."""

MAY_USE_COLLABORATORS = {
    "tiny_scheduler",  # create_app wires them together
    "tiny_scheduler.service",  # and its parts, tiny_scheduler.service.*
    "tiny_scheduler.gunicorn_conf",  # checks the database before the worker starts
}


def test_only_the_service_reaches_its_collaborators() -> None:
    def collaborator(name: str) -> bool:
        return any(name == c or name.startswith(c + ".") for c in COLLABORATORS)

    def may_use(name: str) -> bool:
        return name in MAY_USE_COLLABORATORS or name.startswith("tiny_scheduler.service.")

    graph = import_graph()
    assert "tiny_scheduler.table" in graph["tiny_scheduler.service"]  # the reader works
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
