"""Where the Ray backend puts its actors: spread over the cluster's live nodes.

Ray's own scheduler packs actors that ask for no CPUs onto the node it happens to pick (often
the driver's), and its ``SPREAD`` strategy is best effort, so a run would keep most of its
rollouts on one node and lose most of them with it. The backend therefore chooses a node for
every actor it starts: the eligible live node that holds the fewest of this run's actors
(ties go to the node listed first), asked for with a node affinity. An actor that reserves
CPUs asks *softly*: if its node is full or has died by the time it is scheduled, Ray places
it elsewhere. An actor that reserves none asks firmly, because Ray ignores a soft affinity
for an actor without resources (seen on Ray 2.60: it lands on any node) and such an actor
can never find a node full; if its node died in between, it fails to start and the restart
that follows places it again. The node an actor really runs on is what it reports when it
answers.

Nodes are read again for every choice, so replacements after a node's loss go to the nodes
that survived. :func:`choose_nodes` is pure (tests give it any cluster); :func:`live_nodes`
and :func:`affinity` are the thin layer over Ray.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ClusterNode", "affinity", "choose_nodes", "live_nodes"]


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """A live node of the cluster, as the placement sees it.

    Attributes:
        node_id: Ray's hex node id.
        address: The node's IP address.
        cpus: Logical CPUs the node offers in total.
    """

    node_id: str
    address: str
    cpus: float


def choose_nodes(
    nodes: Iterable[ClusterNode],
    placed: Mapping[str, int],
    count: int,
    *,
    actor_cpus: float = 0.0,
) -> list[str | None]:
    """Nodes for ``count`` new actors, each on the eligible node holding fewest actors.

    A node is eligible when it offers CPUs at all (a head node started with
    ``--num-cpus 0`` is kept free of work on purpose) and at least ``actor_cpus`` of them.
    Among eligible nodes, those with room left for another actor of ``actor_cpus`` come
    first; when none has room the least loaded still gets it (Ray then queues or spills it).

    Args:
        nodes: The cluster's live nodes, in a stable order (ties go to the earlier one).
        placed: How many of this run's actors each node id already holds.
        count: Actors to place.
        actor_cpus: CPUs each actor reserves.

    Returns:
        One node id per actor, or None for each when no node is eligible (Ray decides).
    """
    eligible = [n for n in nodes if n.cpus > 0 and n.cpus >= actor_cpus]
    if not eligible:
        return [None] * count
    load = Counter({n.node_id: placed.get(n.node_id, 0) for n in eligible})
    order = {n.node_id: i for i, n in enumerate(eligible)}
    capacity = {
        n.node_id: math.floor(n.cpus / actor_cpus + 1e-9) if actor_cpus > 0 else math.inf
        for n in eligible
    }
    chosen: list[str | None] = []
    for _ in range(count):
        node_id = min(
            load,
            key=lambda nid: (load[nid] >= capacity[nid], load[nid], order[nid]),
        )
        load[node_id] += 1
        chosen.append(node_id)
    return chosen


def live_nodes() -> list[ClusterNode]:
    """The cluster's live nodes (Ray's node table), in the order Ray lists them."""
    import ray

    nodes = []
    table: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    for entry in table:
        if not entry.get("Alive", False):
            continue
        resources: Mapping[str, Any] = entry.get("Resources", {})
        nodes.append(
            ClusterNode(
                node_id=str(entry["NodeID"]),
                address=str(entry.get("NodeManagerAddress", "")),
                cpus=float(resources.get("CPU", 0.0)),
            )
        )
    return nodes


def affinity(node_id: str | None, actor_cpus: float) -> Any:
    """The scheduling strategy that asks for ``node_id`` ("DEFAULT" for None): softly for
    an actor that reserves CPUs, firmly for one that reserves none (see above)."""
    if node_id is None:
        return "DEFAULT"
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if actor_cpus <= 0:
        return NodeAffinitySchedulingStrategy(node_id, soft=False)
    # soft: if the node has died meanwhile, place the actor elsewhere instead of failing;
    # _spill_on_unavailable: and if it is full, elsewhere instead of waiting for it.
    return NodeAffinitySchedulingStrategy(node_id, soft=True, _spill_on_unavailable=True)
