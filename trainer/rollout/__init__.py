"""Producing rollouts: the worker, the backend interface, the local and Ray backends, the
per-mode drivers that feed the replay buffers, and fault injection.

May import ``trainer.rl`` and ``trainer.config``; never the runtime or the CLI (a test
checks it). The public names are re-exported by ``trainer``.
"""
