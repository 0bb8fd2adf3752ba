#!/usr/bin/env bash
# One task per rank: `sbatch [--nodes N --ntasks-per-node K] sbatch/train.sh [CONFIG] [key=value ...]`
# Every rank runs `python -m hpcddp train`, which reads its rank, world and master from the
# Slurm step. Counts come from the sbatch options alone; nothing here repeats them.
# Before the time limit Slurm sends USR2 to this shell (--signal=B:...), which passes it on to
# every rank: they agree to stop, save one checkpoint, and rank 0 requeues the job, which then
# resumes where it stopped (--requeue; --open-mode=append keeps one output file).
#SBATCH --job-name=hpcddp
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=01:00:00
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR2@120
#SBATCH --requeue
set -euo pipefail

# The Python that was active at submission (sbatch exports PATH); override to pin another.
PYTHON=${HPCDDP_PYTHON:-python3}
CONFIG=${HPCDDP_CONFIG:-examples/quickstart.yaml}
if [[ $# -gt 0 && $1 != *=* ]]; then
    CONFIG=$1
    shift
fi
# Since Slurm 22.05 srun no longer inherits --cpus-per-task; without this, loaders starve.
export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}

# Slurm may signal this shell alone, and bash runs a trap only between commands: so srun runs
# in the background while the shell waits, and the trap passes the signal to srun, which
# forwards it to every task.
signals=0
forward() {
    signals=$((signals + 1))
    echo "hpcddp: SIG$1 received; forwarding it to the job step" >&2
    kill -s "$1" "$srun_pid" 2>/dev/null || true
}
trap 'forward USR2' USR2
trap 'forward TERM' TERM

echo "hpcddp: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: ${SLURM_NTASKS} tasks," \
    "restart ${SLURM_RESTART_COUNT:-0}, config ${CONFIG}"
# --kill-on-bad-exit: one failed rank ends the step instead of leaving the others hanging.
# shellcheck disable=SC2086  # HPCDDP_SRUN_ARGS is meant to split into words
srun --kill-on-bad-exit=1 ${HPCDDP_SRUN_ARGS:-} "$PYTHON" -m hpcddp train "$CONFIG" "$@" &
srun_pid=$!
# A trapped signal ends `wait` early (status > 128) while srun still runs: wait again.
while :; do
    seen=$signals
    status=0
    wait "$srun_pid" || status=$?
    ((status > 128 && signals > seen)) || break
done
# 75: the ranks stopped with a checkpoint but could not requeue the job themselves (no
# scontrol inside their container, say); this shell runs outside it and tries once more.
if ((status == 75)); then
    echo "hpcddp: the step stopped to be requeued; requeueing job $SLURM_JOB_ID" >&2
    scontrol requeue "$SLURM_JOB_ID" || echo "hpcddp: requeue failed; resubmit to resume" >&2
fi
exit "$status"
