"""A griffe extension for the API pages: Sphinx roles in docstrings become links.

The docstrings are Google style, but their cross-references use Sphinx roles
(``:class:`EventBus```, ``:meth:`~replay.RolloutTracker.reissue```). mkdocstrings does
not read those roles and would print them as ``:meth:`` followed by code. This extension
rewrites each role, before the docstring is parsed, into an optional autoref: a link when
the name resolves to a documented object, plain code otherwise (never a build warning).

Names are resolved the way a reader would: in the scope of the documented object (its
class members, then its module's names and imports), or as a full dotted path when they
start with one of the project's packages. ``~`` keeps only the last component as the
visible text, as in Sphinx.

Loaded from ``mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``).
It changes nothing in the code base: only what the documentation build renders.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

PACKAGES = ("eventbus", "replay", "trainer")
ROLE = re.compile(r":(?:class|meth|func|data|attr|mod|exc|obj):`(?P<target>~?[\w.]+)`")


def _resolve(obj: griffe.Object, target: str) -> str | None:
    """The full path ``target`` names in the scope of ``obj``, or None."""
    head, _, rest = target.partition(".")
    try:
        base = obj.resolve(head)
    except (griffe.NameResolutionError, griffe.AliasResolutionError, KeyError):
        base = head if head in PACKAGES else None
    if base is None:
        return None
    return f"{base}.{rest}" if rest else base


class SphinxRoles(griffe.Extension):
    """Rewrite ``:role:`target``` in every docstring of a loaded package."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._visit(pkg, seen=set())

    def _visit(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = ROLE.sub(
                lambda m: self._link(obj, m["target"]), obj.docstring.value
            )
        for member in obj.members.values():
            if not member.is_alias:
                self._visit(member, seen)  # type: ignore[arg-type]

    @staticmethod
    def _link(obj: griffe.Object, target: str) -> str:
        short = target.startswith("~")
        target = target.lstrip("~")
        text = target.rsplit(".", 1)[-1] if short else target
        # Inside a function's docstring, look names up from the function's class first.
        scope = obj.parent if obj.is_function and obj.parent is not None else obj
        path = _resolve(scope, target) if scope is not None else None
        if path is None:
            return f"`{text}`"
        return (
            f'<autoref identifier="{html.escape(path)}" optional>'
            f"<code>{html.escape(text)}</code></autoref>"
        )
