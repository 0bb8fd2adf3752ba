"""The shipped examples run as documented: chargpt fetches its corpus once per job (file:// and
over HTTP from a loopback server), and quickstart reaches the accuracy its YAML promises."""

import hashlib
import logging
import os
import re

import pytest
import torch

from examples import chargpt
from hpcddp.config import load_config
from hpcddp.errors import ConfigError
from hpcddp.launch.resolve import resolve_env
from hpcddp.train.trainer import Trainer
from tests.fixtures.helpers import REPO, LoopbackServer, run_cli, summary

CORPUS = REPO / "examples" / "data" / "tiny-corpus.txt"
CHARGPT_YAML = REPO / "examples" / "chargpt.yaml"
QUICKSTART_YAML = REPO / "examples" / "quickstart.yaml"


@pytest.fixture
def in_process_run():
    """Undo what an in-process `Trainer.fit` leaves behind: exported launch variables and the
    'hpcddp' logger's handlers (it stops propagating, which would blind later caplog tests)."""
    environ = dict(os.environ)
    logger = logging.getLogger("hpcddp")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    os.environ.clear()
    os.environ.update(environ)
    for handler in [h for h in logger.handlers if h not in saved[0]]:
        logger.removeHandler(handler)
        handler.close()
    logger.level, logger.propagate = saved[1], saved[2]


# --- the corpus and the dataset ---------------------------------------------------------------


def test_corpus_is_what_the_generator_writes_and_the_yaml_checksums():
    data = CORPUS.read_bytes()
    assert data == chargpt.corpus_text().encode("utf-8")
    assert load_config(CHARGPT_YAML).data.kwargs["sha256"] == hashlib.sha256(data).hexdigest()
    assert 100_000 <= len(data) <= 200_000


def test_unigram_baseline_is_what_the_yaml_states():
    stated = re.search(r"unigram baseline .* is ([0-9.]+) nats", CHARGPT_YAML.read_text())
    assert stated and abs(chargpt.unigram_loss_nats(CORPUS.read_text()) - float(stated[1])) < 0.005


def test_dataset_pairs_are_next_characters_with_a_fixed_split(tmp_path):
    train, evaluation = chargpt.make_dataset(
        CORPUS.as_uri(), None, root=str(tmp_path), block_size=16, stride=4
    )
    text = CORPUS.read_text()
    assert train.vocab == evaluation.vocab == "".join(sorted(set(text)))
    x, y = train[3]
    assert x.shape == y.shape == (16,)
    assert "".join(train.vocab[i] for i in x) == text[12:28]
    assert torch.equal(x[1:], y[:-1])
    first_eval = "".join(evaluation.vocab[i] for i in evaluation[0][0])
    assert first_eval == text[int(len(text) * 0.9) :][:16]
    assert len(evaluation) == (len(text) - int(len(text) * 0.9) - 17) // 16 + 1


def test_a_plain_path_becomes_an_absolute_file_url(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    assert chargpt.absolute_url("examples/data/tiny-corpus.txt") == CORPUS.as_uri()
    assert chargpt.absolute_url("http://host/x.txt") == "http://host/x.txt"
    _train, _ = chargpt.make_dataset("examples/data/tiny-corpus.txt", None, root=str(tmp_path))
    assert (tmp_path / "tiny-corpus.txt").read_bytes() == CORPUS.read_bytes()


def test_too_small_vocab_says_what_to_set(tmp_path):
    with pytest.raises(ConfigError, match=r"vocab_size=56"):
        chargpt.make_dataset(CORPUS.as_uri(), None, root=str(tmp_path), vocab_size=20)


# --- training ---------------------------------------------------------------------------------


def test_chargpt_trains_a_few_steps_from_a_file_url(tmp_path, in_process_run):
    config = load_config(
        CHARGPT_YAML,
        [
            f"data.kwargs.url={CORPUS.as_uri()}",
            f"data.kwargs.root={tmp_path / 'data'}",
            f"run.dir={tmp_path / 'run'}",
            "train.max_steps=3",
            "train.epochs=1",
        ],
    )
    result = (
        Trainer(config=config).fit(resolve_env({})).summary
    )  # a world of one, wherever pytest runs
    assert result.steps == 3
    assert 0 < result.evaluation["eval_loss"] < 5  # ~log(56) = 4.0 at the start
    assert (tmp_path / "data" / "tiny-corpus.txt").read_bytes() == CORPUS.read_bytes()


@pytest.fixture
def corpus_server():
    """Serves examples/data (the corpus among it) over loopback HTTP, counting requests."""
    with LoopbackServer(CORPUS.parent) as server:
        yield server


@pytest.mark.slow
def test_two_ranks_fetch_the_corpus_over_http_exactly_once(tmp_path, corpus_server):
    done = run_cli(
        "train",
        "--config",
        str(CHARGPT_YAML),
        "--nproc",
        "2",
        f"data.kwargs.url={corpus_server.url}/tiny-corpus.txt",
        f"data.kwargs.root={tmp_path / 'data'}",
        f"run.dir={tmp_path / 'run'}",
        "train.max_steps=10",
        "train.epochs=1",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = summary(tmp_path / "run")
    assert result["world_size"] == 2 and result["steps"] == 10
    assert corpus_server.counts == {"/tiny-corpus.txt": 1}


def _stated_accuracy(yaml_path) -> float:
    """The accuracy floor the example's header comment promises (`eval_accuracy >= X`)."""
    found = re.search(r"eval_accuracy >= ([0-9.]+)", yaml_path.read_text())
    assert found, f"{yaml_path} states no 'eval_accuracy >= X' in its comment"
    return float(found.group(1))


@pytest.mark.slow
def test_quickstart_reaches_the_accuracy_its_yaml_states(tmp_path):
    done = run_cli(
        "train", "--config", str(QUICKSTART_YAML), "--nproc", "2", f"run.dir={tmp_path / 'run'}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary(tmp_path / "run")["eval_accuracy"] >= _stated_accuracy(QUICKSTART_YAML)
