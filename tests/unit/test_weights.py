"""The weights fingerprint: equal exactly when every parameter and buffer is bitwise equal."""

import torch
from torch import nn

from hpcddp.train.state import weights_sha256


def make(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))  # a 0-d int64 buffer inside


def test_models_with_batchnorm_hash_and_equal_weights_hash_equal():
    assert weights_sha256(make(0)) == weights_sha256(make(0))
    assert weights_sha256(make(0)) != weights_sha256(make(1))


def test_one_flipped_bit_or_a_buffer_change_is_seen():
    model = make(0)
    before = weights_sha256(model)
    model[1].num_batches_tracked += 1
    assert weights_sha256(model) != before
    model = make(0)
    bits = model[0].weight.data.view(torch.int32)
    bits[0, 0] ^= 1  # the last bit of one float
    assert weights_sha256(model) != before
