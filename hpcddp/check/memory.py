"""Does the configured model fit a rank under ddp, under fsdp at this world size? Pure arithmetic.

The state a rank holds before any activation, with an AdamW-style optimizer: the weights, their
gradients and two moments, each as wide as a weight (fp32 under bf16 too: autocast and FSDP's
policy keep fp32 master weights), so 16 bytes a parameter for an fp32 model. ddp keeps all of
it on every rank. fsdp keeps 1/world of it, plus what it gathers whole for a while: the root's
own parameters (embeddings, head; kept gathered through the backward) and the largest block,
in bf16 under ``train.precision=bf16``. Activations are not estimated: the figure is a floor.
"""

import dataclasses
import math

STATE_COPIES = 4  # weights, gradients, AdamW's two moments
BF16_BYTES = 2


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """What the model factory built: its parameters and how they group into fsdp's units."""

    params: int
    param_bytes: int  # bytes of one parameter as built (4 for fp32)
    largest_block_params: int  # the biggest block fsdp shards on its own (0: none found)
    root_params: int  # parameters outside every block (sharded with the root)


@dataclasses.dataclass(frozen=True)
class Need:
    """Bytes per rank for the model's state under each strategy."""

    ddp: int
    fsdp: int


def need(size: ModelSize, world_size: int, precision: str) -> Need:
    """Bytes a rank holds for weights, gradients and optimizer state (not activations)."""
    state = size.params * size.param_bytes * STATE_COPIES
    gathered_bytes = BF16_BYTES if precision == "bf16" else size.param_bytes
    gathered = (size.largest_block_params + size.root_params) * gathered_bytes
    return Need(ddp=state, fsdp=math.ceil(state / world_size) + gathered)


def verdict(needs: Need, available: float, strategy: str) -> tuple[str, bool]:
    """The judgement line for ``strategy`` given ``available`` bytes per rank, and whether the
    job would fail (its state alone does not fit)."""
    mine = needs.ddp if strategy == "ddp" else needs.fsdp
    if mine <= available:
        return "fits", False
    if needs.fsdp <= available:  # so the strategy was ddp
        return f"does not fit: set dist.strategy=fsdp (needs {gb(needs.fsdp)} per rank)", True
    return "does not fit even sharded", True


def gb(nbytes: float) -> str:
    """Binary gigabytes, or megabytes under one."""
    if nbytes < 2**30:
        return f"{nbytes / 2**20:.3g} MB"
    return f"{nbytes / 2**30:.3g} GB"
