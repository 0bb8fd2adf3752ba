"""The model's and optimizer's state by parameter name, for any strategy and any world size.

torch.distributed.checkpoint's state-dict API names every tensor by its parameter's name
(never by position) and keeps each rank's shard as a DTensor under fsdp, a whole tensor
under ddp. DCP writes each rank's shards and loads whatever slice a rank now owns, so a
checkpoint written by N fsdp ranks loads on M fsdp ranks or on ddp ranks (which load it whole),
and a ddp checkpoint (whole tensors, optimizer state by position) loads sharded on fsdp ranks.
"""

import pathlib
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from hpcddp.storage.sharded_reader import VerifyingReader


def named(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Model and optimizer state by parameter name (this rank's shards under fsdp)."""
    return {
        "model": get_model_state_dict(model),
        "optimizer": get_optimizer_state_dict(model, optimizer),
    }


def load_sharded(
    path: pathlib.Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    digests: dict[str, str] | None = None,
) -> None:
    """Every rank reads its own slice of the DCP checkpoint at ``path`` (whichever world and
    strategy wrote it) into ``model`` and ``optimizer``, each file it reads once, checked
    against ``digests`` (`hpcddp.storage.sharded_reader`; None: not checked)."""
    state = named(model, optimizer)
    dcp.load(state, storage_reader=VerifyingReader(path, digests))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def load_whole(
    saved: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """A ddp checkpoint's whole tensors into a (sharded) model: each rank keeps its slice."""
    whole = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, saved["model"], options=whole)
    optimizer_state = by_name(saved["optimizer"], model, optimizer)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=whole)


def by_name(
    saved: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """``optimizer.state_dict()``'s layout (parameters by position) keyed by parameter name
    instead; positions follow this optimizer's groups, which a checkpoint of the same model
    and config shares."""
    names = {id(p): n for n, p in model.named_parameters()}
    position: dict[int, str] = {}
    for saved_group, group in zip(saved["param_groups"], optimizer.param_groups, strict=True):
        for index, param in zip(saved_group["params"], group["params"], strict=True):
            position[index] = names[id(param)]
    return {
        "state": {position[i]: dict(s) for i, s in saved["state"].items()},
        "param_groups": [
            {**g, "params": [position[i] for i in g["params"]]} for g in saved["param_groups"]
        ],
    }
