"""The training thread's watchdog: a Hugging Face Trainer's step that runs past
``diagnose_after_s`` gets ``StallDiagnosed``, with the training thread's stack and the stage
read from it.

The watchdog loop, the repeat rule (a stall is diagnosed again each time it has lasted four
times longer), the live log line (``stalled: ...``) and the stack reading are the trainbus
trainer's (:class:`~trainer.runtime._diagnosis.StallWatchdog`,
:class:`~trainer.runtime._stall.StallWatch`, :mod:`trainer.rollout._stacks`); what differs is
what a diagnosis holds. The callback keeps the watch in one stage for the whole of training
and marks progress at each step boundary; a diagnosis holds the stacks of the threads working
for the training thread (a guarded reward call, whose stack shows the user's function) first,
then the training thread's own, its stage read by :func:`~._trl_stages.stage_of`.

The same thread notices a training loop that ended without telling the callback (an error
left ``train()`` of a trainer whose ``train`` the callback could not wrap): ``ended`` says so
and ``on_end`` finishes the run, so the bus's thread does not outlive training.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from eventbus import EventBus
from eventbus.runtime import StallDiagnosed

from ..rollout import StackReader
from ..rollout import helpers_of
from ..runtime import Stall
from ..runtime import StallWatch
from ..runtime import StallWatchdog
from ._trl_stages import framework_frames
from ._trl_stages import stage_of

__all__ = ["TrainingThreadWatchdog"]


class TrainingThreadWatchdog(StallWatchdog):
    """Diagnoses the training thread of a Hugging Face Trainer.

    Args:
        watch: The callback's watch (one stage, progress at each step boundary).
        bus: Where ``StallDiagnosed`` goes.
        thread: The training thread's ident.
        thread_name: Its name (the owner a guarded reward call's helper thread names).
        reader: Reads stacks.
        ended: Whether training has ended without the callback's ``on_train_end`` (checked
            at each look at the watch); None: never asked.
        on_end: Called once when ``ended`` says so; the watchdog then stops.
        clock: The watch's clock.
        sleep: Waits up to the given seconds; True once stopped (tests inject their own).
        max_sleep_s: Longest sleep between two looks at the watch.
        publish: How a diagnosis is published (the callback's ordered channel).
    """

    def __init__(
        self,
        watch: StallWatch,
        bus: EventBus,
        *,
        thread: int,
        thread_name: str,
        reader: StackReader,
        ended: Callable[[], bool] | None = None,
        on_end: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], bool] | None = None,
        max_sleep_s: float = 1.0,
        publish: Callable[[StallDiagnosed], None] | None = None,
    ) -> None:
        super().__init__(
            watch,
            bus,
            clock=clock,
            sleep=sleep,
            max_sleep_s=max_sleep_s,
            name="trainbus training watchdog",
            publish=publish,
        )
        self.thread = thread
        self.thread_name = thread_name
        self.reader = reader
        self._ended = ended
        self._on_end = on_end

    def check(self) -> StallDiagnosed | None:
        """Finish a run whose training ended unseen; else publish a due diagnosis."""
        if self._ended is not None and self._ended():
            self._ended = None
            self.stop()
            self._on_end()
            return None
        return super().check()

    def diagnose(self, stall: Stall) -> StallDiagnosed:
        """The diagnosis of ``stall``: the helpers' stacks, then the training thread's."""
        reader = self.reader
        helpers = [
            reader.thread(ident, "trainer", name)
            for ident, name in helpers_of(self.thread_name).items()
        ]
        training = reader.thread(self.thread, "trainer", f"{self.thread_name} (training)")
        stacks = framework_frames([*helpers, training])
        notes = () if training.frames else (f"the training thread's stack: {training.note}",)
        return StallDiagnosed(
            step=stall.step,
            stage=stage_of(stacks[-1]),
            # The watch is one stage for the whole of training, marked at each step
            # boundary: the step's wait is its stall.
            waited_s=stall.stalled_s,
            stalled_s=stall.stalled_s,
            stacks=stacks,
            repeat=stall.repeat,
            notes=notes,
        )
