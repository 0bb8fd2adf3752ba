"""The model as DDP trains it: wrapping, precision, and a bucket layout fixed before step one.

Kept apart from the training loop so each choice that decides the arithmetic (device ids,
SyncBatchNorm, autocast dtype, GradScaler, bucket layout) is in one short place and can be
tested without a GPU.
"""

import contextlib
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from hpcddp.config import Config
from hpcddp.errors import ConfigError
from hpcddp.launch.distenv import DistEnv
from hpcddp.train import batches


def wrap(
    model: torch.nn.Module, cfg: Config, env: DistEnv, device: torch.device
) -> tuple[torch.nn.Module, DDP]:
    """(the module to optimize and save, its DDP wrapper); SyncBatchNorm only across ranks."""
    if cfg.train.sync_batchnorm and env.distributed:
        if device.type != "cuda":
            raise ConfigError(
                f"train.sync_batchnorm=true needs CUDA: DDP refuses SyncBatchNorm on {device} "
                "modules. HINT: set train.sync_batchnorm=false on CPU (each rank then keeps "
                "its own batch statistics)."
            )
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if cfg.train.compile:
        # in place, inside DDP: dynamo will not trace through DDP's own forward, and
        # torch.compile(model) would prefix every checkpoint key with "_orig_mod."
        model.compile()
    d = cfg.dist
    ddp = DDP(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        bucket_cap_mb=d.bucket_cap_mb,
        find_unused_parameters=d.find_unused_parameters,
        static_graph=d.static_graph,
        gradient_as_bucket_view=d.gradient_as_bucket_view,
    )
    return model, ddp


def autocast(precision: str, device: torch.device):
    """bf16 or fp16 autocast on the rank's device type; nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


TF32_DEPRECATION = "Please use the new API settings to control TF32 behavior"


def set_fp32_matmuls(tf32: bool, device: torch.device) -> None:
    """TF32 for fp32 matmuls and convolutions on this rank's GPU, or full fp32 (train.tf32).

    torch computes fp32 matmuls in full IEEE precision unless told otherwise, leaving an
    Ampere or newer GPU's tensor cores idle in an fp32 model; older GPUs ignore the setting.
    CPUs are left alone: there "high" precision may switch to bf16 kernels and change results.
    """
    if device.type != "cuda":
        return
    # torch 2.9 to 2.11 warn at each of these calls, on every GPU rank, that they will be
    # replaced by per-backend ``fp32_precision`` settings. Those new settings are not used
    # here: torch raises when code that reads the old ones (libraries do) meets a mix.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TF32_DEPRECATION, category=UserWarning)
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        torch.backends.cudnn.allow_tf32 = tf32


def make_scaler(precision: str, device: torch.device) -> "torch.amp.GradScaler | None":
    """fp16 needs loss scaling (bf16 keeps fp32's range and needs none).

    On the rank's own device type: ``GradScaler("cuda")`` on a CPU rank disables itself with a
    warning, so CPU fp16 would run without the scaling (and the overflows) a GPU run has.
    """
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


def found_inf(scaler: "torch.amp.GradScaler", optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """After ``unscale_``: 1 when the scaler found inf/NaN gradients (it will skip the step).

    GradScaler keeps this per device in its optimizer state and has no public reader; the
    value is on the device, so reading it is left to the guard (one step late on CUDA).
    """
    per_device = scaler._found_inf_per_device(optimizer)
    return torch.stack([f.reshape(()).float() for f in per_device.values()]).sum()


def sync_buffers(model: torch.nn.Module) -> None:
    """Rank 0's buffers (BatchNorm running statistics) on every rank, as DDP's next forward
    would make them: before evaluation and the final weights check, where no forward comes."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


def first_batch(dataset: Any, batch_size: int) -> Any:
    """The first ``batch_size`` samples collated as the loader would (no sampler, no RNG)."""
    return torch.utils.data.default_collate(
        [dataset[i] for i in range(min(batch_size, len(dataset)))]
    )


def settle_buckets(
    ddp: torch.nn.Module, model: torch.nn.Module, batch: Any, precision: str, task
) -> None:
    """One synchronized backward of a zero loss before training, changing nothing.

    DDP lays out its gradient buckets once, then rebuilds them in the order gradients became
    ready during the first synchronized backward. With more than two ranks the all-reduce adds
    in an order that depends on that layout, so a resumed run (whose first step would use the
    initial layout) drifted from an uninterrupted one in the last bits. Settling the layout here
    makes every step of every run use the rebuilt one. Under fsdp (``ddp`` is then the sharded
    model itself) it gathers and reduces zeros once, and counts the FLOPs all the same. Eval
    mode: no dropout draw, no batch-norm statistics update; the zero gradients are dropped.
    ``batch`` is already on the device; the zero loss is the step's own loss when a
    training_step hook makes it, else every floating tensor of the output (a tuple, dict or
    ModelOutput), so every used parameter takes part.
    """
    model.eval()
    with autocast(precision, _device_of(model)):
        if task.training_step is not None:
            zero = task.training_step(ddp, batch) * 0
        else:
            fed = batches.feed(batch, model)
            floating = [
                t.float().sum()
                for t in batches.tensors_in(ddp(*fed.args, **fed.kwargs))
                if t.is_floating_point() and t.requires_grad
            ]
            zero = torch.stack(floating).sum() * 0
    zero.backward()
    for param in model.parameters():
        param.grad = None
    model.train()


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
