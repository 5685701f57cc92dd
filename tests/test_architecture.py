"""The package's shape, read from its source: no import cycles, allowed dependencies only,
one concept a module under a name of its own, a bus that names no training concept.

The graph helpers live in ``tests/_imports.py`` so every package's tests can use them; the
cycle test below already runs over each package of the repository.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Set
from pathlib import Path

import pytest

from tests._imports import REPOSITORY
from tests._imports import find_cycles
from tests._imports import format_cycle
from tests._imports import import_graph
from tests._imports import imported_modules


@pytest.mark.parametrize(
    "package",
    [
        "eventbus",
        "replay",
        "trainer",
    ],
)
def test_no_module_imports_another_in_a_cycle(package: str) -> None:
    """TYPE_CHECKING and function-level imports count: a cycle there is still a cycle."""
    graph = import_graph(package)
    assert len(graph) > 1
    assert [format_cycle(c) for c in find_cycles(graph)] == []


def test_the_cycle_finder_sees_type_checking_and_function_level_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from ._a import A\n")
    (package / "_a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._b import B\nA = 1\n"
    )
    (package / "_b.py").write_text("def f():\n    from . import _c\nB = 2\n")
    (package / "_c.py").write_text("from pkg._a import A\n")
    (package / "_d.py").write_text("from ._a import A\n")  # not on the cycle
    (package / "_e.py").write_text("from . import _e\n")  # imports itself
    cycles = find_cycles(import_graph("pkg", tmp_path))
    assert cycles == [["pkg._a", "pkg._b", "pkg._c", "pkg._a"], ["pkg._e", "pkg._e"]]


# What eventbus may import besides the standard library (docs/architecture.md).
EVENTBUS_THIRD_PARTY = {"msgspec", "anyio"}


def test_eventbus_imports_only_the_stdlib_msgspec_and_anyio() -> None:
    outside: set[str] = set()
    for path in sorted((REPOSITORY / "eventbus").glob("*.py")):
        module = f"eventbus.{path.stem}" if path.stem != "__init__" else "eventbus"
        for name in imported_modules(
            module, path.read_text(encoding="utf-8"), is_package=path.stem == "__init__"
        ):
            top = name.partition(".")[0]
            if top and top != "eventbus" and top not in sys.stdlib_module_names:
                outside.add(top)
    assert outside <= EVENTBUS_THIRD_PARTY


def test_no_two_modules_share_a_name() -> None:
    """A name says which module a reader opens: two ``_state.py`` of unrelated concepts make
    every search a guess. Each package's exceptions are its ``_errors.py``, the one name a
    top-level package may share."""
    paths = [
        path.relative_to(REPOSITORY)
        for package in ("eventbus", "replay", "trainer")
        for path in sorted((REPOSITORY / package).rglob("*.py"))
        if path.name != "__init__.py"
        and not (path.name == "_errors.py" and len(path.relative_to(REPOSITORY).parts) == 2)
    ]
    seen: dict[str, list[str]] = {}
    for path in paths:
        seen.setdefault(path.name, []).append(str(path))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


# The bus is the mechanism: every module of eventbus but its face, the table of names that
# moved out of it (_moved.py: each name and where it went) and the runtime contract's
# vocabulary (eventbus/runtime/).
MECHANISM = sorted(
    path
    for path in (REPOSITORY / "eventbus").glob("*.py")
    if path.name not in {"__init__.py", "_moved.py"}
)


def vocabulary() -> set[str]:
    """What the mechanism may not name: the runtime contract's vocabulary and the events
    their producers own (replay's, the trainer's)."""
    import eventbus.runtime
    import replay
    import trainer.rollout._faults
    import trainer.rollout._rollout_events
    from eventbus import Event

    producers = (replay, trainer.rollout._rollout_events, trainer.rollout._faults)
    owned = {
        name
        for module in producers
        for name in getattr(module, "__all__", ())
        if isinstance(getattr(module, name), type) and issubclass(getattr(module, name), Event)
    }
    return set(eventbus.runtime.__all__) | owned


def test_the_bus_imports_no_vocabulary() -> None:
    imports = {
        str(path.relative_to(REPOSITORY)): sorted(
            name
            for name in imported_modules(f"eventbus.{path.stem}", path.read_text(encoding="utf-8"))
            if name.startswith(("eventbus.runtime", "replay", "trainer"))
        )
        for path in MECHANISM
    }
    assert {path: names for path, names in imports.items() if names} == {}


def test_the_bus_names_no_training_concept() -> None:
    """Not in its code, its messages or its docstrings: no safe point of the trainer's, no
    lifecycle event, no capability of the runtime contract, no worker's event. (It knows its
    hosts' safe points, capabilities and requests only through their bases:
    ``BarrierPoint``, ``CapabilityBase``, ``BarrierRequest``.)"""
    names = vocabulary()
    assert {"SafePoint", "SampleWaitState", "Capability", "Host", "WorkerLost"} <= names
    word = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b")
    found = [
        f"{path.relative_to(REPOSITORY)}:{number}: {match[0]}"
        for path in MECHANISM
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        for match in word.finditer(line)
    ]
    assert found == []


def test_every_module_states_its_one_concept() -> None:
    """One concept a module, named where a reader looks first: every module of eventbus,
    replay and trainer opens with a docstring whose first line says what it holds (the
    private ones state their invariant there too). A module that cannot say it in a line
    holds two; its size alone says nothing."""
    missing = [
        str(path.relative_to(REPOSITORY))
        for package in ("eventbus", "replay", "trainer")
        for path in sorted((REPOSITORY / package).rglob("*.py"))
        if not (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").strip()
    ]
    assert missing == []


# Underscored names of the standard library that the packages use on purpose: thread stacks
# for stall diagnosis and single-thread mode (there is no public spelling of either), and
# os._exit (documented), the third signal's exit that unwinds nothing a stuck loop holds.
STDLIB_PRIVATE = {"sys._current_frames", "os._exit"}


# What eventbus's modules may use of each other's private names: a subscription's bus side
# (what the bus calls on it, documented in _subscription.py: it stays private because
# Subscription is a public class), the factory of a NoPublicConstructor class, Enum
# internals, and eventbus.testing's recorder task.
EVENTBUS_INTERNAL = {
    "_accepts",
    "_observes_point",
    "_vote_points",
    "_queue",
    "_stop",
    "_request_expired",
    "_holds_through",
    "_end_iteration_when_empty",
    "_create",
    "_value_",
    "_member_names_",
    "_consume",
}
ALLOWED = {"eventbus": EVENTBUS_INTERNAL, "replay": set(), "trainer": set()}


def reach_ins(source: str, allowed: Set[str] = frozenset()) -> list[str]:
    """``obj._name`` reads of another object's private attribute: not on ``self``/``cls``,
    not on a class this module defines (its own table of methods), not a dunder, not one of
    ``allowed``."""
    tree = ast.parse(source)
    own_classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") or node.attr in allowed:
            continue
        if ast.unparse(node) in STDLIB_PRIVATE:
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in {"self", "cls", *own_classes}:
            continue
        found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_reach_in_finder_sees_another_objects_private_attribute() -> None:
    source = (
        "import sys\n"
        "class Own:\n"
        "    def f(self, other):\n"
        "        self._a, Own._b, sys._current_frames()\n"
        "        return other._c, other.__class__\n"
    )
    assert reach_ins(source) == ["5: other._c"]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_module_reads_another_objects_private_attributes(package: str) -> None:
    """The pieces talk through package-level interfaces (the tracker's, the
    buffers', an extension's ``Dispatch`` record), never through each other's underscore
    names; in eventbus only through the few listed in ``EVENTBUS_INTERNAL``."""
    found = {
        str(path.relative_to(REPOSITORY)): hits
        for path in sorted((REPOSITORY / package).rglob("*.py"))
        if (hits := reach_ins(path.read_text(encoding="utf-8"), ALLOWED[package]))
    }
    assert found == {}
