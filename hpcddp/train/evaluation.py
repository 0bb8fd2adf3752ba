"""Evaluation over ranks: each sample seen once, metrics summed across the job, then divided.

The unwrapped module runs the forward (no DDP hooks, no collectives inside it); every rank
scores its own shard (`hpcddp.train.data.EvalShard`: no padding, so no sample counts twice,
and a rank may have fewer or none), and one gather adds up the (sum, count) pairs. Under
``dist.strategy=fsdp`` every forward gathers parameters with every rank, so a rank with fewer
batches runs as many spare forwards as it is short, their scores dropped.
"""

from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

from hpcddp.comm import collectives
from hpcddp.errors import ConfigError
from hpcddp.train import batches, task_metrics
from hpcddp.train.ddp import autocast
from hpcddp.train.task import Task


@torch.no_grad()
def evaluate(
    module: torch.nn.Module, loader, task: Task, device: torch.device, precision: str
) -> dict[str, float]:
    """The job's ``eval_*`` figures for ``module`` over ``loader`` (this rank's shard)."""
    module.eval()
    totals: dict[str, list[Any]] = {}
    short = _short_of_peers(module, len(loader))
    try:
        for batch in loader:
            batch = batches.to_device(batch, device)
            with autocast(precision, device):
                task_metrics.add(totals, _scores(module, task, batch))
        for _ in range(short):  # sharded: in step with the ranks that have more batches
            spare = batches.to_device(_spare_batch(loader), device)
            with autocast(precision, device):
                _scores(module, task, spare)
    finally:
        module.train()
    merged = task_metrics.merge(collectives.all_gather_object(task_metrics.as_floats(totals)))
    return task_metrics.finish(merged, task.kind)


def _short_of_peers(module: torch.nn.Module, batches_here: int) -> int:
    """How many forwards fewer than the busiest rank this one runs (0 unless sharded)."""
    if not isinstance(module, FSDPModule):
        return 0
    return max(collectives.all_gather_object(batches_here)) - batches_here


def _spare_batch(loader: Any) -> Any:
    """The evaluation set's first samples, as one batch (every rank has them)."""
    size = min(loader.batch_size or 1, len(loader.dataset))
    return torch.utils.data.default_collate([loader.dataset[i] for i in range(size)])


def _scores(module: torch.nn.Module, task: Task, batch: Any) -> dict:
    if task.eval_step is not None:
        scores = task.eval_step(module, batch)
        if not isinstance(scores, dict) or not all(
            isinstance(v, (tuple, list)) and len(v) == 2 for v in scores.values()
        ):
            raise ConfigError(
                f"eval_step returned {type(scores).__name__}; expected {{name: (sum, count)}}. "
                "HINT: e.g. return {'accuracy': (correct.sum(), labels.numel())}."
            )
        return scores
    try:
        fed = batches.feed(batch, module)
    except ConfigError as err:
        raise ConfigError(
            f"{err} For evaluation, define eval_step(model, batch) -> {{name: (sum, count)}} "
            "too (or set task.eval_step)."
        ) from None
    return task_metrics.score(task, module(*fed.args, **fed.kwargs), batch, fed.targets)
