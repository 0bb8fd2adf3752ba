"""``hpcddp plot RUN_DIR``: a run's metrics.jsonl as one PNG (loss, learning rate, throughput).

matplotlib is an optional extra (``pip install 'hpcddp[plot]'``); it is imported only when a
plot is drawn, with the Agg backend, so this works on login nodes without a display.
"""

import json
import logging
import pathlib

from hpcddp.errors import HpcddpError

log = logging.getLogger(__name__)

PANELS = ("loss", "learning rate", "throughput (samples/s)")


class PlotError(HpcddpError):
    """The metrics cannot be read or the plot cannot be drawn."""


def read_metrics(path: pathlib.Path) -> tuple[list[dict], list[dict]]:
    """Split metrics.jsonl into training lines (with ``loss``) and eval lines (``eval_loss``).

    A damaged last line (a run killed mid-write) is skipped with a warning; one elsewhere raises.
    """
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise PlotError(
            f"no metrics file at {path}. HINT: pass the run directory (run.dir) of "
            "a run that logged at least one step."
        ) from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines):
                log.warning("%s: skipping the damaged last line %d (%s)", path, number, err.msg)
                break
            raise PlotError(
                f"{path} line {number} is not JSON ({err.msg}). HINT: the file "
                "may be truncated; remove the damaged line."
            ) from None
    train = [r for r in records if "loss" in r and "step" in r]
    evals = [r for r in records if "eval_loss" in r and "step" in r]
    if not train and not evals:
        raise PlotError(
            f"{path} holds no training or eval metrics. HINT: plot after the run "
            "has logged a step (train.log_every_steps)."
        )
    return train, evals


def _pyplot():
    """matplotlib's pyplot on the Agg backend, or a one-line error naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError(
            "plotting needs matplotlib, which is not installed. "
            "HINT: pip install 'hpcddp[plot]' (or pip install matplotlib)."
        ) from None
    return plt


def _series(records: list[dict], key: str) -> tuple[list, list]:
    """(steps, values) for the records that carry ``key``."""
    pairs = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [s for s, _ in pairs], [v for _, v in pairs]


def plot_run(run_dir: str | pathlib.Path, out: str | pathlib.Path | None = None) -> pathlib.Path:
    """Draw RUN_DIR/metrics.jsonl into a PNG (default RUN_DIR/metrics.png); return its path."""
    run_dir = pathlib.Path(run_dir)
    train, evals = read_metrics(run_dir / "metrics.jsonl")
    plt = _pyplot()
    out = pathlib.Path(out) if out else run_dir / "metrics.png"
    fig, (loss_ax, lr_ax, speed_ax) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    try:
        loss_ax.plot(*_series(train, "loss"), label="train", linewidth=1)
        loss_ax.plot(*_series(evals, "eval_loss"), "o-", label="eval", markersize=4)
        loss_ax.legend()
        lr_ax.plot(*_series(train, "lr"), color="tab:green")
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        speed_ax.plot(*_series(train, "samples_per_s"), color="tab:purple")
        for ax, title in zip((loss_ax, lr_ax, speed_ax), PANELS, strict=True):
            ax.set_ylabel(title)
            ax.grid(alpha=0.3)
        speed_ax.set_xlabel("optimizer step")
        fig.suptitle(f"{run_dir.resolve().name}: {_caption(train, evals)}")
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    except OSError as err:
        raise PlotError(
            f"could not write {out}: {err.strerror}. HINT: pass --out <a writable path>."
        ) from None
    finally:
        plt.close(fig)
    return out


def _caption(train: list[dict], evals: list[dict]) -> str:
    """The headline numbers: last step, last train loss, last eval loss and accuracy."""
    parts = [f"step {max(r['step'] for r in train + evals)}"]
    if train:
        parts.append(f"loss {train[-1]['loss']:.4g}")
    if evals:
        parts.append(f"eval loss {evals[-1]['eval_loss']:.4g}")
        if evals[-1].get("eval_accuracy") is not None:
            parts.append(f"accuracy {evals[-1]['eval_accuracy']:.4g}")
    return ", ".join(parts)
