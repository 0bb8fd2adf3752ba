"""A rank's start-up skips work that buys nothing (`hpcddp.launch.collector`).

The cyclic garbage collector is off while the rank imports torch and builds its parts (its
full passes over torch's millions of objects cost about 0.4 CPU-s and free nothing), and on
again from the first step, with start-up's objects frozen out of its passes.
"""

import json

from tests.fixtures.helpers import QUICKSTART, TINY, run_cli


def test_the_collector_is_off_during_start_up_and_on_from_the_first_step(tmp_path):
    notes = tmp_path / "notes.jsonl"
    done = run_cli(
        "train", QUICKSTART, f"run.dir={tmp_path / 'run'}", *TINY,
        "model.factory=tests.fixtures.collector_probe:make_model",
        f"model.kwargs={{note_file: {notes}}}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = {note["when"]: note for note in map(json.loads, notes.read_text().splitlines())}
    assert seen["build"]["enabled"] is False
    assert seen["first step"]["enabled"] is True
    assert seen["first step"]["frozen"] > 100_000  # torch's objects, set aside for good
