"""Producing rollouts: the worker, the backend interface, the local and Ray backends, the
per-mode drivers that feed the replay buffers, and fault injection.

May import ``trainer.rl`` and ``trainer.config``; never the runtime or the CLI (a test
checks it). The public names are re-exported by ``trainer``.

The other subpackages use this one only through its face, below.
"""

# The face: what the other subpackages use of this one. The TYPE_CHECKING block is the one
# list; trainer/_faces.py imports each name from its module when it is used.
import typing as _typing

from .._faces import Face as _Face

if _typing.TYPE_CHECKING:
    from ._backend import Holding as Holding
    from ._backend import RolloutBackend as RolloutBackend
    from ._backend import stuck_rollouts as stuck_rollouts
    from ._driver import RolloutDriver as RolloutDriver
    from ._driver import WaitEnded as WaitEnded
    from ._factory import make_backend as make_backend
    from ._faults import FAULT_HELP as FAULT_HELP
    from ._faults import FAULTS as FAULTS
    from ._faults import FaultInjected as FaultInjected
    from ._faults import FaultInjector as FaultInjector
    from ._faulty import faulty_step as faulty_step
    from ._faulty import inject_faults as inject_faults
    from ._logs import ALSO_AN_EVENT as ALSO_AN_EVENT
    from ._logs import also_an_event as also_an_event
    from ._modes import make_driver as make_driver
    from ._rollout_events import RewardTimed as RewardTimed
    from ._rollout_events import RolloutFailed as RolloutFailed
    from ._rollout_events import RolloutFinished as RolloutFinished
    from ._rollout_events import RolloutRestarted as RolloutRestarted
    from ._rollout_events import RolloutRetried as RolloutRetried
    from ._rollout_events import RolloutStarted as RolloutStarted
    from ._rollout_events import WeightsSynced as WeightsSynced
    from ._rollout_events import WorkerEventsDropped as WorkerEventsDropped
    from ._rollout_events import WorkerJoined as WorkerJoined
    from ._rollout_events import WorkerLeft as WorkerLeft
    from ._rollout_events import WorkerLost as WorkerLost
    from ._rollout_events import WorkerRestarted as WorkerRestarted
    from ._rollout_events import WorkerStalled as WorkerStalled
    from ._rollout_events import asked as asked
    from ._rollout_workload import Workload as Workload
    from ._rollout_workload import build_workload as build_workload
    from ._rollout_workload import worker_spec as worker_spec
    from ._scoring import verdicts as verdicts
    from ._stacks import StackReader as StackReader
    from ._stacks import helpers_of as helpers_of
    from ._stacks import is_library as is_library

_FACE = _Face(__name__, __file__)
__getattr__ = _FACE.attribute
__dir__ = _FACE.names
