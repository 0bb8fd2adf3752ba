"""hpcddp: PyTorch DistributedDataParallel on Slurm/HPC clusters, made boring.

The package has wings by world (each subpackage's docstring says what it may import):

- ground floor: `hpcddp.config`, `hpcddp.errors`, `hpcddp.exit_codes`, `hpcddp.progress`,
  `hpcddp.outcome`, `hpcddp.run_files` (a run directory's file names and its summary),
  `hpcddp.run_events` (what people are told happened to a run)
- `hpcddp.resilience`: how a run ends (requeue, restart on a spare, chain hand-on, stop): the
  rules, pure and torch-free, which the trainer, the job script and submitit's task all ask
- `hpcddp.launch`: who am I (hostlists, launch contexts, ports, the local launcher); torch-free
- `hpcddp.notify`: notices of what happens to a run (started, preempted, ...) to a JSON webhook
  and a Slack or Mattermost channel; torch-free
- `hpcddp.storage`: run directory, atomic files, checkpoints, plots
- `hpcddp.comm`: the process group's life, collectives, failure reports, guarded downloads
- `hpcddp.train`: the trainer and its loop
- `hpcddp.slurm`: job scripts, submission, queue, status, the job index; torch-free at import
- `hpcddp.cli`: the ``hpcddp`` command, on top

Public names are imported lazily so that the CLI's light commands start fast on login nodes
without importing torch.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "DistEnv": "hpcddp.launch.distenv",
    "resolve_env": "hpcddp.launch.resolve",
    "process_group": "hpcddp.comm.group",
    "Config": "hpcddp.config",
    "load_config": "hpcddp.config",
    "Trainer": "hpcddp.train.trainer",
    "download": "hpcddp.comm.download",
    "main_process_first": "hpcddp.comm.download",
    "stage": "hpcddp.comm.staging",
    "submit": "hpcddp.slurm.submission",
    "sweep": "hpcddp.slurm.sweep_submit",
    "HpcddpError": "hpcddp.errors",
    "RunOutcome": "hpcddp.outcome",
    "StopReason": "hpcddp.outcome",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """Import a public name from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hpcddp' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
