"""The "Coming from TRL" page names only keys the schema has, with values they take."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any
from typing import get_args
from typing import get_type_hints

import msgspec
import pytest

from trainer import TrainerConfig

PAGE = Path(__file__).resolve().parents[3] / "docs" / "coming-from-trl.md"
SPAN = re.compile(r"`([^`]+)`")
KEY = re.compile(r"^[a-z_]+(\.[a-z_]+)+$")


def _trainbus_cells() -> list[str]:
    """The trainbus column (the second) of every table row of the page."""
    cells = []
    for line in PAGE.read_text().splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        row = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if row[1] != "trainbus":  # (the header)
            cells.append(row[1])
    return cells


def _settings() -> list[tuple[str, str | None]]:
    """Every ``key`` or ``key = value`` the trainbus column names."""
    found: list[tuple[str, str | None]] = []
    for cell in _trainbus_cells():
        for span in SPAN.findall(cell):
            key, equals, value = (part.strip() for part in span.partition("="))
            assert KEY.match(key), f"not a dotted key: {span!r} in {cell!r}"
            found.append((key, value if equals else None))
    return found


def _type_at(key: str) -> Any:
    kind: Any = TrainerConfig
    for part in key.split("."):
        kind = next((t for t in get_args(kind) if isinstance(t, type)), kind)  # T | None
        hints = get_type_hints(kind, include_extras=True)
        assert part in hints, f"{key}: the schema has no {part!r} there"
        kind = hints[part]
    return kind


def test_the_page_maps_most_settings_and_says_none_otherwise() -> None:
    cells = _trainbus_cells()
    assert len(cells) > 80
    assert all(cell == "none" or SPAN.search(cell) for cell in cells)
    assert len(_settings()) > 80


@pytest.mark.parametrize(("key", "value"), _settings(), ids=lambda v: str(v))
def test_every_trainbus_key_exists_and_takes_the_value_shown(key: str, value: str | None) -> None:
    kind = _type_at(key)
    if value is not None:
        parsed = tomllib.loads(f"x = {value}")["x"]
        msgspec.convert(parsed, kind, strict=True)  # raises for a value the key refuses
