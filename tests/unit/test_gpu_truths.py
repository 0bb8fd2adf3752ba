"""Smaller GPU truths without a GPU (issue 15 item 8): TF32 by config, and CUDA peak memory
per logging interval. torch's CUDA calls are replaced by fakes that keep torch's meaning."""

import warnings

import pytest
import torch

from hpcddp.config import load_config
from hpcddp.train import ddp, telemetry


@pytest.fixture
def matmul_precision():
    """Put torch's process-wide fp32 settings back as they were."""
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield
    torch.set_float32_matmul_precision(before[0])
    torch.backends.cudnn.allow_tf32 = before[1]


@pytest.mark.parametrize("override, precision", [([], "high"), (["train.tf32=false"], "highest")])
def test_fp32_matmuls_use_tf32_on_a_gpu_unless_the_config_says_not(
    matmul_precision, override, precision
):
    config = load_config(None, override)
    torch.set_float32_matmul_precision("medium")  # neither: the call must decide
    ddp.set_fp32_matmuls(config.train.tf32, torch.device("cuda:1"))
    assert torch.get_float32_matmul_precision() == precision
    assert torch.backends.cuda.matmul.allow_tf32 is (precision == "high")
    assert torch.backends.cudnn.allow_tf32 is config.train.tf32


def test_torch_s_tf32_deprecation_warning_is_not_printed_on_every_gpu_rank(
    matmul_precision, recwarn
):
    """torch 2.9 to 2.11 warn at both legacy settings (a UserWarning from C++), on every rank."""
    told = ddp.TF32_DEPRECATION + " ... will be deprecated after Pytorch 2.9."
    real_precision = torch.set_float32_matmul_precision
    cudnn_tf32 = vars(type(torch.backends.cudnn))["allow_tf32"]  # torch's ContextProp
    real_setter = cudnn_tf32.setter

    def warning(real):
        def setter(value):
            warnings.warn(told, UserWarning, stacklevel=2)
            real(value)

        return setter

    warnings.simplefilter("always")
    with pytest.MonkeyPatch.context() as patch:  # undone before the settings are put back
        patch.setattr(torch, "set_float32_matmul_precision", warning(real_precision))
        patch.setattr(cudnn_tf32, "setter", warning(real_setter))
        ddp.set_fp32_matmuls(True, torch.device("cuda:0"))
    assert [str(w.message) for w in recwarn] == []
    assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32


def test_a_cpu_rank_keeps_full_fp32(matmul_precision):
    torch.set_float32_matmul_precision("highest")
    ddp.set_fp32_matmuls(True, torch.device("cpu"))  # "high" could mean bf16 kernels on a CPU
    assert torch.get_float32_matmul_precision() == "highest"


class FakeAllocator:
    """torch.cuda's peak counter: the most allocated since the last reset."""

    def __init__(self, monkeypatch) -> None:
        self.now = self.peak = 0
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)

    def use(self, nbytes: int) -> None:
        self.now = nbytes
        self.peak = max(self.peak, nbytes)

    def reset(self, device=None) -> None:
        self.peak = self.now


def test_cuda_peak_memory_is_the_interval_s_own(monkeypatch):
    memory = FakeAllocator(monkeypatch)
    clock = telemetry.IntervalClock(torch.device("cuda:0"))
    peak = telemetry.FIELDS.index("cuda_peak_bytes")
    memory.use(8 << 30)  # the first interval: a big evaluation batch, say
    memory.use(1 << 30)
    assert clock.close_interval()[peak] == 8 << 30
    memory.use(2 << 30)  # the next interval never went above 2 GiB
    memory.use(1 << 30)
    assert clock.close_interval()[peak] == 2 << 30
    assert clock.close_interval()[peak] == 1 << 30  # still held, nothing more


def test_the_gpu_probe_measures_compute_with_cuda_events(monkeypatch):
    """On a GPU the probe is a 4096 matmul (a 384 one only measures launch latency there),
    timed by the GPU's own events around batches run back to back, not by the host clock."""
    from hpcddp.check import preflight

    recorded = []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = 0.0

        def record(self):
            self.at = 40.0 * len(recorded)  # the GPU's clock: 40 ms between the two events
            recorded.append(self)

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    assert preflight.probe_size(torch.device("cuda:0")) == (4096, 8)
    assert preflight.probe_size(torch.device("cpu"))[0] == 384
    a = torch.randn(8, 8)  # stands in for the device tensor: only the timing is under test
    ms = preflight._cuda_ms(torch.device("cuda:0"), a, repeats=1, window_s=0.0)
    assert len(recorded) == 2 and ms == 40.0 / preflight.MIN_BATCHES
