"""trainbus inside TRL (and any Hugging Face ``Trainer``): the bus, votes, stall diagnosis,
exporters and a trainbus run folder, without switching trainer.

```python
from trainer.integrations.trl import TrainbusCallback, guard_rewards

callback = TrainbusCallback(out="runs/x", self_heal=True, diagnose_after_s=120,
                            export=["tensorboard"])
trainer = GRPOTrainer(..., reward_funcs=guard_rewards([f1, f2], timeout_s=30, callback=callback),
                      callbacks=[callback])
trainer.train()
```

Importing this module imports ``transformers`` (``pip install 'trainbus[trl]'``); nothing
else in trainbus does. This module only re-exports the public API; see
``docs/trl.md`` for what each part does.
"""

from ._trl_callback import TrainbusCallback as TrainbusCallback
from ._trl_rewards import GuardedReward as GuardedReward
from ._trl_rewards import guard_rewards as guard_rewards

__all__ = ("GuardedReward", "TrainbusCallback", "guard_rewards")
