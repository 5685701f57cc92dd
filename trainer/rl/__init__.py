"""The RL core: built-in tasks, policies, the GRPO/PPO update and their hyper-parameters.

Pure torch and the standard library: no asyncio, no bus, nothing of ``trainer``'s other
subpackages (a test checks it), so the learning code can be read, tested and reused alone.
The public names are re-exported by ``trainer``.
"""
