"""A dataset already on the GPU (a common way to train on small data): the loaders neither pin
its samples nor start workers for it, and the rank's log says why, once.

No GPU here: the samples are tensors whose device type says ``cuda`` (a subclass), which is all
the decision reads; pinning one or sending it to a worker is what would fail on a GPU.
"""

import dataclasses
import logging

import pytest
import torch

from hpcddp.config import Config
from hpcddp.train import data
from tests.unit.test_cuda_path import gpu_rank

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # "CUDA is not available"


class OnCuda(torch.Tensor):
    """A host tensor that reports a CUDA device, as a tensor made with device="cuda" does."""

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 1)


def on_cuda(tensor):
    return torch.Tensor._make_subclass(OnCuda, tensor)


class CudaPairs(torch.utils.data.Dataset):
    """(inputs, labels) held on the GPU whole, indexed without a copy."""

    def __init__(self, n=8):
        self.x, self.y = on_cuda(torch.zeros(n, 2)), on_cuda(torch.zeros(n, dtype=torch.long))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return {"inputs": self.x[index], "labels": self.y[index]}


def test_a_dataset_on_the_gpu_gets_no_pinning_and_no_workers(caplog):
    cfg = dataclasses.replace(Config().data, num_workers=4)  # even when asked for
    with caplog.at_level(logging.INFO, logger="hpcddp.train.data"):
        train = data.make_train_loader(CudaPairs(), cfg, gpu_rank(), seed=0)
    assert (train.pin_memory, train.num_workers, train.persistent_workers) == (False, 0, False)
    assert not data.make_eval_loader(CudaPairs(), cfg, gpu_rank()).pin_memory
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("the dataset's samples are already on cuda:1: no pinned memory")


def test_a_host_dataset_keeps_its_workers_and_pinning(caplog):
    cfg = dataclasses.replace(Config().data, num_workers=2)
    host = torch.utils.data.TensorDataset(torch.zeros(8, 2), torch.zeros(8))
    with caplog.at_level(logging.INFO, logger="hpcddp.train.data"):
        train = data.make_train_loader(host, cfg, gpu_rank(), seed=0)
    assert (train.pin_memory, train.num_workers) == (True, 2) and not caplog.records
    assert data.samples_device(torch.utils.data.TensorDataset(torch.zeros(0))) == ""
