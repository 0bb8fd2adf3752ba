"""fsdp's build on the meta device: no rank ever holds the whole model, only its own shards.

The factory runs under ``torch.device("meta")`` (shapes, no storage), ``fully_shard`` splits
the meta parameters, ``to_empty`` gives each rank storage for its shards alone, and only then
are the weights initialised, in place, shard by shard. The factory's own initialisation ran on
meta and did nothing, so the model must be able to initialise itself again: its
``init_weights()`` (a Hugging Face ``PreTrainedModel`` has one), or else every module that
holds parameters or buffers has ``reset_parameters()``. A tensor that neither recreates (a
parameter of a module without ``reset_parameters``, a buffer computed in ``__init__`` such as a
rotary table or a causal mask) would train from whatever memory ``to_empty`` left: refused.
A resume overwrites the weights from the checkpoint, but not the buffers that are not
persistent, so the same rule holds for it.
"""

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

from hpcddp.errors import ConfigError

_SHOWN = 4  # names in a refusal, then a count


def attempt(make: Callable[[], torch.nn.Module], asked: str) -> tuple[torch.nn.Module | None, str]:
    """The model built on meta, or None and why it may not be (``auto``; ``true`` refuses).

    Not when the factory fails there (Hugging Face's ``from_pretrained`` refuses meta), nor
    when it puts real values into the model (weights loaded, a tensor made off meta): they
    would be lost to the initialisation; under ``auto`` not either for a model without
    ``init_weights()``, whose factory may initialise otherwise than its modules'
    ``reset_parameters()`` would."""
    try:
        with torch.device("meta"), _Loads() as loads:
            model = make()
    except Exception as err:
        if asked == "true":
            raise
        first = str(err).splitlines()[0] if str(err) else ""
        return None, f"its factory failed on the meta device ({type(err).__name__}: {first})"
    loaded = _loaded(model, loads.seen)
    if loaded and asked == "true":
        raise ConfigError(
            f"dist.fsdp_meta_init=true: {type(model).__name__}: {loaded}. HINT: load weights "
            "after the build (resume from a checkpoint), or set dist.fsdp_meta_init=false."
        )
    if loaded:
        return None, loaded
    missing = uncovered(model)
    if missing and asked == "true":
        raise refusal(model, missing, asked)
    if asked == "true" or own_init(model):
        return model, ""
    unset = f"; none recreates {', '.join(missing[:_SHOWN])}" if missing else ""
    return None, (
        f"{type(model).__name__} has no init_weights(), and its factory may initialise it "
        f"otherwise than its modules' reset_parameters() (set dist.fsdp_meta_init=true if "
        f"not){unset}"
    )


def _loaded(model: torch.nn.Module, copied: bool) -> str:
    """Why the factory's values would be lost, or ``""``: tensors it made off the meta device,
    or real values copied into meta ones."""
    named = (*model.named_parameters(), *model.named_buffers())
    real = [name for name, tensor in named if not tensor.is_meta]
    if not real and not copied:
        return ""
    what = ", ".join(real[:_SHOWN]) if real else "copied from real tensors: loaded weights?"
    return f"its factory puts values into it ({what}), which a meta build would lose"


class _Loads(TorchFunctionMode):
    """Sees a real tensor copied into a meta one: weights the factory loads
    (``load_state_dict``), which a meta build would silently drop."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.copy_ and len(args) > 1:
            into, source = args[0], args[1]
            if into.is_meta and isinstance(source, torch.Tensor) and not source.is_meta:
                self.seen = True
        return func(*args, **(kwargs or {}))


def own_init(model: torch.nn.Module) -> bool:
    """The model initialises itself whole (``init_weights()``, as Hugging Face's models do)."""
    return callable(getattr(model, "init_weights", None))


def uncovered(model: torch.nn.Module) -> list[str]:
    """The parameters and buffers that no ``reset_parameters()`` recreates, when the model has
    no ``init_weights()`` (which is trusted, then checked after it ran: `check_initialised`)."""
    if own_init(model):
        return []
    found = []
    for prefix, module in model.named_modules():
        if callable(getattr(module, "reset_parameters", None)):
            continue
        tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        found += [f"{prefix}.{name}" if prefix else name for name, _ in tensors]
    return found


def refusal(model: torch.nn.Module, names: list[str], asked: str) -> ConfigError:
    """One line: what cannot be initialised after a meta build, and the two ways out."""
    shown = ", ".join(names[:_SHOWN]) + (
        f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    )
    return ConfigError(
        f"dist.fsdp_meta_init={asked}: {type(model).__name__} built on the meta device cannot "
        f"initialise {shown} (not covered by a reset_parameters(), and the model has no "
        "init_weights()). HINT: give the model an init_weights() that sets every parameter and "
        "buffer, or set dist.fsdp_meta_init=false to build it whole on each rank."
    )


def is_meta(model: torch.nn.Module) -> bool:
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


@torch.no_grad()
def materialise(model: torch.nn.Module, device: torch.device, asked: str) -> None:
    """Storage for this rank's shards (and the buffers), then the weights initialised in place:
    first marked (NaN, or the largest integer) so that any tensor the initialisation missed is
    found and refused instead of training from garbage."""
    model.to_empty(device=device)
    tensors = dict(_named_tensors(model))
    for tensor in tensors.values():
        _mark(tensor)
    with _stream_per_rank(device):
        _initialise(model)
    missed = [name for name, tensor in tensors.items() if _marked(tensor)]
    if missed:
        raise refusal(model, missed, asked)


def _initialise(model: torch.nn.Module) -> None:
    if own_init(model):
        with _own_classes(model):
            model.init_weights()  # type: ignore[operator]
        return
    for module in model.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()


@contextlib.contextmanager
def _stream_per_rank(device: torch.device) -> Iterator[None]:
    """On CPU, DTensor's random ops draw each rank's shard from that rank's own generator, which
    the run's seed made the same on every rank: every rank's shard would repeat rank 0's
    values. So each rank draws from a stream of its own, seeded from the run's stream (one
    draw, the same on every rank) and its rank: the same seed and world size, the same weights.
    (On GPUs DTensor gives each shard its slice of one stream itself.)"""
    if device.type != "cpu":
        yield
        return
    shared = int(torch.randint(0, 2**62, ()))
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # DTensor's "random operators may not have complete support on cpu": taken care of here
        warnings.filterwarnings("ignore", "DTensor random operators", UserWarning)
        torch.manual_seed(shared + dist.get_rank())
        yield


@contextlib.contextmanager
def _own_classes(model: torch.nn.Module) -> Iterator[None]:
    """Each sharded module as its own class for a while: fully_shard makes it an instance of a
    subclass defined in torch's modules, which Hugging Face's ``init_weights`` takes for remote
    code and then skips every module without parameters of its own (GPT-2's residual
    projections would keep the plain init instead of the scaled one)."""
    swapped = [(m, type(m)) for m in model.modules() if isinstance(m, FSDPModule)]
    for module, made in swapped:
        module.__class__ = next(base for base in made.__bases__ if base is not FSDPModule)
    try:
        yield
    finally:
        for module, made in swapped:
            module.__class__ = made


def _named_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """This rank's storage of every parameter (its shard) and buffer, by name."""
    named = [*model.named_parameters(), *model.named_buffers()]
    return [(name, t.to_local() if isinstance(t, DTensor) else t) for name, t in named]


def _sentinel(tensor: torch.Tensor) -> Any:
    if tensor.is_floating_point() or tensor.is_complex():
        return math.nan
    if tensor.dtype == torch.bool:
        return None  # no value that an initialisation could not also write
    return torch.iinfo(tensor.dtype).max


def _mark(tensor: torch.Tensor) -> None:
    value = _sentinel(tensor)
    if value is not None and tensor.numel():
        tensor.fill_(value)


def _marked(tensor: torch.Tensor) -> bool:
    value = _sentinel(tensor)
    if value is None or not tensor.numel():
        return False
    if isinstance(value, float):
        return bool(torch.isnan(tensor).any())
    return bool((tensor == value).any())
