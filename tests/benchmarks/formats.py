"""Which file format a checkpoint is streamed in: the figures behind the choice.

Usage::

    python -m tests.benchmarks.formats              # a 1.1 GB state, 3 rounds: about a minute
    python -m tests.benchmarks.formats --size-mb 256 --runs 5 --dir /scratch/$USER/bench

Each writer stores the same state (17 tensors of 64 MB at the default size) durably (fsync at
the end) and must end with a digest of the file, because resume refuses a file it cannot
verify. Writers, in rounds (each round runs every writer once, in turn; medians):

- raw: ``os.write`` of the tensor bytes + fsync, no format at all: the ceiling;
- torch zip via the store: `CheckpointStore.save`, ``torch.save`` streaming into a sink that
  hashes on a helper thread while writing (what hpcddp does);
- torch.save to a path, then a second pass to hash it;
- safetensors ``save_file`` (it writes a path itself: no sink to hash through), then a hash pass;
- ``torch.distributed.checkpoint.save`` (no process group), then a hash pass over its files.

MB = 10^6 bytes of tensor data.
"""

import argparse
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import torch

from hpcddp.storage import atomic, digest
from hpcddp.storage.checkpoint import CheckpointStore


def _fsync(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _hash_files(root: pathlib.Path) -> None:
    """The store's digest (XXH3-128) of every file: what resume needs to verify them."""
    for path in sorted(root.rglob("*")) if root.is_dir() else [root]:
        if path.is_file():
            digest.of_file(path)


def raw(state: dict, out: pathlib.Path) -> None:
    fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o644)
    for tensor in state.values():
        atomic.write_all(fd, memoryview(tensor.numpy()).cast("B"))
    os.fsync(fd)
    os.close(fd)


def store(state: dict, out: pathlib.Path) -> None:
    CheckpointStore(out).save(1, state)


def torch_path(state: dict, out: pathlib.Path) -> None:
    torch.save(state, out)
    _fsync(out)
    _hash_files(out)


def safetensors_file(state: dict, out: pathlib.Path) -> None:
    from safetensors.torch import save_file

    save_file(state, out)
    _fsync(out)
    _hash_files(out)


def dcp(state: dict, out: pathlib.Path) -> None:
    import torch.distributed.checkpoint as checkpoint

    checkpoint.save(state, checkpoint_id=out, no_dist=True)
    for path in out.rglob("*"):
        if path.is_file():
            _fsync(path)
    _hash_files(out)


WRITERS = {
    "raw write + fsync (no format)": raw,
    "torch zip, hashed while written (hpcddp)": store,
    "torch.save to a path + hash pass": torch_path,
    "safetensors save_file + hash pass": safetensors_file,
    "torch.distributed.checkpoint + hash pass": dcp,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.formats")
    parser.add_argument("--size-mb", type=float, default=1100.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    count = max(round(args.size_mb / 64), 1)
    state = {f"layer{i}": torch.full((16_000_000,), float(i)) for i in range(count)}
    nbytes = sum(t.nbytes for t in state.values())
    seconds: dict[str, list[float]] = {name: [] for name in WRITERS}
    with tempfile.TemporaryDirectory(prefix="hpcddp-formats-", dir=args.dir) as tmp:
        for _ in range(args.runs):
            for name, write in WRITERS.items():
                out = pathlib.Path(tmp) / "out"
                started = time.perf_counter()
                write(state, out)
                seconds[name].append(time.perf_counter() - started)
                shutil.rmtree(out) if out.is_dir() else out.unlink()
    ceiling = statistics.median(seconds[next(iter(WRITERS))])
    print(f"{nbytes / 1e6:.0f} MB of tensors, median of {args.runs}; MB/s and share of raw")
    for name, times in seconds.items():
        median = statistics.median(times)
        print(f"  {name:<44}{nbytes / 1e6 / median:>8.0f} MB/s {ceiling / median:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
