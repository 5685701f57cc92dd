"""Why a torch or safetensors file could not be read, in a few words: the one wording for a
damaged checkpoint and for damaged model weights.

The libraries' own texts do not fit a user's one line: torch's for a file its weights-only
loader rejects suggests loading it with ``weights_only=False`` and filing an issue, which
for a corrupt file is the wrong advice, so only its detail is kept.
"""

from __future__ import annotations

import re

__all__ = ["why_unreadable"]


def why_unreadable(error: BaseException, kind: str) -> str:
    """``it is empty or cut short``, ``it is corrupt, or not a {kind} (...)`` and the like.

    Args:
        error: What loading the file raised.
        kind: What the file should have been (``torch checkpoint``, ``weights file``).
    """
    if isinstance(error, EOFError):
        return "it is empty or cut short"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    detail = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
    if detail is not None:
        what = detail.group(1).strip()
        if what.startswith("Unsupported global"):
            # (the rest is torch's advice on allowing the class: not for a file of unknown origin)
            named = re.search(r"GLOBAL (\S+)", what)
            which = f"a {named.group(1)}" if named else what
            return f"it holds objects other than tensors and plain data ({which})"
        return f"it is corrupt, or not a {kind} ({what.lower()})"
    if "zip archive" in text:
        return "it is corrupt or cut short (not a complete zip archive)"
    reason = " ".join(text.split()).split(". ")[0].rstrip(".") or type(error).__name__
    return f"it is corrupt, cut short or not a {kind} ({reason})"
