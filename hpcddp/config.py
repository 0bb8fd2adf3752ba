"""The run's configuration: YAML and ``key=value`` overrides mapped onto checked dataclasses.

Every section is a keyword-only dataclass whose fields carry units in their names and whose
``__post_init__`` rejects values that cannot work, so a typo fails at start-up with the list
of valid keys instead of an hour into the job.
"""

import dataclasses
import difflib
import pathlib
import typing
from typing import Any

import yaml

from hpcddp.errors import ConfigError


def _positive(section: str, **values: float) -> None:
    """Raise if any of the named sizes is zero or negative."""
    for name, value in values.items():
        if value is not None and value <= 0:
            raise ConfigError(f"{section}.{name} must be > 0, got {value}. "
                              f"HINT: set {section}.{name}=<positive number>.")


def _one_of(section: str, name: str, value: Any, allowed: tuple) -> None:
    """Raise if a choice is not among the allowed ones."""
    if value not in allowed:
        raise ConfigError(f"{section}.{name}={value!r} is not one of {list(allowed)}. "
                          f"HINT: set {section}.{name}={allowed[0]}.")


@dataclasses.dataclass(kw_only=True)
class RunConfig:
    """Where outputs go and how a run starts."""

    name: str = "run"
    dir: str = "runs/run"  # the run directory: checkpoints, metrics, logs, summary.json
    seed: int = 0
    resume: bool = True  # continue from the latest complete checkpoint in `dir`
    force: bool = False  # resume into a run directory written by a different config


@dataclasses.dataclass(kw_only=True)
class FactoryConfig:
    """A user function ``package.module:function`` called with ``kwargs``."""

    factory: str = ""
    kwargs: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.factory and ":" not in self.factory:
            raise ConfigError(f"factory {self.factory!r} must look like 'package.module:function'. "
                              "HINT: e.g. factory: examples.quickstart:make_model")


@dataclasses.dataclass(kw_only=True)
class DataConfig(FactoryConfig):
    """The dataset factory and how batches are drawn from it."""

    batch_size: int = 32  # per rank, per micro-batch
    num_workers: int = -1  # DataLoader workers per rank; -1: from SLURM_CPUS_PER_TASK or psutil
    drop_last: bool = False
    shuffle: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("data", batch_size=self.batch_size)
        if self.num_workers < -1:
            raise ConfigError(f"data.num_workers must be >= 0 (or -1 for automatic), "
                              f"got {self.num_workers}. HINT: set data.num_workers=-1.")


@dataclasses.dataclass(kw_only=True)
class OptimConfig:
    """Optimizer and learning-rate schedule."""

    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9  # sgd only
    warmup_steps: int = 0
    schedule: str = "cosine"  # cosine decay after warmup, or constant
    min_lr_ratio: float = 0.1  # floor of the cosine, as a fraction of lr
    grad_clip_norm: float = 0.0  # 0 disables clipping

    def __post_init__(self) -> None:
        _one_of("optim", "name", self.name, ("adamw", "sgd"))
        _one_of("optim", "schedule", self.schedule, ("cosine", "constant"))
        _positive("optim", lr=self.lr)
        if self.warmup_steps < 0 or self.grad_clip_norm < 0 or self.weight_decay < 0:
            raise ConfigError("optim.warmup_steps, optim.grad_clip_norm and optim.weight_decay "
                              "must be >= 0. HINT: use 0 to disable.")


@dataclasses.dataclass(kw_only=True)
class TrainConfig:
    """The training loop."""

    epochs: int = 1
    max_steps: int = 0  # optimizer steps; 0: run all epochs
    grad_accum_steps: int = 1
    precision: str = "fp32"  # fp32, bf16 (autocast), fp16 (autocast + GradScaler, CUDA only)
    eval_every_steps: int = 0  # 0: evaluate at the end of every epoch
    checkpoint_every_steps: int = 0  # 0: checkpoint at the end of every epoch
    keep_checkpoints: int = 3
    log_every_steps: int = 10
    compile: bool = False
    sync_batchnorm: bool = False
    stop_after_steps: int = 0  # stop early (checkpoint kept) after this many steps, for tests
    stop_before_end_s: float = 120.0  # checkpoint and requeue this long before the job's end

    def __post_init__(self) -> None:
        _positive("train", epochs=self.epochs, grad_accum_steps=self.grad_accum_steps,
                  keep_checkpoints=self.keep_checkpoints, log_every_steps=self.log_every_steps)
        _one_of("train", "precision", self.precision, ("fp32", "bf16", "fp16"))
        for name in ("max_steps", "eval_every_steps", "checkpoint_every_steps", "stop_after_steps",
                     "stop_before_end_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0. HINT: use 0 to disable.")


@dataclasses.dataclass(kw_only=True)
class DistConfig:
    """Process group and DistributedDataParallel knobs."""

    backend: str = ""  # empty: nccl on CUDA, gloo otherwise
    timeout_s: float = 300.0  # collective timeout: a hung peer ends the job after this
    bucket_cap_mb: float = 25.0
    find_unused_parameters: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = True

    def __post_init__(self) -> None:
        if self.backend:
            _one_of("dist", "backend", self.backend, ("gloo", "nccl"))
        _positive("dist", timeout_s=self.timeout_s, bucket_cap_mb=self.bucket_cap_mb)


@dataclasses.dataclass(kw_only=True)
class SlurmConfig:
    """What to ask Slurm for when hpcddp submits the job."""

    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    mem_gb: float = 0  # 0: the partition's default
    time_min: int = 60
    partition: str = ""
    account: str = ""
    qos: str = ""
    job_name: str = "hpcddp"
    signal_delay_s: int = 120  # SIGUSR2 this long before the time limit: checkpoint and requeue
    extra: dict = dataclasses.field(default_factory=dict)  # more sbatch options, name: value

    def __post_init__(self) -> None:
        _positive("slurm", nodes=self.nodes, tasks_per_node=self.tasks_per_node,
                  cpus_per_task=self.cpus_per_task, time_min=self.time_min)
        if self.gpus_per_node < 0 or self.mem_gb < 0 or self.signal_delay_s < 0:
            raise ConfigError("slurm.gpus_per_node, slurm.mem_gb and slurm.signal_delay_s "
                              "must be >= 0. HINT: use 0 for none / the default.")


@dataclasses.dataclass(kw_only=True)
class Config:
    """A whole run."""

    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    model: FactoryConfig = dataclasses.field(default_factory=FactoryConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    dist: DistConfig = dataclasses.field(default_factory=DistConfig)
    slurm: SlurmConfig = dataclasses.field(default_factory=SlurmConfig)

    def to_dict(self) -> dict:
        """Plain data, as saved in the run directory."""
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        """The resolved configuration as YAML that `load_config` reads back."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def _field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass (they are strings under `from __future__`)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, kind: Any, where: str) -> Any:
    """Check one value against its field's type, accepting ints where floats are expected."""
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-3` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is str:
        if isinstance(value, str):
            return value
    elif kind is dict:
        if isinstance(value, dict):
            return value
    else:
        return value
    shown = getattr(kind, "__name__", str(kind))
    raise ConfigError(f"{where} must be {shown}, got {type(value).__name__} {value!r}. "
                      f"HINT: write it as a {shown} in YAML or on the command line.")


def _build(cls: type, data: Any, where: str) -> Any:
    """Make a dataclass from a mapping, naming unknown keys and the valid ones."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'the config'} must be a mapping of keys to values, got "
                          f"{type(data).__name__}. HINT: see examples/quickstart.yaml.")
    types_ = _field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        prefix = f"{where}." if where else ""
        close = difflib.get_close_matches(unknown[0], list(types_), n=1)
        hint = f"did you mean {prefix}{close[0]}?" if close else "check the spelling."
        raise ConfigError(f"unknown key {prefix}{unknown[0]}; valid keys: "
                          f"{', '.join(prefix + k for k in types_)}. HINT: {hint}")
    values = {}
    for key, value in data.items():
        kind, path = types_[key], f"{where}.{key}" if where else key
        nested = dataclasses.is_dataclass(kind)
        values[key] = _build(kind, value, path) if nested else _coerce(value, kind, path)
    return cls(**values)


def _parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b=value`` and read the value as YAML (so 3, 1e-3, true, [1, 2] keep their type)."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} is not of the form section.key=value. "
                          "HINT: e.g. optim.lr=0.01 train.epochs=3")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Merge ``key=value`` overrides into raw config data (types are checked when built)."""
    for text in overrides:
        path, value = _parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {part} is not a section.")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and _is_str_field(path):
            value = str(value)
        node[path[-1]] = value
    return data


def _is_str_field(path: list[str]) -> bool:
    """True when the override targets a string field (so `run.name=123` stays a string)."""
    cls: Any = Config
    for part in path:
        kinds = _field_types(cls) if dataclasses.is_dataclass(cls) else {}
        if part not in kinds:
            return False
        cls = kinds[part]
    return cls is str


def read_yaml(path: str | pathlib.Path) -> dict:
    """Load one YAML file with safe_load, turning every failure into a one-line ConfigError."""
    path = pathlib.Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config {path}: {err.strerror}. "
                          "HINT: check the path (examples/quickstart.yaml is one).") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"config {path} is not valid YAML{where}: "
                          f"{getattr(err, 'problem', err)}. HINT: fix the YAML syntax there.") from None
    return data if data is not None else {}


def load_config(path: str | pathlib.Path | None = None, overrides: list[str] = ()) -> Config:
    """Read a YAML file (or start from defaults), apply overrides, check every value."""
    data = read_yaml(path) if path else {}
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping of sections, got "
                          f"{type(data).__name__}. HINT: see examples/quickstart.yaml.")
    return from_dict(apply_overrides(data, list(overrides)))


def from_dict(data: dict) -> Config:
    """Build a checked Config from plain data (e.g. a saved ``config.yaml``)."""
    try:
        return _build(Config, data, "")
    except TypeError as err:  # a dataclass refused an argument we did not anticipate
        raise ConfigError(f"invalid configuration: {err}") from None

