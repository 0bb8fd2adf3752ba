"""The sections of a run's configuration: every field with its unit in its name, its help beside it.

Every section is a keyword-only dataclass whose ``__post_init__`` rejects values that cannot
work, so a typo fails at start-up instead of an hour into the job. Each field's help lives in
its metadata (`setting`), which is where ``hpcddp train --help-config`` and the configuration
reference in docs/configuration.md read it from.
"""

import dataclasses
import os
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from hpcddp.config.slurm_option import (
    SlurmFlag,
    mail_events,
    mail_needs_user,
    not_negative,
    positive,
    slurm_flag,
    slurm_option,
)
from hpcddp.errors import ConfigError
from hpcddp.run_events import Event

T = TypeVar("T")


def setting(default: T, help: str) -> T:
    """A field with a default and the one line of help that ``--help-config`` shows."""
    field: T = dataclasses.field(default=default, metadata={"help": help})
    return field


def setting_from(factory: Callable[[], T], help: str) -> T:
    """A field whose default is made fresh for each config (for dicts)."""
    field: T = dataclasses.field(default_factory=factory, metadata={"help": help})
    return field


def field_help(field: "dataclasses.Field[Any]") -> str:
    """The help text of one field ('' when it has none)."""
    return str(field.metadata.get("help", ""))


def _positive(section: str, **values: float) -> None:
    """Raise if any of the named sizes is zero or negative."""
    for name, value in values.items():
        positive(f"{section}.{name}", value)


def _not_negative(section: str, **values: float) -> None:
    """Raise if any of the named values is below zero (0 means off or default)."""
    for name, value in values.items():
        not_negative(f"{section}.{name}", value)


def _fraction(section: str, **values: float) -> None:
    """Raise unless each value lies in [0, 1]."""
    for name, value in values.items():
        if not 0 <= value <= 1:
            raise ConfigError(
                f"{section}.{name} must be between 0 and 1, got {value}. "
                f"HINT: set {section}.{name} to a fraction such as 0.1."
            )


def _one_of(section: str, name: str, value: object, allowed: tuple[str, ...]) -> None:
    """Raise if a choice is not among the allowed ones."""
    if value not in allowed:
        raise ConfigError(
            f"{section}.{name}={value!r} is not one of {list(allowed)}. "
            f"HINT: set {section}.{name}={allowed[0]}."
        )


@dataclasses.dataclass(kw_only=True)
class RunConfig:
    """Where outputs go and how a run starts."""

    name: str = setting("run", "a label for people; nothing looks runs up by it")
    dir: str = setting("runs/run", "the run directory: checkpoints, metrics, logs, summary.json")
    seed: int = setting(0, "seeds weights, data order and every rank's random streams")
    resume: bool = setting(True, "continue from the latest complete checkpoint in run.dir")
    force: bool = setting(False, "resume into a run directory written by a different config")
    overwrite: bool = setting(
        False,
        "with resume=false, move an existing run directory aside (RUN_DIR.old-TIME) "
        "instead of refusing to start",
    )
    same_code: bool = setting(
        False,
        "refuse to resume when the code (git commit, diff) or torch/hpcddp versions differ "
        "from the run's; false: warn in one line",
    )

    def __post_init__(self) -> None:
        if not self.dir.strip():
            raise ConfigError(
                "run.dir is empty, so the run would write into the current directory. "
                "HINT: set run.dir=runs/<name>."
            )
        self.dir = os.path.expanduser(self.dir)  # "~/runs/x": the shell would have expanded it


@dataclasses.dataclass(kw_only=True)
class FactoryConfig:
    """A user function ``package.module:function`` called with ``kwargs``."""

    factory: str = setting("", "your function as package.module:function")
    kwargs: dict[str, Any] = setting_from(dict, "keyword arguments passed to the factory")

    def __post_init__(self) -> None:
        if self.factory and ":" not in self.factory:
            raise ConfigError(
                f"factory {self.factory!r} must look like 'package.module:function'. "
                "HINT: e.g. factory: examples.quickstart:make_model"
            )


@dataclasses.dataclass(kw_only=True)
class DataConfig(FactoryConfig):
    """The dataset factory and how batches are drawn from it."""

    factory: str = setting("", "returns train, (train, eval) or {'train':..., 'eval':...}")
    batch_size: int = setting(32, "samples per rank per micro-batch")
    num_workers: int = setting(-1, "DataLoader workers per rank; -1: this rank's CPUs minus one")
    drop_last: bool = setting(False, "drop each rank's last, smaller batch of an epoch")
    shuffle: bool = setting(True, "reshuffle the training set every epoch (seeded)")

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("data", batch_size=self.batch_size)
        if self.num_workers < -1:
            raise ConfigError(
                f"data.num_workers must be >= 0 (or -1 for automatic), "
                f"got {self.num_workers}. HINT: set data.num_workers=-1."
            )


@dataclasses.dataclass(kw_only=True)
class OptimConfig:
    """Optimizer and learning-rate schedule."""

    name: str = setting("adamw", "adamw or sgd")
    lr: float = setting(1e-3, "peak learning rate")
    weight_decay: float = setting(0.0, "decoupled (adamw) or L2 (sgd) weight decay")
    momentum: float = setting(0.9, "sgd momentum (sgd only)")
    warmup_steps: int = setting(0, "optimizer steps of linear warmup from 0 to lr")
    schedule: str = setting("cosine", "cosine decay after warmup, or constant")
    min_lr_ratio: float = setting(0.1, "floor of the cosine, as a fraction of lr")
    grad_clip_norm: float = setting(0.0, "clip the global gradient norm to this; 0: no clipping")
    fused: bool = setting(
        True, "the fused optimizer kernel where torch has one: one pass over the weights per step"
    )

    def __post_init__(self) -> None:
        _one_of("optim", "name", self.name, ("adamw", "sgd"))
        _one_of("optim", "schedule", self.schedule, ("cosine", "constant"))
        _positive("optim", lr=self.lr)
        _fraction("optim", min_lr_ratio=self.min_lr_ratio, momentum=self.momentum)
        _not_negative(
            "optim",
            warmup_steps=self.warmup_steps,
            grad_clip_norm=self.grad_clip_norm,
            weight_decay=self.weight_decay,
        )


@dataclasses.dataclass(kw_only=True)
class TrainConfig:
    """The training loop."""

    epochs: int = setting(1, "passes over the training set")
    max_steps: int = setting(0, "stop after this many optimizer steps; 0: run all epochs")
    grad_accum_steps: int = setting(1, "micro-batches per optimizer step")
    precision: str = setting(
        "fp32", "fp32, bf16 (autocast) or fp16 (autocast + GradScaler on the rank's device type)"
    )
    tf32: bool = setting(
        True,
        "fp32 matmuls and convolutions on TF32 tensor cores (Ampere and newer GPUs: fp32's "
        "range, a 10-bit mantissa in products, several times faster); false: full fp32",
    )
    eval_every_steps: int = setting(0, "evaluate every N steps; 0: at the end of every epoch")
    checkpoint_every_steps: int = setting(0, "checkpoint every N steps; 0: every epoch's end")
    keep_checkpoints: int = setting(3, "how many of the newest checkpoints to keep")
    log_every_steps: int = setting(10, "write a metrics line (and a log line) every N steps")
    compile: bool = setting(False, "torch.compile the model (in place, inside DDP)")
    sync_batchnorm: bool = setting(False, "convert BatchNorm layers to SyncBatchNorm")
    stop_after_steps: int = setting(0, "stop early after N steps, checkpoint kept (for tests)")
    stop_before_end_s: float = setting(
        120.0, "checkpoint and requeue this many seconds before the job's time limit"
    )
    nonfinite: str = setting(
        "stop", "a NaN/inf loss: stop (every rank, no checkpoint of it), skip the step, or off"
    )
    nonfinite_max_skips: int = setting(
        10, "with nonfinite=skip: stop once more than this many steps were skipped"
    )
    nonfinite_grad_norm: bool = setting(
        False, "also treat a NaN/inf gradient norm as non-finite (one pass over the gradients)"
    )
    checkpoint_async: bool = setting(
        True, "write checkpoints in the background; training waits only for a copy to memory"
    )
    count_flops: bool = setting(
        True, "count the model's FLOPs once (torch.utils.flop_counter) for TFLOP/s and MFU"
    )
    peak_tflops: float = setting(
        0.0,
        "one device's peak TFLOP/s, for MFU; 0: the dense bf16/fp16 peak of a known GPU "
        "(H100, A100, ...), no MFU on the CPU",
    )

    def __post_init__(self) -> None:
        _positive(
            "train",
            epochs=self.epochs,
            grad_accum_steps=self.grad_accum_steps,
            keep_checkpoints=self.keep_checkpoints,
            log_every_steps=self.log_every_steps,
        )
        _one_of("train", "precision", self.precision, ("fp32", "bf16", "fp16"))
        _not_negative(
            "train",
            max_steps=self.max_steps,
            eval_every_steps=self.eval_every_steps,
            checkpoint_every_steps=self.checkpoint_every_steps,
            stop_after_steps=self.stop_after_steps,
            stop_before_end_s=self.stop_before_end_s,
            nonfinite_max_skips=self.nonfinite_max_skips,
            peak_tflops=self.peak_tflops,
        )
        _one_of("train", "nonfinite", self.nonfinite, ("stop", "skip", "off"))


@dataclasses.dataclass(kw_only=True)
class DistConfig:
    """Process group and DistributedDataParallel knobs."""

    backend: str = setting("", "gloo or nccl; empty: nccl on CUDA, gloo otherwise")
    timeout_s: float = setting(300.0, "collective timeout: a hung peer ends the job after this")
    bucket_cap_mb: float = setting(25.0, "DDP gradient bucket size")
    find_unused_parameters: bool = setting(False, "DDP: allow parameters without gradients")
    static_graph: bool = setting(False, "DDP: the graph is the same every step")
    gradient_as_bucket_view: bool = setting(
        True, "DDP: gradients live in the buckets (less memory)"
    )
    socket_ifname: str = setting(
        "",
        "network interface for gloo/NCCL (sets GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME); a "
        "comma list takes the first each node has; empty: the one that routes to the master",
    )
    pin_cpus: bool = setting(
        True,
        "pin each GPU rank to the CPUs of its GPU's NUMA node (sysfs), within those Slurm gave "
        "it; false: leave the binding as it is",
    )
    hang_timeout_s: float = setting(
        0.0,
        "no training step on a rank for this long is a hang: every rank's stacks go to "
        "RUN_DIR/logs/hang/, the rank that is behind is named and ends as a rank death (the "
        "job goes on without its node); 0: off",
    )
    hang_slow_phase_s: float = setting(
        0.0,
        "the hang budget of the first step, an evaluation or a checkpoint save; 0: 10x "
        "dist.hang_timeout_s",
    )
    strategy: str = setting(
        "ddp",
        "ddp: a whole replica of the model on every rank; fsdp: parameters, gradients and "
        "optimizer state sharded across the ranks (FSDP2), for models bigger than one GPU",
    )
    fsdp_blocks: list[str] = setting_from(
        list,
        "fsdp: class names of the blocks each sharded on their own (a list); empty: the "
        "children of the model's largest ModuleList",
    )
    fsdp_reshard_after_forward: bool = setting(
        True, "fsdp: free each block's gathered parameters after its forward (less memory)"
    )
    fsdp_activation_checkpointing: bool = setting(
        False,
        "fsdp: keep only each block's input and recompute its activations in the backward "
        "(less memory, about a third more compute)",
    )
    fsdp_cpu_offload: bool = setting(
        False,
        "fsdp, GPU only: keep the sharded parameters, gradients and optimizer state in host "
        "memory, copied to the GPU for each block (much less GPU memory, slower)",
    )
    fsdp_meta_init: str | bool = setting(
        "auto",
        "fsdp: build the model on the meta device so that each rank only ever holds its shards, "
        "then initialise them: auto: when the model has init_weights() and its factory loads "
        "no weights (else built whole on each rank, with a warning); true: also by each "
        "module's reset_parameters(), refused if a parameter or buffer has neither; false: "
        "always built whole on each rank",
    )

    def __post_init__(self) -> None:
        if self.backend:
            _one_of("dist", "backend", self.backend, ("gloo", "nccl"))
        _one_of("dist", "strategy", self.strategy, ("ddp", "fsdp"))
        if isinstance(self.fsdp_meta_init, bool):  # YAML's true/false, as users write them
            self.fsdp_meta_init = str(self.fsdp_meta_init).lower()
        _one_of("dist", "fsdp_meta_init", self.fsdp_meta_init, ("auto", "true", "false"))
        _positive("dist", timeout_s=self.timeout_s, bucket_cap_mb=self.bucket_cap_mb)
        for name in ("hang_timeout_s", "hang_slow_phase_s"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"dist.{name}={getattr(self, name)} is negative. HINT: give seconds, or 0 "
                    "for the default (hang_timeout_s=0 turns the hang watchdog off)."
                )
        if self.hang_timeout_s >= self.timeout_s:
            raise ConfigError(
                f"dist.hang_timeout_s={self.hang_timeout_s:g} is not below dist.timeout_s="
                f"{self.timeout_s:g}: the ranks waiting for a hung one would time out first. "
                "HINT: lower dist.hang_timeout_s or raise dist.timeout_s."
            )


LAUNCHERS = ("srun", "torchrun")
TASK_KINDS = ("classification", "regression", "language_modeling")
LOSSES = ("cross_entropy", "mse", "l1")


@dataclasses.dataclass(kw_only=True)
class TaskConfig:
    """What is learned: the loss, the evaluation metrics, and your own step hooks."""

    kind: str = setting(
        "classification",
        "classification (loss, accuracy), regression (loss, MSE, MAE) or language_modeling "
        "(loss, perplexity): the default loss and the eval metrics",
    )
    loss: str = setting(
        "",
        "cross_entropy, mse, l1 or package.module:function(outputs, targets); empty: from "
        "task.kind (used only when the model's output has no loss)",
    )
    training_step: str = setting(
        "", "package.module:function(model, batch) -> loss; overrides the model's own hook"
    )
    eval_step: str = setting(
        "",
        "package.module:function(model, batch) -> {name: (sum, count)}; replaces the built-in "
        "metrics",
    )

    def __post_init__(self) -> None:
        _one_of("task", "kind", self.kind, TASK_KINDS)
        if self.loss and self.loss not in LOSSES and ":" not in self.loss:
            raise ConfigError(
                f"task.loss={self.loss!r} is neither one of {list(LOSSES)} nor "
                "'package.module:function'. HINT: e.g. task.loss=mse"
            )
        for name in ("training_step", "eval_step"):
            value = getattr(self, name)
            if value and ":" not in value:
                raise ConfigError(
                    f"task.{name}={value!r} must look like 'package.module:function'. "
                    f"HINT: e.g. task.{name}=mypkg.steps:{name}"
                )


CONTAINER_RUNTIMES = ("", "apptainer", "singularity", "pyxis")


def _strings(where: str, values: object) -> None:
    """Raise unless ``values`` is a list of strings (YAML lists are not type-checked on load)."""
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ConfigError(
            f"{where} must be a list of strings, got {values!r}. "
            f"HINT: {where}: ['first', 'second'] in YAML, or {where}=[first,second]."
        )


@dataclasses.dataclass(kw_only=True)
class ContainerConfig:
    """The container every rank runs in; the batch shell (and requeueing) stays outside it."""

    runtime: str = setting(
        "", "apptainer, singularity or pyxis (srun --container-image); empty: none"
    )
    image: str = setting("", "the image: a .sif path (apptainer/singularity) or a pyxis image name")
    bind: list[str] = setting_from(list, "paths to mount, src[:dst], e.g. /scratch:/scratch")
    options: list[str] = setting_from(list, "more arguments for the runtime (apptainer exec ...)")

    def __post_init__(self) -> None:
        _one_of("slurm.container", "runtime", self.runtime, CONTAINER_RUNTIMES)
        _strings("slurm.container.bind", self.bind)
        _strings("slurm.container.options", self.options)
        if self.runtime and not self.image:
            raise ConfigError(
                f"slurm.container.runtime={self.runtime} needs an image. "
                "HINT: set slurm.container.image=<path to .sif or image name>."
            )


@dataclasses.dataclass(kw_only=True)
class SlurmConfig:
    """What to ask Slurm for when hpcddp submits the job."""

    # The option table: one row per sbatch option, each spelt for sbatch, submitit and the
    # command line by hpcddp.slurm.options (hpcddp.config.slurm_option says what a row holds).
    job_name: str = slurm_option(
        "hpcddp",
        "job name (squeue, output file names)",
        SlurmFlag("job-name", "name", "--job-name", example="llm-pretrain"),
    )
    nodes: int = slurm_option(
        1,
        "nodes to run on",
        SlurmFlag("nodes", "nodes", "--nodes", example=2, check=positive),
    )
    tasks_per_node: int = slurm_option(
        1,
        "ranks per node",
        SlurmFlag(
            "ntasks-per-node", "tasks_per_node", "--tasks-per-node", example=8, check=positive
        ),
    )
    gpus_per_node: int = slurm_option(
        0,
        "GPUs per node",
        SlurmFlag(
            "gpus-per-node", "gpus_per_node", "--gpus-per-node", example=8, check=not_negative
        ),
    )
    cpus_per_task: int = slurm_option(
        0,
        "CPUs per rank; 0: 1 on CPU, on GPUs the node's cores over its GPUs (at most 16)",
        SlurmFlag(
            "cpus-per-task", "cpus_per_task", "--cpus-per-task", example=12, check=not_negative
        ),
    )
    mem_gb: float = slurm_option(
        0.0,
        "memory per node in GB; 0: the partition's default",
        SlurmFlag("mem", "mem_gb", "--mem-gb", example=480, check=not_negative),
    )
    time_min: int = slurm_option(
        60,
        "time limit in minutes",
        SlurmFlag("time", "timeout_min", "--time", example=2880, check=positive),
    )
    partition: str = slurm_option(
        "",
        "partition; empty: the cluster's default",
        SlurmFlag("partition", "slurm_partition", "--partition", example="gpu-a100"),
    )
    account: str = slurm_option(
        "",
        "account to charge; empty: your default",
        SlurmFlag("account", "slurm_account", "--account", example="proj123"),
    )
    qos: str = slurm_option(
        "",
        "quality of service; empty: the default",
        SlurmFlag("qos", "slurm_qos", "--qos", example="high"),
    )
    constraint: str = slurm_option(
        "",
        "node features the job needs, as sbatch --constraint takes them; empty: any node",
        SlurmFlag("constraint", "slurm_constraint", "--constraint", example="a100&ib"),
    )
    mail_type: str = slurm_option(
        "",
        "Slurm mails slurm.mail_user on these events, comma-separated: BEGIN, END, FAIL, "
        "REQUEUE, TIME_LIMIT_90, ALL, ...; empty: no mail",
        SlurmFlag(
            "mail-type", "slurm_mail_type", "--mail-type", example="END,FAIL", check=mail_events
        ),
    )
    mail_user: str = slurm_option(
        "",
        "where Slurm's mail goes (an address); needed with slurm.mail_type",
        SlurmFlag("mail-user", "slurm_mail_user", "--mail-user", example="you@example.org"),
    )
    reservation: str = slurm_option(
        "",
        "run in this reservation (scontrol show reservation); empty: none",
        SlurmFlag("reservation", "", "--reservation", example="maintenance"),
    )
    exclusive: bool = slurm_option(
        False,
        "the nodes to this job alone, shared with no other job",
        SlurmFlag("exclusive", "slurm_exclusive", "--exclusive", example=True),
    )
    # End of the option table.
    signal_delay_s: int = setting(
        120,
        "USR2 this long before the time limit: checkpoint, requeue; at most "
        "train.stop_before_end_s, the stop margin (0: no signal; a chain's links get none)",
    )
    launcher: str = setting(
        "srun",
        "how the job script starts ranks: srun (a task per rank) "
        "or torchrun (a task per node); submit() uses srun",
    )
    extra: dict[str, Any] = setting_from(dict, "more sbatch options, name: value (true: a flag)")
    max_failures: int = setting(
        2,
        "when a rank dies (not a preemption), restart on a spare node or requeue the job without "
        "the failing node at most "
        "this many times, and not after a retry that gained no step; 0: never",
    )
    spare_nodes: int = setting(
        0,
        "nodes held in reserve on top of slurm.nodes: when a rank dies, training restarts "
        "within the job on a spare instead of requeueing the job",
    )
    shrink_on_failure: bool = setting(
        False,
        "when a rank dies and no spare is left, restart within the job on the nodes that "
        "remain (fewer ranks, the global batch kept) instead of requeueing, down to "
        "slurm.min_nodes",
    )
    min_nodes: int = setting(
        0,
        "the fewest nodes slurm.shrink_on_failure goes on with; 0: all of slurm.nodes",
    )
    chain: int = setting(
        1,
        "submit the run as this many jobs linked by --dependency=singleton, each resuming "
        "where the last stopped at its time limit (no requeue then); 1: one job",
    )
    setup: list[str] = setting_from(
        list, "shell lines the job script runs before the ranks start (module load, exports)"
    )
    container: ContainerConfig = setting_from(ContainerConfig, "the container the ranks run in")

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            flag = slurm_flag(field)
            if flag and flag.check:
                flag.check(f"slurm.{field.name}", getattr(self, field.name))
        _positive("slurm", chain=self.chain)
        _not_negative(
            "slurm",
            signal_delay_s=self.signal_delay_s,
            max_failures=self.max_failures,
            spare_nodes=self.spare_nodes,
            min_nodes=self.min_nodes,
        )
        _floor_within(self)
        _one_of("slurm", "launcher", self.launcher, LAUNCHERS)
        _strings("slurm.setup", self.setup)
        if any("\n" in line for line in self.setup):
            raise ConfigError(
                "slurm.setup lines may not contain newlines. HINT: one list item per line."
            )
        _chain_alone(self)
        mail_needs_user(self.mail_type, self.mail_user)

    @property
    def chained(self) -> bool:
        """Whether the run goes as a chain of jobs (``slurm.chain`` > 1): the one spelling of
        that question (`hpcddp.slurm.chain`)."""
        return self.chain > 1


def _floor_within(slurm: SlurmConfig) -> None:
    """A shrunken job never has more nodes than the job asked for."""
    if slurm.min_nodes > slurm.nodes:
        raise ConfigError(
            f"slurm.min_nodes={slurm.min_nodes} is above slurm.nodes={slurm.nodes}: a job "
            "shrinks from its nodes, never grows. HINT: set slurm.min_nodes between 1 and "
            f"{slurm.nodes} (0: all of slurm.nodes, never shrink below what was asked)."
        )


def _chain_alone(slurm: SlurmConfig) -> None:
    """A chain links its jobs with --dependency=singleton; another dependency would replace it."""
    if slurm.chained and any(str(name).replace("_", "-") == "dependency" for name in slurm.extra):
        raise ConfigError(
            f"slurm.chain={slurm.chain} links its jobs with --dependency=singleton, which "
            "slurm.extra.dependency would replace. HINT: remove slurm.extra.dependency, or "
            "set slurm.chain=1 and chain the jobs yourself."
        )


TRACKING_BACKENDS = ("tensorboard", "wandb", "mlflow")


@dataclasses.dataclass(kw_only=True)
class TrackingConfig:
    """Where rank 0 sends what it logs, besides metrics.jsonl (one run across requeues)."""

    backends: list[str] = setting_from(list, "any of tensorboard, wandb, mlflow (a list)")
    project: str = setting("", "W&B project / MLflow experiment; empty: run.name")

    def __post_init__(self) -> None:
        for name in self.backends:
            _one_of("tracking", "backends", name, TRACKING_BACKENDS)


@dataclasses.dataclass(kw_only=True)
class NotifyConfig:
    """Webhooks told what happens to the run (`hpcddp.notify`), posted in the background."""

    url: str = setting(
        "", "webhook (http or https) that gets each event as a JSON object; empty: off"
    )
    slack_url: str = setting(
        "", "Slack or Mattermost incoming webhook: one readable line per event; empty: off"
    )
    events: list[str] = setting_from(
        lambda: list(Event.names()), f"which events to post: any of {', '.join(Event.names())}"
    )
    timeout_s: float = setting(
        5.0, "a post that has no answer by then is given up (one line in the log); never waited on"
    )

    def __post_init__(self) -> None:
        _strings("notify.events", self.events)
        for name in self.events:
            _one_of("notify", "events", name, Event.names())
        _positive("notify", timeout_s=self.timeout_s)
        _webhook("url", self.url)
        _webhook("slack_url", self.slack_url)


def _webhook(name: str, url: str) -> None:
    """An empty URL (off) or an http(s) one with a host."""
    parsed = urllib.parse.urlsplit(url)
    if url and (parsed.scheme not in ("http", "https") or not parsed.hostname):
        raise ConfigError(
            f"notify.{name}={url!r} is not an http(s) URL. HINT: set notify.{name}="
            f"https://host/path (a webhook), or notify.{name}= to turn it off."
        )


def _one_stop_margin(stop_before_end_s: float, signal_delay_s: int) -> None:
    """The trainer's own clock keeps the stop margin; Slurm's signal may come no earlier.

    A signal earlier than the trainer's margin would make the margin a setting that does
    nothing under srun and the only one under torchrun (which gets no signal).
    """
    if signal_delay_s > stop_before_end_s:
        raise ConfigError(
            f"slurm.signal_delay_s={signal_delay_s} is longer than train.stop_before_end_s="
            f"{stop_before_end_s:g}, the stop margin (the time a checkpoint and requeue need). "
            f"HINT: raise train.stop_before_end_s to {signal_delay_s} as well."
        )


def _chain_resumes(slurm: SlurmConfig, resume: bool) -> None:
    """Every link of a chain but the first continues the run in run.dir: it must resume."""
    if slurm.chained and not resume:
        raise ConfigError(
            f"slurm.chain={slurm.chain} with run.resume=false: each link after the first must "
            "resume the run from its checkpoint. HINT: set run.resume=true (and a new run.dir "
            "for a fresh run)."
        )


@dataclasses.dataclass(kw_only=True)
class Config:
    """A whole run."""

    run: RunConfig = setting_from(RunConfig, "where outputs go and how a run starts")
    model: FactoryConfig = setting_from(FactoryConfig, "the model factory")
    data: DataConfig = setting_from(DataConfig, "the dataset factory and batching")
    optim: OptimConfig = setting_from(OptimConfig, "optimizer and learning-rate schedule")
    train: TrainConfig = setting_from(TrainConfig, "the training loop")
    dist: DistConfig = setting_from(DistConfig, "process group and DDP knobs")
    slurm: SlurmConfig = setting_from(SlurmConfig, "what hpcddp asks Slurm for")
    task: TaskConfig = setting_from(TaskConfig, "the loss, the eval metrics and step hooks")
    tracking: TrackingConfig = setting_from(TrackingConfig, "TensorBoard, W&B and MLflow")
    notify: NotifyConfig = setting_from(NotifyConfig, "a webhook told of starts, stops, failures")

    def __post_init__(self) -> None:
        _one_stop_margin(self.train.stop_before_end_s, self.slurm.signal_delay_s)
        _chain_resumes(self.slurm, self.run.resume)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as saved in the run directory."""
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        """The resolved configuration as YAML that `hpcddp.config.load_config` reads back."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)
