"""FLOPs counted on a real forward and backward, and MFU only where a peak is known."""

import pytest
import torch

from hpcddp.train import batches, flops


def test_a_linear_layer_counts_two_flops_per_multiply_add_forward_and_twice_that_backward():
    layer = torch.nn.Linear(64, 32, bias=False)
    inputs = torch.randn(8, 64, requires_grad=True)
    with flops.counting(True) as counted:
        layer(inputs).sum().backward()
    forward = 2 * 8 * 64 * 32
    assert counted() == 3 * forward  # backward: the input's and the weight's gradients


def test_counting_can_be_turned_off():
    with flops.counting(False) as counted:
        torch.nn.Linear(4, 4)(torch.randn(2, 4)).sum().backward()
    assert counted() == 0


@pytest.mark.parametrize(
    "name, precision, configured, peak",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 0.0, 989e12),
        ("NVIDIA H100 PCIe", "fp16", 0.0, 756e12),
        ("NVIDIA H100 NVL", "bf16", 0.0, 835e12),  # not the SXM part's 989
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "bf16", 0.0, 989e12 * 66 / 132),  # its SMs' share
        ("NVIDIA A100-SXM4-80GB", "bf16", 0.0, 312e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", 0.0, None),  # no tensor-core peak to compare with
        ("Some Future GPU", "bf16", 0.0, None),
        ("Some Future GPU", "bf16", 500.0, 500e12),  # the user's figure wins
    ],
)
def test_the_peak_is_a_known_gpus_or_the_configured_one(
    monkeypatch, name, precision, configured, peak
):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    sms = 66 if "MIG" in name else 132  # a 3g slice of an H100 has about half its SMs

    class Props:
        multi_processor_count = sms

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props)
    assert flops.peak_flops(torch.device("cuda", 0), precision, configured) == peak


def test_the_cpu_has_no_peak_unless_configured():
    assert flops.peak_flops(torch.device("cpu"), "bf16", 0.0) is None
    assert flops.peak_flops(torch.device("cpu"), "fp32", 2.0) == 2e12


def test_utilisation_is_per_device_and_mfu_only_with_a_peak():
    # 1e9 FLOPs per sample at 8000 samples/s over 4 devices: 2 TFLOP/s each
    assert flops.utilisation(1e9, 8000, 4, None) == {"tflops_per_device": 2.0}
    assert flops.utilisation(1e9, 8000, 4, 10e12) == {"tflops_per_device": 2.0, "mfu": 0.2}


def test_a_small_model_on_a_busy_cpu_keeps_its_figure():
    """The quickstart MLP (about 430k FLOPs a sample) at 100 samples/s: 4.3e-5 TFLOP/s, once
    rounded to 0 (4 decimal places), failing the telemetry test on a loaded machine."""
    figures = flops.utilisation(4.3e5, 100, 2, 1e12)
    assert figures == {"tflops_per_device": 2.15e-05, "mfu": 2.15e-05}


def test_tokens_are_counted_from_input_ids_only():
    assert batches.tokens_of({"input_ids": torch.zeros(4, 128), "labels": torch.zeros(4)}) == 512
    assert batches.tokens_of((torch.zeros(4, 128), torch.zeros(4))) == 0
    assert batches.tokens_of({"pixel_values": torch.zeros(4, 3, 8, 8)}) == 0
