"""Stall diagnosis on Ray (run inside a loopback-only namespace): a hung actor's stack is read
from outside with py-spy, or, without py-spy, from the actor's own diagnosis thread; a
trainer with self-healing names it in the restart vote.

    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python -m pytest -m ray \\
        tests/trainer/rollout/ray/test_ray_diagnosis.py'
"""

from __future__ import annotations

import anyio
import msgspec
import pytest
import torch

from eventbus.runtime import SafePointReached
from eventbus.runtime import StallDiagnosed
from eventbus.testing import record_events
from trainer import FaultInjector
from trainer import PPOTrainer
from trainer import RolloutRestarted
from trainer import SelfHealingExtension
from trainer import WaitDeadlineExceeded
from trainer import inject_faults
from trainer.rollout._stacks import StackReader

from ...helpers import tiny_config
from .test_ray_backend import SPEC
from .test_ray_backend import FakeSink
from .test_ray_backend import make_work
from .test_ray_backend import until
from .test_ray_backend import weights

torch.set_num_threads(1)

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

ray = pytest.importorskip("ray")
from trainer import RayBackend  # noqa: E402  (needs ray)


async def hung_backend(reader: StackReader) -> None:
    """Start two actors, hang one on its first work, check what a diagnosis reads."""
    backend = inject_faults(RayBackend(SPEC, 2), FaultInjector.parse(["hang@1"]))
    sink = FakeSink()
    await backend.start(sink, weights(0), 0)
    try:
        works = [make_work("a"), make_work("b")]
        for work in works:
            backend.submit(work)
        await until(lambda: len(sink.results) == 8 and len(backend.holdings()) == 1)
        [holding] = backend.holdings()
        assert holding.work in works
        assert {r.group_id for r in sink.results} == {
            g.group_id for w in works if w is not holding.work for g in w.groups
        }
        stacks = await anyio.to_thread.run_sync(backend.read_stacks, [holding.worker_id], reader)
        [stack] = [s for s in stacks if s.where() and s.where().function.endswith("hang")]  # type: ignore[union-attr]
        assert stack.owner == holding.worker_id
        return stack  # type: ignore[return-value]
    finally:
        await backend.close()


async def test_py_spy_reads_a_hung_actor_from_outside() -> None:
    stack = await hung_backend(StackReader(timeout_s=20))
    assert stack.source == "py-spy" and stack.note == ""
    assert stack.where().function == "RolloutActor.hang"  # type: ignore[union-attr]


async def test_without_py_spy_the_actor_answers_from_its_second_thread() -> None:
    stack = await hung_backend(StackReader(py_spy="/nonexistent/py-spy", timeout_s=20))
    assert stack.source == "actor"
    assert "/nonexistent/py-spy is not installed" in stack.note
    assert "read by the actor itself" in stack.note
    assert stack.where().function == "RolloutActor.hang"  # type: ignore[union-attr]


async def test_a_hung_actor_is_diagnosed_and_named_in_the_restart_vote() -> None:
    config = tiny_config(
        run__steps=3,
        rollout__backend="ray",
        rollout__wait_timeout_s=120.0,
        diagnose__after_s=1.0,
    )
    trainer = PPOTrainer(config, faults=FaultInjector.parse(["hang@2"]))
    trainer.register_runtime_extension(SelfHealingExtension(stall_timeout_s=3.0))
    async with record_events(
        trainer.bus, StallDiagnosed, RolloutRestarted, SafePointReached
    ) as recorder:
        summary = await trainer.fit()
    assert summary.status == "finished"
    [restart] = recorder.of_type(RolloutRestarted)
    # (Starting the new actors may be diagnosed too, as stage "restart": it takes seconds.)
    diagnoses = [
        d for d in recorder.of_type(StallDiagnosed) if d.seq < restart.seq and d.stage == "rollouts"
    ]
    assert diagnoses and all(d.step == 2 for d in diagnoses)
    latest = diagnoses[-1]
    [worker] = {r.worker_id for r in latest.stuck}
    assert worker.startswith("ray-0.")
    assert len(latest.stuck) == len({r.rollout_id for r in latest.stuck}) > 0
    [stack] = [s for s in latest.stacks if s.owner == worker]
    assert stack.source == "py-spy"
    assert stack.where().function == "RolloutActor.hang"  # type: ignore[union-attr]
    voted_at = [e for e in recorder.of_type(SafePointReached) if e.seq < restart.seq][-1]
    quoted = [d for d in diagnoses if d.seq < voted_at.seq][-1]  # the healer's latest
    assert restart.reason.endswith(f": {quoted.headline(after_s=voted_at.time - quoted.time)})")


async def test_a_hung_weight_sync_is_diagnosed_where_the_put_hangs() -> None:
    # The ray.put runs on a thread helping the trainer: the diagnosis shows it stuck there,
    # and past rollout.sync_timeout_s the step fails naming the deadline and the diagnosis.
    # (Recovery from it is the local tests'; restarting actors would double this test.)
    config = tiny_config(
        run__steps=3, rollout__backend="ray", rollout__sync_timeout_s=2.0, diagnose__after_s=0.5
    )
    trainer = PPOTrainer(config, faults=FaultInjector.parse(["sync-hang@2"]))
    async with record_events(trainer.bus, StallDiagnosed) as recorder:
        with pytest.raises(WaitDeadlineExceeded) as raised:
            await trainer.fit()
    first = next(d for d in recorder.of_type(StallDiagnosed) if d.stage == "weight_sync")
    assert (first.step, first.repeat) == (2, 0)
    [stack, *_] = [s for s in first.stacks if s.owner == "trainer"]
    assert stack.source == "thread"
    assert stack.where().function == "FaultInjector.hang_weight_sync"  # type: ignore[union-attr]
    assert (raised.value.stage, raised.value.setting) == ("weight_sync", "rollout.sync_timeout_s")
    assert raised.value.diagnosis is not None
    assert raised.value.diagnosis.stage == "weight_sync"


async def test_a_hung_reward_call_in_an_actor_is_read_and_fails_its_rollouts() -> None:
    # reward-hang travels to the actor with the work; py-spy sees the reward thread, and
    # past task.reward_timeout_s the actor fails those rollouts as reward_timeout.
    spec = msgspec.structs.replace(SPEC, reward_timeout_s=6.0)
    backend = inject_faults(RayBackend(spec, 1), FaultInjector.parse(["reward-hang@1"]))
    sink = FakeSink()
    await backend.start(sink, weights(0), 0)
    try:
        work = make_work("r")
        backend.submit(work)
        await until(lambda: len(backend.holdings()) == 1)
        [worker] = [h.worker_id for h in backend.holdings()]
        reader = StackReader(timeout_s=20)
        where = None
        while where != "_hang_until_abandoned" and not sink.results:  # sampling comes first
            stacks = await anyio.to_thread.run_sync(backend.read_stacks, [worker], reader)
            where = stacks[0].where().function if stacks[0].where() else None  # type: ignore[union-attr]
        # The reward thread first: the actor's own only waits for it.
        assert where == "_hang_until_abandoned"
        assert stacks[0].source == "py-spy"
        assert [s.where().function for s in stacks[1:2]] == ["call_with_deadline"]  # type: ignore[union-attr]
        await until(lambda: len(sink.results) == 8)
        assert {(r.status.value, r.error_kind) for r in sink.results} == {
            ("failed", "reward_timeout")
        }
    finally:
        await backend.close()
