"""The sweep grid from the command line, and the manifest a sweep directory knows itself by."""

import json

import pytest

from hpcddp.cli import main
from hpcddp.config import Config, from_dict, with_overrides
from hpcddp.errors import ConfigError
from hpcddp.records import sweep_manifest
from hpcddp.slurm import grid


def test_grid_values_parse_like_override_values():
    parsed = grid.parse_grid(
        [
            "optim.lr=0.001,3.0e-3",
            "train.epochs=1,2",
            "data.shuffle=true,false",
            "optim.name=adamw,sgd",
            "model.kwargs.sizes=[1, 2],[3,4]",
            "run.name=123,abc",
        ]
    )
    assert parsed == {
        "optim.lr": [0.001, 0.003],
        "train.epochs": [1, 2],
        "data.shuffle": [True, False],
        "optim.name": ["adamw", "sgd"],
        "model.kwargs.sizes": [[1, 2], [3, 4]],
        "run.name": ["123", "abc"],  # a string field keeps the text, as an override does
    }
    assert [type(v) for v in parsed["optim.lr"]] == [float, float]
    # the same rule as key=value overrides: each value lands as the override would put it
    for key, values in parsed.items():
        for value, text in zip(values, grid.split_values(_raw(key)), strict=True):
            assert _get(with_overrides(Config(), [f"{key}={text.strip()}"]), key) == value


def _raw(key: str) -> str:
    return {
        "optim.lr": "0.001,3.0e-3",
        "train.epochs": "1,2",
        "data.shuffle": "true,false",
        "optim.name": "adamw,sgd",
        "model.kwargs.sizes": "[1, 2],[3,4]",
        "run.name": "123,abc",
    }[key]


def _get(config, key: str):
    node = config
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def test_commas_inside_brackets_and_quotes_do_not_split():
    assert grid.split_values("[1, 2],{a: 1, b: 2},'x,y',3") == [
        "[1, 2]",
        "{a: 1, b: 2}",
        "'x,y'",
        "3",
    ]


@pytest.mark.parametrize(
    "items, message",
    [
        ([], "needs at least one --grid"),
        (["optim.lr"], "not of the form section.key=v1,v2"),
        (["optim.lr="], "not of the form section.key=v1,v2"),
        (["9lr=1,2"], "not of the form section.key=v1,v2"),
        (["optim.lr=0.1,,0.2"], "has an empty value"),
        (["optim.lr=0.1", "optim.lr=0.2"], "given twice"),
        (["optim.lr=0.1,0.10"], "repeats a value"),
    ],
)
def test_bad_grids_get_one_line(items, message):
    with pytest.raises(ConfigError, match=message) as err:
        grid.parse_grid(items)
    assert "\n" not in str(err.value) and "HINT" in str(err.value)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--grid", "optim.lr"], "not of the form section.key=v1,v2"),
        (["--grid", "optim.lr=0.1,fast"], "optim.lr must be float"),
        (["--grid", "slurm.nodes=1,2"], "cannot vary within one job array"),
        (["--grid", "optim.lr=0.1", "--max-parallel", "0"], "max_parallel must be a positive"),
        ([], "needs at least one --grid"),
    ],
)
def test_a_bad_sweep_exits_2_with_one_line_and_submits_nothing(
    args, message, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("HPCDDP_JOBS_DIR", str(tmp_path / "jobs"))
    run_dir = tmp_path / "sweep"
    code = main(
        ["sweep", "examples/quickstart.yaml", *args, f"run.dir={run_dir}", "--cluster", "local"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not run_dir.exists() and not (tmp_path / "jobs").exists()


def test_a_second_sweep_into_the_same_directory_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HPCDDP_JOBS_DIR", str(tmp_path / "jobs"))
    sweep_manifest.write(tmp_path, _manifest(tmp_path))
    before = (tmp_path / "sweep.json").read_text()
    code = main(["sweep", "examples/quickstart.yaml", "--grid", "optim.lr=0.1,0.2",
                 f"run.dir={tmp_path}", "--cluster", "local"])  # fmt: skip
    assert code == 2 and "already holds a sweep" in capsys.readouterr().err
    assert (tmp_path / "sweep.json").read_text() == before


# -- the manifest ------------------------------------------------------------------------------


def _manifest(sweep_dir, arrays=()) -> sweep_manifest.Manifest:
    points = tuple(
        sweep_manifest.Point(i, {"optim.lr": lr, "run.seed": seed}, str(sweep_dir / f"{i}-p"))
        for i, (lr, seed) in enumerate([(0.001, 0), (0.001, 1), (0.003, 0), (0.003, 1)])
    )
    grid_values = {"optim.lr": [0.001, 0.003], "run.seed": [0, 1]}
    return sweep_manifest.Manifest(grid_values, points, tuple(arrays), 2, Config().to_dict())


def _array(job_id, indices, cluster="slurm", at=100.0) -> sweep_manifest.Array:
    tasks = tuple(
        sweep_manifest.Task(index, f"{job_id}_{n}", f"/o/{job_id}_{n}.out", f"/o/{job_id}_{n}.err")
        for n, index in enumerate(indices)
    )
    return sweep_manifest.Array(str(job_id), cluster, at, tasks)


def test_the_manifest_round_trips_and_names_each_points_latest_job(tmp_path):
    first, retry = _array(7, [0, 1, 2, 3]), _array(9, [1, 3], at=200.0)
    manifest = _manifest(tmp_path).with_array(first).with_array(retry)
    sweep_manifest.write(tmp_path, manifest)
    read = sweep_manifest.read(tmp_path)
    assert read == manifest and sweep_manifest.is_sweep_dir(tmp_path)
    assert read.latest(0) == (first, first.tasks[0])
    assert read.latest(3) == (retry, retry.tasks[1])  # 9_1 runs point 3 now
    assert [read.submissions(i) for i in range(4)] == [1, 2, 1, 2]
    assert from_dict(read.config) == Config()  # a retry rebuilds the points from it
    data = json.loads((tmp_path / "sweep.json").read_text())
    assert data["format"] == 1 and data["arrays"][1]["tasks"][0] == {
        "index": 1, "job": "9_0", "stdout": "/o/9_0.out", "stderr": "/o/9_0.err",
    }  # fmt: skip
    assert list(tmp_path.iterdir()) == [tmp_path / "sweep.json"]  # no temporary file left


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "is not a sweep directory"),
        ("{not json", "is unreadable"),
        ('{"format": 2, "grid": {}, "points": [], "arrays": []}', "format 1"),
        ('{"format": 1, "grid": {}, "points": [{"index": 0}], "arrays": []}', "format 1"),
    ],
)
def test_a_missing_or_damaged_manifest_is_one_line(tmp_path, text, message):
    if text is not None:
        (tmp_path / "sweep.json").write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        sweep_manifest.read(tmp_path)
    assert "\n" not in str(err.value)


def test_labels_are_the_grid_values_short_where_unambiguous(tmp_path):
    assert sweep_manifest.labels(_manifest(tmp_path).points) == {
        0: "lr=0.001 seed=0", 1: "lr=0.001 seed=1", 2: "lr=0.003 seed=0", 3: "lr=0.003 seed=1",
    }  # fmt: skip
    clash = [sweep_manifest.Point(0, {"optim.lr": 0.1, "sched.lr": True}, "d")]
    assert sweep_manifest.labels(clash) == {0: "optim.lr=0.1 sched.lr=true"}


@pytest.mark.parametrize(
    "extra", [["--nodes", "2"], ["--grid", "optim.lr=1,2"], ["optim.lr=1"], ["--max-parallel", "1"]]
)
def test_a_retry_takes_only_the_sweep_directory(extra, tmp_path, capsys):
    sweep_manifest.write(tmp_path, _manifest(tmp_path))
    assert main(["sweep", "--retry-failed", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "--retry-failed takes only the sweep directory" in err and extra[0] in err
    assert len(err.splitlines()) == 1


def test_a_manifest_json_cannot_hold_is_refused_before_anything_is_written(tmp_path):
    manifest = _manifest(tmp_path)
    odd = sweep_manifest.Manifest(manifest.grid, manifest.points, config={"model": {1j: 2}})
    with pytest.raises(ConfigError, match="cannot be recorded in sweep.json") as err:
        sweep_manifest.write(tmp_path, odd)
    assert "\n" not in str(err.value) and not (tmp_path / "sweep.json").exists()
