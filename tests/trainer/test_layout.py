"""The folder tree is the architecture: ``rl`` < ``config`` < ``rollout`` < ``runtime`` <
``integrations`` < ``cli``.

A subpackage imports only the ones below it, and only through their faces (their
``__init__.py``): what one subpackage uses of another is listed in one place, the other's
face, and its private modules can move without touching their users. No module of
``trainer`` imports another in a cycle (counting imports under ``TYPE_CHECKING`` and inside
functions).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests._imports import find_cycle
from tests._imports import import_graph

LAYERS = ("rl", "config", "rollout", "runtime", "integrations", "cli")
# The one module outside the subpackages: how a face resolves its names (stdlib only).
SHARED = "trainer._faces"


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_module_lives_in_a_subpackage() -> None:
    top = {f"trainer.{name}" for name in (*LAYERS, "__main__")} | {SHARED}
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


def test_the_layer_finder_sees_a_face_as_its_layer() -> None:
    assert [_layer(m) for m in ("trainer.cli", "trainer.rl._grpo", "trainer._faces")] == [
        "cli",
        "rl",
        None,
    ]


def cross_reach_ins() -> set[str]:
    """Imports of another subpackage's private module (``from ..rollout._driver import``)."""
    return {
        f"{module} -> {target}"
        for module, targets in import_graph("trainer").items()
        if (layer := _layer(module)) is not None
        for target in targets
        if _layer(target) not in (None, layer)
        and any(part.startswith("_") for part in target.split(".")[2:])
    }


def test_subpackages_use_each_other_through_their_faces() -> None:
    assert cross_reach_ins() == set()


def test_a_face_imports_nothing_until_a_name_is_used() -> None:
    """Importing every face costs nothing: the command line can reject a bad flag before
    torch is imported."""
    faces = ", ".join(f"trainer.{layer}" for layer in LAYERS)
    code = f"import sys, {faces}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_no_import_cycle_in_trainer() -> None:
    # trainer/__init__.py only names its modules under TYPE_CHECKING and for lazy lookup.
    assert find_cycle(import_graph("trainer"), ignore=frozenset({"trainer"})) == []
