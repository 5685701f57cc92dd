"""The public surface of eventbus, checked from the code and the API reference, not from a
copy of the list (anyio's ``test_all_attributes`` in spirit).

For each public module (``eventbus``, ``eventbus.runtime``, ``eventbus.testing``): every
name in ``__all__`` resolves, is defined in a private module of the package (or in the
public module itself), has a docstring and is rendered by ``docs/api/eventbus.md``; nothing
else public is defined there, and nothing private is re-exported. Every field of every event
(and other Struct) is described, since the API page lists each field from the docstring's
``Attributes:``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import types
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import pytest

from .._docs import API_PAGES
from .._docs import rendered

griffe = pytest.importorskip("griffe")

PACKAGE = "eventbus"
PUBLIC_MODULES = ("eventbus", "eventbus.runtime", "eventbus.testing")
ROOT = Path(__file__).resolve().parents[2]


@cache
def static(module: str) -> Any:
    """The module as the docs build sees it (griffe, docstrings parsed Google style)."""
    package = griffe.load(PACKAGE, search_paths=[str(ROOT)], docstring_parser="google")
    return package if module == PACKAGE else package[module.removeprefix(f"{PACKAGE}.")]


def public_names() -> list[tuple[str, str]]:
    return [
        (module, name)
        for module in PUBLIC_MODULES
        for name in importlib.import_module(module).__all__
    ]


def is_private_module(path: str) -> bool:
    return path.startswith(f"{PACKAGE}.") and any(
        part.startswith("_") for part in path.split(".")[1:]
    )


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_all_is_a_tuple_or_list_of_unique_names(module: str) -> None:
    names = importlib.import_module(module).__all__
    assert isinstance(names, tuple | list)
    assert len(set(names)) == len(names)
    if module == PACKAGE:
        assert isinstance(names, tuple)  # DEVELOPERS.md: __init__ re-exports a tuple


@pytest.mark.parametrize(("module", "name"), public_names())
def test_every_public_name_resolves_and_lives_where_it_should(module: str, name: str) -> None:
    obj = getattr(importlib.import_module(module), name)
    member = static(module)[name]
    defined_in = member.target_path.rpartition(".")[0] if member.is_alias else module
    if module == PACKAGE:
        assert is_private_module(defined_in), f"{name} is defined in {defined_in}"
    else:
        assert defined_in == module or is_private_module(defined_in)
    if inspect.isclass(obj) or inspect.isfunction(obj):
        assert obj.__module__ == defined_in


@pytest.mark.parametrize(("module", "name"), public_names())
def test_every_public_name_has_a_docstring(module: str, name: str) -> None:
    target = static(module)[name]
    target = target.final_target if target.is_alias else target
    assert target.docstring is not None and target.docstring.value.strip(), name


@cache
def documented() -> set[str]:
    """Full names the API pages render: ``::: path`` directives and what their options let
    through (``members`` lists, ``filters`` regexes, as mkdocstrings applies them)."""
    found: set[str] = set()
    for page in API_PAGES:
        text = rendered(page)
        for block in re.split(r"^(?=::: )", text, flags=re.MULTILINE)[1:]:
            path = block.split()[1]
            found.add(path)
            try:
                module = importlib.import_module(path)
            except ImportError:
                continue  # a class or function: rendered itself
            flow = re.search(r"members: (\[.*\])", block)  # as the api hook writes it
            members = (
                ast.literal_eval(flow[1]) if flow else re.findall(r"^\s+- (\w+)$", block, re.M)
            )
            if "members:" in block:
                found.update(f"{path}.{m}" for m in members)
                continue
            filters = re.search(r"filters: (\[.*\])", block)
            patterns = ast.literal_eval(filters[1]) if filters else ["!^_"]  # a YAML flow list
            for name in getattr(module, "__all__", ()):
                if all(
                    not re.search(p[1:], name) if p.startswith("!") else re.search(p, name)
                    for p in patterns
                ):
                    found.add(f"{path}.{name}")
    return found


@pytest.mark.parametrize(("module", "name"), public_names())
def test_every_public_name_is_in_the_api_reference(module: str, name: str) -> None:
    assert f"{module}.{name}" in documented(), f"docs/api/*.md does not render {module}.{name}"


def test_the_package_all_is_read_from_its_re_exports() -> None:
    # eventbus/__init__.py derives __all__ from its namespace, so the rule to hold is the
    # source's: every public name there is `from ._x import Name as Name`, nothing else.
    members = {n: m for n, m in static(PACKAGE).members.items() if not n.startswith("_")}
    modules = {n for n, m in members.items() if m.is_module}  # eventbus.testing
    assert sorted(n for n, m in members.items() if not m.is_alias and n not in modules) == []
    assert list(importlib.import_module(PACKAGE).__all__) == sorted(set(members) - modules)


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_nothing_else_public_is_defined_or_re_exported(module: str) -> None:
    runtime = importlib.import_module(module)
    exported = set(runtime.__all__)
    package_api = set(importlib.import_module(PACKAGE).__all__)
    leaks: list[str] = []
    for name, value in vars(runtime).items():
        if name.startswith("_") or name in exported:
            continue
        if isinstance(value, types.ModuleType) and value.__name__.startswith(f"{PACKAGE}."):
            continue  # a submodule (eventbus.testing)
        if module == PACKAGE:
            leaks.append(name)  # the package only re-exports its public API
            continue
        member = static(module).members.get(name)
        if member is None or not member.is_alias:
            leaks.append(name)  # defined here, public, but not exported
        elif is_private_module(member.target_path.rpartition(".")[0]) and name not in package_api:
            leaks.append(name)  # a private helper re-exported under a public name
    assert leaks == []


def struct_types() -> list[type[msgspec.Struct]]:
    package = importlib.import_module(PACKAGE)
    return [
        obj
        for obj in (getattr(package, name) for name in package.__all__)
        if isinstance(obj, type) and issubclass(obj, msgspec.Struct)
    ]


@pytest.mark.parametrize("struct", struct_types(), ids=lambda t: t.__name__)
def test_every_field_of_every_event_is_described(struct: type[msgspec.Struct]) -> None:
    """The API page lists each field with the description from ``Attributes:`` (the class's,
    or the base's that declares it), so a user writing an extension need not guess."""
    described: set[str] = set()
    for base in reversed(struct.__mro__):
        if not (issubclass(base, msgspec.Struct) and base.__module__.startswith(PACKAGE)):
            continue
        # By where it is defined: a base that only shares fields is not exported.
        cls = static(PACKAGE)[f"{base.__module__.removeprefix(f'{PACKAGE}.')}.{base.__name__}"]
        if cls.docstring is None:
            continue
        for section in cls.docstring.parsed:
            if section.kind.value == "attributes":
                described |= {item.name for item in section.value if item.description.strip()}
    fields = {field.name for field in msgspec.structs.fields(struct)}
    assert fields - described == set()
