"""Bad config files, values and paths through the real command line: one line, exit 2, fast.

Every case runs ``python -m hpcddp train ...`` as a user would, and is refused before torch is
even imported: one ``hpcddp: error: ...`` line naming what is wrong and the fix, exit status 2,
no traceback, and nothing written.
"""

import pathlib
import time

import pytest

from hpcddp.config import load_config
from hpcddp.errors import ConfigError
from tests.fixtures.helpers import QUICKSTART, REPO, run_cli


def alias_bomb(levels: int = 9, width: int = 9) -> list[str]:
    """ "Billion laughs": each level lists the previous one ``width`` times (9**9 values)."""
    entries = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    entries += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return entries


BOMB = "\n".join(alias_bomb()) + "\n"
FLOW_BOMB = "{" + ", ".join(alias_bomb()) + "}"
DEEP = "data:\n  kwargs:\n    deep: " + "[" * 400 + "]" * 400 + "\n"

# (id, files to write into the test folder, argv after `train` ({t}: that folder), words)
CASES = [
    ("alias-bomb", {"c.yaml": BOMB}, ["{t}/c.yaml"], "expands to more than 100000 values"),
    ("duplicate-section", {"c.yaml": "optim: {lr: 0.1}\noptim: {lr: 0.2}\n"}, ["{t}/c.yaml"],
     "at line 2, column 1 has the key 'optim' twice (first at line 1)"),
    ("duplicate-key", {"c.yaml": "optim:\n  lr: 0.1\n  lr: 0.2\n"}, ["{t}/c.yaml"],
     "has the key 'lr' twice"),
    ("not-utf8", {"c.yaml": b"run:\n  name: caf\xe9\n"}, ["{t}/c.yaml"],
     "is not UTF-8 text (byte 0xe9 on line 2)"),
    ("absurd-nesting", {"c.yaml": DEEP}, ["{t}/c.yaml"], "nests deeper than 64 levels"),
    ("nan-in-yaml", {"c.yaml": "optim: {grad_clip_norm: .nan}\n"}, ["{t}/c.yaml"],
     "optim.grad_clip_norm must be a finite number, got nan"),
    ("inf-override", {}, [QUICKSTART, "optim.lr=.inf"], "optim.lr must be a finite number"),
    ("nan-text-override", {}, [QUICKSTART, "dist.timeout_s=nan"],
     "dist.timeout_s must be a finite number"),
    ("negative-min-lr-ratio", {}, [QUICKSTART, "optim.min_lr_ratio=-0.1"],
     "optim.min_lr_ratio must be between 0 and 1, got -0.1"),
    ("min-lr-ratio-above-one", {}, [QUICKSTART, "optim.min_lr_ratio=2"],
     "optim.min_lr_ratio must be between 0 and 1"),
    ("momentum-above-one", {}, [QUICKSTART, "optim.momentum=1.5"],
     "optim.momentum must be between 0 and 1"),
    ("config-is-dev-zero", {}, ["/dev/zero"], "is larger than 1 MiB, so it is not a config"),
    ("config-is-a-directory", {}, ["{t}"], "Is a directory"),
    ("empty-run-dir", {}, [QUICKSTART, "run.dir="], "run.dir is empty"),
    ("blank-run-dir", {}, [QUICKSTART, "run.dir=  "], "run.dir is empty"),
    ("nul-in-run-dir", {"c.yaml": 'run: {dir: "runs/a\\0b"}\n'}, ["{t}/c.yaml"],
     "run.dir contains a NUL byte"),
    ("nproc-zero", {}, [QUICKSTART, "--nproc", "0"], "--nproc must be >= 1, got 0"),
    ("nproc-negative", {}, [QUICKSTART, "--nproc", "-3"], "--nproc must be >= 1, got -3"),
    ("unknown-launcher", {}, [QUICKSTART, "slurm.launcher=mpirun"],
     "slurm.launcher='mpirun' is not one of ['srun', 'torchrun']"),
    ("bool-for-int", {}, [QUICKSTART, "train.epochs=true"], "train.epochs must be int"),
    ("list-for-float", {}, [QUICKSTART, "optim.lr=[1, 2]"], "optim.lr must be float, got list"),
    ("override-alias-bomb", {}, [QUICKSTART, "data.kwargs=" + FLOW_BOMB],
     "expands to more than 100000 values"),
]  # fmt: skip


@pytest.mark.parametrize("files, argv, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config_is_one_line_and_exit_2(tmp_path, files, argv, words):
    for name, content in files.items():
        path = tmp_path / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    cwd = tmp_path / "cwd"  # where a run with an empty or relative run.dir would write
    cwd.mkdir()
    before = sorted(tmp_path.rglob("*"))
    args = [arg.replace("{t}", str(tmp_path)).replace(QUICKSTART, str(REPO / QUICKSTART))
            for arg in argv]  # fmt: skip
    started = time.monotonic()
    done = run_cli("train", *args, timeout=30, cwd=cwd)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("hpcddp: error: "), done.stderr
    assert words in lines[0] and "HINT: " in lines[0], lines[0]
    assert sorted(tmp_path.rglob("*")) == before  # nothing written
    assert time.monotonic() - started < 20  # refused at once, never after a long expansion


def test_tilde_in_run_dir_is_the_home_directory():
    assert load_config(None, ["run.dir=~/runs/x"]).run.dir == str(pathlib.Path.home() / "runs/x")


def test_nul_in_the_config_path_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="contains a NUL byte. HINT: fix the path"):
        load_config("examples/quick\x00start.yaml")


def test_a_config_whose_name_holds_an_equals_sign_is_still_the_config(tmp_path):
    odd = tmp_path / "lr=0.1.yaml"
    odd.write_text((REPO / QUICKSTART).read_text())
    done = run_cli("train", str(odd), "run.dir=", timeout=30)  # refused later, for run.dir
    assert "run.dir is empty" in done.stderr, done.stderr


def test_anchors_and_merge_keys_still_work(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "optim: &o {lr: 0.01, warmup_steps: 3}\ndata:\n  kwargs: {a: *o, b: {<<: *o, lr: 0.5}}\n"
    )
    loaded = load_config(config)
    assert loaded.optim.lr == 0.01 and loaded.data.kwargs["b"] == {"lr": 0.5, "warmup_steps": 3}
