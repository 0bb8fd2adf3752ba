"""The local launch's zygote loads nothing that would spoil a forked rank.

A process that has asked CUDA anything (``torch.cuda.is_available()`` initialises the driver)
cannot fork a child that uses a GPU: the child's first CUDA call fails. Nor may the zygote leave
a thread running into the fork. So what it loads for every rank (`hpcddp.cli.zygote.PRELOAD`)
is loaded here in a fresh interpreter with CUDA's entry points watched.
"""

import json
import subprocess
import sys

from hpcddp.cli import zygote
from tests.fixtures.helpers import REPO

WATCHED = """
import json, sys, threading
import torch

asked = []
def watched(name, call):
    def asking(*args, **kwargs):
        asked.append(name)
        return call(*args, **kwargs)
    return asking

for name in ("is_available", "device_count", "init", "_lazy_init", "current_device",
             "get_device_properties", "get_device_name", "mem_get_info", "set_device"):
    setattr(torch.cuda, name, watched(name, getattr(torch.cuda, name)))
for name in ("_cuda_getDeviceCount", "_cuda_init"):
    if hasattr(torch._C, name):
        setattr(torch._C, name, watched(name, getattr(torch._C, name)))
from hpcddp.cli.zygote import PRELOAD
import importlib
for module in PRELOAD:
    importlib.import_module(module)
print(json.dumps({"asked": asked, "threads": threading.active_count()}))
"""


def test_the_preload_asks_nothing_of_cuda_and_leaves_no_python_thread():
    assert zygote.PRELOAD[0] == "torch"  # watched from right after torch itself is loaded
    done = subprocess.run(
        [sys.executable, "-c", WATCHED], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found == {"asked": [], "threads": 1}, found
