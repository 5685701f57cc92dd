"""Loading a user's extension from ``MODULE:ATTR`` (``--extension``, ``extensions = [...]``)."""

from __future__ import annotations

import importlib
import sys

from eventbus import ExtensionError

__all__ = ["load_extension"]


def load_extension(spec: str) -> object:
    """Import ``MODULE:ATTR`` and return an extension: the attribute itself when it is an
    extension object, else what calling it without arguments returns (a class or factory).

    Raises:
        ExtensionError: naming the spec and what could not be imported or built.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ExtensionError(f"extension {spec!r}: expected MODULE:ATTR")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # a user's extension module in the current folder
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ExtensionError(f"extension {spec!r}: cannot import {module_name!r}: {exc}") from None
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise ExtensionError(
            f"extension {spec!r}: module {module_name!r} has no {attr!r}"
        ) from None
    if isinstance(target, type) or (callable(target) and not hasattr(target, "api_version")):
        try:
            return target()
        except Exception as exc:  # noqa: BLE001  (reported as an ExtensionError naming it)
            raise ExtensionError(f"extension {spec!r}: building it failed: {exc}") from None
    return target
