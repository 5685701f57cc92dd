"""A typed asyncio event bus with ordered subscriptions, safe-point barriers and a
versioned extension contract.

The bus is the mechanism: it knows no host and no training concept. The runtime contract's
vocabulary (the lifecycle events and safe points every host publishes, the capabilities and
the ``Host`` protocol extensions rely on) is :mod:`eventbus.runtime`.

This module only re-exports the public API; the implementation lives in private modules.
"""

import types as _types

from . import runtime as runtime
from ._barrier_types import EVERY_POINT as EVERY_POINT
from ._barrier_types import AtPoint as AtPoint
from ._barrier_types import BarrierOutcome as BarrierOutcome
from ._barrier_types import BarrierPoint as BarrierPoint
from ._barrier_types import BarrierRequest as BarrierRequest
from ._barrier_types import BarrierResolved as BarrierResolved
from ._barrier_types import OptedInPoints as OptedInPoints
from ._barrier_types import Vote as Vote
from ._barrier_types import VotePoints as VotePoints
from ._bus import BusStatistics as BusStatistics
from ._bus import EventBus as EventBus
from ._bus import ExtensionContext as ExtensionContext
from ._capabilities import CapabilityBase as CapabilityBase
from ._capabilities import Grant as Grant
from ._capabilities import known_capabilities as known_capabilities
from ._codec import decode_event as decode_event
from ._codec import encode_event as encode_event
from ._codec import event_types as event_types
from ._decisions import Decision as Decision
from ._errors import BusClosedError as BusClosedError
from ._errors import BusNotRunningError as BusNotRunningError
from ._errors import EventDecodeError as EventDecodeError
from ._errors import ExtensionError as ExtensionError
from ._errors import SafePointError as SafePointError
from ._errors import SubscriberOverflowError as SubscriberOverflowError
from ._events import Event as Event
from ._events import ExtensionBehind as ExtensionBehind
from ._events import ExtensionFailed as ExtensionFailed
from ._events import Lagged as Lagged
from ._extensions import EXTENSION_FAILURES as EXTENSION_FAILURES
from ._extensions import RUNTIME_EXTENSION_API_VERSION as RUNTIME_EXTENSION_API_VERSION
from ._extensions import RuntimeExtension as RuntimeExtension
from ._moved import moved_attribute as _moved_attribute
from ._registration import Registration as Registration
from ._registration import RegistrationStatistics as RegistrationStatistics
from ._sinks import JsonlSink as JsonlSink
from ._sinks import LoggingSink as LoggingSink
from ._sinks import opt_in_streams as opt_in_streams
from ._sinks import read_events as read_events
from ._subscription import Subscription as Subscription
from ._subscription import SubscriptionStatistics as SubscriptionStatistics

# The re-exports above are the one list of the public API; __all__ is read from them (the
# subpackage eventbus.runtime has its own).
__all__ = tuple(
    sorted(
        name
        for name, value in dict(globals()).items()
        if not name.startswith("_") and not isinstance(value, _types.ModuleType)
    )
)

# Names that moved to eventbus.runtime resolve with a warning; the others say where they went.
__getattr__ = _moved_attribute(__name__)
