#!/bin/bash
# Compare pipelm against an independent PyTorch reference (tests/reference/torch_ref.py):
# step losses and step-1 gradients of a small random GPT-2.
# Exit: 0 pass, 1 fail (also: no torch), 77 skip (no torch with PIPELM_TEST_NO_TORCH=1), 99 hard error (no pipelm binary).

PY=/usr/bin/python3

if ! [ -x "$PY" ] || ! "$PY" -c 'import torch, numpy' >/dev/null 2>&1; then
    # the reference is how pipelm's numbers are proven: its absence fails (tests/lib/lib.sh need_torch)
    if [ "${PIPELM_TEST_NO_TORCH:-0}" = 1 ]; then echo "SKIP: $PY cannot import torch/numpy (PIPELM_TEST_NO_TORCH=1)"; exit 77; fi
    echo "FAIL: $PY cannot import torch and numpy: ./jobs/setup.sh --test installs them (PIPELM_TEST_NO_TORCH=1 skips)"
    exit 1
fi

here=$(cd "$(dirname "$0")" && pwd)
script="$here/torch_ref.py"
if ! [ -f "$script" ] && [ -n "${srcdir:-}" ]; then
    script="$srcdir/torch_ref.py"
fi
if ! [ -f "$script" ]; then
    echo "ERROR: cannot find torch_ref.py (looked in $here and \$srcdir)"
    exit 99
fi

if [ -n "${PIPELM:-}" ]; then
    bin=$PIPELM
elif [ -x ../src/pipelm ]; then
    bin=../src/pipelm
elif [ -x ./pipelm ]; then          # non-recursive build: tests run in builddir
    bin=./pipelm
elif [ -x ../pipelm ]; then
    bin=../pipelm
elif command -v pipelm >/dev/null 2>&1; then
    bin=$(command -v pipelm)
else
    echo "ERROR: no pipelm binary (set \$PIPELM, or build ../src/pipelm)"
    exit 99
fi
case $bin in
    */*) d=$(cd "$(dirname "$bin")" 2>/dev/null && pwd) && bin=${d%/}/$(basename "$bin") ;;
esac
if ! [ -x "$bin" ]; then
    echo "ERROR: pipelm binary '$bin' is not executable"
    exit 99
fi

# TORCH_REF_KEEP=DIR keeps the model, tokens, metrics, grads and log there
if [ -n "${TORCH_REF_KEEP:-}" ]; then
    mkdir -p "$TORCH_REF_KEEP" || exit 99
    tmp=$TORCH_REF_KEEP
else
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/torch_ref.XXXXXX") || exit 99
    trap 'rm -rf "$tmp"' EXIT
fi

# one BLAS thread keeps the run deterministic and avoids oversubscription
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# torch_ref.py wraps the pipelm call in `timeout 120`
"$PY" "$script" --pipelm "$bin" --keep "$tmp" --timeout 120 "$@"
rc=$?
case $rc in
    0|1) exit $rc ;;
    *) exit 99 ;;
esac
