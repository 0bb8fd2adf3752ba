"""``dist.strategy: fsdp``: parameters, gradients and optimizer state sharded across the ranks.

FSDP2's ``fully_shard`` on each repeated block, then on the root: a block's parameters are
gathered just before its forward (and again for its backward) and freed after, so a rank holds
its shard of everything plus one block whole. The blocks are the classes named in
``dist.fsdp_blocks``, or else the children of the model's largest ``ModuleList`` (a
transformer's layers) or ``Sequential`` of one repeated class. bf16 (fp16) gathers bf16
(fp16) parameters and reduces gradients in fp32; the sharded master weights and the optimizer
state stay fp32. Under fp16, GradScaler's overflow check on the sharded gradients agrees across
the ranks by itself: DTensor runs it on each shard and all-reduces the found-inf flag (max), so
a rank whose shard overflowed makes every rank skip the step.

Where the model is built (``dist.fsdp_meta_init``, `hpcddp.train.fsdp_meta`): on the meta
device, each rank materialising only its shards, when the model can initialise itself there
(``auto``: it has ``init_weights()``; ``true``: that, or each module's ``reset_parameters()``);
otherwise whole in host memory on every rank, then sharded.
"""

import contextlib
import logging
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.distributed._composable import checkpoint
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

from hpcddp.config import Config
from hpcddp.errors import ConfigError
from hpcddp.launch.distenv import DistEnv
from hpcddp.train import fsdp_meta, rng
from hpcddp.train.sharded_checkpointing import ShardedCheckpointer
from hpcddp.train.strategy import Strategy, Wrapped

log = logging.getLogger(__name__)


class Fsdp(Strategy):
    """FSDP2 (``fully_shard``); every rank writes its own shards of each checkpoint."""

    name = "fsdp"
    shards_gradients = True

    def build(
        self, make: Callable[[], torch.nn.Module], cfg: Config, device: torch.device
    ) -> torch.nn.Module:
        """On the meta device when ``dist.fsdp_meta_init`` allows and the model can initialise
        itself after it (`wrap` materialises it); else whole in host memory (fully_shard then
        moves only this rank's shards to the device, so a model bigger than one GPU fits)."""
        asked = str(cfg.dist.fsdp_meta_init)
        if asked != "false":
            model, why_not = fsdp_meta.attempt(make, asked)
            if model is not None:
                return model
            log.warning(
                "fsdp: the model is built whole on every rank before sharding: %s. HINT: give "
                "the model an init_weights() that sets every parameter and buffer (then only "
                "its shards are ever built), or set dist.fsdp_meta_init=false to silence this.",
                why_not,
            )
            rng.seed_everything(cfg.run.seed)  # the weights an eager build always had
        return make().to("cpu")

    def wrap(
        self, model: torch.nn.Module, cfg: Config, env: DistEnv, device: torch.device
    ) -> Wrapped:
        _refuse_unsupported(cfg)
        meta = fsdp_meta.is_meta(model)
        mesh = init_device_mesh(device.type, (env.world_size,))
        sharding: dict[str, Any] = {
            "mesh": mesh,
            "mp_policy": _policy(cfg.train.precision),
            "offload_policy": offload(cfg, device),
        }
        reshard = cfg.dist.fsdp_reshard_after_forward
        found = prepared_blocks(model, cfg)
        for block in found:
            fully_shard(block, reshard_after_forward=reshard, **sharding)
        # the root's own parameters (embeddings, head) are needed again at once by the backward
        fully_shard(model, reshard_after_forward=False, **sharding)
        if meta:  # storage for this rank's shards only, then the weights
            fsdp_meta.materialise(model, device, str(cfg.dist.fsdp_meta_init))
        log.info(
            "fsdp: %d blocks sharded over %d ranks, then the root%s%s%s",
            len(found),
            env.world_size,
            "; built on the meta device, each rank initialising its shards" if meta else "",
            "; activations recomputed per block" if cfg.dist.fsdp_activation_checkpointing else "",
            "; shards offloaded to host memory" if cfg.dist.fsdp_cpu_offload else "",
        )
        if cfg.train.compile:
            model.compile()
        return Wrapped(model, model)

    def micro_batch(self, wrapped: Wrapped, last: bool) -> contextlib.AbstractContextManager[None]:
        return _accumulating(wrapped.model, last)

    def grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Each rank's shards' norms, combined over the ranks (one all-reduce)."""
        first = grads[0] if grads else None
        if isinstance(first, DTensor) and first.device.type != first.device_mesh.device_type:
            return norm_through_mesh_device(grads)
        norm = torch.nn.utils.get_total_norm(grads)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def checkpointer(
        self, run_dir: pathlib.Path, cfg: Config, env: DistEnv, trained: Any
    ) -> ShardedCheckpointer:
        return ShardedCheckpointer(run_dir, cfg, env, trained)


def norm_through_mesh_device(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of sharded gradients held off the mesh's device, combined over the ranks on it.

    Under CPU offload the gradients are in host memory while the group is NCCL's, which has no
    CPU collectives (torch's own total norm would all-reduce there): each gradient's part of its
    norm goes to the GPU for one all-reduce, DTensor's own norm reduction from the same
    placements, and the total comes back to where the gradients are."""
    parts = torch.stack([torch.linalg.vector_norm(grad, 2.0) for grad in grads])
    assert isinstance(parts, DTensor)
    mesh = parts.device_mesh
    moved = parts.to_local().to(mesh.device_type)
    on_device = DTensor.from_local(moved, mesh, parts.placements, run_check=False)
    return torch.linalg.vector_norm(on_device.full_tensor(), 2.0).to(parts.device)


@contextlib.contextmanager
def _accumulating(model: torch.nn.Module, last: bool) -> Iterator[None]:
    """Before the last micro-batch, no reduce-scatter and no reshard after the backward: the
    unsharded gradients add up locally and the gathered parameters serve the next forward."""
    assert isinstance(model, FSDPModule)
    model.set_requires_gradient_sync(last)
    model.set_reshard_after_backward(last)
    yield


def prepared_blocks(model: torch.nn.Module, cfg: Config) -> list[torch.nn.Module]:
    """The blocks to shard, each checkpointed first when ``dist.fsdp_activation_checkpointing``
    asks (before ``fully_shard``, so its gathering hooks stay outside the recomputation)."""
    found = blocks(model, cfg.dist.fsdp_blocks)
    if cfg.dist.fsdp_activation_checkpointing:
        for block in found:
            # non-reentrant, as hooks on the block: its parameters' names do not change, so
            # checkpoints stay interchangeable with runs without it
            checkpoint(block)
    return found


def offload(cfg: Config, device: torch.device) -> OffloadPolicy:
    """``dist.fsdp_cpu_offload``: shards kept in host memory (a GPU's only; refused on CPU)."""
    if not cfg.dist.fsdp_cpu_offload:
        return OffloadPolicy()
    if device.type != "cuda":
        raise ConfigError(
            f"dist.fsdp_cpu_offload=true needs GPUs, and this rank runs on {device.type}. HINT: "
            "set dist.fsdp_cpu_offload=false (on CPU the shards are in host memory already)."
        )
    return CPUOffloadPolicy()


def blocks(model: torch.nn.Module, names: list[str]) -> list[torch.nn.Module]:
    """The modules each sharded on their own: of the classes ``names``, or else the children of
    the largest ``ModuleList`` or repeating ``Sequential`` (by parameters); none without one."""
    if names:
        found = [m for m in model.modules() if type(m).__name__ in names and m is not model]
        missing = set(names) - {type(m).__name__ for m in found}
        if missing:
            present = sorted({type(m).__name__ for m in model.modules()})
            raise ConfigError(
                f"dist.fsdp_blocks names {sorted(missing)}, which the model does not contain "
                f"(its module classes: {', '.join(present[:12])}). HINT: name its repeated "
                "block class (a transformer's layer), or leave dist.fsdp_blocks empty."
            )
        return _outermost(found)
    lists = [m for m in model.modules() if _repeats(m)]
    if not lists:
        log.warning(
            "fsdp: the model has no ModuleList (nor Sequential of one repeated class); only the "
            "root is sharded. HINT: name its block class in dist.fsdp_blocks."
        )
        return []
    largest = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    return list(largest.children())


def _repeats(module: torch.nn.Module) -> bool:
    """A ``ModuleList``, or a ``Sequential`` of two or more modules of one class (blocks)."""
    if isinstance(module, torch.nn.ModuleList):
        return len(module) > 0
    kinds = {type(child) for child in module.children()}
    return isinstance(module, torch.nn.Sequential) and len(module) > 1 and len(kinds) == 1


def _outermost(found: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """A named block inside another is sharded with it, not on its own."""
    inner = {id(sub) for m in found for sub in m.modules() if sub is not m}
    return [m for m in found if id(m) not in inner]


def _policy(precision: str) -> MixedPrecisionPolicy:
    """bf16 or fp16: parameters gathered in that type, gradients reduced in fp32; fp32: as
    stored."""
    if precision in ("bf16", "fp16"):
        low = torch.bfloat16 if precision == "bf16" else torch.float16
        return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def _refuse_unsupported(cfg: Config) -> None:
    if cfg.train.sync_batchnorm:
        raise ConfigError(
            "train.sync_batchnorm=true is not supported with dist.strategy=fsdp. HINT: set "
            "train.sync_batchnorm=false, or use dist.strategy=ddp."
        )
