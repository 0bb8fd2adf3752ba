"""The configured model's size, for `hpcddp check`: its factory called once on the meta device.

On ``meta`` a parameter has a shape and a dtype but no storage, so a 70B model is counted in
seconds without a byte of its weights. The blocks are found by fsdp's own rule
(`hpcddp.train.strategy_fsdp.blocks`), so the estimate shards what training would shard.
"""

import logging
from typing import Any

import torch

from hpcddp.config import Config
from hpcddp.train import factories, fsdp_meta, strategy_fsdp, usercode


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def measure(cfg: Config) -> dict[str, Any]:
    """``{params, param_bytes, largest_block_params, root_params}`` of the model the config
    builds (fields of `hpcddp.check.memory.ModelSize`), and ``fsdp_builds_whole``: fsdp would
    build it whole in host memory on each rank before sharding it (not on the meta device);
    raises what the factory raises."""
    model_fn = factories.import_factory(cfg.model.factory, "model")
    what = f"the model factory {usercode.name_of(model_fn)}"

    def make() -> Any:
        return usercode.call(model_fn, cfg.model.kwargs, what, "model.kwargs")

    # would fsdp build it whole on each rank before sharding it (`hpcddp.train.fsdp_meta`)?
    meta_built, _ = (None, "") if cfg.dist.fsdp_meta_init == "false" else _quietly(make, cfg)
    model = meta_built
    if model is None:  # counted on the meta device all the same: no weights allocated
        with torch.device("meta"):
            model = make()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"the model factory returned {type(model).__name__}, not a Module")
    quiet = strategy_fsdp.log.level
    if cfg.dist.strategy != "fsdp":  # fsdp's advice on finding blocks is not for a ddp run
        strategy_fsdp.log.setLevel(logging.ERROR)
    try:
        found = strategy_fsdp.blocks(model, cfg.dist.fsdp_blocks)
    finally:
        strategy_fsdp.log.setLevel(quiet)
    total = _params(model)
    first = next(model.parameters(), None)
    return {
        "params": total,
        "param_bytes": first.element_size() if first is not None else 4,
        "largest_block_params": max(map(_params, found), default=0),
        "root_params": total - sum(map(_params, found)),
        "fsdp_builds_whole": meta_built is None,
    }


def _quietly(make: Any, cfg: Config) -> tuple[torch.nn.Module | None, str]:
    """fsdp's own choice, its refusals taken for a whole build (training reports them)."""
    try:
        return fsdp_meta.attempt(make, "auto" if cfg.dist.fsdp_meta_init == "auto" else "true")
    except Exception:
        return None, ""
