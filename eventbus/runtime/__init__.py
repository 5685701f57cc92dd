"""The runtime contract's vocabulary: what every host publishes and offers its extensions.

A *host* runs a training loop on an :class:`~eventbus.EventBus` (this trainer,
``PPOTrainer``; trainbus inside TRL, ``TrainbusCallback``). Every host publishes the same
lifecycle events (:class:`FitStarted` ... :class:`FitFinished`), reaches the same
:class:`SafePoint`\\ s with typed requests (:class:`SafePointReached`), explains its stalls
the same way (:class:`StallDiagnosed`), offers the same :class:`Capability` names and hands
every extension a :class:`Host`. An extension written against this module runs on any host.

The bus underneath (:mod:`eventbus`) knows none of it. Events that one producer owns live
with it: a replay buffer's batch reports in :mod:`replay`, the rollout workers' events in
:mod:`trainer`.

This module only re-exports the public API; the implementation lives in private modules.
"""

from ._host_contract import Capability as Capability
from ._host_contract import Host as Host
from ._host_contract import HostConfig as HostConfig
from ._lifecycle import CheckpointRestored as CheckpointRestored
from ._lifecycle import CheckpointSaved as CheckpointSaved
from ._lifecycle import CompletionSample as CompletionSample
from ._lifecycle import CompletionsSampled as CompletionsSampled
from ._lifecycle import FitFailed as FitFailed
from ._lifecycle import FitFinished as FitFinished
from ._lifecycle import FitStarted as FitStarted
from ._lifecycle import StepFinished as StepFinished
from ._lifecycle import StepStarted as StepStarted
from ._points import SafePoint as SafePoint
from ._points import SafePointOutcome as SafePointOutcome
from ._points import SafePointReached as SafePointReached
from ._points import SafePointResolved as SafePointResolved
from ._stall_events import StackFrame as StackFrame
from ._stall_events import StallDiagnosed as StallDiagnosed
from ._stall_events import StuckRollout as StuckRollout
from ._stall_events import ThreadStack as ThreadStack
from ._wait_state import SampleWait as SampleWait
from ._wait_state import SampleWaitState as SampleWaitState

# The re-exports above are the one list of the public API; __all__ is read from them.
__all__ = tuple(sorted(name for name in dict(globals()) if not name.startswith("_")))
