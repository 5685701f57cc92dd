"""The optional libraries of the exporters, and the one message for a missing one.

An exporter calls :func:`require` when it is built, before training starts: a missing
library is one line naming the extra to install (the command line exits with status 2),
and the import's own cost is paid then, not while the trainer runs.

Exporting a run sends the run, and only where the user pointed it: MLflow's usage telemetry
and W&B's error reports are turned off unless the user set those variables themselves.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

from eventbus import ExtensionError

__all__ = ["REQUIREMENTS", "require"]

# exporter -> the modules it imports (the extra of the same name installs them).
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "tensorboard": ("tensorboard",),
    "mlflow": ("mlflow", "sqlalchemy", "alembic"),
    "wandb": ("wandb",),
    "prometheus": ("prometheus_client",),
}


# exporter -> environment defaults set before its library is first imported.
QUIET: dict[str, dict[str, str]] = {
    "mlflow": {"MLFLOW_DISABLE_TELEMETRY": "true"},
    "wandb": {"WANDB_ERROR_REPORTING": "false"},
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
        for variable, value in QUIET.get(exporter, {}).items():
            os.environ.setdefault(variable, value)
        importlib.import_module(module)
