"""hpcddp: PyTorch DistributedDataParallel on Slurm/HPC clusters, made boring.

Names are imported lazily so that ``import hpcddp.hostlist`` and the CLI's light commands
start fast on login nodes without importing torch.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "DistEnv": "hpcddp.environments",
    "resolve_env": "hpcddp.environments",
    "process_group": "hpcddp.distributed",
    "Config": "hpcddp.config",
    "load_config": "hpcddp.config",
    "Trainer": "hpcddp.trainer",
    "download": "hpcddp.fetch",
    "main_process_first": "hpcddp.fetch",
    "submit": "hpcddp.submission",
    "sweep": "hpcddp.submission",
    "HpcddpError": "hpcddp.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import a public name from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hpcddp' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
