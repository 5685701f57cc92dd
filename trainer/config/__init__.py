"""The run configuration: TOML in, validated ``TrainerConfig`` Structs out, and back to TOML.

May import ``trainer.rl`` (a task and a policy are named by config) and nothing else of
``trainer``. The public names are re-exported by ``trainer``.

The other subpackages use this one only through its face, below.
"""

# The face: what the other subpackages use of this one. The TYPE_CHECKING block is the one
# list; trainer/_faces.py imports each name from its module when it is used.
import typing as _typing

from .._faces import Face as _Face

if _typing.TYPE_CHECKING:
    from ._export import ExportConfig as ExportConfig
    from ._export import PrometheusExportConfig as PrometheusExportConfig
    from ._export import exporter_flag as exporter_flag
    from ._ray_address import check_reachable as check_reachable
    from ._ray_address import joined_address as joined_address
    from ._ray_address import parse_ray_address as parse_ray_address
    from ._schema import DEFAULT_WORKERS as DEFAULT_WORKERS
    from ._schema import ActorCpus as ActorCpus
    from ._schema import AutoscaleConfig as AutoscaleConfig
    from ._schema import BackendName as BackendName
    from ._schema import ConfigError as ConfigError
    from ._schema import Device as Device
    from ._schema import RolloutConfig as RolloutConfig
    from ._schema import RolloutWorkers as RolloutWorkers
    from ._schema import RunMode as RunMode
    from ._schema import Seconds as Seconds
    from ._schema import SelfHealConfig as SelfHealConfig
    from ._schema import StandbyActors as StandbyActors
    from ._schema import TaskConfig as TaskConfig
    from ._schema import TrainerConfig as TrainerConfig
    from ._schema import convert as convert
    from ._schema import load_config as load_config
    from ._schema import within as within
    from ._toml import example_toml as example_toml
    from ._toml import key_table as key_table
    from ._toml import to_toml as to_toml

_FACE = _Face(__name__, __file__)
__getattr__ = _FACE.attribute
__dir__ = _FACE.names
