from __future__ import annotations

import pytest

from ..helpers import Clock


@pytest.fixture
def clock() -> Clock:
    """A clock the test moves by hand, at 100.0 to begin with."""
    return Clock()
