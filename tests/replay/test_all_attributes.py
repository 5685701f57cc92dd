"""The public surface of ``replay``: what ``__all__`` lists is exactly what the package
shows, each name is documented, defined in one of the package's private modules, and on
the API reference page. (After anyio's ``tests/test_all_attributes.py``.)

Docstrings and definition sites are read with griffe, the way the API pages are built
(``mkdocs.yml``: mkdocstrings with ``show_if_no_docstring: false``), so a type alias or a
constant documented by the string under it counts, and an undocumented name, which the
reference would silently leave out, does not.
"""

from __future__ import annotations

import pkgutil
import re
import types
from importlib import import_module
from inspect import isclass
from inspect import isfunction
from pathlib import Path

import pytest

import replay

from .._docs import API_PAGES
from .._docs import rendered

griffe = pytest.importorskip("griffe")

ROOT = Path(__file__).resolve().parents[2]
DIRECTIVE = re.compile(r"^:::\s+(?P<path>[\w.]+)\s*$", re.MULTILINE)


@pytest.fixture(scope="module")
def package() -> griffe.Module:
    return griffe.load("replay", search_paths=[str(ROOT)])


def test_all_is_a_tuple_of_names_that_resolve() -> None:
    assert isinstance(replay.__all__, tuple)
    assert len(set(replay.__all__)) == len(replay.__all__)
    for name in replay.__all__:
        assert hasattr(replay, name), name


def test_all_is_read_from_the_re_exports_and_nothing_else_is_public(
    package: griffe.Module,
) -> None:
    # __init__.py derives __all__ from its namespace, so the rule to hold is the source's:
    # every public name there is a re-export (`from ._x import Name as Name`), and nothing
    # public is defined there or left out of __all__.
    static = {name: m for name, m in package.members.items() if not name.startswith("_")}
    assert sorted(name for name, m in static.items() if not m.is_alias) == []
    public = {name for name in vars(replay) if not name.startswith("_")}
    modules = {name for name in public if isinstance(getattr(replay, name), types.ModuleType)}
    assert list(replay.__all__) == sorted(static) == sorted(public - modules)


def test_public_submodules_keep_their_all_in_step() -> None:
    # anyio's rule, for any public module below replay: exported classes and functions
    # defined there are in its __all__, and its __all__ names nothing else.
    for _finder, name, ispkg in pkgutil.walk_packages(replay.__path__, "replay."):
        if ispkg or "._" in name:
            continue
        module = import_module(name)
        exported = getattr(module, "__all__", None)
        assert isinstance(exported, tuple), f"{name}.__all__ must be a tuple"
        defined = {
            attr
            for attr, value in vars(module).items()
            if not attr.startswith("_")
            and (isclass(value) or isfunction(value))
            and value.__module__ == name
        }
        assert defined == set(exported), name


@pytest.mark.parametrize("name", replay.__all__)
def test_each_name_is_documented_where_a_private_module_defines_it(
    package: griffe.Module, name: str
) -> None:
    member = package.members[name]
    assert member.is_alias, f"replay.{name} is defined in __init__.py, not re-exported"
    module, _, attr = member.target_path.rpartition(".")
    assert attr == name
    assert module.startswith("replay._"), f"replay.{name} comes from {module}"
    assert module.count(".") == 1, f"replay.{name} comes from {module}"
    target = member.final_target
    assert target.docstring is not None, f"{member.target_path} has no docstring"
    assert target.docstring.value.strip(), f"{member.target_path} has an empty docstring"


def test_each_name_is_on_the_api_reference() -> None:
    """``<!-- api: replay -->`` as the docs build expands it: ``::: replay`` and its members."""
    pytest.importorskip("mkdocs")
    pages = "\n".join(rendered(page) for page in API_PAGES)
    directive = re.search(r"^::: replay\n    options:\n      members: (\[.*\])$", pages, re.M)
    listed = set(re.findall(r'"(\w+)"', directive[1])) if directive else set()
    directives = {m["path"] for m in DIRECTIVE.finditer(pages)}
    missing = [n for n in replay.__all__ if n not in listed and f"replay.{n}" not in directives]
    assert missing == [], f"not on any of {[p.name for p in API_PAGES]}"
