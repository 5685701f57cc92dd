"""The API reference pages as the documentation build renders them (``docs/_hooks.py``
expands their ``<!-- api: ... -->`` markers into ``::: module`` blocks)."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))


@cache
def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def rendered(page: Path) -> str:
    """The page's Markdown after the build's hooks (needs mkdocs installed)."""
    text: str = _hooks().on_page_markdown(page.read_text(encoding="utf-8"))
    return text
