"""Quickstart: a small MLP learns a teacher network's labels on data generated from a seed.

Works offline and identically everywhere: the data is a pure function of the seed.
"""

import torch
from torch import nn
from torch.utils.data import TensorDataset


def make_model(
    in_features: int = 16, hidden: int = 256, classes: int = 4, dropout: float = 0.0
) -> nn.Module:
    """A 3-layer MLP classifier (~71k parameters at the defaults)."""
    return nn.Sequential(
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, classes),
    )


def make_dataset(
    train_size: int = 16384,
    eval_size: int = 4096,
    in_features: int = 16,
    classes: int = 4,
    seed: int = 1234,
) -> tuple[TensorDataset, TensorDataset]:
    """Inputs from N(0, 1); labels from a fixed random teacher network (learnable, nonlinear)."""
    gen = torch.Generator().manual_seed(seed)
    teacher_in = torch.randn(in_features, 16, generator=gen) / in_features**0.5
    teacher_out = torch.randn(16, classes, generator=gen)
    inputs = torch.randn(train_size + eval_size, in_features, generator=gen)
    labels = (torch.tanh(inputs @ teacher_in) @ teacher_out).argmax(dim=1)
    train = TensorDataset(inputs[:train_size], labels[:train_size])
    evaluation = TensorDataset(inputs[train_size:], labels[train_size:])
    return train, evaluation
