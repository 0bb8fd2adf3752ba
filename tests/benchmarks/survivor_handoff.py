"""Issue 16 item 6, measured before built: can a replacement take its state from a survivor?

Usage::

    python -m tests.benchmarks.survivor_handoff                 # ~18 MB of state, 3 runs
    python -m tests.benchmarks.survivor_handoff --hidden 4096   # ~270 MB of state

Two ranks train a DDP MLP (gloo, AdamW) on data that is a pure function of (step, rank); a
checkpoint is written every ``--every`` steps. Rank 1 dies (``os._exit``) as its step
``--die-at`` starts. Two ways back, each from the moment of the death to the first step done
by the re-formed pair, side by side:

- **checkpoint**: what hpcddp does inside a job (issue 16 item 1): every rank ends, two fresh
  processes start, import torch, join, load the latest checkpoint, train. Lost: the steps since
  that checkpoint.
- **hand-off**: the survivor stays alive. Its failed collective raises; it leaves the broken
  group, forms a new one with a hot spare (a process started with the job, torch imported,
  waiting at the new group's store), and DDP's own start broadcasts the weights; the optimizer
  state and the step follow in one object broadcast. The step in flight was never applied (no
  rank reached ``optimizer.step``), so nothing is lost.

Both arms end at ``--steps``; their final weights are compared with an uninterrupted run's.
"lost s" is the time back plus the lost steps at the uninterrupted run's pace: what the death
cost the run. Not built into the trainer (see docs/resilience.md, "When a node fails").
"""

import argparse
import dataclasses
import datetime
import hashlib
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BATCH = 64
FEATURES, CLASSES = 64, 8
TIMEOUT = datetime.timedelta(seconds=60)


@dataclasses.dataclass(frozen=True)
class Plan:
    hidden: int
    steps: int
    every: int
    die_at: int


def make_model(hidden: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, CLASSES),
    )  # fmt: skip


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of ``step``: the same on every run, whoever computes it."""
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    inputs = torch.randn(BATCH, FEATURES, generator=gen)
    return inputs, (inputs[:, :CLASSES] > 0).long().argmax(dim=1)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, start: int, end: int, rank: int,
          on_step=None) -> None:  # fmt: skip
    for step in range(start, end):
        if on_step is not None:
            on_step(step)
        inputs, labels = batch(step, rank)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()


def weights_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for tensor in model.state_dict().values():
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def join(store_port: int, prefix: str, rank: int) -> None:
    store = dist.TCPStore("127.0.0.1", store_port, None, False, timeout=TIMEOUT)
    dist.init_process_group(
        "gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=2, timeout=TIMEOUT
    )


def note(work: pathlib.Path, name: str, value: object) -> None:
    (work / f"{name}.tmp").write_text(str(value))
    os.replace(work / f"{name}.tmp", work / name)


# -- the processes ------------------------------------------------------------------------------


def first_pair(plan: Plan, work: pathlib.Path, port: int, rank: int, handoff: bool) -> None:
    """Rank 0 or 1 of the pair that meets the death; rank 0 survives it in the hand-off arm."""
    join(port, "first", rank)
    model = DistributedDataParallel(make_model(plan.hidden))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def on_step(step: int) -> None:
        if rank == 0 and step and step % plan.every == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save({**state, "step": step}, work / "ckpt.tmp")
            os.replace(work / "ckpt.tmp", work / "ckpt.pt")
        if rank == 1 and step == plan.die_at:
            note(work, "died", time.time())
            os._exit(1)

    try:
        train(model, optimizer, 0, plan.steps, rank, on_step)
    except RuntimeError:
        note(work, "detected", time.time())
        if not handoff:
            os._exit(1)
        dist.destroy_process_group()
        join(port, "second", 0)
        resumed = DistributedDataParallel(model.module)  # broadcasts rank 0's weights
        box = [{"optimizer": optimizer.state_dict(), "step": plan.die_at}]
        dist.broadcast_object_list(box, src=0)
        optimizer = torch.optim.AdamW(resumed.parameters(), lr=1e-3)
        optimizer.load_state_dict(box[0]["optimizer"])
        finish(plan, work, resumed, optimizer, plan.die_at, 0)


def spare(plan: Plan, work: pathlib.Path, port: int) -> None:
    """Started with the job, torch imported, model built: waits to take rank 1's place."""
    model = make_model(plan.hidden)
    join(port, "second", 1)  # blocks until the survivor comes
    resumed = DistributedDataParallel(model)
    box: list = [None]
    dist.broadcast_object_list(box, src=0)
    optimizer = torch.optim.AdamW(resumed.parameters(), lr=1e-3)
    optimizer.load_state_dict(box[0]["optimizer"])
    finish(plan, work, resumed, optimizer, box[0]["step"], 1)


def restarted(plan: Plan, work: pathlib.Path, port: int, rank: int) -> None:
    """A fresh process of the checkpoint arm: join, load the latest checkpoint, train on."""
    join(port, "second", rank)
    state = torch.load(work / "ckpt.pt", weights_only=True)
    model = DistributedDataParallel(make_model(plan.hidden))
    model.module.load_state_dict(state["model"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.load_state_dict(state["optimizer"])
    finish(plan, work, model, optimizer, state["step"], rank)


def straight(plan: Plan, work: pathlib.Path, port: int, rank: int) -> None:
    join(port, "first", rank)
    model = DistributedDataParallel(make_model(plan.hidden))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    started = time.perf_counter()
    train(model, optimizer, 0, plan.steps, rank)
    if rank == 0:
        note(work, "step_s", (time.perf_counter() - started) / plan.steps)
        note(work, "digest", weights_digest(model.module))


def finish(plan, work, model, optimizer, start: int, rank: int) -> None:
    """Train from ``start`` to the end; rank 0 notes its first step's end, resumed step, digest."""
    train(model, optimizer, start, start + 1, rank)
    if rank == 0:
        note(work, "first_step", time.time())
        note(work, "resumed_at", start)
    train(model, optimizer, start + 1, plan.steps, rank)
    if rank == 0:
        note(work, "digest", weights_digest(model.module))


# -- the parent ----------------------------------------------------------------------------------


def spawn(plan: Plan, work: pathlib.Path, port: int, role: str, rank: int = 0) -> subprocess.Popen:
    args = [str(plan.hidden), str(plan.steps), str(plan.every), str(plan.die_at)]
    command = [sys.executable, "-m", "tests.benchmarks.survivor_handoff", "--role", role,
               str(work), str(port), str(rank), *args]  # fmt: skip
    return subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"})


def served_store() -> tuple[dist.TCPStore, int]:
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=TIMEOUT, wait_for_workers=False)
    return store, store.port


def wait_for(path: pathlib.Path, timeout_s: float = 300.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} never came")
        time.sleep(0.005)
    return path.read_text()


def run_arm(plan: Plan, arm: str, root: pathlib.Path) -> dict[str, float | str]:
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=root))
    _store, port = served_store()
    if arm == "straight":
        pair = [spawn(plan, work, port, "straight", r) for r in (0, 1)]
        for p in pair:
            p.wait()
        return {"digest": wait_for(work / "digest"), "step_s": float(wait_for(work / "step_s"))}
    handoff = arm == "hand-off"
    pair = [spawn(plan, work, port, f"first-{arm}", r) for r in (0, 1)]
    helpers = [spawn(plan, work, port, "spare")] if handoff else []
    died = float(wait_for(work / "died"))
    if not handoff:
        pair[0].wait()  # every rank ends; then two fresh processes
        helpers = [spawn(plan, work, port, "restarted", r) for r in (0, 1)]
    first = float(wait_for(work / "first_step"))
    for p in [*pair, *helpers]:
        p.wait()
    return {
        "detected_s": float(wait_for(work / "detected")) - died,
        "back_s": first - died,
        "lost_steps": plan.die_at - int(wait_for(work / "resumed_at")),
        "digest": wait_for(work / "digest"),
    }


def main() -> None:
    if sys.argv[1:2] == ["--role"]:
        role, work, port, rank, *numbers = sys.argv[2:]
        plan = Plan(*map(int, numbers))
        where, port_n, rank_n = pathlib.Path(work), int(port), int(rank)
        if role == "straight":
            straight(plan, where, port_n, rank_n)
        elif role.startswith("first-"):
            first_pair(plan, where, port_n, rank_n, handoff=role == "first-hand-off")
        elif role == "spare":
            spare(plan, where, port_n)
        else:
            restarted(plan, where, port_n, rank_n)
        return
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.survivor_handoff")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--die-at", type=int, default=140)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    plan = Plan(args.hidden, args.steps, args.every, args.die_at)
    state_mb = 3 * sum(p.numel() * 4 for p in make_model(plan.hidden).parameters()) / 1e6
    with tempfile.TemporaryDirectory(prefix="hpcddp-handoff-") as root:
        reference = run_arm(plan, "straight", pathlib.Path(root))
        results = {arm: [run_arm(plan, arm, pathlib.Path(root)) for _ in range(args.runs)]
                   for arm in ("checkpoint", "hand-off")}  # fmt: skip
    print(f"2 ranks (gloo, CPU), {state_mb:.0f} MB of weights + AdamW state, a checkpoint every "
          f"{plan.every} steps, rank 1 dies at step {plan.die_at}; medians of {args.runs}; "
          f"{reference['step_s'] * 1e3:.0f} ms a step")  # fmt: skip
    print(f"{'arm':<12}{'detected s':>12}{'back s':>10}{'lost steps':>12}{'lost s':>10}"
          "  weights = straight run")  # fmt: skip
    for arm, runs in results.items():
        med = {k: statistics.median(float(r[k]) for r in runs)
               for k in ("detected_s", "back_s", "lost_steps")}  # fmt: skip
        same = all(r["digest"] == reference["digest"] for r in runs)
        lost_s = med["back_s"] + med["lost_steps"] * float(reference["step_s"])
        print(f"{arm:<12}{med['detected_s']:>12.2f}{med['back_s']:>10.2f}"
              f"{med['lost_steps']:>12.0f}{lost_s:>10.2f}  {'yes' if same else 'NO'}")  # fmt: skip


if __name__ == "__main__":
    main()
