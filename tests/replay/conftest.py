from __future__ import annotations

from typing import Any

import pytest

from replay import RolloutTracker

from .helpers import FakeTime
from .helpers import MakeTracker


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def make_tracker(fake_time: FakeTime) -> MakeTracker:
    """Trackers on the fake clock (options as for RolloutTracker)."""

    def make(**options: Any) -> RolloutTracker:
        options.setdefault("clock", fake_time.clock)
        options.setdefault("sleep", fake_time.sleep)
        return RolloutTracker(**options)

    return make
