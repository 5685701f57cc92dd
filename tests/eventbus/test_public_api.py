"""The public surface: what users import is exactly what we mean to export."""

from __future__ import annotations

import subprocess
import sys

import eventbus
import eventbus.testing

EXPECTED = {
    "RUNTIME_EXTENSION_API_VERSION",
    "BatchReconciled",
    "BatchReport",
    "BusClosedError",
    "BusNotRunningError",
    "BusStatistics",
    "Capability",
    "CheckpointRestored",
    "CheckpointSaved",
    "Decision",
    "Event",
    "EventBus",
    "EventDecodeError",
    "ExtensionContext",
    "ExtensionError",
    "ExtensionFailed",
    "FaultInjected",
    "FitFailed",
    "FitFinished",
    "FitStarted",
    "JsonlSink",
    "Lagged",
    "LoggingSink",
    "Registration",
    "RegistrationStatistics",
    "RolloutRejected",
    "RolloutRestarted",
    "RuntimeExtension",
    "SafePoint",
    "SafePointError",
    "SafePointOutcome",
    "SafePointReached",
    "SafePointResolved",
    "SampleWait",
    "SampleWaitState",
    "StackFrame",
    "StallDiagnosed",
    "StepFinished",
    "StepStarted",
    "StuckRollout",
    "SubscriberOverflowError",
    "Subscription",
    "SubscriptionStatistics",
    "ThreadStack",
    "Vote",
    "WeightsSynced",
    "WorkerJoined",
    "WorkerLeft",
    "WorkerLost",
    "WorkerRestarted",
    "decode_event",
    "encode_event",
    "event_types",
    "read_events",
}


def test_all_lists_exactly_the_public_api() -> None:
    assert isinstance(eventbus.__all__, tuple)
    assert set(eventbus.__all__) == EXPECTED
    public = {name for name in vars(eventbus) if not name.startswith("_")}
    # submodules are attributes too; everything else public must be in __all__
    assert public - EXPECTED <= {"testing"}
    for name in EXPECTED:
        assert getattr(eventbus, name) is not None


def test_api_version_is_one_zero() -> None:
    assert eventbus.RUNTIME_EXTENSION_API_VERSION == "1.0"


def test_testing_module_exports_its_helpers() -> None:
    assert set(eventbus.testing.__all__) == {
        "HANG",
        "RecordingSubscriber",
        "ScriptedVoter",
        "record_events",
    }


def test_importing_eventbus_pulls_in_neither_torch_nor_ray() -> None:
    code = (
        "import sys, eventbus, eventbus.testing; print(sorted({'torch', 'ray'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
