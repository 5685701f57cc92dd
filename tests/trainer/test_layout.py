"""The folder tree is the architecture: ``rl`` < ``config`` < ``rollout`` < ``runtime`` <
``integrations`` < ``cli``.

A subpackage imports only the ones below it, and no module of ``trainer`` imports another in
a cycle (counting imports under ``TYPE_CHECKING`` and inside functions).
"""

from __future__ import annotations

import pytest

from tests._imports import find_cycle
from tests._imports import import_graph

LAYERS = ("rl", "config", "rollout", "runtime", "integrations", "cli")


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in LAYERS else None


def test_every_module_lives_in_a_subpackage() -> None:
    top = {f"trainer.{name}" for name in (*LAYERS, "__main__")}
    loose = [m for m in import_graph("trainer") if m.count(".") == 1 and m not in top]
    assert loose == []


@pytest.mark.parametrize("layer", LAYERS)
def test_a_subpackage_imports_only_those_below_it(layer: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    upward = {
        f"{module} -> {target}"
        for module, targets in import_graph("trainer").items()
        if _layer(module) == layer
        for target in targets
        if target == "trainer" or (_layer(target) or layer) not in allowed
    }
    assert upward == set()


def test_no_import_cycle_in_trainer() -> None:
    # trainer/__init__.py only names its modules under TYPE_CHECKING and for lazy lookup.
    assert find_cycle(import_graph("trainer"), ignore=frozenset({"trainer"})) == []
