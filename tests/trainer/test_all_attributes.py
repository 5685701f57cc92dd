"""The public surface of ``trainer``: ``__all__`` is exactly what the package shows, each name
resolves, is documented, is defined in a private module and is on the API reference; the
subpackages (``trainer.rl``, ...) say what they hold and export nothing themselves.
(After anyio's ``tests/test_all_attributes.py``.)

``trainer/__init__.py``'s ``TYPE_CHECKING`` block is the one list of the public API. It is
read here with griffe, the way the API reference is built (mkdocstrings), so "documented"
means what the reference shows: it leaves out a name without a docstring
(``show_if_no_docstring: false`` in ``mkdocs.yml``).
"""

from __future__ import annotations

import pkgutil
import re
import types
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest

import trainer

from .._docs import rendered

griffe = pytest.importorskip("griffe")

ROOT = Path(__file__).resolve().parents[2]
API_PAGE = ROOT / "docs" / "api" / "trainer.md"


def _subpackages() -> list[str]:
    return sorted(
        name
        for _finder, name, ispkg in pkgutil.walk_packages(trainer.__path__, "trainer.")
        if ispkg and "._" not in name
    )


SUBPACKAGES = _subpackages()


@pytest.fixture(scope="module")
def package() -> Any:
    return griffe.load("trainer", search_paths=[str(ROOT)])


def _resolve(name: str) -> object:
    if name == "RayBackend":
        pytest.importorskip("ray")
    return getattr(trainer, name)


def test_all_is_a_sorted_tuple_of_the_type_checking_imports(package: Any) -> None:
    assert isinstance(trainer.__all__, tuple)
    assert list(trainer.__all__) == sorted(set(trainer.__all__))
    imported = {
        name for name, member in package.members.items() if member.is_alias and name[0] != "_"
    }
    assert imported == set(trainer.__all__)


@pytest.mark.parametrize("name", trainer.__all__)
def test_each_name_resolves_to_what_the_list_names(package: Any, name: str) -> None:
    value = _resolve(name)
    module, _, attr = package.members[name].target_path.rpartition(".")
    assert getattr(import_module(module), attr) is value


@pytest.mark.parametrize("name", trainer.__all__)
def test_each_name_is_documented_where_a_private_module_defines_it(package: Any, name: str) -> None:
    member = package.members[name]
    module, _, attr = member.target_path.rpartition(".")
    assert attr == name
    assert module.split(".")[-1].startswith("_"), f"trainer.{name} comes from {module}"
    assert module.split(".")[1] in {p.split(".")[1] for p in SUBPACKAGES}, module
    docstring = member.final_target.docstring
    assert docstring is not None and docstring.value.strip(), f"{member.target_path}: no docstring"


def test_every_name_is_on_the_api_reference() -> None:
    """The page's ``<!-- api: trainer -->`` marker, as the docs build expands it."""
    pytest.importorskip("mkdocs")
    page = rendered(API_PAGE)
    directive = re.search(r"^::: trainer\n    options:\n      members: (\[.*\])$", page, re.M)
    assert directive is not None, f"{API_PAGE} renders no `::: trainer` block"
    assert set(re.findall(r'"(\w+)"', directive[1])) == set(trainer.__all__)


def test_every_public_attribute_is_in_all_or_a_subpackage() -> None:
    for name in trainer.__all__:
        _resolve(name)  # lazily resolved names join the namespace
    public = {name for name in vars(trainer) if not name.startswith("_")}
    subpackages = {name for name in public if isinstance(getattr(trainer, name), types.ModuleType)}
    assert {f"trainer.{name}" for name in subpackages} <= set(SUBPACKAGES)
    assert sorted(public - subpackages - set(trainer.__all__)) == []


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_each_subpackage_says_what_it_holds_and_shows_only_its_face(name: str) -> None:
    """A subpackage's face lists what the other subpackages use of it; none of it is public
    API (``__all__`` is empty: the public names are ``trainer``'s), and nothing else shows."""
    module = import_module(name)
    assert (module.__doc__ or "").strip(), f"{name} has no docstring"
    assert getattr(module, "__all__", ()) == ()
    face = set(dir(module)) if hasattr(module, "_FACE") else set()
    public = {attr for attr in vars(module) if not attr.startswith("_")}
    modules = {attr for attr in public if isinstance(getattr(module, attr), types.ModuleType)}
    assert sorted(public - modules - face) == [], f"{name} exports names of its own"
