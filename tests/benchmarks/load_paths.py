"""Resume's load against a raw read: today's one read into place against the two passes before.

One 1.1 GB state, saved once; the arms alternate, each with the file evicted from the page
cache first, so they see the same disk:

- **raw**: ``readinto`` of the file through one 8 MB buffer (no hash, no model);
- **into place** (`benchmarks.checkpoints.resume_s`, what local rank 0 does): map the file,
  read each weight's bytes straight into the model while hashing the file;
- **hash beside copy** (what it did before): hash the file on a helper thread while the
  mapped weights are copied into the model, each 16 MB populated first (`mapped.populate`).

``python -m tests.benchmarks.load_paths [--size-mb 1100] [--runs 5]``
"""

import argparse
import concurrent.futures
import pathlib
import statistics
import tempfile
import time

import torch

from hpcddp.storage import mapped
from hpcddp.storage.checkpoint import CheckpointStore
from tests.benchmarks.checkpoints import FrozenBackbone, evict, raw_read_s, resume_s


def hash_beside_copy_s(store: CheckpointStore, path: pathlib.Path, model: torch.nn.Module) -> float:
    """The resume before the read into place: the digest on a helper thread, the copy here."""
    evict(path)
    with torch.no_grad():
        for weight in model.state_dict().values():
            weight.zero_()
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        check = pool.submit(store.verify, path)
        if not mapped.copy_into(model.state_dict(), store.load_verified(path)["model"]):
            raise RuntimeError("the checkpoint does not fit the model")
        check.result()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.load_paths")
    parser.add_argument("--size-mb", type=float, default=1100.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as work:
        store = CheckpointStore(pathlib.Path(work) / "store", keep_last=1)
        model = FrozenBackbone(args.size_mb)
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        path = store.save(1, {"model": model.state_dict(), "progress": {"step": 1}})
        times: dict[str, list[float]] = {"raw": [], "into place": [], "hash beside copy": []}
        for _ in range(args.runs):
            times["raw"].append(raw_read_s(path))
            times["into place"].append(resume_s(store, path, model))
            _check(model, expected)
            times["hash beside copy"].append(hash_beside_copy_s(store, path, model))
            _check(model, expected)
    raw = statistics.median(times["raw"])
    print(f"{args.size_mb:.0f} MB state, {args.runs} runs of each, alternated, file evicted")
    for arm, seconds in times.items():
        median = statistics.median(seconds)
        rounded = [round(s, 3) for s in seconds]
        print(f"{arm:<17} median {median:6.3f} s  {median / raw:5.2f}x raw  runs {rounded}")


def _check(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    """Each arm must have loaded the weights, not only read the file."""
    for key, tensor in model.state_dict().items():
        if not torch.equal(tensor, expected[key]):
            raise RuntimeError(f"{key} was not restored")


if __name__ == "__main__":
    main()
