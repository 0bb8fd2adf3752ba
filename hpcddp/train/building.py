"""A rank's model and data, built from the user's factories and agreed by every rank before DDP.

Each rank calls the factories itself, so one rank can fail where the others do not (a node
without the data, a factory that looks at the rank). Every rank then meets at one agreement
point (`hpcddp.comm.agreement`), a small all-gather before the first collective of DDP, and
brings its outcome, its host and its dataset's lengths: a fault anywhere ends every rank at once
with the failing rank's line, and datasets of different lengths, which would give the ranks
shards of different lengths and hang the last step of an epoch, are refused before training.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from hpcddp.comm import agreement
from hpcddp.config import Config
from hpcddp.errors import ConfigError, UserCodeError, agreed
from hpcddp.launch.distenv import DistEnv
from hpcddp.train import data, ddp, rng, strategy, usercode


@dataclasses.dataclass
class Built:
    """What the factories gave this rank, ready for DDP."""

    model: torch.nn.Module
    train_loader: DataLoader[Any]
    eval_loader: DataLoader[Any] | None
    hosts: list[str] = dataclasses.field(default_factory=list)  # every rank's, in rank order


def build(
    model_fn: Callable[..., Any],
    dataset_fn: Callable[..., Any],
    cfg: Config,
    env: DistEnv,
    device: torch.device,
) -> Built:
    """Model and loaders on this rank, once every rank has built its own without a fault."""
    rng.seed_everything(cfg.run.seed)  # identical initial weights on every rank
    ddp.set_fp32_matmuls(cfg.train.tf32, device)
    made: Built | None = None
    fault = None
    what = f"the model factory {usercode.name_of(model_fn)}"
    try:
        # ddp: on the device; fsdp: on the meta device or in host memory (`Strategy.build`)
        model = strategy.of(cfg).build(
            lambda: _model(usercode.call(model_fn, cfg.model.kwargs, what, "model.kwargs")),
            cfg,
            device,
        )
        what = f"the dataset factory {usercode.name_of(dataset_fn)}"
        made = _loaders(model, dataset_fn, cfg, env, what)
    except Exception as err:  # told to every rank at the agreement point below
        fault = usercode.fault_of(err, env, what)
    gathered = agreement.agree(
        fault,
        (env.hostname, _lengths(made)),
        env=env,
        timeout_s=cfg.dist.timeout_s,
        doing="building its model and data",
    )
    check_same_lengths([lengths for _, lengths in gathered])
    assert made is not None  # no rank had a fault, so this one built everything
    made.hosts = [host for host, _ in gathered]
    return made


def _model(made: Any) -> torch.nn.Module:
    if not isinstance(made, torch.nn.Module):
        raise ConfigError(
            f"the model factory returned {type(made).__name__}, not a torch.nn.Module. "
            "HINT: return the model itself (e.g. `return MyModel(...)`)."
        )
    return made


def _loaders(
    model: torch.nn.Module, dataset_fn: Callable[..., Any], cfg: Config, env: DistEnv, what: str
) -> Built:
    train_set, eval_set = data.split_datasets(
        usercode.call(dataset_fn, cfg.data.kwargs, what, "data.kwargs")
    )
    if not hasattr(train_set, "__len__"):
        raise ConfigError(
            f"{what} returned a {type(train_set).__name__} training set without len(); "
            "DDP shards a map-style dataset by index. HINT: return a torch Dataset with "
            "__len__ and __getitem__ (e.g. a TensorDataset)."
        )
    train_loader = data.make_train_loader(train_set, cfg.data, env, cfg.run.seed)
    eval_loader = None if eval_set is None else data.make_eval_loader(eval_set, cfg.data, env)
    return Built(model, train_loader, eval_loader)


def _lengths(made: Built | None) -> tuple[int, int | None] | None:
    """(training samples, eval samples) as this rank's dataset has them."""
    if made is None:
        return None
    evaluation = made.eval_loader
    eval_len = len(evaluation.dataset) if evaluation is not None else None  # type: ignore[arg-type]
    return len(made.train_loader.dataset), eval_len  # type: ignore[arg-type]


def check_same_lengths(lengths: list[tuple[int, int | None]]) -> None:
    """Refuse, on every rank alike, datasets whose lengths differ between ranks."""
    for index, which in ((0, "training"), (1, "eval")):
        seen = [pair[index] for pair in lengths]
        if len(set(seen)) > 1:
            raise agreed(
                UserCodeError(
                    f"the dataset factory gave the ranks {which} sets of different lengths "
                    f"({_by_value(seen)}), so their shards and steps per epoch would differ "
                    "and the ranks would hang at the end of an epoch. HINT: return the same "
                    "dataset on every rank (no rank-dependent size, randomness from a fixed "
                    "seed); hpcddp shards it across the ranks itself."
                )
            )


def _by_value(seen: list[Any], most: int = 4) -> str:
    """``rank 0, 2: 2048; rank 1: 2047``, the rarest lengths first (the odd ranks out)."""
    groups: dict[Any, list[int]] = {}
    for rank, value in enumerate(seen):
        groups.setdefault(value, []).append(rank)
    ordered = sorted(groups.items(), key=lambda item: len(item[1]))
    parts = [f"{_ranks(ranks)}: {value}" for value, ranks in ordered[:most]]
    more = f"; {len(ordered) - most} more lengths" if len(ordered) > most else ""
    return "; ".join(parts) + more


def _ranks(ranks: list[int], most: int = 8) -> str:
    shown = ", ".join(map(str, ranks[:most])) + (", ..." if len(ranks) > most else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"
