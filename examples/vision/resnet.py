"""A small ResNet (HF ``ResNetForImageClassification``, random init) learns synthetic images.

Nothing is downloaded: the model is built from a config and the images are a pure function of a
seed. Each image is noise plus a bright square in one of four quadrants; the quadrant is the
label. Samples are dicts, ``{"pixel_values": (3, H, W), "labels": int}``, the shape of an HF
image dataset, so the trainer calls ``model(pixel_values=..., labels=...)`` and takes the loss
the model returns; accuracy comes from its ``logits``. BatchNorm layers make this the example
for ``train.sync_batchnorm``.

A torchvision model trains the same way: give it a dataset of ``(image, label)`` pairs (or
dicts, with a ``training_step`` hook) and ``task.kind: classification``.
"""

import torch
from torch.utils.data import Dataset


def make_model(
    classes: int = 4, width: int = 16, depths: tuple[int, ...] = (1, 1)
) -> torch.nn.Module:
    """A two-stage basic-block ResNet (about 50k parameters at the defaults)."""
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(
        num_channels=3,
        embedding_size=width,
        hidden_sizes=[width * 2**i for i in range(len(depths))],
        depths=list(depths),
        layer_type="basic",
        num_labels=classes,
    )
    return ResNetForImageClassification(config)


class QuadrantImages(Dataset):
    """Noise images with a bright square in the quadrant named by the label."""

    def __init__(self, size: int, image_size: int, classes: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, classes, (size,), generator=gen)
        self.images = 0.5 * torch.randn(size, 3, image_size, image_size, generator=gen)
        half = image_size // 2
        for i, label in enumerate(self.labels.tolist()):
            row, col = divmod(label % 4, 2)
            self.images[i, :, row * half : (row + 1) * half, col * half : (col + 1) * half] += 1.0

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.images[index], "labels": self.labels[index]}


def make_dataset(
    train_size: int = 1024,
    eval_size: int = 256,
    image_size: int = 32,
    classes: int = 4,
    seed: int = 1234,
) -> dict[str, Dataset]:
    """Training and evaluation images from one seed (disjoint draws)."""
    return {
        "train": QuadrantImages(train_size, image_size, classes, seed),
        "eval": QuadrantImages(eval_size, image_size, classes, seed + 1),
    }
