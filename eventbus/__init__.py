"""A typed asyncio event bus with ordered subscriptions, safe-point barriers and a
versioned extension contract.

This module only re-exports the public API; the implementation lives in private modules.
"""

from ._bus import BusStatistics as BusStatistics
from ._bus import EventBus as EventBus
from ._bus import ExtensionContext as ExtensionContext
from ._codec import decode_event as decode_event
from ._codec import encode_event as encode_event
from ._codec import event_types as event_types
from ._decisions import Decision as Decision
from ._decisions import SafePoint as SafePoint
from ._errors import BusClosedError as BusClosedError
from ._errors import BusNotRunningError as BusNotRunningError
from ._errors import EventDecodeError as EventDecodeError
from ._errors import ExtensionError as ExtensionError
from ._errors import SafePointError as SafePointError
from ._errors import SubscriberOverflowError as SubscriberOverflowError
from ._events import BatchReconciled as BatchReconciled
from ._events import BatchReport as BatchReport
from ._events import CheckpointRestored as CheckpointRestored
from ._events import CheckpointSaved as CheckpointSaved
from ._events import CompletionSample as CompletionSample
from ._events import CompletionsSampled as CompletionsSampled
from ._events import Event as Event
from ._events import ExtensionBehind as ExtensionBehind
from ._events import ExtensionFailed as ExtensionFailed
from ._events import FaultInjected as FaultInjected
from ._events import FitFailed as FitFailed
from ._events import FitFinished as FitFinished
from ._events import FitStarted as FitStarted
from ._events import Lagged as Lagged
from ._events import RolloutRejected as RolloutRejected
from ._events import RolloutRestarted as RolloutRestarted
from ._events import SafePointOutcome as SafePointOutcome
from ._events import SafePointReached as SafePointReached
from ._events import SafePointResolved as SafePointResolved
from ._events import SampleWait as SampleWait
from ._events import SampleWaitState as SampleWaitState
from ._events import StepFinished as StepFinished
from ._events import StepStarted as StepStarted
from ._events import Vote as Vote
from ._events import WeightsSynced as WeightsSynced
from ._events import WorkerLost as WorkerLost
from ._events import WorkerRestarted as WorkerRestarted
from ._extensions import RUNTIME_EXTENSION_API_VERSION as RUNTIME_EXTENSION_API_VERSION
from ._extensions import Capability as Capability
from ._extensions import RuntimeExtension as RuntimeExtension
from ._registration import Registration as Registration
from ._registration import RegistrationStatistics as RegistrationStatistics
from ._sinks import JsonlSink as JsonlSink
from ._sinks import LoggingSink as LoggingSink
from ._sinks import read_events as read_events
from ._stall_events import StackFrame as StackFrame
from ._stall_events import StallDiagnosed as StallDiagnosed
from ._stall_events import StuckRollout as StuckRollout
from ._stall_events import ThreadStack as ThreadStack
from ._subscription import Subscription as Subscription
from ._subscription import SubscriptionStatistics as SubscriptionStatistics
from ._worker_events import RewardTimed as RewardTimed
from ._worker_events import RolloutFailed as RolloutFailed
from ._worker_events import RolloutFinished as RolloutFinished
from ._worker_events import RolloutRetried as RolloutRetried
from ._worker_events import RolloutStarted as RolloutStarted
from ._worker_events import WorkerEventsDropped as WorkerEventsDropped
from ._worker_events import WorkerJoined as WorkerJoined
from ._worker_events import WorkerLeft as WorkerLeft
from ._worker_events import WorkerStalled as WorkerStalled

# The re-exports above are the one list of the public API; __all__ is read from them.
__all__ = tuple(sorted(name for name in dict(globals()) if not name.startswith("_")))
