#!/usr/bin/env bash
# The GPU tier on a GPU machine that has no network, in under 8 minutes:
#   1. installs hpcddp onto the machine's own Python and torch, without network: an editable
#      install with no dependencies and no build isolation, plus the small wheels the image
#      lacks (submitit; py-spy, which the hang watchdog uses when it can) from tests/gpu/wheels/,
#      a git-ignored folder filled beforehand on a machine with network:
#        pip download --no-deps --only-binary=:all: --python-version 3.12 \
#          --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 --platform any \
#          -d tests/gpu/wheels submitit py-spy
#      (carried to the GPU machine with the working tree; without them the tier still runs);
#   2. runs the tier in one process (-p no:xdist: its tests share the GPUs); rows that need
#      more GPUs than the machine has are named at the end, not run;
#   3. times the trainer against a hand-written DDP + NCCL loop on cuda:0 (tests/gpu/step_time.py).
# Usage: tests/gpu/run.sh [pytest arguments]   (PYTHON=... picks the interpreter; default python3)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PYTHON=${PYTHON:-python3}
WHEELS=tests/gpu/wheels
started=$SECONDS

say() { printf '\n== %s (%ds)\n' "$*" "$((SECONDS - started))"; }

say "the machine"
nvidia-smi -L || true
"$PYTHON" - <<'EOF'
import sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}")
if not torch.cuda.is_available():
    sys.exit("tests/gpu/run.sh: torch sees no GPU here; the GPU tier needs one")
print(f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}")
EOF

say "installing hpcddp onto this torch, without network"
missing=()
for module in yaml psutil numpy xxhash submitit; do
    "$PYTHON" -c "import $module" 2>/dev/null || missing+=("$module")
done
if ((${#missing[@]})); then
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        "$PYTHON" -m pip install --no-index --no-deps --find-links "$WHEELS" \
            --disable-pip-version-check --quiet "$WHEELS"/*.whl
    else
        echo "missing ${missing[*]} and no wheels in $WHEELS (see this script's header)" >&2
    fi
fi
if ! "$PYTHON" -m pip install --no-deps --no-build-isolation --no-index --quiet \
    --disable-pip-version-check -e .; then
    echo "pip could not install hpcddp; running it from the checkout instead (PYTHONPATH)" >&2
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PYTHON" -c "import hpcddp, torch; print('hpcddp from', hpcddp.__path__[0])"

say "the GPU tier"
status=0
"$PYTHON" -m pytest -p no:xdist -p no:cacheprovider -o addopts=-ra tests/gpu "$@" || status=$?

say "step time: the trainer against a hand-written DDP + NCCL loop"
timeout 200 "$PYTHON" -m tests.gpu.step_time --runs 3 --steps 300 || echo "step time failed" >&2

say "done"
exit "$status"
