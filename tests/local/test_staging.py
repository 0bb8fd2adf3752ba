"""Node-local staging with real ranks: one copy per node, the others wait for it and read it."""

import json

from tests.fixtures.helpers import TINY, train_local


def test_two_ranks_stage_once_and_both_read_the_copy(tmp_path):
    shared, local = tmp_path / "shared" / "data", tmp_path / "node"
    shared.mkdir(parents=True)
    (shared / "labels.txt").write_text("ok\n")
    run_dir = tmp_path / "run"
    kwargs = {"shared": str(shared), "local": str(local), "train_size": 256, "eval_size": 64}
    train_local(
        run_dir,
        *TINY,
        "data.factory=tests.fixtures.staged_data:make_dataset",
        f"data.kwargs={json.dumps(kwargs)}",
    )
    logs = [(run_dir / "logs" / f"rank-{r}.log").read_text() for r in (0, 1)]
    assert [log.count(f"staged {shared} to {local / 'data'}") for log in logs] == [1, 0]
    assert (local / "data" / "labels.txt").read_text() == "ok\n"
