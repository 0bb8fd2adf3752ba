"""Where training stands (`Progress`), and a fingerprint of the weights it produced.

`Progress` is saved in every checkpoint; `weights_sha256` is equal exactly when the weights are
bitwise equal, which is how resumed, relaunched and differently launched runs are compared
(sharded weights are gathered whole first, so ddp and fsdp runs compare too).
"""

import dataclasses
import hashlib

import torch
from torch.distributed.tensor import DTensor


@dataclasses.dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0
    batch: int = 0  # micro-batches of this epoch each rank consumed (at this world size)
    # samples of this epoch consumed, over all ranks, before ``batch`` began counting: set when
    # a run resumes at another world size (`hpcddp.train.data.ResumableSampler`)
    samples_before: int = 0
    last_loss: float = float("nan")
    skipped_steps: int = 0  # non-finite steps skipped (train.nonfinite=skip)
    overflow_steps: int = 0  # fp16 steps GradScaler skipped for an overflow (not non-finite)

    def epoch_position(self, batch_size: int, world_size: int) -> int:
        """Samples of this epoch consumed over all ranks: the data position any world resumes."""
        return self.samples_before + self.batch * batch_size * world_size

    def next_epoch(self) -> None:
        self.epoch, self.batch, self.samples_before = self.epoch + 1, 0, 0


def weights_sha256(module: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, raw bytes) in a fixed order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        if isinstance(tensor, DTensor):  # sharded (dist.strategy=fsdp): every rank gathers it
            tensor = tensor.full_tensor()
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        # reshape first: a 0-d tensor (BatchNorm's num_batches_tracked) cannot be viewed as bytes
        digest.update(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))  # no copy
    return digest.hexdigest()
