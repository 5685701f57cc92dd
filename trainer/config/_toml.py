"""The configuration as TOML: the effective config (``config show``) and a commented example
(``config example``) generated from the schema, so the example can never drift from it.

The comments come from each section's ``Attributes:`` docstring; the values are the
defaults. Only the small subset of TOML the configuration uses is written: tables of
scalars, lists of strings, and one nested table (``[task.params]``).
"""

from __future__ import annotations

import inspect
import re
import textwrap
from typing import Any

import msgspec

from ._schema import TrainerConfig

__all__ = ["example_toml", "to_toml"]

_HEADER = """\
# trainbus run configuration. Every key is optional: what you leave out keeps its default.
# Command-line flags (--steps, --seed, --mode, --backend, --workers, --ray-address, --out,
# --wait-timeout, --stall-timeout, --self-heal, --autoscale, --diagnose-after, --export,
# --model, --dataset, --val-dataset, --reward, --lora-r, --device) override the file. Check
# a file with:
#     trainbus config show --config FILE.toml
"""


def to_toml(config: TrainerConfig) -> str:
    """The configuration as TOML, every key with its effective value."""
    return _render(config, comments=False)


def example_toml() -> str:
    """A commented example holding every key at its default."""
    return _HEADER + "\n" + _render(TrainerConfig(), comments=True)


def _render(config: TrainerConfig, *, comments: bool) -> str:
    lines: list[str] = []
    top_docs = _attribute_docs(type(config))
    for field in msgspec.structs.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, msgspec.Struct):
            continue
        if comments:
            lines += _comment(top_docs.get(field.name, ""))
        lines.append(f"{field.name} = {_value(value)}")
    for field in msgspec.structs.fields(config):
        section = getattr(config, field.name)
        if isinstance(section, msgspec.Struct):
            _section(lines, field.name, section, comments=comments)
    return "\n".join(lines) + "\n"


def _section(lines: list[str], name: str, section: msgspec.Struct, *, comments: bool) -> None:
    """``[name]`` with its scalars, then its tables (``[task.params]``, ``[export.mlflow]``)."""
    lines.append("")
    if comments:
        lines += _comment(_summary(type(section)))
    lines.append(f"[{name}]")
    docs = _attribute_docs(type(section))
    tables: list[tuple[str, dict[str, Any]]] = []
    subsections: list[tuple[str, msgspec.Struct]] = []
    for sub in msgspec.structs.fields(section):
        value = getattr(section, sub.name)
        if isinstance(value, dict):
            tables.append((sub.name, value))
        elif isinstance(value, msgspec.Struct):
            subsections.append((sub.name, value))
        else:
            if comments:
                lines += _comment(docs.get(sub.name, ""))
            if value is None:
                lines.append(f"# {sub.name} = (unset)")
            else:
                lines.append(f"{sub.name} = {_value(value)}")
    for key, table in tables:
        lines.append("")
        if comments:
            lines += _comment(docs.get(key, ""))
        lines.append(f"[{name}.{key}]")
        lines += [f"{k} = {_value(item)}" for k, item in table.items()]
    for key, subsection in subsections:
        _section(lines, f"{name}.{key}", subsection, comments=comments)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()  # a JSON string is a valid TOML string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def _comment(text: str) -> list[str]:
    if not text:
        return []
    return [f"# {line}" for line in textwrap.wrap(text, width=92)]


def _summary(cls: type) -> str:
    """The first line of a class docstring, without its ``[section]:`` prefix."""
    first = (inspect.getdoc(cls) or "").split("\n", 1)[0]
    text = re.sub(r"^``\[[\w.]+\]``: ", "", first).replace("``", "")
    return text[:1].upper() + text[1:]


def _attribute_docs(cls: type) -> dict[str, str]:
    """``{name: description}`` from a Google-style ``Attributes:`` docstring section."""
    doc = inspect.getdoc(cls) or ""
    _, found, section = doc.partition("Attributes:\n")
    if not found:
        return {}
    docs: dict[str, str] = {}
    current = None
    for line in section.splitlines():
        match = re.match(r"^    (\w+): (.*)$", line)
        if match:
            current = match.group(1)
            docs[current] = match.group(2).strip()
        elif current and line.startswith("        "):
            docs[current] += " " + line.strip()
        elif line.strip() and not line.startswith(" "):
            break  # the next section
    return {name: re.sub(r"``([^`]*)``", r"\1", text) for name, text in docs.items()}
