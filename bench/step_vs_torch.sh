#!/bin/bash
# Benchmark: one training step of pipelm vs PyTorch, one process, one thread.
#
#   bench/step_vs_torch.sh [PIPELM]      (or PIPELM=... bench/step_vs_torch.sh)
#
# Model: pipelm `tutorial` preset (V=10000 -> Vp=10112, C=512, L=8, NH=8,
# T=128), B=8. pipelm: median step_ms of steps 3..8 from its metrics;
# torch: bench/torch_step.py (same architecture, random init and tokens),
# median of steps 3..8. Also reports pipelm's achieved GFLOP/s against the
# one-thread sgemm peak from `pipelm bench --peak`.
# Targets: torch/pipelm ratio >= 1, achieved >= 75% of the 1-thread peak.
# This is a report, not a test: it always exits 0.
#
# Environment: PIPELM_LAUNCHER (prefix, e.g. "mpirun -np 1"),
# BENCH_STEPS (default 8), BENCH_WARMUP (default 2).

PIPELM=${PIPELM:-${1:-./build/src/pipelm}}
# the non-recursive automake build puts the program at build/pipelm
if [ "$PIPELM" = ./build/src/pipelm ] && ! [ -x "$PIPELM" ] && [ -x ./build/pipelm ]; then
    PIPELM=./build/pipelm
fi
PY=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)

V=10000 VP=10112 C=512 L=8 NH=8 T=128 MAXT=128 B=8
STEPS=${BENCH_STEPS:-8}
WARMUP=${BENCH_WARMUP:-2}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/step_vs_torch.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT

echo "== pipelm vs torch: one training step, tutorial preset, B=$B T=$T, 1 thread"
echo "pipelm: $PIPELM"

have_pipelm=1
if ! [ -x "$PIPELM" ] && ! command -v "$PIPELM" >/dev/null 2>&1; then
    echo "pipelm binary not found: $PIPELM"
    have_pipelm=0
fi

if [ $have_pipelm = 1 ]; then
    echo "-- pipelm train ($STEPS steps) ..."
    if ! OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
        timeout 900 ${PIPELM_LAUNCHER:-} "$PIPELM" train --preset tutorial \
            --batch $B --seq-len $T --microbatches 1 --steps "$STEPS" \
            --metrics "$tmp/m.jsonl" >"$tmp/train.log" 2>&1; then
        echo "pipelm train failed; log tail:"
        tail -n 20 "$tmp/train.log"
    fi
    echo "-- pipelm bench --peak ..."
    # no thread limits here: peak_gflops_all should use every core
    if ! timeout 600 "$PIPELM" bench --peak --json "$tmp/peak.json" \
            >"$tmp/peak.log" 2>&1; then
        echo "pipelm bench --peak failed; log tail:"
        tail -n 20 "$tmp/peak.log"
    fi
fi

if "$PY" -c 'import torch' >/dev/null 2>&1; then
    echo "-- torch ($STEPS steps, $WARMUP warm-up) ..."
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
        timeout 1800 "$PY" "$here/torch_step.py" --V $V --C $C --L $L --NH $NH \
        --T $T --B $B --steps "$STEPS" --warmup "$WARMUP" --threads 1 \
        --json "$tmp/torch.json" >"$tmp/torch.log" 2>&1 ||
        { echo "torch step failed; log tail:"; tail -n 20 "$tmp/torch.log"; }
else
    echo "torch not available to $PY: torch side skipped"
fi

REPORT_PY=$PY
[ -x "$REPORT_PY" ] || REPORT_PY=python3
"$REPORT_PY" - "$tmp" $V $VP $C $L $NH $T $MAXT $B "$WARMUP" <<'PYEOF'
import json, os, statistics, sys
tmp = sys.argv[1]
V, Vp, C, L, NH, T, maxT, B, warmup = map(int, sys.argv[2:11])

def load_json(name):
    try:
        with open(os.path.join(tmp, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

# pipelm: median step_ms over the steps after the warm-up
p_ms = None
steps_used = []
try:
    rows = {}
    with open(os.path.join(tmp, "m.jsonl")) as f:
        for line in f:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if d.get("event") == "step" and "step_ms" in d:
                rows.setdefault(int(d["step"]), float(d["step_ms"]))
    steps_used = sorted(s for s in rows if s > warmup)
    if steps_used:
        p_ms = statistics.median(rows[s] for s in steps_used)
except OSError:
    pass

t = load_json("torch.json")
t_ms = t["median_ms"] if t else None
peak = load_json("peak.json") or {}
peak1 = peak.get("peak_gflops_1")
peakall = peak.get("peak_gflops_all")

N = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
flops_per_token = 6 * N + 6 * L * C * T
tokens = B * T

def fmt(x, f="%.1f"):
    return f % x if x is not None else "n/a"

print()
print("model: V=%d Vp=%d C=%d L=%d NH=%d T=%d B=%d; N=%d params; "
      "%.1f MFLOP/token, %.1f GFLOP/step"
      % (V, Vp, C, L, NH, T, B, N, flops_per_token / 1e6,
         tokens * flops_per_token / 1e9))
print("pipelm median step : %s ms (steps %s)" % (
    fmt(p_ms), ",".join(map(str, steps_used)) or "none"))
print("torch  median step : %s ms" % fmt(t_ms))
ratio = t_ms / p_ms if (t_ms and p_ms) else None
print("ratio torch/pipelm : %s   (target >= 1; > 1 means pipelm is faster)%s"
      % (fmt(ratio, "%.2f"),
         "" if ratio is None else ("  MET" if ratio >= 1 else "  NOT MET")))
gf = tokens * flops_per_token / (p_ms / 1e3) / 1e9 if p_ms else None
print("pipelm achieved    : %s GFLOP/s" % fmt(gf))
print("sgemm peak         : %s GFLOP/s 1 thread, %s GFLOP/s all threads"
      % (fmt(peak1), fmt(peakall)))
pct = 100.0 * gf / peak1 if (gf and peak1) else None
print("achieved / 1-thread peak: %s%%   (target >= 75%%)%s"
      % (fmt(pct), "" if pct is None else ("  MET" if pct >= 75 else "  NOT MET")))
PYEOF
exit 0
