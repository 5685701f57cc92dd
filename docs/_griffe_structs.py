"""A griffe extension for the API pages: every msgspec Struct lists all of its fields.

A Struct's fields are class attributes without docstrings of their own, so mkdocstrings shows
only what the class docstring's ``Attributes:`` section happens to mention, and many event
classes rendered with no fields at all. This extension rewrites the ``Attributes:`` section of
each Struct (events included) to list every field, inherited ones too (``seq`` and ``time``
on every event), in field order, each with its type annotation as written in the source, its
default, and its description from the docstring of the class or of the base that declares it.

Which classes are Structs, and their fields, come from the imported class
(:func:`msgspec.structs.fields`), so the list is exactly what msgspec encodes. Loaded from
``mkdocs.yml`` before ``_griffe_roles.py``; it changes nothing in the code base.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import griffe
import msgspec

PACKAGES = ("eventbus", "replay", "trainer")
SECTION = re.compile(r"^Attributes:[ \t]*$", re.MULTILINE)
ENTRY = re.compile(r"^ {4}(?P<name>\w+)(?: \([^)]*\))?:[ \t]*(?P<text>.*)$")


def split_attributes(text: str) -> tuple[str, str, dict[str, str]]:
    """``text`` before and after its ``Attributes:`` section, and that section's entries."""
    match = SECTION.search(text)
    if match is None:
        return text.rstrip(), "", {}
    before, rest = text[: match.start()], text[match.end() :].lstrip("\n").splitlines()
    entries: dict[str, str] = {}
    current: str | None = None
    end = len(rest)
    for index, line in enumerate(rest):
        if line.strip() and not line.startswith(" "):
            end = index  # the next section (or paragraph) starts
            break
        entry = ENTRY.match(line)
        if entry:
            current = entry["name"]
            entries[current] = entry["text"].strip()
        elif current is not None and line.strip():
            entries[current] = f"{entries[current]} {line.strip()}".strip()
    after = "\n".join(rest[end:]).strip()
    return before.rstrip(), after, entries


def _runtime_class(cls: griffe.Class) -> Any:
    try:
        module = importlib.import_module(cls.module.path)
    except ImportError:
        return None
    return getattr(module, cls.name, None) if cls.parent is cls.module else None


class StructFields(griffe.Extension):
    """Rewrite the ``Attributes:`` section of every msgspec Struct of the loaded packages."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name not in PACKAGES:
            return
        for cls in _classes(pkg, set()):
            runtime = _runtime_class(cls)
            if isinstance(runtime, type) and issubclass(runtime, msgspec.Struct):
                _document_fields(cls, runtime)


def _classes(obj: griffe.Object, seen: set[str]) -> list[griffe.Class]:
    found: list[griffe.Class] = []
    for member in obj.members.values():
        if member.is_alias or member.path in seen:
            continue
        seen.add(member.path)
        if isinstance(member, griffe.Class):
            found.append(member)
        if isinstance(member, griffe.Module | griffe.Class):
            found += _classes(member, seen)
    return found


def _described(cls: griffe.Class, runtime: type) -> dict[str, str]:
    """Field descriptions from ``cls`` and its Struct bases (the nearest one wins)."""
    descriptions: dict[str, str] = {}
    for base in reversed(runtime.__mro__):
        if not (issubclass(base, msgspec.Struct) and base.__module__.split(".")[0] in PACKAGES):
            continue
        doc = base.__doc__ or ""
        descriptions.update(split_attributes(_cleandoc(doc))[2])
    if cls.docstring is not None:
        descriptions.update(split_attributes(cls.docstring.value)[2])
    return descriptions


def _cleandoc(doc: str) -> str:
    return inspect.cleandoc(doc)


def _document_fields(cls: griffe.Class, runtime: type) -> None:
    descriptions = _described(cls, runtime)
    lines: list[str] = []
    for field in msgspec.structs.fields(runtime):
        member = cls.all_members.get(field.name)
        annotation = getattr(member, "annotation", None) if member is not None else None
        value = getattr(member, "value", None) if member is not None else None
        text = descriptions.get(field.name, "")
        if field.required:
            default = ""
        elif field.default is msgspec.NODEFAULT:  # a default_factory
            factory = getattr(field.default_factory, "__name__", "a new value")
            default = f"Defaults to `{factory}()`." if factory.isidentifier() else ""
        elif value is not None and "field(" not in str(value):
            default = f"Defaults to `{value}`."
        else:
            default = f"Defaults to `{field.default!r}`."
        body = " ".join(part for part in (text, default) if part)
        typed = f" ({annotation})" if annotation is not None else ""
        lines.append(f"    {field.name}{typed}: {body}".rstrip())
    if not lines:
        return
    before, after, _ = split_attributes(cls.docstring.value if cls.docstring else "")
    section = "Attributes:\n" + "\n".join(lines)
    text = "\n\n".join(part for part in (before, section, after) if part)
    if cls.docstring is None:
        cls.docstring = griffe.Docstring(text, parent=cls)
    else:
        cls.docstring.value = text
