"""Runtime bad input, in-process: the pieces that turn a fault into one line with a fix.

A checkpoint that does not fit the model, the agreement point after the user's factories,
datasets of different lengths per rank, the user's own frame in a traceback, a factory whose
signature does not take its kwargs, HPCDDP_DEVICE and nccl without CUDA (with a faked GPU
count), and a second Ctrl-C while a checkpoint is being written.
"""

import os
import signal
import sys

import pytest
import torch

from hpcddp.comm import agreement
from hpcddp.comm.agreement import Fault
from hpcddp.errors import (
    ConfigError,
    DownloadError,
    LaunchError,
    UserCodeError,
)
from hpcddp.launch.distenv import DistEnv
from hpcddp.launch.resolve import check_backend, place
from hpcddp.storage import misfit
from hpcddp.train import building, preemption, usercode
from hpcddp.train.factories import import_factory

ENV = DistEnv(
    rank=2,
    local_rank=0,
    world_size=4,
    local_world_size=2,
    node_rank=1,
    num_nodes=2,
    master_addr="n1",
    master_port=29400,
    launcher="slurm",
    job_id="7",
    hostname="n7",
)


# -- a checkpoint that does not fit the model ------------------------------------------------


def state(**shapes):
    return {name.replace("_", "."): torch.zeros(shape) for name, shape in shapes.items()}


MODEL = state(fc1_weight=(64, 16), fc1_bias=(64,), fc2_weight=(4, 64), fc2_bias=(4,))

# (id, checkpoint's model state, words the description must hold, words it must not)
MISFITS = [
    (
        "wider-layer",
        state(fc1_weight=(128, 16), fc1_bias=(128,), fc2_weight=(4, 128), fc2_bias=(4,)),
        ["first mismatched parameter 'fc1.weight': checkpoint (128, 16) vs model (64, 16)"],
        ["fc2.weight", "missing", "not in the model"],
    ),
    (
        "renamed-keys",
        {f"module.{k}": v for k, v in MODEL.items()},
        [
            "missing from the checkpoint: fc1.weight, fc1.bias, fc2.weight and 1 more",
            "not in the model: module.fc1.weight, module.fc1.bias, module.fc2.weight and 1 more",
        ],
        ["mismatched"],
    ),
    (
        "one-extra-key",
        {**MODEL, "head.weight": torch.zeros(2)},
        ["not in the model: head.weight"],
        ["missing", "mismatched"],
    ),
    (
        "shape-and-missing",
        state(fc1_weight=(64, 32), fc1_bias=(64,), fc2_weight=(4, 64)),
        ["'fc1.weight': checkpoint (64, 32) vs model (64, 16)", "missing from the checkpoint: "],
        ["not in the model"],
    ),
]


@pytest.mark.parametrize(
    "loaded, words, absent", [c[1:] for c in MISFITS], ids=[c[0] for c in MISFITS]
)
def test_a_misfit_names_the_first_parameter_and_a_few_keys(loaded, words, absent):
    text = misfit.describe(MODEL, loaded)
    assert text is not None and "\n" not in text
    for word in words:
        assert word in text
    for word in absent:
        assert word not in text


def test_a_checkpoint_that_fits_has_no_misfit():
    assert misfit.describe(MODEL, {k: v.clone() for k, v in MODEL.items()}) is None


# -- the agreement point after the user's factories -------------------------------------------


def test_no_fault_anywhere_gives_every_ranks_facts():
    assert agreement.agree(None, (2048, 512), env=ENV, timeout_s=5) == [(2048, 512)]


def test_a_fault_is_raised_as_its_own_class_and_printed_once():
    fault = Fault(0, "n1", "DownloadError", "could not fetch x. HINT: check the URL")
    with pytest.raises(DownloadError, match="could not fetch x") as caught:
        agreement.agree(fault, None, env=ENV, timeout_s=5)
    assert caught.value.agreed  # rank 0 (or the launcher) prints it, once


# (id, faults, error class, the line it must be)
AS_ERROR = [
    (
        "user-code",
        [Fault(2, "n2", "UserCodeError", "boom. HINT: fix it")],
        UserCodeError,
        "boom. HINT: fix it",
    ),
    (
        "same-on-every-rank",
        [Fault(r, "n1", "ConfigError", "bad kwargs. HINT: fix them") for r in range(4)],
        ConfigError,
        "bad kwargs. HINT: fix them",
    ),
    (
        "others-failed-otherwise",
        [Fault(1, "n1", "UserCodeError", "a. HINT: x"), Fault(3, "n2", "UserCodeError", "b")],
        UserCodeError,
        "a (rank 3 failed otherwise too: see RUN_DIR/logs). HINT: x",
    ),
    (
        "unknown-class",
        [Fault(0, "n1", "ValueError", "odd")],
        UserCodeError,
        "odd",
    ),
]


@pytest.mark.parametrize(
    "faults, cls, line", [c[1:] for c in AS_ERROR], ids=[c[0] for c in AS_ERROR]
)
def test_the_first_fault_becomes_everyones_error(faults, cls, line):
    err = agreement.as_error(faults)
    assert type(err) is cls and str(err) == line


# (id, each rank's (train, eval) lengths, words of the refusal or None)
LENGTHS = [
    ("equal", [(2048, 512)] * 4, None),
    ("no-eval-set", [(2048, None)] * 2, None),
    ("one-rank-short", [(2048, 512), (2047, 512), (2048, 512)], "(rank 1: 2047; ranks 0, 2: 2048)"),
    ("eval-differs", [(64, 10), (64, 11)], "eval sets of different lengths"),
    ("every-rank-its-own", [(n, None) for n in range(10, 16)], "; 2 more lengths"),
]


@pytest.mark.parametrize("lengths, words", [c[1:] for c in LENGTHS], ids=[c[0] for c in LENGTHS])
def test_datasets_of_different_lengths_are_refused_naming_ranks(lengths, words):
    if words is None:
        building.check_same_lengths(lengths)
        return
    with pytest.raises(UserCodeError) as caught:
        building.check_same_lengths(lengths)
    assert words in str(caught.value) and "HINT: return the same dataset" in str(caught.value)
    assert caught.value.agreed  # every rank reaches it alike: printed once


# -- the user's own frame --------------------------------------------------------------------


def users_helper(width):
    raise ValueError(f"width {width} must be even")


def users_factory(width: int = 3):
    users_helper(width)


def users_factory_needing(width: int):
    return torch.nn.Linear(width, 1)


def test_a_factory_that_raises_is_named_with_the_users_frame_on_top(caplog):
    with pytest.raises(ValueError) as caught:
        usercode.call(users_factory, {}, "the model factory m:f", "model.kwargs")
    fault = usercode.fault_of(caught.value, ENV, "the model factory m:f")
    assert fault.kind == "UserCodeError" and (fault.rank, fault.host) == (2, "n7")
    this_file = os.path.relpath(__file__)
    assert fault.message.startswith(
        "the model factory m:f raised on rank 2 (n7): ValueError: width 3 must be even at "
        f"{this_file}:"
    )
    assert " in users_helper. HINT: " in fault.message
    logged = caplog.records[-1].getMessage()
    assert logged.count("Traceback (most recent call last)") == 1
    assert "users_factory" in logged and "users_helper" in logged
    assert f"{os.sep}hpcddp{os.sep}" not in logged  # the trainer's own frames are trimmed


def test_an_error_with_no_user_frame_is_left_as_it_is():
    err = RuntimeError("gloo: connection closed")
    assert usercode.blame(err, ENV, "your code in training") is err
    ours = ConfigError("x. HINT: y")
    assert usercode.blame(ours, ENV, "your code in training") is ours


def test_an_error_in_forward_becomes_one_line_with_the_users_frame():
    model = torch.nn.Linear(4, 2)
    try:
        model(torch.zeros(3, 5))  # the user's call; torch raises below it
    except RuntimeError as err:
        blamed = usercode.blame(err, ENV, "your code in training")
    assert isinstance(blamed, UserCodeError)
    line = str(blamed)
    assert line.startswith("your code in training raised on rank 2 (n7): RuntimeError: mat1")
    assert "test_an_error_in_forward_becomes_one_line_with_the_users_frame" in line
    assert "\n" not in line


# (id, factory, kwargs, words)
SIGNATURES = [
    ("missing-argument", users_factory_needing, {}, "missing a required argument: 'width'"),
    (
        "unknown-argument",
        users_factory,
        {"width": 2, "depth": 3},
        "got an unexpected keyword argument 'depth'",
    ),
]


@pytest.mark.parametrize(
    "factory, kwargs, words", [c[1:] for c in SIGNATURES], ids=[c[0] for c in SIGNATURES]
)
def test_a_factory_that_cannot_take_its_kwargs_is_a_config_error(factory, kwargs, words):
    with pytest.raises(ConfigError) as caught:
        usercode.call(factory, kwargs, "the model factory m:f", "model.kwargs")
    line = str(caught.value)
    assert words in line and "HINT: give every argument it requires in model.kwargs" in line
    assert f"it is defined at {os.path.relpath(__file__)}:" in line


# (id, module text or None, factory path, words)
IMPORTS = [
    ("raises-on-import", "SETTINGS = {}\nWIDTH = SETTINGS['depth']\n", "raises KeyError"),
    ("does-not-parse", "def make_model(:\n    pass\n", "raised SyntaxError"),
    ("not-a-function", "make_model = 42\n", "names a int, not a function"),
]


@pytest.mark.parametrize("text, words", [c[1:] for c in IMPORTS], ids=[c[0] for c in IMPORTS])
def test_a_factory_module_that_fails_to_import_is_one_line(tmp_path, monkeypatch, text, words):
    name = f"users_module_{abs(hash(text))}"
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        import_factory(f"{name}:make_model", "model")
    line = str(caught.value)
    assert words.replace("raises", "raised") in line and "HINT: " in line
    if "raise" in words:
        assert f"{name}.py:" in line  # where the module failed
    sys.modules.pop(name, None)


# -- devices and backends ---------------------------------------------------------------------

TORCHRUN = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "n1",
    "MASTER_PORT": "29400",
}

# (id, extra environment, GPUs seen, words of the refusal)
REFUSED = [
    ("gpu-is-no-device", {"HPCDDP_DEVICE": "gpu"}, 2, "HPCDDP_DEVICE='gpu' is not a device"),
    ("upper-case", {"HPCDDP_DEVICE": "CUDA"}, 2, "expected cpu, cuda or cuda:N"),
    ("index-missing", {"HPCDDP_DEVICE": "cuda:"}, 2, "expected cpu, cuda or cuda:N"),
    ("index-too-high", {"HPCDDP_DEVICE": "cuda:9"}, 2, "sees only 2 GPU(s) (cuda:0 to cuda:1)"),
    ("index-without-gpu", {"HPCDDP_DEVICE": "cuda:0"}, 0, "HPCDDP_DEVICE=cuda:0 but this process"),
    ("cuda-without-gpu", {"HPCDDP_DEVICE": "cuda"}, 0, "HPCDDP_DEVICE=cuda but this process"),
    ("nccl-on-cpu", {"HPCDDP_BACKEND": "nccl"}, 0, "HPCDDP_BACKEND=nccl needs CUDA"),
    ("nccl-on-forced-cpu", {"HPCDDP_BACKEND": "nccl", "HPCDDP_DEVICE": "cpu"}, 2, "needs CUDA"),
]

# (id, extra environment, GPUs seen, device chosen, backend chosen)
ACCEPTED = [
    ("index-in-range", {"HPCDDP_DEVICE": "cuda:1"}, 2, "cuda:1", "nccl"),
    ("cpu", {"HPCDDP_DEVICE": "cpu"}, 2, "cpu", "gloo"),
    ("nccl-on-gpu", {"HPCDDP_BACKEND": "nccl"}, 2, "cuda:1", "nccl"),
]


@pytest.mark.parametrize(
    "extra, gpus, expected", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_device_and_backend_mistakes_are_refused_before_the_group(extra, gpus, expected):
    env, refusal = place({**TORCHRUN, **extra}, cuda_devices=lambda: gpus, hostname="n2")
    assert isinstance(refusal, LaunchError) and expected in str(refusal)
    assert "HINT: " in str(refusal) and env.rank == 1  # still told to the others at the meeting


@pytest.mark.parametrize(
    "extra, gpus, device, backend", [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED]
)
def test_valid_device_and_backend_choices_are_accepted(extra, gpus, device, backend):
    """A valid choice must not be refused, whatever words a refusal would have used."""
    env, refusal = place({**TORCHRUN, **extra}, cuda_devices=lambda: gpus, hostname="n2")
    assert refusal is None, f"a valid choice was refused: {refusal}"
    assert (env.device, env.backend) == (device, backend)


def test_dist_backend_nccl_without_cuda_names_the_config_key():
    with pytest.raises(LaunchError, match=r"^dist.backend=nccl needs CUDA.*HINT: unset dist"):
        check_backend("nccl", "cpu", "dist.backend")
    check_backend("nccl", "cuda:0", "dist.backend")
    check_backend("gloo", "cpu", "dist.backend")


# -- a second Ctrl-C while a checkpoint is written --------------------------------------------


@pytest.fixture
def stop_flag():
    flag = preemption.StopFlag().install()
    yield flag
    flag.uninstall()


def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)


def test_a_second_ctrl_c_waits_for_the_checkpoint_then_interrupts(stop_flag):
    finished = []
    ctrl_c()
    assert signal.SIGINT in stop_flag.seen  # the first one asks for a clean stop
    with (
        pytest.raises(KeyboardInterrupt),
        preemption.shielded(finish=lambda: finished.append("write")),
    ):
        ctrl_c()
        ctrl_c()  # insisting more changes nothing: the write goes on
        finished.append("save")
    assert finished == ["save", "write"]


def test_a_second_ctrl_c_outside_a_checkpoint_interrupts_at_once(stop_flag):
    ctrl_c()
    with pytest.raises(KeyboardInterrupt):
        ctrl_c()


def test_once_every_rank_agreed_to_stop_a_second_ctrl_c_lets_the_stop_finish(stop_flag):
    """Every rank is in the stop's collectives (drain, checkpoint wait, conclude): one rank
    leaving on its own would fail the others (exit 1), or take the store with it (SIGABRT)."""
    finished = []
    ctrl_c()
    stop_flag.agreed = True  # `Stopping.reason` returned the stop every rank voted for
    ctrl_c()  # between two shields: no KeyboardInterrupt here
    with preemption.shielded(finish=lambda: finished.append("write")):
        ctrl_c()
        finished.append("save")
    ctrl_c()
    assert finished == ["save"]  # no interrupt after the shield either: the stop goes on
    assert stop_flag.deferred  # said once, on the console: "stopping once ... complete"


def test_no_ctrl_c_means_the_shield_changes_nothing(stop_flag):
    with preemption.shielded(finish=lambda: pytest.fail("nothing to finish")):
        pass
    with preemption.shielded(), preemption.shielded():  # nested, as save() inside a stop
        pass
    assert not stop_flag.deferred


def test_without_an_installed_flag_the_shield_is_a_plain_block():
    with preemption.shielded():
        done = True
    assert done
