# tests/lib/lib.sh — shared helpers for the shell tests (sourced, not run).
# PIPELM, MPIEXEC and TOP_SRCDIR come from automake's AM_TESTS_ENVIRONMENT; defaults let a
# test run by hand from the build directory.
set -u
PIPELM=${PIPELM:-$(pwd)/pipelm}
MPIEXEC=${MPIEXEC:-mpiexec}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pipelm_test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
PASS=0
FAIL=0
T_START=$(date +%s)

# full_tier: true in the full tier (PIPELM_TEST_FULL=1: ./jobs/setup.sh --test --full, .ci/run),
# which adds the slow checks to the plain tier's (make check, ./jobs/setup.sh --test). A test
# that leaves a check to the full tier says which and why (docs/testing.md lists them).
full_tier() { [ "${PIPELM_TEST_FULL:-0}" = 1 ]; }
# full_only NAME: note that check NAME runs in the full tier only
full_only() { echo "skip - $1 (full tier only: PIPELM_TEST_FULL=1)"; }

# ok NAME: count a passed check; bad NAME WHY: count a failure and say why.
ok() { PASS=$((PASS + 1)); echo "ok   - $1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $1: $2"; }

# mpirun_t SECONDS NP ARGS...: pipelm under mpiexec with a hard timeout (a hang fails).
mpirun_t() {
    local secs=$1 np=$2
    shift 2
    timeout -k 5 "$secs" "$MPIEXEC" -n "$np" "$PIPELM" "$@"
}

# need_torch: PY (Debian's python3, which ./jobs/setup.sh --test gives torch, numpy and h5py)
# and TORCH=1; where it cannot import torch and numpy, the test fails: the references are how
# pipelm's numbers are proven, so their absence is not a skip. PIPELM_TEST_NO_TORCH=1 (a
# machine set up without --test) runs the rest with TORCH=0 and says what is left out.
need_torch() {
    PY=/usr/bin/python3
    TORCH=1
    if [ -x "$PY" ] && "$PY" -c 'import torch, numpy' > /dev/null 2>&1; then return 0; fi
    TORCH=0
    if [ "${PIPELM_TEST_NO_TORCH:-0}" = 1 ]; then
        echo "note: $PY cannot import torch/numpy (PIPELM_TEST_NO_TORCH=1): the torch checks are left out"
        return 0
    fi
    echo "FAIL: $PY cannot import torch and numpy, which the reference checks need: ./jobs/setup.sh --test installs" \
        "them (or set PIPELM_TEST_NO_TORCH=1 to run without them)"
    exit 1
}

# close A B [TOL]: every step loss of metrics file A within relative TOL (default 1e-5) of the
# same step's in B; prints the steps compared and the largest difference.
close() {
    awk -v tol="${3:-1e-5}" -F'"step":' '/"event":"step"/ { split($2, a, ","); l = $0; sub(/.*"loss":/, "", l); sub(/,.*/, "", l);
                                       if (FILENAME == ARGV[1]) A[a[1]] = l; else B[a[1]] = l }
        END { for (s in A) { if (!(s in B)) exit 1; d = A[s] - B[s]; if (d < 0) d = -d; r = d / (B[s] < 0 ? -B[s] : B[s]);
                             if (r > m) m = r; k++ }
              printf "%d steps, max relative difference %.3g\n", k, m; exit !(k > 0 && m <= tol) }' "$1" "$2"
}
# run TAG NP ARGS...: `pipelm train $COMMON ARGS` on NP ranks (the test sets COMMON) into
# TAG.jsonl (metrics), TAG.bin (final weights) and TAG.out; a non-zero exit fails the test.
run() {
    local tag=$1 np=$2
    shift 2
    mpirun_t 180 "$np" train $COMMON --metrics "$tag.jsonl" --save-final "$tag.bin" "$@" > "$tag.out" 2>&1
    local rc=$?
    if [ $rc -ne 0 ]; then
        bad "$tag" "exit status $rc ($(grep -m2 error "$tag.out" | tr '\n' ' '))"
        return 1
    fi
}
# losses FILE: the step losses of a metrics file, one per line, exactly as written.
losses() { grep '"event":"step"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }

# expect NAME STATUS PATTERN CMD...: CMD exits with STATUS and its output (stdout and stderr)
# holds PATTERN.
expect() {
    local name=$1 want=$2 pat=$3
    shift 3
    local out rc
    out=$("$@" 2>&1)
    rc=$?
    if [ "$rc" -eq "$want" ] && printf '%s\n' "$out" | grep -q -- "$pat"; then ok "$name"
    else bad "$name" "exit $rc (want $want), output: $(printf '%s' "$out" | head -c 400)"; fi
}

# descendants PID: every process below PID (mpiexec -> hydra proxy -> ranks)
descendants() {
    local c
    for c in $(pgrep -P "$1"); do
        echo "$c"
        descendants "$c"
    done
}

# finish: print the plain summary line (and the test's time) and exit with the right status.
finish() {
    echo "$PASS passed, $FAIL failed in $(($(date +%s) - T_START)) s"
    [ "$FAIL" -eq 0 ]
}
