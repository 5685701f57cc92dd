"""The import graph of a package, read from its source with ``ast`` (nothing is imported).

Every import counts: module level, inside functions (lazy imports) and under
``TYPE_CHECKING``, because a cycle a type checker or a lazy import closes is still a cycle a
reader has to hold in their head.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    """``trainer/rl/_policy.py`` -> ``trainer.rl._policy``; a package is its ``__init__``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    # A package's relative import starts from itself, a module's from its package.
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, node.module] if node.module else base)


def import_graph(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` and the modules of the same package it imports."""
    paths = sorted((ROOT / package).rglob("*.py"))
    modules = {module_name(path): path for path in paths}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(module, is_package, node)
                # `from . import x` and `from .pkg import mod` name modules, not attributes.
                names = [target, *(f"{target}.{alias.name}" for alias in node.names)]
            else:
                continue
            targets.update(name for name in names if name in modules and name != module)
        graph[module] = targets
    return graph


def find_cycle(graph: dict[str, set[str]], *, ignore: frozenset[str] = frozenset()) -> list[str]:
    """One import cycle of ``graph`` as a path ``[a, b, ..., a]``, or ``[]`` if there is none.

    Args:
        graph: From ``import_graph``.
        ignore: Modules whose imports do not count (a package's ``__init__`` that only
            re-exports lazily is imported by every submodule's import machinery, not by
            their code).
    """
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if target in ignore:
                continue
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and node not in ignore and (cycle := visit(node)):
            return cycle
    return []
