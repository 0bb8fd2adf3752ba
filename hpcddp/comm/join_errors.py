"""Why a backend could not connect ranks that had met, and what to check: per backend and cause.

NCCL puts its reason after its first line: ``NCCL error in: ..., invalid usage ...`` then
``ncclInvalidUsage: ...``, ``Last error:`` and the cause itself ("Duplicate GPU detected : rank 1
and rank 0 both on CUDA device 3b000", an InfiniBand verb that failed, a socket that could not
connect). Keeping only the first line drops the one fact the user needs, and a firewall hint is
wrong for most of these. Pure text in, text out: no torch, so every cause is tested on CPU.
"""

import dataclasses
import re

MAX_REASON_LINES = 4  # NCCL's "Last error:" is one or two lines; a stack below it is noise


@dataclasses.dataclass(frozen=True)
class Cause:
    """One kind of failure: how its text reads, and what to check."""

    name: str
    pattern: re.Pattern[str]
    hint: str


NCCL_CAUSES = (
    Cause(
        "duplicate GPU",
        re.compile(r"Duplicate GPU detected", re.I),
        "two ranks of this job are on one GPU (MIG instances of one GPU count as one for "
        "NCCL): give each rank its own GPU (--gpus-per-task=1, or --gpus-per-node equal to "
        "--ntasks-per-node), or start fewer tasks per node",
    ),
    Cause(
        "InfiniBand",
        re.compile(r"\bibv_\w+|NET/IB\b|\bmlx5|IB(?:verbs)?\s*:|ib_plugin|\bRDMA\b", re.I),
        "NCCL's InfiniBand transport failed on that node: check its ports (ibstat, ibv_devinfo) "
        "and NCCL_IB_HCA; NCCL_IB_DISABLE=1 falls back to sockets (slower) to tell a bad link "
        "from a bad job",
    ),
    Cause(
        "socket",
        re.compile(
            r"socket\w*|Bootstrap|Connect to .* failed|Connection (refused|timed out|reset)|"
            r"NET/Socket|no socket interface|Software caused connection abort",
            re.I,
        ),
        "NCCL's sockets could not connect the nodes: they must reach each other on every port "
        "of the interface NCCL_SOCKET_IFNAME names (dist.socket_ifname picks another); "
        "NCCL_DEBUG=INFO prints which interface and address NCCL tried",
    ),
    Cause(
        "CUDA",
        re.compile(r"Cuda failure|ncclUnhandledCudaError|out of memory|CUDA error", re.I),
        "a CUDA call inside NCCL failed on that rank (GPU memory already full, or a GPU in a bad "
        "state): run nvidia-smi on that node",
    ),
)
NCCL_OTHER = (
    "rerun with NCCL_DEBUG=WARN (INFO for every step) to see NCCL's own log; `hpcddp check` "
    "with the same resources names the node"
)
NETWORK_HINT = (
    "the nodes must reach each other on every port of that interface (a firewall between "
    "nodes?); `hpcddp check` with the same resources names the node, and dist.socket_ifname "
    "picks another interface"
)


def reason(text: str) -> str:
    """The error's first line and, for NCCL, its ``Last error:`` lines, on one line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    kept = [lines[0]]
    if "Last error:" in lines[1:]:
        after = lines.index("Last error:", 1) + 1
        kept.append("Last error: " + " ".join(lines[after : after + MAX_REASON_LINES]))
    else:
        kept += [line for line in lines[1:MAX_REASON_LINES] if line.startswith("Last error:")]
    return "; ".join(kept)


def cause_of(backend: str, text: str) -> Cause | None:
    """The NCCL cause ``text`` reads as (None for gloo, and for an NCCL text of no known cause)."""
    if backend != "nccl":
        return None
    detail = text.split("Last error:", 1)[-1]  # NCCL's own reason decides, not the file names
    return next((cause for cause in NCCL_CAUSES if cause.pattern.search(detail)), None)


def hint(backend: str, text: str) -> str:
    """What to check for this backend and cause."""
    if backend != "nccl":
        return NETWORK_HINT
    cause = cause_of(backend, text)
    return cause.hint if cause else NCCL_OTHER
