"""Model FLOPs utilisation: the model's FLOPs counted once, set against the device's peak.

Counting is exact and free of guesses (``torch.utils.flop_counter`` records every matmul and
convolution a real forward and backward dispatch), but it slows the step it watches, so it
watches one: the bucket-settling pass before training, which runs forward and backward on the
first batch. A peak is only known for GPUs whose dense bf16/fp16 tensor-core figure is public;
on the CPU, or at fp32, the achieved TFLOP/s is still logged, without an MFU.
"""

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch.utils.flop_counter import FlopCounterMode

# Dense (no sparsity) bf16/fp16 tensor-core TFLOP/s from the vendors' data sheets, and the
# streaming multiprocessors of the whole GPU; the first name that is part of
# torch.cuda.get_device_name() wins, so the longer names come first ("H100 NVL" and "H100 PCIe"
# before "H100", whose 989 is the SXM part's).
KNOWN_PEAK_TFLOPS = (
    ("H100 NVL", 835.0, 132),
    ("H100 PCIe", 756.0, 114),
    ("H100", 989.0, 132),
    ("GH200", 989.0, 132),
    ("H200", 989.0, 132),
    ("A100", 312.0, 108),
    ("L40S", 362.0, 142),
    ("V100", 125.0, 80),
)


@contextlib.contextmanager
def counting(enabled: bool) -> Iterator[Callable[[], int]]:
    """Count the FLOPs of the body; the yielded function reads the total (0 when disabled)."""
    if not enabled:
        yield lambda: 0
        return
    counter = FlopCounterMode(display=False)
    with counter:
        yield counter.get_total_flops


def peak_flops(device: torch.device, precision: str, configured_tflops: float) -> float | None:
    """One device's peak FLOP/s: the configured one, else a known GPU's at bf16/fp16."""
    if configured_tflops:
        return configured_tflops * 1e12
    if device.type != "cuda" or precision not in ("bf16", "fp16"):
        return None
    name = torch.cuda.get_device_name(device)
    known = next((row for row in KNOWN_PEAK_TFLOPS if row[0] in name), None)
    if known is None:
        return None
    _, tflops, whole_sms = known
    if " MIG " in f"{name} ":  # a MIG slice ("... MIG 3g.40gb") has its share of the SMs
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return tflops * 1e12 * min(sms / whole_sms, 1.0)
    return tflops * 1e12


def utilisation(
    flops_per_sample: float, samples_per_s: float, devices: int, peak: float | None
) -> dict[str, float]:
    """Achieved TFLOP/s per device and, with a known peak, the MFU (0..1)."""
    achieved = flops_per_sample * samples_per_s / max(devices, 1)
    figures = {"tflops_per_device": _significant(achieved / 1e12)}
    if peak:
        figures["mfu"] = _significant(achieved / peak)
    return figures


def _significant(value: float) -> float:
    """``value`` to 4 significant digits: a small model on a busy CPU does 0.00004 TFLOP/s,
    which 4 decimal places would log as 0."""
    return float(f"{value:.4g}")
