"""trainbus inside other trainers' loops: :mod:`trainer.integrations.trl` brings the bus, votes,
stall diagnosis and exporters to a Hugging Face ``Trainer`` (TRL's ``GRPOTrainer``).

May import every subpackage but the CLI; the CLI uses this one only through its face.
"""

# The face: what the other subpackages use of this one. The TYPE_CHECKING block is the one
# list; trainer/_faces.py imports each name from its module when it is used.
import typing as _typing

from .._faces import Face as _Face

if _typing.TYPE_CHECKING:
    from ._trl_launch import LAUNCH_FILE as LAUNCH_FILE
    from ._trl_launch import RESUME_ENV as RESUME_ENV
    from ._trl_launch import Launch as Launch
    from ._trl_launch import last_checkpoint as last_checkpoint
    from ._trl_launch import read_launch as read_launch

_FACE = _Face(__name__, __file__)
__getattr__ = _FACE.attribute
__dir__ = _FACE.names
