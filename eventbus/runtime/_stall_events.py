"""Events that explain a stall: where a wait without progress is stuck, and on what.

When a wait makes no progress for a while, the trainer publishes one :class:`StallDiagnosed`:
each stuck rollout with the worker holding it, each holding worker's Python stacks, and the
trainer's own stage. Everything is plain data, captured when the event is built, so the
diagnosis can be written to the event log and read back as it was (see :class:`~eventbus.Event`).
"""

from __future__ import annotations

import msgspec

from .._events import Event

__all__ = ["StackFrame", "StallDiagnosed", "StuckRollout", "ThreadStack"]


class StackFrame(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One frame of a Python stack.

    Attributes:
        file: The source file, as the interpreter names it.
        line: The line being executed.
        function: The function (``Class.method`` where the reader knows the class).
        library: The frame is in the standard library or an installed third-party package,
            not in the user's code or trainbus's: :meth:`ThreadStack.where` skips it.
    """

    file: str
    line: int
    function: str
    library: bool = False

    def location(self) -> str:
        """``file.py:41 function`` (the file's base name)."""
        name = self.file.replace("\\", "/").rsplit("/", 1)[-1]
        return f"{name}:{self.line} {self.function}"


class ThreadStack(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The Python stack of one thread, innermost frame last, or why it could not be read.

    Attributes:
        owner: Whose thread it is: a rollout worker's id (``local-0.1``, ``ray-0.1``) or
            ``trainer`` for the trainer process itself.
        thread: The thread's name (``MainThread``, ``local-0.1``, ``fit task`` for the
            trainer's await chain), when known.
        frames: Outermost first, innermost (where it is now) last.
        source: How it was read: ``thread`` (this process's own threads), ``task`` (the
            await chain of an asyncio task), ``py-spy`` (the worker's process, read from
            outside), ``actor`` (the actor answered from its diagnosis thread); empty when
            nothing could be read.
        pid: The process the thread belongs to, when known.
        note: Why the stack is missing or second-best (py-spy not installed or not
            permitted, the actor did not answer, ...). Empty when all went well.
    """

    owner: str
    thread: str = ""
    frames: tuple[StackFrame, ...] = ()
    source: str = ""
    pid: int | None = None
    note: str = ""

    def where(self) -> StackFrame | None:
        """The innermost frame of the user's or trainbus's code (the innermost frame of
        all when every frame is a library's), or None without frames."""
        for frame in reversed(self.frames):
            if not frame.library:
                return frame
        return self.frames[-1] if self.frames else None


class StuckRollout(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A rollout the trainer waits for, and the worker holding it.

    Attributes:
        rollout_id: The rollout's id.
        group_id: Its prompt group.
        attempt: The attempt the worker runs.
        worker_id: The worker that took it.
        held_s: Seconds since the worker took it.
        step: The trainer step it was dispatched at (None: not said, as in logs written
            before it was): held past that step, the trainer went on without it.
    """

    rollout_id: str
    group_id: str
    attempt: int
    worker_id: str
    held_s: float
    step: int | None = None


class StallDiagnosed(Event, frozen=True):
    """A wait of the trainer made no progress for ``diagnose_after_s``: what it waits for,
    who holds it, and where that code is.

    Published once per stall, and again (``repeat`` 1, 2, ...) each time the stall has
    lasted several times longer. Stacks are read only once a stall is diagnosed, and only
    when someone listens.

    Attributes:
        step: The trainer step.
        stage: What the trainer is waiting for: ``start`` (the workers starting),
            ``rollouts`` (a batch; a hung reward call is one, in its worker), ``update``
            (the PPO update), ``weight_sync`` (new weights to the workers), ``validation``,
            ``checkpoint`` (a checkpoint write), ``restore`` (reading the last checkpoint),
            ``restart`` (the rollout side restarting), ``close`` (the workers stopping), or
            ``held``: no wait of the trainer's, but work a worker has held that long while
            the trainer goes on (others keep it fed). Inside a Hugging Face Trainer
            (TRL), read from the training thread's stack: ``generation``, ``reward``,
            ``update``, ``checkpoint``, or ``step`` when the stack names none of them.
        waited_s: Seconds since this wait began.
        stalled_s: Seconds since the last progress (a rollout result, or the wait's start).
        stuck: The rollouts workers hold and have not delivered (``rollouts`` stage; for
            ``held``, those held that long).
        stacks: Each holding worker's stack; for other stages, the trainer's own (its
            ``fit`` task and the threads doing the stage's work).
        repeat: 0 for the first diagnosis of this stall, then 1, 2, ...
        notes: What the diagnosis could not find out, in words.
        loop_blocked: The trainer's event loop was running something (a synchronous call in
            an extension, a reward function, a callback), not waiting for events: nothing
            else on it runs, results, deadlines and views included, until that returns. Its
            stack is the first of ``stacks``, and it is the stall's cause at any stage.
    """

    step: int
    stage: str
    waited_s: float
    stalled_s: float
    stuck: tuple[StuckRollout, ...] = ()
    stacks: tuple[ThreadStack, ...] = ()
    repeat: int = 0
    notes: tuple[str, ...] = ()
    loop_blocked: bool = False

    def headline(self, *, after_s: float = 0.0) -> str:
        """One line: who holds what, for how long, stuck where.

        ``worker ray-1.0 holds 4 rollouts for 6.2 s, stuck in `myrewards.py:41 score` ``,
        or for other stages ``weight_sync at step 3 stalled for 6.2 s, stuck in ...``; a
        blocked event loop at any stage: ``rollouts at step 3 stalled for 6.2 s: the event
        loop is blocked, stuck in ...``.

        Args:
            after_s: How long the stall has gone on since this diagnosis: the durations are
                stated that much later (a restart or a deadline quoting the diagnosis says
                how long the rollouts have been held by then, not how long at diagnosis).
        """
        later = max(0.0, after_s)
        what = f"{self.stage} at step {self.step} stalled for {self.stalled_s + later:.1f} s"
        if self.loop_blocked:
            return f"{what}: {self.cause(after_s=later)}"
        if self.stuck:
            return self.cause(after_s=later)
        return what + self._stuck_in("trainer")

    def cause(self, *, after_s: float = 0.0) -> str:
        """The headline without the stage and its duration: the blocked event loop (the
        cause, whatever the stage waits for), then who holds what; else where the trainer
        is stuck (``stuck in `...` ``); empty when nothing more is known.

        Args:
            after_s: As for :meth:`headline`.
        """
        later = max(0.0, after_s)
        held: dict[str, list[StuckRollout]] = {}
        for rollout in self.stuck:
            held.setdefault(rollout.worker_id, []).append(rollout)
        parts = (
            [f"the event loop is blocked{self._stuck_in('trainer')}"] if self.loop_blocked else []
        )
        for worker_id, rollouts in held.items():
            longest = max(r.held_s for r in rollouts) + later
            count = f"{len(rollouts)} rollout" + ("" if len(rollouts) == 1 else "s")
            parts.append(
                f"worker {worker_id} holds {count} for {longest:.1f} s" + self._stuck_in(worker_id)
            )
        if parts:
            return "; ".join(parts)
        # ", stuck in `...`" or " (no stack: why)", as a clause of its own.
        return self._stuck_in("trainer").removeprefix(", ").strip().strip("()")

    def _stuck_in(self, owner: str) -> str:
        stacks = [s for s in self.stacks if s.owner == owner]
        for stack in stacks:
            frame = stack.where()
            if frame is not None:
                return f", stuck in `{frame.location()}`"
        notes = [s.note for s in stacks if s.note]
        return f" (no stack: {notes[0]})" if notes else ""
