"""Names that left the ``eventbus`` namespace still resolve for a release, each with a warning
that names its new import, and are the very objects their new home exports."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import eventbus
from eventbus._moved import MOVED


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_moved_name_resolves_with_a_warning_naming_its_new_home(name: str) -> None:
    home = MOVED[name]
    with pytest.warns(DeprecationWarning, match=rf"eventbus\.{name} moved to {home}\.{name}"):
        old = getattr(eventbus, name)
    assert old is getattr(importlib.import_module(home), name)
    assert name not in eventbus.__all__


def test_from_import_of_a_moved_name_still_works() -> None:
    with pytest.warns(DeprecationWarning, match="moved to eventbus.runtime.SafePoint"):
        from eventbus import SafePoint
    from eventbus.runtime import SafePoint as current

    assert SafePoint is current


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchEvent'"):
        eventbus.NoSuchEvent  # noqa: B018


def test_import_eventbus_imports_none_of_its_producers() -> None:
    code = "import sys, eventbus; print([m for m in ('replay', 'trainer') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
