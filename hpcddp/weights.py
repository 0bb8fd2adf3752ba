"""A fingerprint of model weights that is equal exactly when the weights are bitwise equal."""

import hashlib

import torch


def weights_sha256(module: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer: name, dtype, shape and raw bytes, in a fixed order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        # reshape first: a 0-d tensor (BatchNorm's num_batches_tracked) cannot be viewed as bytes
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
