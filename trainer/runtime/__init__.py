"""Running a fit: ``PPOTrainer``'s loop and its safe points, checkpoints, the run record,
extension loading and the built-in extensions (self-healing).

May import ``trainer.rl``, ``trainer.config`` and ``trainer.rollout``; never the CLI (a test
checks it). The public names are re-exported by ``trainer``.
"""
