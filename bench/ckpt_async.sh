#!/bin/bash
# ckpt_async.sh — step times around a checkpoint save, synchronous against --ckpt-async.
#
#   bench/ckpt_async.sh [PRESET...]          (default: tutorial gpt2)
#
# For each preset, REPS pairs of runs on RANKS ranks (default 2), sync and async interleaved
# (A B A B ...), so a load that changes during the benchmark hits both alike. Each run trains
# STEPS steps with one save at step SAVE_AT (--ckpt-every SAVE_AT) and writes its metrics; from
# them (per run, then the median over the reps):
#   normal   the median step time of the steps outside the save's window
#   sync     the synchronous save's blocked_ms (training held for the whole save)
#   blocked  the async save's blocked_ms (the snapshot)
#   during   the steps that ran while the async write was in flight (up to write_ms after it
#            began): their count, the largest step / normal, and their time beyond normal
#   lost     blocked + the time beyond normal during the write: what one async save costs
#            (less fence_ms, the next optimizer's wait for a deferred snapshot, which is in both)
#   lost/sync  the issue's target is <= 5%, and no step during the write > 1.2 x normal
# Environment: BUILD (default ../build), MPIEXEC, RANKS (2), REPS (3), STEPS (14), SAVE_AT (4),
# THREADS (per rank, default 1: two ranks on two cores leave no spare core for the writer;
# give a larger machine THREADS=k to see how it scales when cores are spare), BENCH_DIR
# (the file system to write to, default a fresh directory under $TMPDIR), EXTRA (more train
# options). The gpt2 preset runs at --batch 2 --seq-len 256 --microbatches 2 (its model, and
# so its 1.5 GB checkpoint, is GPT-2 124M's; the step is cut to fit two cores).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=${BUILD:-$HERE/../build}
PIPELM=${PIPELM:-$BUILD/pipelm}
MPIEXEC=${MPIEXEC:-mpiexec}
RANKS=${RANKS:-2}
REPS=${REPS:-3}
STEPS=${STEPS:-14}
SAVE_AT=${SAVE_AT:-4}
THREADS=${THREADS:-1}
EXTRA=${EXTRA:-}
PRESETS=${*:-tutorial gpt2}
PY=/usr/bin/python3
DIR=${BENCH_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ckpt_async.XXXXXX")}
mkdir -p "$DIR"
[ -z "${BENCH_DIR:-}" ] && trap 'rm -rf "$DIR"' EXIT
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS

# run PRESET MODE REP: one training run; its metrics in $DIR/PRESET.MODE.REP.jsonl
run() {
    local p=$1 mode=$2 rep=$3 opts="--preset $1"
    [ "$p" = gpt2 ] && opts="$opts --batch 2 --seq-len 256 --microbatches 2"
    rm -rf "$DIR/ck"
    "$MPIEXEC" -n "$RANKS" "$PIPELM" train $opts --steps "$STEPS" --ckpt-every "$SAVE_AT" --ckpt-keep 1 \
        --ckpt-dir "$DIR/ck" --ckpt-async $([ "$mode" = async ] && echo 1 || echo 0) --eval-every 0 --progress 0 \
        --lr-schedule constant --threads "$THREADS" --metrics "$DIR/$p.$mode.$rep.jsonl" $EXTRA \
        > "$DIR/$p.$mode.$rep.out" 2>&1 || { echo "ckpt_async: $p $mode run $rep failed:"; tail -3 "$DIR/$p.$mode.$rep.out"; exit 1; }
}

echo "checkpoint step cost, sync vs --ckpt-async: $RANKS ranks x $THREADS thread(s), $STEPS steps, a save every" \
     "$SAVE_AT steps, $REPS interleaved pairs; load: $(uptime | sed 's/.*load average/load average/')"
for p in $PRESETS; do
    for rep in $(seq 1 "$REPS"); do
        run "$p" sync "$rep"
        run "$p" async "$rep"
    done
    $PY - "$DIR" "$p" "$REPS" "$SAVE_AT" << 'EOF'
import json, statistics, sys
d, p, reps, save_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

def load(mode, rep):
    ev = [json.loads(l) for l in open(f"{d}/{p}.{mode}.{rep}.jsonl")]
    steps = {e["step"]: e["step_ms"] for e in ev if e["event"] == "step"}
    ckpts = [e for e in ev if e["event"] == "ckpt"]
    return steps, ckpts

rows = []
for rep in range(1, reps + 1):
    s_steps, s_ck = load("sync", rep)
    a_steps, a_ck = load("async", rep)
    sc = next(c for c in s_ck if c["step"] == save_at)
    ac = next(c for c in a_ck if c["step"] == save_at)
    # the async write's window: the steps after the save that began before write_ms was over
    # (the save's step time includes neither: the save runs after the step's timer)
    t, during = ac["blocked_ms"], []
    for k in range(save_at + 1, max(a_steps) + 1):
        if t >= ac["write_ms"]:
            break
        during.append(k)
        t += a_steps[k]
    skip = set(range(save_at - 1, save_at + len(during) + 2)) | {1, 2}
    normal = statistics.median(v for k, v in a_steps.items() if k not in skip and k not in
                               {c["step"] + 1 for c in a_ck})
    s_normal = statistics.median(v for k, v in s_steps.items() if k not in skip)
    # the time beyond normal: the plain sum (a step's noise either way cancels out), and the
    # sum of only the slower steps (an upper bound: it counts the noise of the fast ones as 0)
    extra = sum(a_steps[k] - normal for k in during)
    extra_hi = sum(max(0.0, a_steps[k] - normal) for k in during)
    worst = max((a_steps[k] / normal for k in during), default=0.0)
    lost = ac["blocked_ms"] - ac.get("fence_ms", 0.0) + extra
    lost_hi = ac["blocked_ms"] - ac.get("fence_ms", 0.0) + extra_hi
    rows.append((normal, s_normal, sc["blocked_ms"], ac["blocked_ms"], len(during), worst, extra, lost,
                 lost / sc["blocked_ms"], ac["write_ms"], ac["bytes"], ac.get("fence_ms", 0.0), lost_hi / sc["blocked_ms"]))
med = [statistics.median(r[i] for r in rows) for i in range(len(rows[0]))]
print(f"{p}: {med[10] / 1e6:.0f} MB per save")
print(f"  normal step {med[0]:.1f} ms (sync runs {med[1]:.1f}); sync save {med[2]:.1f} ms; async: blocked "
      f"{med[3]:.1f} ms (of it fence {med[11]:.1f}), write {med[9]:.1f} ms over {med[4]:.0f} step(s), worst step "
      f"{med[5]:.2f} x normal, {med[6]:.1f} ms beyond normal; lost {med[7]:.1f} ms = {100 * med[8]:.1f}% of the "
      f"sync save (counting only the slower steps: {100 * med[12]:.1f}%)")
for i, r in enumerate(rows, 1):
    print(f"    pair {i}: normal {r[0]:.1f}  sync {r[2]:.1f}  blocked {r[3]:.1f}  fence {r[11]:.1f}  during {r[4]} "
          f"worst {r[5]:.2f}x  beyond {r[6]:.1f}  lost {100 * r[8]:.1f}% (slower steps only {100 * r[12]:.1f}%)")
EOF
done
