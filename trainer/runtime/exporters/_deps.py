"""The optional libraries of the exporters, and the one message for a missing one.

An exporter calls :func:`require` when it is built, before training starts: a missing
library is one line naming the extra to install (the command line exits with status 2),
and the import's own cost is paid then, not while the trainer runs.
"""

from __future__ import annotations

import importlib
import importlib.util

from eventbus import ExtensionError

__all__ = ["REQUIREMENTS", "require"]

# exporter -> the modules it imports (the extra of the same name installs them).
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "tensorboard": ("tensorboard",),
    "mlflow": ("mlflow", "sqlalchemy", "alembic"),
    "wandb": ("wandb",),
    "prometheus": ("prometheus_client",),
}


def require(exporter: str) -> None:
    """Import the libraries ``exporter`` needs.

    Raises:
        ExtensionError: One is not installed; the message names the extra to install.
    """
    for module in REQUIREMENTS[exporter]:
        if importlib.util.find_spec(module) is None:
            raise ExtensionError(
                f"--export {exporter} needs the {module} package, which is not installed: "
                f"pip install 'trainbus[{exporter}]' (or 'trainbus[export]' for every exporter)"
            )
        importlib.import_module(module)
