"""The run's attempts and the code that ran, as the run directory keeps them."""

import json
import subprocess

import pytest
import torch

from hpcddp.records import attempts, provenance
from hpcddp.storage.checkpoint import CheckpointStore


def test_saved_step_reads_the_checkpoint_stores_own_names(tmp_path):
    """A torch-free reader of complete checkpoints must agree with the store that writes them."""
    store = CheckpointStore(tmp_path, keep_last=2)
    assert attempts.saved_step(tmp_path) == 0
    for step in (3, 12):
        store.save(step, {"w": torch.zeros(2)})
    assert attempts.saved_step(tmp_path) == store.latest_step() == 12
    (tmp_path / "checkpoints" / "step-00000099.pt").write_text("no sidecar: not complete")
    assert attempts.saved_step(tmp_path) == 12


def test_history_lists_every_attempt_with_its_cause_and_gain(tmp_path):
    both = ["n1", "n2"]
    attempts.record(
        tmp_path, attempts.Ended(job="5", restart=0, nodes=both, cause="preempted", step=40)
    )
    killed = "failed: task 3 on n2: Killed"
    attempts.record(
        tmp_path,
        attempts.Ended(job="5", restart=1, nodes=both, cause=killed, step=55, excluded=["n2"]),
    )
    with open(tmp_path / attempts.FILE, "a") as f:
        f.write('{"job": "5", "cau')  # a line cut short by a crash
    attempts.record(
        tmp_path, attempts.Ended(job="5", restart=2, nodes=["n1", "n3"], cause="finished", step=90)
    )
    history = attempts.history(tmp_path)
    assert [(a["attempt"], a["cause"], a["steps_gained"]) for a in history] == [
        (1, "preempted", 40),
        (2, "failed: task 3 on n2: Killed", 15),  # from where attempt 1 ended
        (3, "finished", 35),
    ]
    assert history[1]["excluded"] == ["n2"]


@pytest.fixture
def repo(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    (tmp_path / "model.py").write_text("x = 1\n")
    git("add", "model.py")
    git("commit", "-qm", "one")
    return tmp_path, git


def test_provenance_names_the_commit_the_dirt_and_the_diff(repo, tmp_path_factory):
    root, _ = repo
    clean = provenance.describe_tree(root)
    assert len(clean["commit"]) == 40 and not clean["dirty"] and clean["diff"] == ""
    (root / "model.py").write_text("x = 2\n")
    (root / "new.py").write_text("")
    dirty = provenance.describe_tree(root)
    assert dirty["dirty"] and "+x = 2" in dirty["diff"] and dirty["untracked"] == ["new.py"]
    run_dir = tmp_path_factory.mktemp("run")
    found = {"trees": [dirty], "versions": {"torch": "2.13.0"}}
    provenance.record(run_dir, found)
    saved = json.loads((run_dir / provenance.FILE).read_text())
    assert saved["trees"][0]["diff_file"].startswith("provenance/")
    assert "+x = 2" in (run_dir / saved["trees"][0]["diff_file"]).read_text()


def test_differences_say_what_changed_in_one_line_each(repo):
    root, git = repo
    first = {"trees": [provenance.describe_tree(root)], "versions": {"torch": "2.12.0"}}
    (root / "model.py").write_text("x = 3\n")
    dirty = {"trees": [provenance.describe_tree(root)], "versions": {"torch": "2.13.0"}}
    assert provenance.differences(first, dirty) == [
        "torch 2.12.0 -> 2.13.0",
        f"{root}: uncommitted changes differ",
    ]
    git("commit", "-qam", "two")
    committed = {"trees": [provenance.describe_tree(root)], "versions": {"torch": "2.12.0"}}
    (change,) = provenance.differences(first, committed)
    assert change.startswith(f"{root}: commit ") and " -> " in change
