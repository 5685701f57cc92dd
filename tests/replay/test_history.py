"""The bounded memory of retired ids (a private helper with its own invariants)."""

from __future__ import annotations

import gc

from replay import Admission
from replay._history import RetiredIds


def test_remembers_step_and_reason() -> None:
    history = RetiredIds(10)
    history.remember(("a", "b"), 7, Admission.EARLIER_STEP)
    history.remember(("c",), 2**34, Admission.STALE_POLICY)
    assert history.get("a") == (7, Admission.EARLIER_STEP)
    assert history.get("c") == (2**34, Admission.STALE_POLICY)
    assert history.get("z") is None


def test_forgets_oldest_first_even_inside_a_retirement() -> None:
    history = RetiredIds(3)
    history.remember(("a", "b"), 1, Admission.EARLIER_STEP)
    history.remember(("c", "d"), 2, Admission.EARLIER_STEP)
    assert [history.get(x) is not None for x in "abcd"] == [False, True, True, True]
    assert len(history) == 3


def test_an_id_retired_again_survives_the_eviction_of_its_older_entry() -> None:
    history = RetiredIds(3)
    history.remember(("a", "b"), 1, Admission.EARLIER_STEP)
    history.remember(("a",), 2, Admission.FINALIZED)
    history.remember(("c", "d"), 3, Admission.EARLIER_STEP)  # evicts the first chunk
    assert history.get("a") == (2, Admission.FINALIZED)
    assert history.get("b") is None


def test_costs_the_garbage_collector_nothing() -> None:
    history = RetiredIds(1000)
    history.remember(tuple(f"r{i}" for i in range(500)), 5, Admission.EARLIER_STEP)
    gc.collect()
    assert not gc.is_tracked(history._ids)


def test_zero_capacity_remembers_nothing() -> None:
    history = RetiredIds(0)
    history.remember(("a",), 1, Admission.EARLIER_STEP)
    assert history.get("a") is None
