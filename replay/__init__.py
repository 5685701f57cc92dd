"""Replay buffers that say why the trainer waits, and a rollout tracker that makes batch
completion exact.

* :class:`ReplayBuffer` (sync mode, on-policy) and :class:`AsyncReplayBuffer` (async mode,
  staleness-bounded) hand prompt groups to the trainer. Both own a
  :class:`RolloutTracker`, the admission gate every rollout result passes through.
* Waits wake on notification (also from worker threads), report each unsuccessful poll as
  ``SampleWait`` plus a ``SAMPLE_WAIT`` safe point when someone listens, and end at a
  deadline.

This module only re-exports the public API; the implementation lives in private modules.
"""

from ._async import AsyncReplayBuffer as AsyncReplayBuffer
from ._async import RefillCallback as RefillCallback
from ._batch_events import BatchReconciled as BatchReconciled
from ._batch_events import BatchReport as BatchReport
from ._batch_events import RolloutRejected as RolloutRejected
from ._cancel import CancelHook as CancelHook
from ._errors import BatchFailedError as BatchFailedError
from ._errors import RegistrationError as RegistrationError
from ._errors import ReplayError as ReplayError
from ._errors import SampleDeadlineExceeded as SampleDeadlineExceeded
from ._errors import SampleWaitInterrupted as SampleWaitInterrupted
from ._model import PARTITIONS as PARTITIONS
from ._model import GroupResult as GroupResult
from ._model import GroupStatus as GroupStatus
from ._model import Partition as Partition
from ._model import PromptGroup as PromptGroup
from ._model import ReconciledBatch as ReconciledBatch
from ._model import RolloutResult as RolloutResult
from ._model import RolloutStatus as RolloutStatus
from ._reasons import Admission as Admission
from ._reasons import EvictionReason as EvictionReason
from ._reasons import FailurePolicy as FailurePolicy
from ._reasons import GraceMode as GraceMode
from ._reasons import StalenessStrategy as StalenessStrategy
from ._stats import PartitionCounts as PartitionCounts
from ._stats import ReplayState as ReplayState
from ._stats import ReplayStatistics as ReplayStatistics
from ._stats import TrackerStatistics as TrackerStatistics
from ._sync import ReplayBuffer as ReplayBuffer
from ._tracker import RolloutTracker as RolloutTracker
from ._waiting import DEFAULT_INTERRUPTS as DEFAULT_INTERRUPTS
from ._waiting import WaitInterrupts as WaitInterrupts

# The re-exports above are the one list of the public API; __all__ is read from them.
__all__ = tuple(sorted(name for name in dict(globals()) if not name.startswith("_")))
