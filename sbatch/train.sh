#!/usr/bin/env bash
# One task per rank: `sbatch [--nodes N --ntasks-per-node K] sbatch/train.sh [CONFIG] [key=value ...]`
# Every rank runs `python -m hpcddp train`, which reads its rank, world and master from the
# Slurm step. Counts come from the sbatch options alone; nothing here repeats them.
#SBATCH --job-name=hpcddp
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=01:00:00
#SBATCH --output=%x-%j.out
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

echo "hpcddp: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}: ${SLURM_NTASKS} tasks, config ${CONFIG}"
# --kill-on-bad-exit: one failed rank ends the step instead of leaving the others hanging.
srun --kill-on-bad-exit=1 ${HPCDDP_SRUN_ARGS:-} "$PYTHON" -m hpcddp train "$CONFIG" "$@"
