"""Evaluation over ranks: each sample seen once, loss and accuracy summed across the job."""

import torch
import torch.distributed as dist

from hpcddp.train.ddp import autocast


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, loader, loss_fn, device: torch.device, precision: str, distributed: bool
) -> dict:
    """Loss and accuracy of ``model`` (the unwrapped module: no DDP hooks, no collectives in
    forward) over ``loader``'s shard on this rank, all-reduced into the job's figures."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        with autocast(precision, device):
            outputs = model(inputs)
        count = targets.numel()
        sums[0] += loss_fn(outputs.float(), targets).double() * count
        sums[1] += (outputs.argmax(-1) == targets).sum()
        sums[2] += count
    model.train()
    if distributed:
        dist.all_reduce(sums)
    loss, correct, count = sums.tolist()
    return {"eval_loss": loss / max(count, 1), "eval_accuracy": correct / max(count, 1)}
