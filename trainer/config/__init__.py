"""The run configuration: TOML in, validated ``TrainerConfig`` Structs out, and back to TOML.

May import ``trainer.rl`` (a task and a policy are named by config) and nothing else of
``trainer``. The public names are re-exported by ``trainer``.
"""
