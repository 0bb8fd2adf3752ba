"""`hpcddp check` counts the configured model on the meta device, grouped as fsdp shards it."""

import torch

from hpcddp.config import load_config
from hpcddp.train import model_size

BUILT_ON = []


class Stack(torch.nn.Module):
    """Three 10->10 layers (110 parameters each) in a ModuleList, then a 10->2 head (22)."""

    def __init__(self, width: int = 10) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(3))
        self.head = torch.nn.Linear(width, 2)
        BUILT_ON.append(self.head.weight.device.type)


def test_the_factory_is_counted_on_meta_with_its_blocks_and_root():
    cfg = load_config(None, [f"model.factory={__name__}:Stack", "model.kwargs={width: 10}"])
    assert model_size.measure(cfg) == {
        "params": 3 * 110 + 22,
        "param_bytes": 4,
        "largest_block_params": 110,
        "root_params": 22,
        "fsdp_builds_whole": True,  # no init_weights(): fsdp builds it whole first
    }
    assert BUILT_ON[-1] == "meta"  # no weights allocated


class SelfInitialising(Stack):
    def init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, torch.nn.Linear):
                module.reset_parameters()


def test_a_model_fsdp_builds_on_meta_is_not_said_to_be_built_whole():
    factory = f"model.factory={__name__}:SelfInitialising"
    assert not model_size.measure(load_config(None, [factory]))["fsdp_builds_whole"]
    off = load_config(None, [factory, "dist.fsdp_meta_init=false"])
    assert model_size.measure(off)["fsdp_builds_whole"]


def test_named_block_classes_are_the_blocks_as_under_fsdp():
    cfg = load_config(None, [f"model.factory={__name__}:Stack", "dist.fsdp_blocks=[Linear]"])
    measured = model_size.measure(cfg)  # the head is a block too: nothing left at the root
    assert (measured["largest_block_params"], measured["root_params"]) == (110, 0)


def test_a_ranks_room_is_its_gpus_free_memory_or_its_share_of_the_nodes_ram(monkeypatch):
    from types import SimpleNamespace

    from hpcddp.check import preflight

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (70 * 2**30, 80 * 2**30))
    monkeypatch.setattr(
        preflight.psutil, "virtual_memory", lambda: SimpleNamespace(available=90 * 2**30)
    )
    env = SimpleNamespace(local_world_size=3)
    on_gpu = preflight._model_room(env, torch.device("cuda:0"))
    assert on_gpu == {"model_room_bytes": 70 * 2**30, "model_room_kind": "GPU"}
    on_cpu = preflight._model_room(env, torch.device("cpu"))
    assert on_cpu == {"model_room_bytes": 30 * 2**30, "model_room_kind": "RAM"}
