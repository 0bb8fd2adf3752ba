"""What a run directory's checkpoints are (``hpcddp checkpoint inspect``) and the model's whole
weights out of the newest one (``hpcddp checkpoint export``), whole or sharded, on one process
without a process group.

Export reads only the model's tensors: of a sharded checkpoint, DCP reads each shard file into
the output tensors as it goes, so memory holds the output and one item's bytes, never the
optimizer state; each file it reads is checked against its digest on the way.
"""

import dataclasses
import json
import os
import pathlib
import warnings
from typing import Any

import torch

from hpcddp.errors import CheckpointError, ConfigError
from hpcddp.run_files import CHECKPOINTS
from hpcddp.storage import mapped, sharded
from hpcddp.storage.checkpoint import CheckpointStore
from hpcddp.storage.checkpoint_names import CHECKPOINT_NAME, MARKER, SHARDED_NAME, has_sidecar
from hpcddp.storage.sharded import ShardedStore
from hpcddp.storage.sharded_reader import VerifyingReader


@dataclasses.dataclass
class Found:
    """One checkpoint in a run directory."""

    step: int
    path: pathlib.Path
    kind: str  # "whole" (ddp, .pt) or "sharded" (fsdp, .dcp)
    complete: bool
    size_bytes: int
    world_size: int | None = None
    strategy: str = ""
    integrity: str = ""  # what was checked, and how it went


def inventory(run_dir: str | os.PathLike[str], verify: bool = False) -> list[Found]:
    """Every checkpoint and torn save in ``run_dir/checkpoints``, oldest first; ``verify`` reads
    each checkpoint's files against their digests (sharded ones' sizes: always)."""
    folder = pathlib.Path(run_dir) / CHECKPOINTS
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise ConfigError(
            f"no checkpoints folder in {run_dir} ({exc.strerror}). HINT: give the run's run.dir."
        ) from exc
    found = []
    for name in names:
        if whole := CHECKPOINT_NAME.match(name):
            complete = has_sidecar(name, set(names))  # of this version or an earlier one
            found.append(_whole(int(whole[1]), folder / name, complete, verify))
        elif sharded := SHARDED_NAME.match(name):
            found.append(_sharded(int(sharded[1]), folder / name, verify))
    return sorted(found, key=lambda f: f.step)


def _whole(step: int, path: pathlib.Path, complete: bool, verify: bool) -> Found:
    found = Found(step, path, "whole", complete, path.stat().st_size, strategy="ddp")
    try:
        found.world_size = int(mapped.load(path)["world_size"])
    except Exception as exc:  # unreadable: say so, list the rest
        found.integrity = f"unreadable ({type(exc).__name__})"
        return found
    if not verify:
        found.integrity = "digest not checked (--verify)" if complete else "no digest: torn"
        return found
    try:
        CheckpointStore(path.parent.parent).verify(path)
        found.integrity = "digest ok"
    except CheckpointError as exc:
        found.integrity = _bad(exc)
    return found


def _sharded(step: int, path: pathlib.Path, verify: bool) -> Found:
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    if not (path / MARKER).exists():
        return Found(step, path, "sharded", False, size, integrity="no marker: torn, never loaded")
    record = json.loads((path / MARKER).read_text())
    found = Found(
        step, path, "sharded", True, size, record.get("world_size"), record.get("strategy", "")
    )
    try:
        ShardedStore(path.parent.parent).check(path)
        found.integrity = _sharded_digests(path, record, verify)
    except CheckpointError as exc:
        found.integrity = _bad(exc)
    return found


def _sharded_digests(path: pathlib.Path, record: dict[str, Any], verify: bool) -> str:
    """The sharded checkpoint's digest status (sizes already checked); ``verify`` reads every
    file against its digest."""
    if "digests" not in record:
        return "file sizes ok, no digests (an earlier version)"
    if not verify:
        return f"file sizes ok, {len(record['digests'])} digests not checked (--verify)"
    for name in record["files"]:
        sharded.verify_file(path / name, record)
    return f"file sizes ok, {len(record['digests'])} digests ok"


def _bad(exc: CheckpointError) -> str:
    """A failed check as one table cell: the problem, without its HINT."""
    return f"BAD: {exc}".split(". HINT")[0]


def export(run_dir: str | os.PathLike[str], out: str | os.PathLike[str]) -> tuple[Found, int]:
    """The newest complete checkpoint's model weights, whole, as safetensors at ``out``;
    (which checkpoint, how many tensors)."""
    complete = [f for f in inventory(run_dir) if f.complete and not f.integrity.startswith("BAD")]
    if not complete:
        raise CheckpointError(
            f"no complete checkpoint in {run_dir}/checkpoints to export. HINT: give the "
            "run.dir of a run that saved one (hpcddp checkpoint inspect RUN_DIR lists them)."
        )
    newest = complete[-1]
    weights = (
        _sharded_weights(newest.path) if newest.kind == "sharded" else _whole_weights(newest.path)
    )
    try:
        from safetensors.torch import save_file
    except ImportError as exc:
        raise ConfigError(
            "exporting needs the safetensors package. HINT: pip install safetensors"
        ) from exc
    pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
    save_file(weights, os.fspath(out), metadata={"step": str(newest.step)})
    return newest, len(weights)


def _whole_weights(path: pathlib.Path) -> dict[str, torch.Tensor]:
    state = mapped.load(path)["model"]
    return {k: v.contiguous().clone() for k, v in state.items() if isinstance(v, torch.Tensor)}


def _sharded_weights(path: pathlib.Path) -> dict[str, torch.Tensor]:
    """Every ``model.*`` tensor of a DCP checkpoint, allocated whole and read in place."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    digests = ShardedStore(path.parent.parent).check(path).get("digests")
    reader = VerifyingReader(path, digests)  # the files it reads, checked as it reads them
    metadata = reader.read_metadata()
    model: dict[str, Any] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata):
            model[key.removeprefix("model.")] = torch.empty(meta.size, dtype=meta.properties.dtype)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"model": model}, storage_reader=reader, no_dist=True)
    return model
