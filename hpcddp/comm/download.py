"""Guarded downloads: one process fetches, the others wait, and a failure reaches every rank.

The classic bug (Megatron-DeepSpeed#48): rank 0 downloads under ``if rank == 0`` while the
others sit in ``barrier()``; when the download fails, rank 0 dies and the rest hang until the
barrier times out, often half an hour later. Here the waiting is not a barrier but an exchange
of outcomes that the fetching process joins whether its work succeeded or not, over a gloo
group with its own long timeout, so a failure becomes the same `DownloadError` on every rank
within moments. Without an initialized process group (or in a world of one) the work simply runs.
"""

import contextlib
import dataclasses
import hashlib
import http.client
import logging
import os
import pathlib
import re
import secrets
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import IO, TYPE_CHECKING

import torch.distributed as dist

from hpcddp.comm.sidegroup import side_group
from hpcddp.errors import DownloadError, HpcddpError
from hpcddp.progress import ProgressBar, bar

if TYPE_CHECKING:
    from hpcddp.launch.distenv import DistEnv

log = logging.getLogger(__name__)

SCHEMES = ("http", "https", "file")
CHUNK_BYTES = 1 << 20
SOCKET_TIMEOUT_S = 60.0  # one stalled read, not the whole download (that is timeout_s)
VISIBLE_WAIT_S = 10.0  # a shared file system may show another node's rename a little late

_FETCH_HINT = (
    "HINT: check that the URL is right and reachable from this node (`curl -fI URL`); compute "
    "nodes are often offline, so fetch the file once on a login node and pass a file:// URL."
)

# timeout_s -> (default group, status group made under it). Making a group is itself a
# collective, so every rank must ask for the same timeouts in the same order. Weak references:
# torch drops its groups when the default group is destroyed, and a group kept alive past that
# can abort the process at exit ("terminate called without an active exception").


# --- the guard --------------------------------------------------------------------------------


@contextlib.contextmanager
def main_process_first(
    local: bool = False,
    timeout_s: float = 1800.0,
    description: str = "work",
    *,
    env: "DistEnv | None" = None,
) -> Iterator[None]:
    """Run the body on one process first (rank 0, or local rank 0 of each node if ``local``),
    then on the others; if it raises there, every rank raises the same `DownloadError` at once.

    Without a process group the body just runs and its exceptions pass through unchanged.
    """
    with _first(local, timeout_s, description, env):
        yield


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """What each rank tells all the others once the first process is done: where it sits and,
    on a fetching rank, how the body went."""

    rank: int
    host: str
    node: str
    fetcher: bool
    description: str  # each rank words the failure with the fetcher's, so all messages match
    error: str | None = None  # the body failed on this (fetching) rank
    problem: str | None = None  # this rank could not tell where it sits


@contextlib.contextmanager
def _first(
    local: bool, timeout_s: float, description: str, env: "DistEnv | None"
) -> Iterator[bool]:
    """Yield True on the process that goes first (or the only one), False on those that wait."""
    if not _distributed():
        yield True
        return
    group = _status_group(timeout_s, description)
    seat = _seat(env, local, description, os.environ)
    if not seat.fetcher:
        verdict = _exchange(seat, group, local, timeout_s)
        if verdict is not None:
            raise DownloadError(verdict)
        yield False
        return
    error: BaseException | None = None
    try:
        yield True
    except BaseException as exc:  # the others must hear about any failure, even Ctrl-C
        error = exc
    told = dataclasses.replace(seat, error=None if error is None else _describe(error))
    verdict = _exchange(told, group, local, timeout_s)
    if error is not None and not isinstance(error, Exception):
        raise error
    if verdict is not None:
        raise DownloadError(verdict) from error


def _distributed() -> bool:
    """True when there are other ranks to coordinate with."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _status_group(timeout_s: float, description: str) -> dist.ProcessGroup:
    """The gloo side group (`hpcddp.comm.sidegroup`), with a timeout that suits downloads."""
    try:
        group = side_group(timeout_s)
    except Exception as err:  # torch raises several unrelated types here
        raise DownloadError(
            f"{description}: could not create the gloo group that guards it: {err}. HINT: every "
            "rank must call the guard in the same order with the same timeout_s."
        ) from err
    if group is None:
        raise DownloadError(f"{description}: no process group to guard it with")
    return group


def _seat(
    env: "DistEnv | None", local: bool, description: str, environ: Mapping[str, str]
) -> _Outcome:
    """Where this rank sits: from ``env`` if given, else from torch and the launcher's variables."""
    rank = dist.get_rank()
    if env is not None:
        problem = (
            None if env.rank == rank else (f"rank {rank} was passed a DistEnv for rank {env.rank}")
        )
        return _Outcome(
            rank,
            env.hostname,
            str(env.node_rank),
            problem is None and (env.local_rank == 0 if local else rank == 0),
            description,
            problem=problem,
        )
    host = socket.gethostname()
    node = environ.get("GROUP_RANK") or host  # node-local storage is per host by definition
    if not local:
        return _Outcome(rank, host, node, rank == 0, description)
    local_rank = environ.get("LOCAL_RANK", "")
    if not local_rank.isdigit():
        return _Outcome(
            rank,
            host,
            node,
            False,
            description,
            problem=(
                f"rank {rank} ({host}) has LOCAL_RANK={local_rank!r}, so it cannot tell whether "
                "it fetches for its node"
            ),
        )
    return _Outcome(rank, host, node, int(local_rank) == 0, description)


def _exchange(
    seat: _Outcome, group: dist.ProcessGroup, local: bool, timeout_s: float
) -> str | None:
    """Every rank shares its outcome; return the failure message (the same on every rank)."""
    outcomes: list[_Outcome | None] = [None] * dist.get_world_size(group)
    if not seat.fetcher:
        log.info("rank %d waits for %s on another rank", seat.rank, seat.description)
    try:
        dist.all_gather_object(outcomes, seat, group=group)
    except Exception as err:  # a timeout or a peer that died; torch raises several types
        raise DownloadError(
            f"{seat.description}: rank {seat.rank} ({seat.host}) gave up waiting for the other "
            f"ranks after at most {timeout_s:.0f} s: {err}. HINT: if the work is just slow, raise "
            "timeout_s; otherwise a rank died or skipped the guard, see its log."
        ) from err
    return _verdict([o for o in outcomes if o is not None], local)


def _verdict(outcomes: list[_Outcome], local: bool) -> str | None:
    """The first thing that went wrong anywhere, worded identically on every rank, or None."""
    problems = [o for o in outcomes if o.problem]
    if problems:
        first = problems[0]
        return (
            f"{first.description}: {first.problem}. HINT: launch with torchrun or `hpcddp "
            "train`, which export LOCAL_RANK, or pass env=resolve_env(os.environ)."
        )
    layout = _layout_problem(outcomes) if local else None
    if layout:
        return f"{outcomes[0].description}: {layout}"
    failed = [o for o in outcomes if o.error is not None]
    if not failed:
        return None
    first = failed[0]
    more = (
        f" (fetching ranks {', '.join(str(o.rank) for o in failed[1:])} failed too)"
        if len(failed) > 1
        else ""
    )
    return f"{first.description} failed on rank {first.rank} ({first.host}){more}: {first.error}"


def _layout_problem(outcomes: list[_Outcome]) -> str | None:
    """With local=True every node needs exactly one fetching rank (its local rank 0)."""
    fetchers: dict[str, list[int]] = {}
    for o in outcomes:
        fetchers.setdefault(o.node, [])
        if o.fetcher:
            fetchers[o.node].append(o.rank)
    wrong = {node: ranks for node, ranks in fetchers.items() if len(ranks) != 1}
    if not wrong:
        return None
    seen = "; ".join(f"node {node}: ranks {ranks}" for node, ranks in sorted(wrong.items()))
    return (
        f"every node needs exactly one rank with local rank 0, but saw {seen}. HINT: "
        "LOCAL_RANK and GROUP_RANK (or the DistEnv passed) disagree with the real layout."
    )


def _describe(error: BaseException) -> str:
    """The failure as the other ranks will read it; our own errors already explain themselves."""
    if isinstance(error, HpcddpError):
        return str(error)
    return f"{type(error).__name__}: {error}"


# --- the download -----------------------------------------------------------------------------


def download(
    url: str,
    dest: str | os.PathLike,
    sha256: str | None = None,
    *,
    local: bool = False,
    timeout_s: float = 1800.0,
    env: "DistEnv | None" = None,
) -> pathlib.Path:
    """Fetch an http(s):// or file:// URL to ``dest`` once (per job, or per node if ``local``).

    An existing ``dest`` whose checksum matches (or any ``dest`` when ``sha256`` is None) is kept
    without touching the network. Data lands under a temporary name beside ``dest`` and is
    renamed into place only after its checksum is verified. Ranks that wait trust the fetching
    rank's check rather than each reading the file again. Returns ``dest`` on every rank.
    The fetching rank draws a progress bar on a terminal, and logs one line when done.
    """
    dest = pathlib.Path(dest)
    expected = _expected_digest(sha256)
    _check_scheme(url)
    with _first(local, timeout_s, f"download of {url}", env) as first:
        if first:
            _ensure(url, dest, expected)
        else:
            _await_visible(dest, local)
    return dest


def _expected_digest(sha256: str | None) -> str | None:
    """Accept a hex digest in any case; refuse anything that cannot be one."""
    if sha256 is None:
        return None
    digest = sha256.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise DownloadError(
            f"sha256={sha256!r} is not a SHA-256 hex digest (64 hex digits). "
            "HINT: compute it with `sha256sum FILE`."
        )
    return digest


def _check_scheme(url: str) -> None:
    """Only URLs we know how to stream, checked before any rank starts waiting."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in SCHEMES:
        raise DownloadError(
            f"cannot download {url!r}: scheme {scheme!r} is not one of "
            f"{', '.join(SCHEMES)}. HINT: write local paths as file:///abs/path."
        )


def _ensure(url: str, dest: pathlib.Path, expected: str | None) -> None:
    """Keep a good ``dest``; otherwise fetch to a temporary name, verify, rename into place."""
    if dest.is_file():
        if expected is None:
            log.info("%s exists; not downloading %s (no sha256 given to check it)", dest, url)
            return
        actual = _file_digest(dest)
        if actual == expected:
            log.info("%s exists with the expected sha256; not downloading", dest)
            return
        log.warning("%s has sha256 %s, expected %s; downloading it again", dest, actual, expected)
    tmp = _open_temp(dest)
    try:
        with tmp.open("wb") as out:
            actual = _fetch(url, out, dest.name)
        if expected is not None and actual != expected:
            raise DownloadError(
                f"checksum mismatch for {url}: expected sha256 {expected}, got {actual}; "
                f"{dest} was not created. HINT: the file on the server changed or the expected "
                "digest is wrong; check it with `sha256sum` and update sha256."
            )
        os.replace(tmp, dest)
    except OSError as err:
        raise DownloadError(
            f"could not write {dest}: {err}. HINT: check free space and write "
            f"permission in {dest.parent}."
        ) from err
    finally:
        tmp.unlink(missing_ok=True)


def _open_temp(dest: pathlib.Path) -> pathlib.Path:
    """A fresh temporary file beside ``dest`` (same file system, so the rename is atomic)."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(
            f".{dest.name}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}.part"
        )
        # os.open with 0o666 honours the umask, unlike tempfile's private 0o600.
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    except OSError as err:
        raise DownloadError(
            f"could not create a file in {dest.parent}: {err}. HINT: check that "
            "the directory is writable."
        ) from err
    return tmp


def _fetch(url: str, out: IO[bytes], name: str) -> str:
    """Stream ``url`` into ``out`` in chunks; return the sha256 of what arrived."""
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=SOCKET_TIMEOUT_S) as response:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            bar = _Progress(name, total)
            while chunk := response.read(CHUNK_BYTES):
                digest.update(chunk)
                out.write(chunk)
                bar.update(len(chunk))
            bar.close()
    except urllib.error.HTTPError as err:
        raise DownloadError(
            f"could not fetch {url}: HTTP {err.code} {err.reason}. {_FETCH_HINT}"
        ) from err
    except urllib.error.URLError as err:
        raise DownloadError(f"could not fetch {url}: {err.reason}. {_FETCH_HINT}") from err
    except (http.client.HTTPException, TimeoutError, ConnectionError, ssl.SSLError) as err:
        raise DownloadError(
            f"could not fetch {url}: {type(err).__name__}: {err}. {_FETCH_HINT}"
        ) from err
    if total is not None and bar.done != total:
        raise DownloadError(
            f"could not fetch {url}: the connection closed after {bar.done} of "
            f"{total} bytes. {_FETCH_HINT}"
        )
    return digest.hexdigest()


def _file_digest(path: pathlib.Path) -> str:
    """sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _await_visible(dest: pathlib.Path, local: bool) -> None:
    """After the fetching rank succeeded, ``dest`` must be visible here too."""
    deadline = time.monotonic() + VISIBLE_WAIT_S
    while not dest.is_file():
        if time.monotonic() > deadline:
            where = "this node's local rank 0" if local else "rank 0"
            raise DownloadError(
                f"{dest} is missing on rank {dist.get_rank()} ({socket.gethostname()}) although "
                f"{where} downloaded it. HINT: {dest.parent} is not shared with that rank; pass "
                "local=True for node-local storage, or choose a shared directory."
            )
        os.listdir(dest.parent)  # listing a directory makes NFS revalidate its cached entries
        time.sleep(0.2)


# --- progress ---------------------------------------------------------------------------------


class _Progress:
    """Download progress: a `ProgressBar` (drawn only on a terminal; a batch log would fill with
    redraws), elsewhere one log line when done. Only the fetching rank ever makes one."""

    def __init__(
        self, name: str, total: int | None, enabled: bool = True, stream: IO[str] | None = None
    ) -> None:
        self.name, self.total, self.done = name, total, 0
        self.bar = ProgressBar(enabled, stream)
        self.started = time.monotonic()

    def update(self, n_bytes: int) -> None:
        """Count bytes; the bar redraws when its last redraw is old enough."""
        self.done += n_bytes
        if self.bar.drawing:
            self.bar.update(self._line())

    def close(self) -> None:
        """Final state: a last redraw and newline on a terminal, else a log line."""
        if self.bar.drawing:
            self.bar.update(self._line(), force=True)
            self.bar.close()
            return
        elapsed = time.monotonic() - self.started
        log.info(
            "downloaded %s: %.1f MB in %.1f s (%.1f MB/s)",
            self.name,
            self.done / 1e6,
            elapsed,
            self.done / 1e6 / max(elapsed, 1e-9),
        )

    def _line(self) -> str:
        return bar_line(self.name, self.done, self.total, time.monotonic() - self.started)


def bar_line(name: str, done: int, total: int | None, elapsed_s: float, width: int = 30) -> str:
    """``name [#####-----] 12.3/45.6 MB 7.8 MB/s``; without a total, no bar."""
    rate = done / 1e6 / max(elapsed_s, 1e-9)
    if not total:
        return f"{name} {done / 1e6:.1f} MB {rate:.1f} MB/s"
    return f"{name} {bar(done, total, width)} {done / 1e6:.1f}/{total / 1e6:.1f} MB {rate:.1f} MB/s"
