"""The CUDA/NCCL path, checked without a GPU by recording what would be asked of torch.

Device choice itself is tested in test_environments.py; here: binding the device before any
CUDA work, nccl with ``device_id`` (eager init on the right GPU), DDP ``device_ids``, pinned
memory, and the autocast dtype and GradScaler per precision.
"""

import dataclasses
import datetime

import pytest
import torch
import torch.distributed as dist

from hpcddp.comm import group as distributed
from hpcddp.config import Config, load_config
from hpcddp.launch.resolve import resolve_env
from hpcddp.storage import snapshot
from hpcddp.train import data, ddp

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # "CUDA is not available"


def gpu_rank(local_rank=1, gpus=4):
    """Rank 5 of 8, local rank ``local_rank`` on a node where it sees ``gpus`` GPUs."""
    return resolve_env(
        {
            "RANK": "5",
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": "8",
            "LOCAL_WORLD_SIZE": "4",
            "MASTER_ADDR": "n1",
            "MASTER_PORT": "29400",
        },
        cuda_devices=lambda: gpus,
        hostname="n2",
    )


def test_bind_device_sets_the_current_gpu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    assert distributed.bind_device(gpu_rank(3)) == torch.device("cuda:3")
    assert calls == [torch.device("cuda:3")]
    calls.clear()
    assert distributed.bind_device(dataclasses.replace(gpu_rank(), device="cpu")).type == "cpu"
    assert calls == []  # CPU ranks never touch CUDA


def test_nccl_init_names_the_device_and_gloo_does_not(monkeypatch):
    seen = {}
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: seen.update(args=a, **kw))
    store = dist.HashStore()  # what the rendezvous hands over: the job's TCPStore
    distributed.init_group(gpu_rank(2), datetime.timedelta(seconds=120), store)
    assert seen["args"] == ("nccl",) and seen["device_id"] == torch.device("cuda:2")
    assert (seen["rank"], seen["world_size"], seen["store"]) == (5, 8, store)
    assert seen["timeout"].total_seconds() == 120
    seen.clear()
    cpu = dataclasses.replace(gpu_rank(), device="cpu", backend="gloo")
    distributed.init_group(cpu, datetime.timedelta(seconds=300), store)
    assert seen["args"] == ("gloo",) and seen["device_id"] is None


def test_ddp_gets_device_ids_on_cuda_only(monkeypatch):
    made = []

    class FakeDDP:
        def __init__(self, module, **kwargs):
            made.append(kwargs)

    monkeypatch.setattr(ddp, "DDP", FakeDDP)
    config = load_config(None, ["dist.bucket_cap_mb=50", "dist.static_graph=true"])
    ddp.wrap(torch.nn.Linear(2, 2), config, gpu_rank(), torch.device("cuda:1"))
    ddp.wrap(torch.nn.Linear(2, 2), config, gpu_rank(), torch.device("cpu"))
    assert made[0]["device_ids"] == [torch.device("cuda:1")] and made[1]["device_ids"] is None
    assert made[0]["bucket_cap_mb"] == 50 and made[0]["static_graph"] is True


def test_sync_batchnorm_only_across_ranks(monkeypatch):
    monkeypatch.setattr(ddp, "DDP", lambda module, **kwargs: module)
    config = load_config(None, ["train.sync_batchnorm=true"])
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(4))
    wrapped, _ = ddp.wrap(model, config, gpu_rank(), torch.device("cuda:1"))
    assert isinstance(wrapped[0], torch.nn.SyncBatchNorm)
    single = resolve_env({}, cuda_devices=lambda: 1)
    alone, _ = ddp.wrap(
        torch.nn.Sequential(torch.nn.BatchNorm1d(4)), config, single, torch.device("cuda:0")
    )
    assert type(alone[0]) is torch.nn.BatchNorm1d


@pytest.mark.parametrize(
    "precision, device, dtype",
    [
        ("bf16", "cuda", torch.bfloat16),
        ("fp16", "cuda", torch.float16),
        ("bf16", "cpu", torch.bfloat16),
    ],
)
def test_autocast_dtype_and_device(precision, device, dtype):
    context = ddp.autocast(precision, torch.device(device))
    assert isinstance(context, torch.autocast)
    assert (context.device, context.fast_dtype) == (device, dtype)


def test_fp32_has_no_autocast_and_only_fp16_scales():
    assert not isinstance(ddp.autocast("fp32", torch.device("cuda:0")), torch.autocast)
    cuda = torch.device("cuda:0")
    assert isinstance(ddp.make_scaler("fp16", cuda), torch.amp.GradScaler)
    assert ddp.make_scaler("bf16", cuda) is None and ddp.make_scaler("fp32", cuda) is None


def test_the_scaler_scales_on_the_ranks_own_device_type():
    """GradScaler("cuda") on a CPU rank disables itself: CPU fp16 would never overflow."""
    scaler = ddp.make_scaler("fp16", torch.device("cpu"))
    assert scaler is not None and scaler.is_enabled() and scaler.get_scale() == 2.0**16


def test_loaders_pin_memory_on_cuda_only():
    dataset = torch.utils.data.TensorDataset(torch.zeros(8, 2), torch.zeros(8))
    cfg = Config().data
    assert data.make_train_loader(dataset, cfg, gpu_rank(), seed=0).pin_memory
    cpu = dataclasses.replace(gpu_rank(), device="cpu")
    assert not data.make_train_loader(dataset, cfg, cpu, seed=0).pin_memory
    assert data.make_eval_loader(dataset, cfg, gpu_rank()).pin_memory


def test_the_guard_reads_late_on_cuda_only_when_stopping():
    from hpcddp.config import TrainConfig
    from hpcddp.train.guard import Guard

    assert Guard(TrainConfig(), "cuda", scaled=False).lagged
    assert not Guard(TrainConfig(nonfinite="skip"), "cuda", scaled=False).lagged
    assert not Guard(TrainConfig(), "cpu", scaled=False).lagged


def test_snapshot_buffers_are_pinned_for_device_tensors(monkeypatch):
    from tests.unit.test_pinned_chunks import FakeHostMemory

    memory = FakeHostMemory(monkeypatch)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: t.dim() == 2))
    snapshot.Snapshot().take({"on_cpu": torch.ones(3)})
    assert memory.registered == [] and memory.synced == 0  # a CPU run pins nothing
    snapshot.Snapshot().take({"on_gpu": torch.ones(2, 2), "on_cpu": torch.ones(3)})
    assert memory.registered == [1024] and memory.synced == 1  # one chunk, both buffers


def test_the_optimizer_is_fused_where_torch_has_the_kernel():
    from hpcddp.config import OptimConfig
    from hpcddp.train.optim import make_optimizer

    params = list(torch.nn.Linear(2, 2).parameters())
    assert make_optimizer(params, OptimConfig()).defaults["fused"] is True
    assert make_optimizer(params, OptimConfig(name="sgd")).defaults["fused"] is True
    assert make_optimizer(params, OptimConfig(fused=False)).defaults["fused"] is None
    ints = [torch.nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False)]
    assert make_optimizer(ints, OptimConfig()).defaults["fused"] is None
