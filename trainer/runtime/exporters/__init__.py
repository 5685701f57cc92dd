"""Exporters: built-in extensions that send a run to TensorBoard, MLflow, W&B and Prometheus.

Each lives in its own module and imports its library only when a run asks for it; ``import
trainer`` and a run without ``--export`` import none of them. The public names are
re-exported by ``trainer``.
"""
