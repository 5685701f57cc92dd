"""A griffe extension for the API pages: a default taken from elsewhere shows its value.

A default decided in one place and read by another (``SelfHealingExtension``'s
``stall_timeout_s = SelfHealConfig().stall_timeout_s``) is an expression in the source, and
the signature would show the expression, cut to its last name (``stall_timeout_s =
stall_timeout_s``). This extension shows the value such a default (one that calls something)
evaluates to (``10.0``), read from the imported function, when it is a plain number, string,
bool or None; any other default (``sleep = anyio.sleep``, ``level = logging.INFO``) keeps its
expression.

Loaded from ``mkdocs.yml``; it changes nothing in the code base.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe

PACKAGES = ("eventbus", "replay", "trainer")
PLAIN = {bool, int, float, str, type(None)}


class RuntimeDefaults(griffe.Extension):
    """Replace each computed default of the loaded packages' functions by its value."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name in PACKAGES:
            _visit(pkg, set())


def _visit(obj: griffe.Object, seen: set[str]) -> None:
    for member in obj.members.values():
        if member.is_alias or member.path in seen:
            continue
        seen.add(member.path)
        if isinstance(member, griffe.Function):
            _show_values(member)
        elif isinstance(member, griffe.Module | griffe.Class):
            _visit(member, seen)


def _show_values(func: griffe.Function) -> None:
    computed = [p for p in func.parameters if _calls(p.default)]
    if not computed:
        return
    runtime = _runtime(func)
    try:
        parameters = inspect.signature(runtime).parameters if runtime is not None else {}
    except (TypeError, ValueError):
        return
    for parameter in computed:
        value = getattr(parameters.get(parameter.name), "default", inspect.Parameter.empty)
        if type(value) in PLAIN:  # not an enum member, which links to its documentation
            parameter.default = repr(value)


def _calls(default: str | griffe.Expr | None) -> bool:
    """Whether a default expression calls something (``SelfHealConfig().stall_timeout_s``);
    a plain name (``logging.INFO``) reads better than its value."""
    if not isinstance(default, griffe.Expr):
        return False
    return any(isinstance(e, griffe.ExprCall) for e in [default, *default.iterate(flat=False)])


def _runtime(func: griffe.Function) -> Any:
    """The imported function (or method) ``func`` documents, None if it cannot be had."""
    try:
        target: Any = importlib.import_module(func.module.path)
    except ImportError:
        return None
    for name in func.path.removeprefix(func.module.path + ".").split("."):
        target = getattr(target, name, None)
    return target
