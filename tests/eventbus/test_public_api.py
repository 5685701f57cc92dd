"""The public surface beyond its names (those are checked in ``test_all_attributes.py``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import eventbus


def test_api_version_is_one_zero() -> None:
    assert eventbus.RUNTIME_EXTENSION_API_VERSION == "1.0"


def test_importing_eventbus_pulls_in_neither_torch_nor_ray() -> None:
    code = (
        "import sys, eventbus, eventbus.testing; print(sorted({'torch', 'ray'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_handles_have_no_public_constructor() -> None:
    """Subscriptions and registrations come from the bus's factories only."""
    for handle in (eventbus.Subscription, eventbus.Registration):
        with pytest.raises(TypeError, match="no public constructor"):
            handle()
