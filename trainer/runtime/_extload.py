"""The extensions a configuration asks for, and loading a user's from ``MODULE:ATTR``
(``--extension``, ``extensions = [...]``).

The built-in ones are imported only when asked for (an exporter's library, for one).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from eventbus import EXTENSION_FAILURES
from eventbus import ExtensionError

from ..config import TrainerConfig

__all__ = ["configured_extensions", "load_extension"]


def configured_extensions(config: TrainerConfig, out_dir: Path | None) -> list[object]:
    """What ``config`` asks to register, in order: self-healing, autoscaling, the user's
    extensions, the exporters (the same for the command line and for Python).

    Raises:
        ExtensionError: A user's extension cannot be loaded.
    """
    extensions: list[object] = []
    if config.self_heal.enabled:
        from ._selfheal import SelfHealingExtension

        extensions.append(SelfHealingExtension.from_config(config.self_heal))
    if config.autoscale.enabled:
        from ._autoscale import AutoscalingExtension

        extensions.append(AutoscalingExtension(config.autoscale))
    extensions.extend(load_extension(spec) for spec in config.extensions)
    if config.export.to:
        from .exporters._build import build_exporters

        extensions.extend(build_exporters(config.export, out_dir))
    return extensions


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
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else module_name
        raise ExtensionError(
            f"extension {spec!r}: {where}: {type(exc).__name__}: {exc.msg}"
        ) from None
    except EXTENSION_FAILURES as exc:  # (its module raised on import: name it, one line)
        raise ExtensionError(
            f"extension {spec!r}: importing {module_name!r} raised {_one_line(exc)}"
        ) from None
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise ExtensionError(
            f"extension {spec!r}: module {module_name!r} has no {attr!r}"
        ) from None
    if isinstance(target, type) or (callable(target) and not hasattr(target, "api_version")):
        try:
            return target()
        except EXTENSION_FAILURES as exc:  # (reported as an ExtensionError naming it)
            raise ExtensionError(
                f"extension {spec!r}: building it failed: {_one_line(exc)}"
            ) from None
    return target


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, with where in the user's code it was raised."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}{': ' + message if message else ''}{where}"
