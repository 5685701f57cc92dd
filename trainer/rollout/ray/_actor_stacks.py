"""Reading Ray actors' Python stacks for a stall diagnosis.

A hung actor cannot answer a call, so its stacks are read from outside with py-spy when it
runs on this machine; otherwise, or when py-spy cannot, the actor is asked for them (its
diagnosis thread answers even while its worker is stuck). Whatever fails is said in the
stack's note, never raised.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence

import msgspec
import ray
from ray.exceptions import GetTimeoutError
from ray.exceptions import RayError

from eventbus.runtime import ThreadStack

from .._stacks import StackReader
from ._actor import ActorView
from ._actor import first_line
from ._placement import live_nodes

__all__ = ["read_actor_stacks"]


def read_actor_stacks(
    actors: Mapping[str, ActorView], worker_ids: Sequence[str], reader: StackReader
) -> tuple[ThreadStack, ...]:
    """The stacks of the actors ``worker_ids`` names (blocking: call it from a thread).

    Args:
        actors: The current actors by worker id.
        worker_ids: Whose stacks to read.
        reader: Reads a local process's stacks (py-spy) within its timeout.
    """
    here = _nodes_on_this_machine()
    stacks: list[ThreadStack] = []
    for worker_id in worker_ids:
        actor = actors.get(worker_id)
        if actor is None:
            stacks.append(ThreadStack(owner=worker_id, note="no such actor now"))
            continue
        if actor.pid and actor.node in here:
            found, note = reader.process(actor.pid, worker_id)
        else:
            found, note = (
                (),
                f"actor {worker_id} runs on another machine (py-spy reads this one)",
            )
        if not found:
            found = _ask_for_stacks(actor, reader.timeout_s, note)
        stacks.extend(found)
    return tuple(stacks)


def _ask_for_stacks(actor: ActorView, timeout_s: float, why: str) -> tuple[ThreadStack, ...]:
    """The fallback: the actor reports its own stacks from its diagnosis thread."""
    try:
        found: tuple[ThreadStack, ...] = ray.get(actor.handle.stacks.remote(), timeout=timeout_s)
    except GetTimeoutError:
        note = f"{why}; the actor did not answer within {timeout_s:.0f} s"
        return (ThreadStack(owner=actor.worker_id, pid=actor.pid or None, note=note),)
    except RayError as exc:
        note = f"{why}; asking the actor failed: {first_line(exc)}"
        return (ThreadStack(owner=actor.worker_id, pid=actor.pid or None, note=note),)
    return tuple(
        msgspec.structs.replace(s, source="actor", note=f"{why}; read by the actor itself")
        for s in found
    )


def _nodes_on_this_machine() -> set[str]:
    """Ids of the live Ray nodes at this machine's address (py-spy can read their processes;
    several nodes share one machine in a local test cluster)."""
    if not ray.is_initialized():
        return set()
    address = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return {node.node_id for node in live_nodes() if node.address == address}
