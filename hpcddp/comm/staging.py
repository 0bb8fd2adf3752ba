"""Node-local staging: copy a dataset to the node's own disk once per node, before training.

Reading a dataset from a shared file system with every rank of every node, every epoch, is a
classic bottleneck; copying it to ``$TMPDIR`` (often a node-local SSD or RAM disk) once per node
is the usual cure. Here local rank 0 of each node copies, under the same guard as downloads
(`hpcddp.comm.download.main_process_first`): the others wait for it, and a failed copy is the
same error on every rank at once. The copy goes to a temporary name and is renamed into place,
with a small manifest beside it; a later attempt on the same node finds it and copies nothing,
unless the source changed.
"""

import json
import logging
import os
import pathlib
import shutil
import time

from hpcddp.comm.download import main_process_first
from hpcddp.errors import DownloadError

log = logging.getLogger(__name__)

STAGE_DIR_VAR = "HPCDDP_STAGE_DIR"


def default_root() -> pathlib.Path:
    """``$HPCDDP_STAGE_DIR``, else ``$TMPDIR`` (Slurm sites often make it node-local), else /tmp."""
    base = os.environ.get(STAGE_DIR_VAR) or os.environ.get("TMPDIR") or "/tmp"
    return pathlib.Path(base) / "hpcddp-stage"


def manifest(source: pathlib.Path) -> dict[str, int]:
    """What a copy must match: number of files, total bytes, newest modification time."""
    files = [source] if source.is_file() else [p for p in source.rglob("*") if p.is_file()]
    stats = [p.stat() for p in files]
    return {
        "files": len(stats),
        "bytes": sum(s.st_size for s in stats),
        "mtime_ns": max((s.st_mtime_ns for s in stats), default=0),
    }


def _marker(dest: pathlib.Path) -> pathlib.Path:
    return dest.with_name(f"{dest.name}.hpcddp-staged")


def _is_current(dest: pathlib.Path, wanted: dict[str, int]) -> bool:
    try:
        return dest.exists() and json.loads(_marker(dest).read_text()) == wanted
    except (OSError, ValueError):
        return False


def _copy(source: pathlib.Path, dest: pathlib.Path, wanted: dict[str, int]) -> None:
    """Copy to a temporary name beside ``dest``, then rename: a copy is whole or absent."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    started = time.perf_counter()
    if source.is_dir():
        shutil.copytree(source, tmp)
    else:
        shutil.copy2(source, tmp)
    _marker(dest).unlink(missing_ok=True)
    if dest.is_dir():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    _marker(dest).write_text(json.dumps(wanted))
    log.info(
        "staged %s to %s (%.1f MB in %.1f s)",
        source,
        dest,
        wanted["bytes"] / 1e6,
        time.perf_counter() - started,
    )


def stage(
    source: str | os.PathLike[str],
    into: str | os.PathLike[str] | None = None,
    *,
    timeout_s: float = 1800.0,
) -> pathlib.Path:
    """Copy ``source`` (a file or a directory) to node-local ``into``, once per node.

    Returns the local copy's path on every rank: ``into/<name of source>``, with ``into``
    defaulting to `default_root`. Call it from your dataset factory, as every rank does.
    """
    source = pathlib.Path(source).absolute()
    if not source.exists():
        raise DownloadError(
            f"cannot stage {source}: it does not exist. HINT: check the path from this node."
        )
    dest = pathlib.Path(into or default_root()).absolute() / source.name
    wanted = manifest(source)
    with main_process_first(local=True, timeout_s=timeout_s, description=f"staging of {source}"):
        if not _is_current(dest, wanted):
            _copy(source, dest, wanted)
    return dest
