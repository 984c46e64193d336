"""The package's import graph reads top-down: no circles, and only the service (and the app
factory that builds it) reaches the table, the store and the registry client."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tiny_scheduler"

COLLABORATORS = {
    "tiny_scheduler.table",
    "tiny_scheduler.storage",
    "tiny_scheduler.registry",
    "tiny_scheduler.placement",
}
"""What only the service may use (the factory builds them; the daemon's start-up checks the
database before any app exists)."""

MAY_USE_COLLABORATORS = {
    "tiny_scheduler",  # create_app wires them
    "tiny_scheduler.service",
    "tiny_scheduler.placement",  # uses the registry client
    "tiny_scheduler.gunicorn_conf",  # checks the database before the worker starts
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, module: str) -> set[str]:
    """Every tiny_scheduler module `path` imports, wherever in the file (TYPE_CHECKING
    blocks aside: they are for the type checker, not the running program)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(child) for child in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if node.module:  # `from . import x` imports x, not the package for its own sake
                found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("tiny_scheduler")}


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {
        name: {i for i in _imports(path, name) if i in modules and i != name}
        for name, path in modules.items()
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, if there is any (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            # `import tiny_scheduler.x` runs the package's __init__ first; that is not a
            # dependency of the package on x, so the package itself is not followed.
            if nxt == "tiny_scheduler":
                continue
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.xfail(
    strict=True, reason="cli -> dev.cluster -> dev.daemon -> cli: the CLI split removes it"
)
def test_no_import_circles() -> None:
    circle = _cycle(_graph())
    assert circle is None, "import circle: " + " -> ".join(circle or [])


@pytest.mark.parametrize("module", sorted(_graph()))
def test_only_the_service_reaches_its_collaborators(module: str) -> None:
    if module in MAY_USE_COLLABORATORS or any(
        module == c or module.startswith(c + ".") for c in COLLABORATORS
    ):
        return
    reached = {
        imported
        for imported in _graph()[module]
        if any(imported == c or imported.startswith(c + ".") for c in COLLABORATORS)
    }
    assert not reached, f"{module} imports {sorted(reached)}: ask the service instead"
