"""Ground floor: the run's configuration (checked dataclasses, YAML, overrides, reference).

Imports only `hpcddp.errors` and PyYAML: the login node reads configs without torch.
"""

from hpcddp.config.loading import (
    apply_overrides,
    from_dict,
    key_path,
    load_config,
    parse_override,
    read_yaml,
    split_override,
    with_overrides,
    with_values,
)
from hpcddp.config.sections import (
    Config,
    DataConfig,
    DistConfig,
    FactoryConfig,
    NotifyConfig,
    OptimConfig,
    RunConfig,
    SlurmConfig,
    TaskConfig,
    TrackingConfig,
    TrainConfig,
)

__all__ = [
    "Config",
    "DataConfig",
    "DistConfig",
    "FactoryConfig",
    "NotifyConfig",
    "OptimConfig",
    "RunConfig",
    "SlurmConfig",
    "TaskConfig",
    "TrackingConfig",
    "TrainConfig",
    "apply_overrides",
    "from_dict",
    "key_path",
    "load_config",
    "parse_override",
    "read_yaml",
    "split_override",
    "with_overrides",
    "with_values",
]
