"""Resume's load against a raw read, with and without populating the mapped pages first.

One 1.1 GB state, saved once; the arms alternate (raw read, load with `mapped.populate`, load
without it), each with the file evicted from the page cache first, so they see the same disk.
``python -m tests.benchmarks.load_populate [--size-mb 1100] [--runs 5]``
"""

import argparse
import pathlib
import statistics
import tempfile

from hpcddp.storage import mapped
from hpcddp.storage.checkpoint import CheckpointStore
from tests.benchmarks.checkpoints import FrozenBackbone, raw_read_s, resume_s


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.load_populate")
    parser.add_argument("--size-mb", type=float, default=1100.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as work:
        store = CheckpointStore(pathlib.Path(work) / "store", keep_last=1)
        model = FrozenBackbone(args.size_mb)
        path = store.save(1, {"model": model.state_dict(), "progress": {"step": 1}})
        populate, times = mapped.populate, {"raw": [], "populated": [], "faulted": []}
        for _ in range(args.runs):
            times["raw"].append(raw_read_s(path))
            mapped.populate = populate
            times["populated"].append(resume_s(store, path, model))
            mapped.populate = lambda tensor: None
            times["faulted"].append(resume_s(store, path, model))
        mapped.populate = populate
    raw = statistics.median(times["raw"])
    for arm, seconds in times.items():
        median = statistics.median(seconds)
        print(f"{arm:<10} median {median:6.3f} s  {median / raw:5.2f}x raw  runs {seconds}")


if __name__ == "__main__":
    main()
