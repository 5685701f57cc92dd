from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from eventbus import EventBus


@pytest.fixture
async def bus() -> AsyncIterator[EventBus]:
    bus = EventBus(safe_point_timeout=5.0)
    yield bus
    bus.close()
