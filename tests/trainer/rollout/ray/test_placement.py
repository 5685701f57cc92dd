"""Where the Ray backend puts actors: spread over eligible nodes, least loaded first."""

from __future__ import annotations

from trainer.rollout.ray._placement import ClusterNode
from trainer.rollout.ray._placement import choose_nodes

A, B, C = (ClusterNode(node_id=n, address="127.0.0.1", cpus=2.0) for n in "abc")


def test_actors_spread_evenly_in_node_order() -> None:
    assert choose_nodes([A, B, C], {}, 5) == ["a", "b", "c", "a", "b"]


def test_new_actors_fill_the_least_loaded_nodes_first() -> None:
    # After losing one of three actors on node a, its replacement goes to a again only if a
    # holds the fewest: here c does.
    assert choose_nodes([A, B, C], {"a": 1, "b": 2, "c": 0}, 2) == ["c", "a"]


def test_a_lost_node_gets_nothing_because_it_is_not_listed() -> None:
    # live_nodes() lists only live nodes; actors counted on a dead one do not matter.
    assert choose_nodes([A, C], {"b": 3, "a": 1}, 3) == ["c", "a", "c"]


def test_nodes_without_cpus_or_too_small_are_skipped() -> None:
    head = ClusterNode(node_id="head", address="10.0.0.1", cpus=0.0)  # --num-cpus 0
    small = ClusterNode(node_id="small", address="10.0.0.2", cpus=1.0)
    assert choose_nodes([head, small, A], {}, 3) == ["small", "a", "small"]
    assert choose_nodes([head, small, A], {}, 2, actor_cpus=2.0) == ["a", "a"]
    assert choose_nodes([head], {}, 2) == [None, None]  # nothing eligible: Ray decides


def test_nodes_with_room_come_before_full_ones() -> None:
    big = ClusterNode(node_id="big", address="", cpus=4.0)
    # One CPU each: a holds 2 of its 2, big has room for 4; the fifth goes to the least
    # loaded node, since every node is full by then.
    assert choose_nodes([A, big], {"a": 2}, 5, actor_cpus=1.0) == [
        "big",
        "big",
        "big",
        "big",
        "a",
    ]
