#!/bin/bash
# Benchmark: one training step in fp32 and bf16, pipelm against PyTorch, one thread.
#
#   bench/bf16_step.sh [PIPELM]        (or PIPELM=... bench/bf16_step.sh)
#
# For the tutorial preset (B=8, T=128) and GPT-2 124M (B=4, T=256), in one run:
#   pipelm --backend cpu (fp32, OpenBLAS), --backend onednn --precision fp32 and bf16;
#   PyTorch (Debian's python3-torch) fp32 and torch.autocast("cpu", dtype=torch.bfloat16),
#   same architecture and batch (bench/torch_step.py);
# medians of the timed steps after warm-up, the bf16 step's MFU against the measured bf16
# matmul peak (`pipelm bench --peak`), its time by op class, and two ranks x one thread
# against one rank in bf16 (tutorial, 8 micro-batches).
# Targets (issue 9): fp32 default >= 0.95 x best kernel (bench/blas_kernel.sh); bf16 >= 3x
# fp32 with AMX, >= 1.6x with AVX512-BF16 only; bf16 >= 2x torch autocast; 2x1 >= 0.9 ideal.
# Issue 22: the op classes of onednn fp32 and bf16 with the sum of the four non-matmul ones
# (attention, norm/GELU/residual/embedding, loss, optimizer: <= 40 % of the former time), the
# bf16/fp32 step ratio, and the optimizer class's GB/s at AdamW's 28 bytes a parameter against
# the copy bandwidth (numpy, one thread; target within 1.5x).
# Issue 41: the implementations a bf16 step's products used (--backend-opt impl-report=1: the
# primitive's implementation name, queried after creation), with a WARNING for any fallback
# (a bf16 product off oneDNN's brgemm kernels: gemm:jit, ref); BENCH_BASELINE=PIPELM2 runs a
# second build's onednn bf16 step beside this one's, interleaved, in the same invocation (the
# before/after of a change); BENCH_REPEAT (1) runs each pipelm step that many times and keeps
# the fastest median (a machine other jobs load); BENCH_TORCH=0 skips PyTorch, BENCH_SCALE=0
# the two-rank run, BENCH_AB_ROUNDS=0 the weight cache's A/B, BENCH_MATMUL=0 the products
# alone (bench/onednn_matmul.sh: per-product GFLOP/s, the weight gradient's layout A/B).
# A report, not a test: it always exits 0. BENCH_STEPS (default 6), BENCH_WARMUP (2),
# BENCH_MODELS (default "tutorial gpt2"), BENCH_AB_ROUNDS (3: rounds of the weight cache's
# A/B), BENCH_AB_PREC (bf16; fp32 only to try the script on a CPU without bf16).

PIPELM=${PIPELM:-${1:-./build/pipelm}}
PY=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)
STEPS=${BENCH_STEPS:-6}
WARMUP=${BENCH_WARMUP:-2}
MODELS=${BENCH_MODELS:-tutorial gpt2}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bf16_step.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

echo "== fp32 vs bf16, pipelm vs torch, one thread; $(lscpu | sed -n 's/^Model name: *//p')"
echo "   bf16 ISA: $(grep -o -m1 -w 'amx_bf16\|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
timeout 600 "$PIPELM" bench --peak --threads 1 --json "$tmp/peak.json" > "$tmp/peak.log" 2>&1
grep -i "gflop" "$tmp/peak.log" | sed 's/^/   /'

# pipelm_step TAG MODELARGS...: median ms of the timed steps (bench JSON), op split kept; with
# BENCH_REPEAT > 1 the run with the fastest median of that many (BIN: the build, default PIPELM)
pipelm_step() {
    local tag=$1 r best=""
    shift
    for r in $(seq 1 "${BENCH_REPEAT:-1}"); do
        timeout 1800 "${BIN:-$PIPELM}" bench --steps "$STEPS" --warmup "$WARMUP" --microbatches 1 --threads 1 \
            --json "$tmp/$tag.r.json" "$@" > "$tmp/$tag.r.log" 2>&1 \
            || { echo "   $tag failed: $(tail -n 2 "$tmp/$tag.r.log")"; return; }
        if [ -z "$best" ] || "$PY" -c 'import json,sys; m=lambda f: json.load(open(f))["step_ms"]["median"]; sys.exit(0 if m(sys.argv[1]) < m(sys.argv[2]) else 1)' \
                "$tmp/$tag.r.json" "$tmp/$tag.json" 2> /dev/null; then
            mv "$tmp/$tag.r.json" "$tmp/$tag.json"
            mv "$tmp/$tag.r.log" "$tmp/$tag.log"
            best=1
        fi
    done
}
# the implementations of a run's products (impl-report lines), counted, and its fallbacks
impls() {
    grep '^onednn: impl ' "$tmp/$1.log" | sed 's/.*: //; s/ (operands not dense)/, operands not dense/' | sort | uniq -c \
        | sed 's/^ */      /'
    grep '^onednn: WARNING' "$tmp/$1.log" | sort -u | sed 's/^/      /'
    grep -q '^onednn: WARNING' "$tmp/$1.log" || echo "      no bf16 product on a fallback implementation"
}
torch_step() {
    local tag=$1
    shift
    timeout 3600 "$PY" "$here/torch_step.py" --steps $((STEPS + WARMUP)) --warmup "$WARMUP" --threads 1 \
        --json "$tmp/$tag.json" "$@" > "$tmp/$tag.log" 2>&1 || echo "   $tag failed: $(tail -n 2 "$tmp/$tag.log")"
}

for model in $MODELS; do
    case $model in
    tutorial) P="--preset tutorial --batch 8 --seq-len 128"; TA="--V 10000 --C 512 --L 8 --NH 8 --T 128 --B 8" ;;
    gpt2) P="--preset gpt2 --batch 4 --seq-len 256"; TA="--V 50257 --C 768 --L 12 --NH 12 --T 256 --maxT 1024 --B 4" ;;
    esac
    echo "-- $model: pipelm cpu/fp32, onednn/fp32, onednn/bf16; torch fp32, torch bf16 autocast ..."
    pipelm_step ${model}_cpu $P --backend cpu
    pipelm_step ${model}_dnn32 $P --backend onednn --precision fp32
    if [ -n "$BENCH_BASELINE" ]; then # interleaved with the baseline's, the fastest of each kept
        for r in $(seq 1 "${BENCH_REPEAT:-1}"); do
            BENCH_REPEAT=1 BIN=$BENCH_BASELINE pipelm_step ${model}_base$r $P --backend onednn --precision bf16
            BENCH_REPEAT=1 pipelm_step ${model}_bf16r$r $P --backend onednn --precision bf16 --backend-opt impl-report=1
        done
        "$PY" - "$tmp" "$model" "${BENCH_REPEAT:-1}" <<'PYEOF'
import json, os, shutil, sys
tmp, m, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def med(f):
    try: return json.load(open(os.path.join(tmp, f + ".json")))["step_ms"]["median"]
    except (OSError, ValueError, KeyError): return None
for tag in ("base", "bf16r"):
    runs = [(med("%s_%s%d" % (m, tag, r)), r) for r in range(1, n + 1)]
    runs = [x for x in runs if x[0]]
    if not runs: continue
    best = min(runs)[1]
    dst = m + ("_base" if tag == "base" else "_bf16")
    for ext in (".json", ".log"): shutil.copy(os.path.join(tmp, "%s_%s%d%s" % (m, tag, best, ext)), os.path.join(tmp, dst + ext))
PYEOF
    else
        pipelm_step ${model}_bf16 $P --backend onednn --precision bf16 --backend-opt impl-report=1
    fi
    echo "   implementations of the bf16 step's products (count of shapes: implementation):"
    impls ${model}_bf16
    if [ "${BENCH_TORCH:-1}" != 0 ] && "$PY" -c 'import torch' > /dev/null 2>&1; then
        torch_step ${model}_t32 $TA
        torch_step ${model}_t16 $TA --autocast bf16
    fi
    for t in dnn32 base bf16; do [ -f "$tmp/${model}_$t.log" ] || continue; sed -n '/op classes/,/all ops/p' "$tmp/${model}_$t.log" | sed 's/^/   /'; done
done
# the machine's copy bandwidth, one thread (a memcpy of 256 MiB through Python's memoryview,
# read + write bytes, best of 5 in CPU time, which a shared machine does not halve), for
# AdamW's 28 bytes a parameter (issue 22: within 1.5x of it)
"$PY" - > "$tmp/copy_gbs" 2> /dev/null <<'PYEOF' || true
import time
a = bytearray(b"\1") * (256 << 20); b = bytearray(len(a)); ma, mb = memoryview(a), memoryview(b)
best = 1e9
for _ in range(5):
    t = time.process_time(); mb[:] = ma; best = min(best, time.process_time() - t)
print("%.2f" % (2 * len(a) / best / 1e9))
PYEOF
# every product of the models' shapes alone (bench/onednn_matmul.sh on PIPELM's build: N = 1024
# rows, GFLOP/s of fwd, bwd_input, bwd_weight in fp32 and bf16, the bf16 weight gradient with
# wgrad-layout=1 and =0 interleaved); issue 41's target: every weight-gradient product >= 600
# GFLOP/s at the tutorial's shapes. BENCH_MATMUL=0 skips it.
BUILD_DIR=$(dirname "$PIPELM")
if [ "${BENCH_MATMUL:-1}" != 0 ] && [ -f "$BUILD_DIR/libpipelm.a" ]; then
    shapes=""
    for model in $MODELS; do
        case $model in
        tutorial) shapes="$shapes 512x1536 512x512 512x2048 2048x512 512x10000" ;;
        gpt2) shapes="$shapes 768x2304 768x768 768x3072 3072x768 768x50304" ;;
        esac
    done
    echo "-- every product alone (bench/onednn_matmul.sh), load: $(uptime | sed 's/.*load/load/')"
    BENCH_SHAPES="$shapes" timeout 1800 "$here/onednn_matmul.sh" "$BUILD_DIR" > "$tmp/matmul.log" 2>&1
    sed 's/^/   /' "$tmp/matmul.log"
    awk '$3 == "bwd_weight" && $6 + 0 > 0 && $6 + 0 < 600 { low = low " " $2 " (" $6 ")" }
         END { print "   bf16 weight-gradient products below 600 GFLOP/s:" (low == "" ? " none" : low) }' "$tmp/matmul.log"
fi

echo "-- two ranks x one thread vs one rank, bf16, tutorial, 8 micro-batches ..."
for np in $([ "${BENCH_SCALE:-1}" != 0 ] && echo 1 2); do
    timeout 1800 mpiexec -n $np "$PIPELM" bench --preset tutorial --batch 8 --seq-len 128 --microbatches 8 --threads 1 \
        --steps "$STEPS" --warmup "$WARMUP" --backend onednn --precision bf16 --json "$tmp/scale$np.json" \
        > "$tmp/scale$np.log" 2>&1 || echo "   $np ranks failed: $(tail -n 2 "$tmp/scale$np.log")"
done

# the bf16 weight copies (--backend-opt weight-cache=1, the default) against a conversion on
# every product (=0), tutorial, one thread, 1 and 8 micro-batches (the copy saves 2M - 1
# conversions of every weight a step): A and B interleaved, BENCH_AB_ROUNDS rounds (default 3)
echo "-- weight cache A/B (bf16, tutorial, 1 and 8 micro-batches), load: $(uptime | sed 's/.*load/load/')"
for r in $(seq 1 "${BENCH_AB_ROUNDS:-3}"); do
    for mb in 1 8; do
        for c in 0 1; do
            timeout 1800 "$PIPELM" bench --preset tutorial --batch 8 --seq-len 128 --microbatches $mb --threads 1 \
                --steps "$STEPS" --warmup "$WARMUP" --backend onednn --precision "${BENCH_AB_PREC:-bf16}" \
                --backend-opt weight-cache=$c --json "$tmp/wc${c}_mb${mb}_r$r.json" > "$tmp/wc.log" 2>&1 \
                || echo "   weight-cache=$c M=$mb failed: $(tail -n 2 "$tmp/wc.log")"
        done
    done
done
echo "   load after: $(uptime | sed 's/.*load/load/')"

"$PY" - "$tmp" "$MODELS" <<'PYEOF'
import json, os, sys
tmp, models = sys.argv[1], sys.argv[2].split()
def j(name):
    try:
        return json.load(open(os.path.join(tmp, name + ".json")))
    except (OSError, ValueError):
        return None
def med(name):
    d = j(name)
    if not d: return None
    return d["step_ms"]["median"] if isinstance(d.get("step_ms"), dict) else d.get("median_ms")
f = lambda x, p="%.1f": p % x if x else "n/a"
NONMM = ("attention", "norm/GELU/residual/embedding", "loss", "optimizer")
def classes(name):
    """rank 0's op-class table (ms per step) of a run's log."""
    try: lines = open(os.path.join(tmp, name + ".log")).read().split("\n")
    except OSError: return None
    out, on = {}, False
    for l in lines:
        if "op classes" in l: on = True; continue
        if on:
            for k in ("matmul", "attention", "norm/GELU/residual/embedding", "loss", "optimizer", "memory", "all ops"):
                if l.strip().startswith(k):
                    try: out[k] = float(l.strip()[len(k):].split()[0])
                    except (ValueError, IndexError): pass
            if l.strip().startswith("all ops"): break
    return out if "all ops" in out else None
def params_of(name):
    try:
        for l in open(os.path.join(tmp, name + ".log")):
            if l.startswith("model:") and "parameters" in l: return int(l.rsplit(",", 1)[1].split()[0])
    except (OSError, ValueError, IndexError): pass
    return None
try: copy_gbs = float(open(os.path.join(tmp, "copy_gbs")).read())
except (OSError, ValueError): copy_gbs = None
peak = j("peak") or {}
print()
print("matmul peak, 1 thread: sgemm %s GFLOP/s, oneDNN fp32 %s, oneDNN bf16 %s" % (
    f(peak.get("peak_gflops_1")), f(peak.get("onednn_fp32_gflops")), f(peak.get("bf16_gflops"))))
for m in models:
    c, d32, b16, t32, t16 = (med(m + s) for s in ("_cpu", "_dnn32", "_bf16", "_t32", "_t16"))
    print("%s: step ms  cpu/fp32 %s  onednn/fp32 %s  onednn/bf16 %s  torch fp32 %s  torch bf16 %s" % (
        m, f(c), f(d32), f(b16), f(t32), f(t16)))
    best32 = min(x for x in (c, d32) if x) if (c or d32) else None
    if b16 and best32: print("   bf16 speed-up over the best fp32: %.2fx (targets: 3x with AMX, 1.6x AVX512-BF16)" % (best32 / b16))
    if b16 and t16: print("   bf16 vs torch bf16 autocast: %.2fx (target 2x)" % (t16 / b16))
    if c and t32: print("   fp32 vs torch fp32: %.2fx" % (t32 / c))
    bj = j(m + "_bf16")
    if bj: print("   bf16 MFU %.1f %% of %.1f GFLOP/s (the peak the run measured)" % (100 * bj["mfu"], bj["peak_gflops"]))
    if b16 and d32: print("   onednn bf16 / onednn fp32 step: %.2fx faster" % (d32 / b16))
    base = med(m + "_base")
    if base and b16:
        print("   onednn bf16 step, baseline build %.1f ms, this build %.1f ms: %.2fx" % (base, b16, base / b16))
    for t, name in (("_dnn32", "onednn fp32"), ("_base", "onednn bf16, baseline build"), ("_bf16", "onednn bf16")):
        c = classes(m + t)
        if not c: continue
        rest = sum(c.get(k, 0) for k in NONMM)
        print("   %s op classes ms: matmul %.1f, attention %.1f, norm/GELU/residual/embedding %.1f, loss %.1f, "
              "optimizer %.1f; the non-matmul four %.1f (%.0f %% of the op time %.1f)" % (
                  name, c.get("matmul", 0), c.get("attention", 0), c.get("norm/GELU/residual/embedding", 0),
                  c.get("loss", 0), c.get("optimizer", 0), rest, 100 * rest / c["all ops"], c["all ops"]))
        params = params_of(m + t)
        if params and c.get("optimizer") and copy_gbs:
            gbs = 28 * params / (c["optimizer"] * 1e-3) / 1e9
            print("   %s optimizer class: %.1f GB/s at AdamW's 28 bytes/param (%d params; the class also holds the "
                  "norm and the clip scale); copy bandwidth %.1f GB/s: %.2fx of the AdamW bytes at copy speed" % (
                      name, gbs, params, copy_gbs, copy_gbs / gbs))
for mb in (1, 8):
    pairs = []
    for r in range(1, 100):
        a, b = med("wc0_mb%d_r%d" % (mb, r)), med("wc1_mb%d_r%d" % (mb, r))
        if a is None and b is None and r > 1 and not os.path.exists(os.path.join(tmp, "wc0_mb%d_r%d.json" % (mb, r))): break
        if a and b: pairs.append((a, b))
    if pairs:
        ratios = sorted(a / b for a, b in pairs)
        print("weight cache, M=%d: step ms off %s, on %s; off/on %.3fx median of %d interleaved rounds (%s)" % (
            mb, "/".join("%.1f" % a for a, _ in pairs), "/".join("%.1f" % b for _, b in pairs),
            (ratios[(len(ratios) - 1) // 2] + ratios[len(ratios) // 2]) / 2, len(pairs), " ".join("%.3f" % x for x in ratios)))
s1, s2 = med("scale1"), med("scale2")
if s1 and s2:
    print("bf16 2 ranks x 1 thread vs 1 rank: %.2fx = %.2f of the ideal 2x (target 0.9)" % (s1 / s2, s1 / s2 / 2))
PYEOF
exit 0
