#!/bin/bash
# bench/gpu_check.sh — every check of the CUDA backend that needs a GPU, in one call of the
# device tool (one H200; target under 8 minutes), results under $OUT.
#
# Prepare on a development machine (no GPU needed):   bench/get_debs.sh
#   (.debs/: Debian 12 packages of MPICH, OpenBLAS, parallel HDF5, inih, Check, pkgconf, make,
#   and the generated autotools files; the GPU machine has nvcc and PyTorch but none of those).
# Then, with the device tool:
#   run(command="bash bench/gpu_check.sh", carry=[".debs"], timeout_s=590)
#
# Steps (each logged with its elapsed time; a failure stops the script with the step named and
# the tail of its log):
#   1. unpack .debs into a private prefix (never into /), fix the .pc files and mpicc's paths;
#   2. configure --with-cuda --with-cuda-arch=90 --without-onednn; make pipelm tests/unit/test_cuda;
#   3. tests/unit/test_cuda with PIPELM_TEST_FULL=1 (every op against backend_cpu, the real-size
#      cases included; exit 77 = no GPU = a failure here); then, where compute-sanitizer exists,
#      `--tool memcheck` over the same test and `--tool racecheck` over the cases whose kernels
#      share memory (CK_RUN_CASE=layernorm, crossentropy, rmsnorm; their plain-tier shapes);
#   4. tiny preset on the GPU: fp32 1, 2 and 4 ranks (PIPELM_CUDA_SHARE=1) and a second 1-rank
#      run: losses and --save-final weights bit-identical (cmp); bf16 1 vs 2 ranks likewise;
#      fp32 GPU vs CPU: losses of 6 steps within 1e-5 relative, step-1 gradients (--dump-grads)
#      per tensor within 1e-4 max-relative; a GPU checkpoint resumed on the CPU and the other
#      way round (final loss within 1e-4 relative of the uninterrupted run); an allocation
#      failure injected on one rank (PIPELM_FAIL_ALLOC) ends both ranks with its message;
#   5. GPT-2 124M, T=1024, bf16: the largest batch of GPU_CHECK_BATCH that fits (a batch the
#      stage's size limit refuses, "micro-batch too large", or one that runs out of memory in
#      any form: cudaMalloc's "out of memory", cuBLAS's CUBLAS_STATUS_ALLOC_FAILED, pipelm's
#      own allocation messages, is "does not fit": the next smaller one is tried); the step-1
#      loss against ln(V) = 10.82 (random init: within 0.5 nats; the logits' spread at init
#      adds about 0.15); median step time of the steps after the warm-up; PyTorch's bf16/TF32
#      matmul peak (8192^3); the same batch with --backend-opt flash=0 (attention by cuBLAS
#      products, against the default fused kernels); PyTorch eager bf16 on the same model and batch (SDPA attention,
#      then llm.c's naive attention), and torch.compile when time allows; MFU against the
#      measured bf16 peak;
#   6. GPT-2, bf16, B=16, M=8: two pipeline stages on the one GPU vs one stage.
# Time: every step's timeout is its own limit capped by what is left of GPU_CHECK_BUDGET
# seconds (default 420; less GPU_CHECK_RESERVE, default 15, kept for the summary), so no step
# carries the run past the budget: set the budget below the device call's timeout_s. A
# required step with no time left stops the run; an optional one is recorded "skipped (time)".
#
# $OUT gets at most 8 files (the device tool's limit): summary.txt (the table, also printed
# last), results.json, log.txt (everything printed), test_cuda.log, details.tar.gz (every
# run's log, metrics and the build logs). results.json and summary.txt are rewritten (whole,
# by a rename) after every result and details.tar.gz at every step, so a run that is killed
# keeps what it measured; their "status" then says "incomplete".
#
# Environment: OUT (default /tmp/gpu_check_out), GPU_CHECK_BUDGET, GPU_CHECK_RESERVE,
# GPU_CHECK_BATCH (default "32 16 8", largest first: B*T*Vp must stay under 2^31 floats, so
# GPT-2 at T=1024 allows at most 41), GPU_CHECK_STEPS (default "3 4 5 6": the steps after the
# build to run), GPU_CHECK_COMPILE=0 (skip torch.compile), GPU_CHECK_ARCH (default 90),
# GPU_CHECK_KEEP=1 (keep the work folder), GPU_CHECK_DRYRUN=1 (a machine without a GPU: checks
# this script's unpacking and build; test_cuda may skip and the GPU runs are skipped),
# GPU_CHECK_FAKE=1 (with DRYRUN: runs steps 4-6 on the CPU backend, fp32, tiny sizes, no
# PyTorch: checks the script's logic only, its numbers mean nothing; the batch list is then
# "262144 32 16": 262144 is refused by the size limit, 32 runs out of memory by
# PIPELM_FAIL_ALLOC, 16 fits), GPU_CHECK_BUILD=DIR (use that configured build's pipelm and
# tests/unit/test_cuda instead of steps 1-2: the dry run of tests/integration/test_gpu_check.sh), and, for that
# test only, GPU_CHECK_KILL_AFTER=KEY (the script kills itself with SIGKILL once result KEY is
# written).
set -uo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 1
T0=$(date +%s)
OUT=${OUT:-${TMPDIR:-/tmp}/gpu_check_out}
mkdir -p "$OUT"
BUDGET=${GPU_CHECK_BUDGET:-420}
RESERVE=${GPU_CHECK_RESERVE:-15}
ARCH=${GPU_CHECK_ARCH:-90}
DRYRUN=${GPU_CHECK_DRYRUN:-0}
FAKE=${GPU_CHECK_FAKE:-0}
STEPS=" ${GPU_CHECK_STEPS:-3 4 5 6} "
BUILD=${GPU_CHECK_BUILD:-}
BE=cuda PREC16=bf16 GPT2=(--preset gpt2 --seq-len 1024) VOCAB=50257 OOM_BATCH=
BATCHES=${GPU_CHECK_BATCH:-32 16 8}
if [ "$FAKE" = 1 ]; then
    BE=cpu PREC16=fp32 GPT2=(--preset tiny) VOCAB=256 OOM_BATCH=32
    BATCHES=${GPU_CHECK_BATCH:-262144 32 16}
fi
# everything printed also goes to $OUT/log.txt (a pipe the script waits for, not a process
# substitution that could be cut off when the command returns)
if [ -z "${GPU_CHECK_INNER:-}" ]; then
    GPU_CHECK_INNER=1 bash "$0" "$@" 2>&1 | tee "$OUT/log.txt"
    exit "${PIPESTATUS[0]}"
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
D=$W/details
mkdir -p "$D"

elapsed() { echo $(($(date +%s) - T0)); }
note() { echo "== [$(elapsed)s] $*"; }
want() { [[ "$STEPS" == *" $1 "* ]]; } # want N: step N is in GPU_CHECK_STEPS
RESULTS=$D/results.txt # key<TAB>value lines, turned into results.json and summary.txt
: >"$RESULTS"

# flush STATUS: results.json and summary.txt from the results so far, each written beside
# and renamed, so that a kill at any moment leaves the last complete pair.
flush() {
    python3 - "$RESULTS" "$OUT/results.json" "$OUT/summary.txt" "$1" "$(elapsed)" <<'PYEOF' || true
import json, os, sys
src, jout, sout, status, el = sys.argv[1:6]
rows = []
for line in open(src):
    k, _, v = line.rstrip("\n").partition("\t")
    rows.append((k, v))
rows += [("status", status), ("elapsed_s", el)]
with open(jout + ".tmp", "w") as f:
    json.dump(dict(rows), f, indent=1)
with open(sout + ".tmp", "w") as f:
    f.write("gpu_check results\n")
    for k, v in rows:
        f.write("  %-44s %s\n" % (k, v))
os.replace(jout + ".tmp", jout)
os.replace(sout + ".tmp", sout)
PYEOF
}
# pack: details.tar.gz from the logs so far (by a rename, as flush)
pack() {
    (cd "$W" && tar czf "$OUT/details.tar.gz.tmp" details build/config.log build/make.log 2>/dev/null
        mv -f "$OUT/details.tar.gz.tmp" "$OUT/details.tar.gz") || true
}
progress() { flush "incomplete (stopped or killed after [$(elapsed)s])"; }
# res KEY VALUE: one result, written out at once
res() {
    printf '%s\t%s\n' "$1" "$2" >>"$RESULTS"
    progress
    if [ "${GPU_CHECK_KILL_AFTER:-}" = "$1" ]; then kill -KILL $$; fi
}
# step TITLE: a new step: the logs so far packed, the title printed
step() {
    pack
    note "$@"
}
# tmo SECONDS [MIN]: SECONDS capped by the time left in the budget, less the reserve and the
# 5 s that `timeout -k 5` may add before its KILL; fails when fewer than MIN (default 5) are left
tmo() {
    local left=$((BUDGET - RESERVE - 5 - $(elapsed))) min=${2:-5}
    [ "$left" -ge "$min" ] || return 1
    echo $(($1 < left ? $1 : left))
}

finish() {
    local rc=$?
    trap - EXIT
    flush "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")"
    pack
    echo
    cat "$OUT/summary.txt" 2>/dev/null
    [ "${GPU_CHECK_KEEP:-0}" = 1 ] && echo "kept $W" || rm -rf "$W"
    exit "$rc"
}
trap finish EXIT

# A failed step: its name, the tail of its log, and stop.
die() {
    local what=$1 log=${2:-}
    echo "FAIL at [$(elapsed)s]: $what"
    if [ -n "$log" ] && [ -f "$log" ]; then
        echo "---- last 40 lines of $log"
        tail -n 40 "$log"
        echo "----"
    fi
    res failed_step "$what"
    exit 1
}

# sanitize NAME SECONDS TOOL [VAR=VALUE...]: tests/unit/test_cuda under compute-sanitizer's TOOL
# (API errors are the test's own business: it provokes some); the result under NAME.
sanitize() {
    local name=$1 own=$2 tool=$3 t rc=0
    shift 3
    t=$(tmo "$own" 30) || { res "$name" "skipped (time)"; return; }
    env "$@" timeout -k 5 "$t" "$SANITIZER" --tool "$tool" --report-api-errors no --error-exitcode 99 \
        --log-file "$D/$name.log" "$B/tests/unit/test_cuda" >"$D/$name.out" 2>&1 || rc=$?
    local sum
    sum=$(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$D/$name.log" 2>/dev/null | tail -n 1 | sed 's/^=* *//')
    echo "$name: exit $rc: ${sum:-no summary}"
    if [ "$rc" = 0 ]; then res "$name" "clean (${sum:-no summary})"
    elif [ "$rc" -ge 124 ]; then res "$name" "timed out after ${t}s (${sum:-no summary}; details/$name.log)"
    else res "$name" "ERRORS (exit $rc: ${sum:-no summary}; details/$name.log)"
    fi
}
# sanitizers: memcheck over the whole of test_cuda (its real-size cases too), racecheck over
# the cases whose kernels reduce in shared memory, at their plain-tier shapes
sanitizers() {
    if [ -z "$SANITIZER" ]; then
        res compute_sanitizer "skipped (no compute-sanitizer here)"
        return
    fi
    sanitize memcheck 180 memcheck PIPELM_TEST_FULL=1
    for c in layernorm crossentropy rmsnorm; do
        sanitize "racecheck_$c" 60 racecheck PIPELM_TEST_FULL=0 CK_RUN_CASE="$c"
    done
}

# ---------------------------------------------------------------------------------------------
note "machine"
uname -a
nproc
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv || true
res budget_s "$BUDGET (reserve $RESERVE)"
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -n "$BUILD" ]; then
    step "1-2. using the build in $BUILD (GPU_CHECK_BUILD)"
    B=$(cd "$BUILD" && pwd) PIPELM=$BUILD/pipelm
    export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
    [ -x "$PIPELM" ] || die "GPU_CHECK_BUILD=$BUILD: no pipelm there"
    res build "given ($BUILD)"
else # steps 1-2, not indented: up to "fi # GPU_CHECK_BUILD"
[ -n "$NVCC" ] || die "no nvcc on this machine"
CUDA_DIR=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
"$NVCC" --version | tail -n 2
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' || true
res nvcc "$("$NVCC" --version | tail -n 1)"

# cuBLAS headers and libraries: in the toolkit, or else in the Python wheels (nvidia-cublas).
CUDA_HOME=$CUDA_DIR
if ! [ -f "$CUDA_DIR/include/cublas_v2.h" ] || ! ls "$CUDA_DIR"/lib64/libcublas.so* >/dev/null 2>&1; then
    note "cuBLAS not in $CUDA_DIR: looking in Python's nvidia packages"
    wheel=$(python3 -c 'import nvidia.cublas as m; print(list(m.__path__)[0])' 2>/dev/null || true)
    [ -n "$wheel" ] && [ -f "$wheel/include/cublas_v2.h" ] || die "no cuBLAS (headers and libraries) on this machine"
    CUDA_HOME=$W/cuda
    mkdir -p "$CUDA_HOME/include" "$CUDA_HOME/lib64"
    ln -s "$CUDA_DIR/bin" "$CUDA_HOME/bin"
    for d in "$CUDA_DIR/include" "$wheel/include"; do
        for f in "$d"/*; do [ -e "$CUDA_HOME/include/$(basename "$f")" ] || ln -s "$f" "$CUDA_HOME/include/"; done
    done
    for d in "$CUDA_DIR/lib64" "$wheel/lib"; do
        for f in "$d"/*; do [ -e "$CUDA_HOME/lib64/$(basename "$f")" ] || ln -s "$f" "$CUDA_HOME/lib64/"; done
    done
    for f in "$CUDA_HOME"/lib64/lib*.so.[0-9]*; do
        b=${f%%.so.*}.so
        [ -e "$b" ] || ln -s "$(basename "$f")" "$b"
    done
fi
res cuda_home "$CUDA_HOME"

# ---------------------------------------------------------------------------------------------
step "1. unpacking .debs into a private prefix"
ls .debs/*.deb >/dev/null 2>&1 || die "no .debs/*.deb here: run bench/get_debs.sh and carry .debs"
P=$W/pfx
mkdir -p "$P/bin"
for f in .debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$f" "$P" || die "dpkg-deb -x $f"
    else
        x=$W/ar.$$
        mkdir -p "$x" && (cd "$x" && ar x "$top/$f" && tar -xf data.tar.* -C "$P") || die "unpacking $f with ar and tar"
        rm -rf "$x"
    fi
done
L=$P/usr/lib/x86_64-linux-gnu
# .pc files and mpicc hard-code /usr; the linker wants unversioned names dpkg -x does not make
find "$P" -name '*.pc' -exec sed -i "s|/usr|$P/usr|g" {} +
sed -e "s|=/usr|=$P/usr|" -e "s|-L/usr/lib|-L$P/usr/lib|g" "$P/usr/bin/mpicc.mpich" >"$P/bin/mpicc"
chmod +x "$P/bin/mpicc"
ln -sf "$P/usr/bin/mpiexec.hydra" "$P/bin/mpiexec"
ln -sf "$P/usr/bin/hydra_pmi_proxy" "$P/bin/hydra_pmi_proxy" # hydra looks beside the mpiexec it ran as
for f in "$L"/lib*.so.[0-9]*; do
    b=${f%%.so.*}.so
    [ -e "$b" ] || ln -s "$(basename "$f")" "$b"
done
command -v pkg-config >/dev/null || ln -s "$P/usr/bin/pkgconf" "$P/bin/pkg-config"
command -v make >/dev/null || ln -s "$P/usr/bin/make" "$P/bin/make"
export PATH=$P/bin:$P/usr/bin:$PATH
export LD_LIBRARY_PATH=$L:$L/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$L/pkgconfig:$L/openblas-pthread/pkgconfig
export PKG_CONFIG_LIBDIR=$PKG_CONFIG_PATH
export UCX_MODULE_DIR=$L/ucx
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mpicc -show || die "mpicc wrapper"
command -v mpiexec hydra_pmi_proxy || die "mpiexec / hydra_pmi_proxy not on PATH"

# ---------------------------------------------------------------------------------------------
step "2. configure and build (sm_$ARCH)"
if [ -d .debs/autotools ]; then
    if [ -f .debs/autotools/SOURCES.sha256 ] && ! sha256sum -c --quiet .debs/autotools/SOURCES.sha256; then
        echo "warning: configure.ac or Makefile.am changed since bench/get_debs.sh snapshotted the autotools files"
        command -v autoreconf >/dev/null && { autoreconf -fi || die "autoreconf"; }
    fi
    if ! [ -x configure ] || ! [ -f Makefile.in ]; then
        cp -a .debs/autotools/configure .debs/autotools/Makefile.in .debs/autotools/config.h.in \
            .debs/autotools/aclocal.m4 .debs/autotools/build-aux . || die "copying .debs/autotools"
    fi
elif ! [ -x configure ]; then
    command -v autoreconf >/dev/null || die "no configure and no autoreconf: run bench/get_debs.sh (it snapshots them)"
    autoreconf -fi || die "autoreconf"
fi
B=$W/build
mkdir -p "$B"
t=$(tmo 120) || die "out of time before configure"
(cd "$B" && timeout -k 5 "$t" "$top/configure" --with-cuda="$CUDA_HOME" --with-cuda-arch="$ARCH" --without-onednn \
    --without-isal --with-openblas=system CFLAGS="-g -O3" >configure.log 2>&1) || die "configure" "$B/config.log"
tail -n 14 "$B/configure.log"
t=$(tmo 300) || die "out of time before make"
(cd "$B" && timeout -k 5 "$t" make -j"$(nproc)" pipelm tests/unit/test_cuda >make.log 2>&1) || die "make" "$B/make.log"
PIPELM=$B/pipelm
if ldd "$PIPELM" | grep "not found"; then die "pipelm has libraries not found (above)"; fi
"$PIPELM" --version || die "pipelm --version"
res build "ok ($(elapsed)s)"
fi # GPU_CHECK_BUILD
SANITIZER=$(command -v compute-sanitizer || true)
[ -z "$SANITIZER" ] && [ -n "$NVCC" ] && [ -x "$(dirname "$NVCC")/compute-sanitizer" ] && SANITIZER=$(dirname "$NVCC")/compute-sanitizer

# ---------------------------------------------------------------------------------------------
step "3. tests/unit/test_cuda"
if want 3; then
    rc=0
    if ! [ -x "$B/tests/unit/test_cuda" ]; then
        rc=77
        echo "no $B/tests/unit/test_cuda (a build without CUDA)"
    elif t=$(tmo 300); then
        PIPELM_TEST_FULL=1 TEST_CUDA_VERBOSE=1 timeout -k 5 "$t" "$B/tests/unit/test_cuda" >"$OUT/test_cuda.log" 2>&1 || rc=$?
    else
        die "out of time before tests/unit/test_cuda"
    fi
    grep -E "^test_cuda|Checks:|Failures|:[0-9]+:[EF]:" "$OUT/test_cuda.log" 2>/dev/null | head -40
    if [ "$rc" = 77 ] && [ "$DRYRUN" = 1 ]; then
        res test_cuda "skipped (77, dry run)"
    elif [ "$rc" != 0 ]; then
        res test_cuda "FAILED (exit $rc$([ "$rc" -ge 124 ] && echo ", timed out"))"
        die "tests/unit/test_cuda exit $rc (77: no usable GPU)" "$OUT/test_cuda.log"
    else
        res test_cuda "passed"
        res test_cuda_worst "$(grep '^test_cuda: worst' "$OUT/test_cuda.log" | sed 's/^test_cuda: //')"
        sanitizers
    fi
fi

note "   CPU sanity: 2 ranks, tiny preset"
t=$(tmo 120) || die "out of time before the CPU sanity run"
timeout -k 5 "$t" mpiexec -n 2 "$PIPELM" train --preset tiny --steps 2 --progress 0 >"$D/cpu_sanity.log" 2>&1 ||
    die "mpiexec -n 2 pipelm train (cpu)" "$D/cpu_sanity.log"
res cpu_sanity ok

if [ "$DRYRUN" = 1 ] && [ "$FAKE" != 1 ]; then
    note "dry run: the GPU steps are skipped"
    t=$(tmo 60) || die "out of time before the refusal run"
    timeout -k 5 "$t" mpiexec -n 2 "$PIPELM" train --backend cuda --steps 1 >"$D/cuda_refusal.log" 2>&1
    rc=$?
    cat "$D/cuda_refusal.log"
    res cuda_refusal_exit "$rc"
    exit 0
fi

# ---------------------------------------------------------------------------------------------
step "4. bit-identity and CPU agreement (tiny preset on the GPU)"
if want 4; then
export PIPELM_CUDA_SHARE=1
TINY=(--preset tiny --steps 6 --microbatches 4 --eval-every 0 --val-batches 1 --progress 0 --seed 7)
# train NAME NP BACKEND PRECISION [extra options]
train() {
    local name=$1 np=$2 be=$3 prec=$4
    shift 4
    local t
    t=$(tmo 180) || die "out of time before train $name"
    timeout -k 5 "$t" mpiexec -n "$np" "$PIPELM" train "${TINY[@]}" --backend "$be" --precision "$prec" \
        --metrics "$D/$name.jsonl" --save-final "$D/$name.bin" "$@" >"$D/$name.log" 2>&1 ||
        die "train $name (np $np, $be, $prec)" "$D/$name.log"
}
losses() { python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if "\"event\":\"step\"" in l))' "$1"; }
same() { # NAME_A NAME_B: weights and losses bit-identical
    cmp -s "$D/$1.bin" "$D/$2.bin" && [ "$(losses "$D/$1.jsonl")" = "$(losses "$D/$2.jsonl")" ]
}
train cuda32_p1 1 "$BE" fp32 --dump-grads "$D/cuda32_p1.grads"
grep -m1 -i "backend\|cuda:" "$D/cuda32_p1.log" || true
train cuda32_p1b 1 "$BE" fp32
train cuda32_p2 2 "$BE" fp32
train cuda32_p4 4 "$BE" fp32
train cuda16_p1 1 "$BE" "$PREC16"
train cuda16_p2 2 "$BE" "$PREC16"
train cpu32_p1 1 cpu fp32 --dump-grads "$D/cpu32_p1.grads"
for pair in "cuda32_p1 cuda32_p1b run-to-run" "cuda32_p1 cuda32_p2 1-vs-2-ranks" "cuda32_p1 cuda32_p4 1-vs-4-ranks" \
    "cuda16_p1 cuda16_p2 bf16-1-vs-2-ranks"; do
    set -- $pair
    if same "$1" "$2"; then res "identical_$3" yes; else res "identical_$3" "NO ($1 vs $2)"; fi
done
echo "losses cuda fp32: $(losses "$D/cuda32_p1.jsonl")"
echo "losses cpu  fp32: $(losses "$D/cpu32_p1.jsonl")"
echo "losses cuda bf16: $(losses "$D/cuda16_p1.jsonl")"
python3 - "$D" >>"$RESULTS" <<'PYEOF' || die "comparing the GPU and CPU runs"
import array, json, os, sys
D = sys.argv[1]
def losses(n):
    return [json.loads(l)["loss"] for l in open(os.path.join(D, n + ".jsonl")) if '"event":"step"' in l]
g, c = losses("cuda32_p1"), losses("cpu32_p1")
rel = max(abs(a - b) / abs(b) for a, b in zip(g, c))
print("loss_gpu_vs_cpu_fp32_max_rel\t%.3e (%s; tol 1e-5)" % (rel, "ok" if rel <= 1e-5 and len(g) == len(c) else "NOT MET"))
# llm.c model file: 256 int32 header (magic, version, maxT, V, L, NH, C, Vp), then the tensors
def tensors(path):
    with open(path, "rb") as f:
        h = array.array("i")
        h.fromfile(f, 256)
        x = array.array("f")
        x.frombytes(f.read())
    maxT, V, L, NH, C, Vp = h[2:8]
    shapes = [("wte", Vp * C), ("wpe", maxT * C), ("ln1w", L * C), ("ln1b", L * C), ("qkvw", L * 3 * C * C),
              ("qkvb", L * 3 * C), ("attprojw", L * C * C), ("attprojb", L * C), ("ln2w", L * C), ("ln2b", L * C),
              ("fcw", L * 4 * C * C), ("fcb", L * 4 * C), ("fcprojw", L * C * 4 * C), ("fcprojb", L * C),
              ("lnfw", C), ("lnfb", C)]
    out, o = {}, 0
    for n, k in shapes:
        out[n] = x[o:o + k]
        o += k
    assert o == len(x), (o, len(x))
    return out
a, b = tensors(os.path.join(D, "cuda32_p1.grads")), tensors(os.path.join(D, "cpu32_p1.grads"))
worst, wn = 0.0, "(all equal)"
for n in a:
    den = max(abs(v) for v in b[n])
    num = max(abs(p - q) for p, q in zip(a[n], b[n]))
    e = num / den if den > 0 else num
    if e != e or e > worst:
        worst, wn = (e if e == e else float("inf")), n
print("grads_gpu_vs_cpu_fp32_worst_max_rel\t%.3e in %s (%s; tol 1e-4)" % (worst, wn, "ok" if worst <= 1e-4 else "NOT MET"))
PYEOF
progress
tail -n 2 "$RESULTS"

note "   an injected cudaMalloc failure on rank 1 ends both ranks"
t=$(tmo 120) || die "out of time before the injected failure"
timeout -k 5 "$t" mpiexec -n 1 "$PIPELM" train "${TINY[@]}" --backend "$BE" : \
    -n 1 env PIPELM_FAIL_ALLOC=7 "$PIPELM" train "${TINY[@]}" --backend "$BE" >"$D/fail_alloc.log" 2>&1
rc=$?
grep -m3 "error\|stopping" "$D/fail_alloc.log"
if [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q "rank 1: error:.*injected" "$D/fail_alloc.log" &&
    grep -q "stopping all 2 ranks: rank 1 failed" "$D/fail_alloc.log"; then
    res injected_failure_one_rank "ends both ranks (exit $rc)"
else
    res injected_failure_one_rank "NOT AS EXPECTED (exit $rc; see details/fail_alloc.log)"
fi

note "   checkpoints across backends"
train ck_cuda 1 "$BE" fp32 --ckpt-dir "$D/ck_cuda" --ckpt-every 3
train ck_cpu 1 cpu fp32 --ckpt-dir "$D/ck_cpu" --ckpt-every 3
train resume_on_cpu 1 cpu fp32 --resume "$D/ck_cuda/ckpt_00000003.h5"
train resume_on_cuda 1 "$BE" fp32 --resume "$D/ck_cpu/ckpt_00000003.h5"
python3 - "$D" >>"$RESULTS" <<'PYEOF' || die "comparing the resumed runs"
import json, os, sys
D = sys.argv[1]
def final(n):
    return [json.loads(l)["loss"] for l in open(os.path.join(D, n + ".jsonl")) if '"event":"step"' in l][-1]
for a, b, k in (("resume_on_cpu", "ck_cuda", "gpu_ckpt_resumed_on_cpu"), ("resume_on_cuda", "ck_cpu", "cpu_ckpt_resumed_on_gpu")):
    x, y = final(a), final(b)
    r = abs(x - y) / abs(y)
    print("%s_final_loss_rel\t%.3e (%s; tol 1e-4)" % (k, r, "ok" if r <= 1e-4 else "NOT MET"))
PYEOF
progress
tail -n 2 "$RESULTS"
unset PIPELM_CUDA_SHARE
fi # step 4

# ---------------------------------------------------------------------------------------------
step "5. GPT-2 124M, T=1024, bf16: pipelm"
# fit_reason LOG: why a run did not fit (the size limit or an out-of-memory in any form), or
# nothing for a failure of another kind
fit_reason() {
    if grep -q "micro-batch too large" "$1"; then
        echo "refused by the size limit (micro-batch too large)"
    elif grep -Eqi "out of (host |device )?memory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|resource allocation failed|allocation of [0-9]+ bytes( failed|: too large)" "$1"; then
        echo "out of memory ($(grep -Eim1 "out of|alloc" "$1" | cut -c1-160))"
    fi
}
# gpt2_run B: one GPT-2 run of 8 steps at batch B (FAKE: an allocation failure injected at
# OOM_BATCH, so the out-of-memory path runs too); its exit status
gpt2_run() {
    local b=$1 t fail=()
    t=$(tmo 300 20) || die "out of time in the batch search (at B=$b)"
    [ "$b" = "$OOM_BATCH" ] && fail=(env PIPELM_FAIL_ALLOC=3)
    timeout -k 5 "$t" ${fail[@]+"${fail[@]}"} mpiexec -n 1 "$PIPELM" train "${GPT2[@]}" --backend "$BE" --precision "$PREC16" \
        --batch "$b" --microbatches 1 --steps 8 --eval-every 0 --val-batches 1 --progress 0 \
        --metrics "$D/gpt2_B$b.jsonl" >"$D/gpt2_B$b.log" 2>&1
}
# loss_check: the step-1 loss of the chosen run against ln(VOCAB), tolerance 0.5 nats
loss_check() {
    python3 - "$D/gpt2_B$GB.jsonl" "$VOCAB" >>"$RESULTS" <<'PYEOF' || die "reading the step-1 loss"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"event":"step"' in l]
l1, want = rows[0]["loss"], math.log(int(sys.argv[2]))
ok = abs(l1 - want) <= 0.5
print("gpt2_step1_loss\t%.4f (ln %s = %.4f, tol 0.5: %s)" % (l1, sys.argv[2], want, "ok" if ok else "NOT MET"))
PYEOF
    progress
    tail -n 1 "$RESULTS"
}
GB=
if want 5; then
    for b in $BATCHES; do
        rc=0
        gpt2_run "$b" || rc=$?
        if [ "$rc" = 0 ]; then
            GB=$b
            res "gpt2_B$b" "fits"
            break
        fi
        [ "$rc" -lt 124 ] || die "GPT-2 step at B=$b: timed out (exit $rc; its timeout capped by the budget)" "$D/gpt2_B$b.log"
        why=$(fit_reason "$D/gpt2_B$b.log")
        [ -n "$why" ] || die "GPT-2 step at B=$b (neither the size limit nor an out-of-memory)" "$D/gpt2_B$b.log"
        res "gpt2_B$b" "does not fit: $why"
        echo "B=$b does not fit ($why); trying a smaller batch"
    done
    [ -n "$GB" ] || die "GPT-2: no batch of '$BATCHES' fits"
    tail -n 14 "$D/gpt2_B$GB.log"
    res gpt2_batch "$GB"
    loss_check
    # the same batch with attention through cuBLAS products and the softmax kernel (flash=0),
    # against the default fused kernels: what the fused kernels save on this GPU
    if [ "$FAKE" != 1 ] && t=$(tmo 120 40); then
        timeout -k 5 "$t" mpiexec -n 1 "$PIPELM" train "${GPT2[@]}" --backend "$BE" --precision "$PREC16" \
            --backend-opt flash=0 --batch "$GB" --microbatches 1 --steps 8 --eval-every 0 --val-batches 1 \
            --progress 0 --metrics "$D/gpt2_flash0.jsonl" >"$D/gpt2_flash0.log" 2>&1 ||
            res gpt2_flash0 "failed or out of time: $(fit_reason "$D/gpt2_flash0.log")"
    else
        res gpt2_flash0 "skipped (time or fake)"
    fi

    note "   PyTorch: matmul peak, then eager bf16 at B=$GB"
    if [ "$FAKE" = 1 ]; then
        GPU_CHECK_COMPILE=0
        res torch "skipped (fake)"
    elif t=$(tmo 120 30); then
        timeout -k 5 "$t" python3 "$top/bench/torch_gpu_step.py" --peak --json "$D/peak.json" >"$D/peak.log" 2>&1 ||
            die "torch matmul peak" "$D/peak.log"
        cat "$D/peak.log"
        if t=$(tmo 240 60); then
            timeout -k 5 "$t" python3 "$top/bench/torch_gpu_step.py" --B "$GB" --attn sdpa --json "$D/torch_sdpa.json" \
                >"$D/torch_sdpa.log" 2>&1 || echo "torch eager (sdpa) failed: $(tail -n 3 "$D/torch_sdpa.log")"
            tail -n 2 "$D/torch_sdpa.log"
        else
            res torch_sdpa "skipped (time)"
        fi
        if t=$(tmo 240 60); then
            timeout -k 5 "$t" python3 "$top/bench/torch_gpu_step.py" --B "$GB" --attn naive --json "$D/torch_naive.json" \
                >"$D/torch_naive.log" 2>&1 || echo "torch eager (naive) failed: $(tail -n 3 "$D/torch_naive.log")"
            tail -n 2 "$D/torch_naive.log"
        else
            res torch_naive "skipped (time)"
        fi
    else
        res torch "skipped (time)"
    fi
fi

step "6. two pipeline stages on one GPU vs one (GPT-2, bf16, B=16, M=8)"
if want 6; then
    export PIPELM_CUDA_SHARE=1
    for np in 1 2; do
        if t=$(tmo 240 30); then
            timeout -k 5 "$t" mpiexec -n $np "$PIPELM" train "${GPT2[@]}" --backend "$BE" --precision "$PREC16" \
                --batch 16 --microbatches 8 --steps 6 --eval-every 0 --val-batches 1 --progress 0 \
                --metrics "$D/pipe_p$np.jsonl" >"$D/pipe_p$np.log" 2>&1 || echo "pipeline run with $np rank(s) failed"
            res "pipeline_p$np" "ran ($(grep -c '"event":"step"' "$D/pipe_p$np.jsonl" 2>/dev/null || echo 0) steps)"
        else
            res "pipeline_p$np" "skipped (time)"
        fi
    done
    unset PIPELM_CUDA_SHARE
fi

if [ -n "$GB" ] && [ "${GPU_CHECK_COMPILE:-1}" != 0 ] && t=$(tmo 200 90); then
    note "   PyTorch torch.compile bf16 at B=$GB (if it works here)"
    timeout -k 5 "$t" python3 "$top/bench/torch_gpu_step.py" --B "$GB" --attn sdpa --compile --json "$D/torch_compile.json" \
        >"$D/torch_compile.log" 2>&1 || echo "torch.compile failed or timed out: $(tail -n 3 "$D/torch_compile.log")"
    tail -n 2 "$D/torch_compile.log"
else
    res torch_compile "skipped"
fi

# ---------------------------------------------------------------------------------------------
note "summary of the timings"
python3 - "$D" "${GB:-0}" >>"$RESULTS" <<'PYEOF' || true
import json, os, statistics, sys
D, GB = sys.argv[1], int(sys.argv[2])
def load(n):
    try:
        return json.load(open(os.path.join(D, n)))
    except (OSError, ValueError):
        return None
def pipelm_ms(n, warm=3):
    try:
        rows = [json.loads(l) for l in open(os.path.join(D, n)) if '"event":"step"' in l]
    except OSError:
        return None
    ms = [r["step_ms"] for r in rows if r["step"] > warm]
    return statistics.median(ms) if ms else None
V, Vp, C, L, NH, T, maxT = 50257, 50304, 768, 12, 12, 1024, 1024
N = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
flops = (6 * N + 6 * L * C * T) * GB * T  # per step, as bench/step_vs_torch.sh counts
p = pipelm_ms("gpt2_B%d.jsonl" % GB)
peak = load("peak.json") or {}
bf = peak.get("bf16_tflops")
print("gpt2_flops_per_step\t%.2f TFLOP (6N + 6LCT per token, N=%d, B=%d, T=%d)" % (flops / 1e12, N, GB, T))
p0 = pipelm_ms("gpt2_flash0.jsonl")
if p:
    print("pipelm_gpt2_bf16_step_ms\t%.1f" % p)
    if p0:
        print("pipelm_gpt2_bf16_step_ms_flash0\t%.1f (attention by cuBLAS products: %.2fx the fused kernels' step)" % (p0, p0 / p))
    print("pipelm_gpt2_bf16_tflops\t%.1f" % (flops / (p / 1e3) / 1e12))
if bf:
    print("peak_bf16_tflops_measured\t%.1f (torch 8192^3)" % bf)
    print("peak_tf32_tflops_measured\t%.1f" % peak.get("tf32_tflops", 0))
    if p:
        mfu = flops / (p / 1e3) / 1e12 / bf
        print("pipelm_mfu_vs_measured_bf16_peak\t%.1f%% (target >= 35%%: %s)" % (100 * mfu, "MET" if mfu >= 0.35 else "NOT MET"))
for n, k in (("torch_sdpa.json", "torch_eager_sdpa"), ("torch_naive.json", "torch_eager_naive"), ("torch_compile.json", "torch_compile_sdpa")):
    t = load(n)
    if t:
        print("%s_step_ms\t%.1f (peak mem %.1f GiB)" % (k, t["median_ms"], t.get("max_mem_gib", 0)))
        if p:
            r = t["median_ms"] / p
            tgt = " (target >= 1.0: %s)" % ("MET" if r >= 1 else "NOT MET") if k == "torch_eager_sdpa" else ""
            print("speed_vs_%s\t%.2fx%s" % (k, r, tgt))
p1, p2 = pipelm_ms("pipe_p1.jsonl", 2), pipelm_ms("pipe_p2.jsonl", 2)
if p1 and p2:
    loss = p2 / p1 - 1
    print("pipeline_1stage_ms\t%.1f" % p1)
    print("pipeline_2stages_same_gpu_ms\t%.1f (%+.1f%%; target <= +10%%: %s)" % (p2, 100 * loss, "MET" if loss <= 0.10 else "NOT MET"))
PYEOF
exit 0
