"""Lazy package faces: a package's names, listed once in its ``TYPE_CHECKING`` block and
imported from their modules on first use.

``trainer`` and each of its subpackages re-export what their users need in one
``TYPE_CHECKING`` block of ``from ._module import Name as Name`` lines: type checkers and
readers see the list as written, and at run time :class:`Face` reads the same block, so
there is one list. A name is imported only when first asked for, so importing a face costs
nothing, and the command line rejects a bad flag without importing torch.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path
from typing import Any

__all__ = ["Face"]


class Face:
    """The lazy namespace of the package ``package`` whose ``__init__.py`` is ``init_file``.

    Use: ``__getattr__ = _FACE.attribute`` and ``__dir__ = _FACE.names`` in the package.

    Args:
        package: The package's name.
        init_file: Its ``__init__.py``.
        keep: Keep a resolved name in the package's namespace (the public face, whose
            names users look up often). A subpackage's face keeps none: each use reads the
            name from the module that owns it, so the face never holds a copy of its own.
    """

    def __init__(self, package: str, init_file: str, *, keep: bool = False) -> None:
        self.package = package
        self.keep = keep
        self.where = _exports(Path(init_file))

    def attribute(self, name: str) -> Any:
        """The package's ``name``, imported from its module."""
        module = self.where.get(name)
        if module is None:
            raise AttributeError(f"module {self.package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, self.package), name)
        if self.keep:
            setattr(sys.modules[self.package], name, value)
        return value

    def names(self) -> list[str]:
        """Every name of the face."""
        return sorted(self.where)


def _exports(init_file: Path) -> dict[str, str]:
    """Each name of the ``TYPE_CHECKING`` block of ``init_file`` and its (relative) module."""
    tree = ast.parse(init_file.read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    return {
        alias.asname or alias.name: f"{'.' * node.level}{node.module}"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
