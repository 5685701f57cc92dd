"""The command line's errors: a leaf module, so every command module can raise them without
importing the entry point (which imports the command modules)."""

from __future__ import annotations

__all__ = ["EXIT_USAGE", "UsageError"]

EXIT_USAGE = 2


class UsageError(Exception):
    """A bad flag, config key or extension: one line, exit status 2."""
