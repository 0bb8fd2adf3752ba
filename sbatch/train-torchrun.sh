#!/usr/bin/env bash
# One task per node, torchrun in it: `sbatch [--nodes N] sbatch/train-torchrun.sh [CONFIG] [key=value ...]`
# Each node's torchrun starts NPROC processes and the torchruns meet in a c10d rendezvous on
# the job's first host; torchrun, not Slurm, numbers the ranks (hpcddp reads its variables).
# Processes per node: NPROC_PER_NODE if set, else one per GPU Slurm gave the node
# (--gpus-per-node), else one per CPU of the node's task (--cpus-per-task; each then gets one
# CPU). Node count, host and port come from Slurm; nothing here repeats them.
# Time limit: torchrun's agent does not forward SIGUSR2 to its workers, so no --signal here;
# the trainer keeps its own deadline instead (train.stop_before_end_s before the job's end
# time, which it reads from Slurm), then stops, checkpoints and requeues the job (--requeue),
# whose rerun resumes and appends to the same output file (--open-mode=append).
#SBATCH --job-name=hpcddp-torchrun
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --time=01:00:00
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
set -euo pipefail

# The Python that was active at submission (sbatch exports PATH); override to pin another.
PYTHON=${HPCDDP_PYTHON:-python3}
CONFIG=${HPCDDP_CONFIG:-examples/quickstart.yaml}
if [[ $# -gt 0 && $1 != *=* ]]; then
    CONFIG=$1
    shift
fi

CPUS=${SLURM_CPUS_PER_TASK:-1}
GPUS=${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-0}}
GPUS=${GPUS##*:}  # SLURM_GPUS_PER_NODE may name the type: a100:4
if ((GPUS > 0)); then
    NPROC=${NPROC_PER_NODE:-$GPUS}
else
    NPROC=${NPROC_PER_NODE:-$CPUS}
fi
# torchrun would set 1 thread per process; share the task's CPUs out instead.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((CPUS / NPROC > 0 ? CPUS / NPROC : 1))}
# Since Slurm 22.05 srun no longer inherits --cpus-per-task: without this, torchrun gets one CPU.
export SRUN_CPUS_PER_TASK=$CPUS

# The rendezvous lives on the first host of the job (node 0 of the step), on a port derived
# from the job id, so neighbouring jobs on a shared node do not collide.
RDZV_HOST=${HPCDDP_RDZV_HOST:-$("$PYTHON" -c 'import os; from hpcddp.hostlist import expand
print(expand(os.environ["SLURM_JOB_NODELIST"])[0])')}
RDZV_PORT=${HPCDDP_RDZV_PORT:-$("$PYTHON" -c 'import os; from hpcddp.ports import derive_port
print(derive_port(os.environ["SLURM_JOB_ID"], "torchrun", os.environ.get("SLURM_ARRAY_TASK_ID", "")))')}

echo "hpcddp: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: ${SLURM_NNODES} nodes x ${NPROC}" \
    "processes, rendezvous ${RDZV_HOST}:${RDZV_PORT}, config ${CONFIG}"
# --kill-on-bad-exit: one failed node ends the step instead of leaving the others waiting.
# shellcheck disable=SC2086  # the *_ARGS knobs are meant to split into words
srun --kill-on-bad-exit=1 --ntasks="$SLURM_NNODES" --ntasks-per-node=1 ${HPCDDP_SRUN_ARGS:-} \
    "$PYTHON" -m torch.distributed.run \
    --nnodes="$SLURM_NNODES" --nproc-per-node="$NPROC" \
    --rdzv-backend=c10d --rdzv-endpoint="$RDZV_HOST:$RDZV_PORT" --rdzv-id="$SLURM_JOB_ID" \
    ${HPCDDP_TORCHRUN_ARGS:-} \
    -m hpcddp train "$CONFIG" "$@"
