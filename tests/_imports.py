"""The import graph of a package, read from its source with ``ast`` (nothing is imported).

Every import counts: module level, inside functions (lazy imports) and under
``TYPE_CHECKING``, because a cycle a type checker or a lazy import closes is still a cycle a
reader has to hold in their head. Each package's architecture tests use it::

    graph = import_graph("eventbus")
    assert find_cycles(graph) == []
"""

from __future__ import annotations

import ast
from collections.abc import Collection
from collections.abc import Iterator
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "REPOSITORY",
    "ROOT",
    "find_cycle",
    "find_cycles",
    "format_cycle",
    "import_graph",
    "imported_modules",
    "module_name",
]

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT


def module_name(path: Path, root: Path = ROOT) -> str:
    """``trainer/rl/_policy.py`` -> ``trainer.rl._policy``; a package is its ``__init__``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(package: str, root: Path) -> dict[str, Path]:
    """Every module of ``package`` (its folder under ``root``), by dotted name."""
    folder = root / package
    if not (folder / "__init__.py").is_file():
        raise FileNotFoundError(f"{folder} is not a package")
    return {module_name(path, root): path for path in sorted(folder.rglob("*.py"))}


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name a (possibly relative) ``from`` import refers to."""
    if level == 0:
        return target or ""
    base = module.split(".")
    # A package's relative import starts from itself, a module's from its package.
    base = base[: len(base) - level + (1 if is_package else 0)]
    return ".".join([*base, target] if target else base)


def imported_modules(
    module: str,
    source: str,
    *,
    is_package: bool = False,
    known: Collection[str] = (),
) -> Iterator[str]:
    """The absolute names of the modules each import statement of ``source`` brings in.

    ``from a import b`` names module ``a.b`` when that is one of the ``known`` modules, and
    module ``a`` otherwise (``b`` is then a name defined in ``a``). Names outside ``known``
    are yielded as written, so the caller can tell third-party imports apart.
    """
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield submodule if submodule in known else base


def import_graph(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of ``package`` and the modules of the same package it imports (directly)."""
    modules = _modules(package, root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        source = path.read_text(encoding="utf-8")
        targets: set[str] = set()
        for imported in imported_modules(name, source, is_package=is_package, known=modules):
            # `import a.b.c` loads module a.b.c, or the deepest module on that path.
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            # A package naming itself (`from . import x` in its __init__) is no edge; any
            # other module importing itself is a cycle of one.
            if imported and not (imported == name and is_package):
                targets.add(imported)
        graph[name] = targets
    return graph


def find_cycle(graph: Mapping[str, set[str]], *, ignore: frozenset[str] = frozenset()) -> list[str]:
    """One import cycle of ``graph`` as a path ``[a, b, ..., a]``, or ``[]`` if there is none.

    Args:
        graph: From ``import_graph``.
        ignore: Modules whose imports do not count (a package's ``__init__`` that only
            re-exports lazily is imported by every submodule's import machinery, not by
            their code).
    """
    kept = {node: targets - ignore for node, targets in graph.items() if node not in ignore}
    cycles = find_cycles(kept)
    return cycles[0] if cycles else []


def find_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component that has one, as a closed path.

    Each cycle starts and ends at its alphabetically first module, e.g.
    ``["pkg._a", "pkg._b", "pkg._a"]``; the list is sorted, so it compares stably.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(_shortest_cycle(graph, component) for component in components)


def _shortest_cycle(graph: Mapping[str, set[str]], component: set[str]) -> list[str]:
    start = min(component)
    paths: dict[str, list[str]] = {start: [start]}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for succ in sorted(graph.get(node, ()) & component):
                if succ == start:
                    return [*paths[node], start]
                if succ not in paths:
                    paths[succ] = [*paths[node], succ]
                    following.append(succ)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not a cycle")  # pragma: no cover


def format_cycle(cycle: list[str]) -> str:
    """``pkg._a -> pkg._b -> pkg._a``."""
    return " -> ".join(cycle)
