#!/bin/bash
# Benchmark: every schedule on P ranks, measured, beside the simulator's prediction from
# measured costs, and the one-rank throughput they are measured against.
#
#   bench/schedules.sh [PIPELM]     (env: NP=2, M="8 16", V=2, PRESET=tutorial, STEPS=4, WARMUP=1)
#
# For each M: `pipelm bench` runs the one-rank baseline (1f1b on 1 rank), gpipe, 1f1b and
# zb-h1, interleaved-1f1b, looped-bfs and interleaved-zb with V chunks per rank, and zb-v and
# dualpipev (two chunks per rank in a V), all with
# --costs-out (one thread per rank). The costs file of the one-chunk schedules takes F and B
# from the 1f1b run and I and W from the zb-h1 run; that of the chunked ones, per global
# stage, F and B from interleaved-1f1b and I and W from interleaved-zb. `pipelm schedule
# --costs` predicts each schedule's step from that shared file, and again from its own run's
# costs. The table: measured step (median), both predictions and their ratios to it,
# measured and predicted bubble, MPI wait, throughput as a
# share of P x the one-rank throughput, and per rank the micro-batches held at most
# (measured, with the schedule's bound in brackets) and their activation MB (measured, and
# predicted from the costs file's per-stage bytes). P > the cores
# oversubscribes them: such rows are marked. Then `pipelm tune` on the largest M's shared
# costs, its top five measured (--verify), the first pick against the best of them and the
# default 1f1b. A report, not a test: it always exits 0.

PIPELM=${PIPELM:-${1:-./build/pipelm}}
NP=${NP:-2}
MS=${M:-8 16}
V=${V:-2}
PRESET=${PRESET:-tutorial}
STEPS=${STEPS:-4}
WARMUP=${WARMUP:-1}
SCHEDS="gpipe 1f1b zb-h1"
CHUNKED="interleaved-1f1b looped-bfs interleaved-zb"
VSHAPED="zb-v dualpipev" # two chunks per rank in a V
tmp=$(mktemp -d "${TMPDIR:-/tmp}/schedules.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
over=""
cores=$(getconf _NPROCESSORS_ONLN)
[ "$NP" -gt "$cores" ] && over=" (oversubscribed: $NP ranks on $cores cores)"
echo "== schedules on $NP ranks x 1 thread (chunked ones: $V chunks per rank), preset $PRESET$over"

# run NAME M NP [ARGS...]: one pipelm bench into $tmp/NAME.M.{json,costs,log}
run() {
    local s=$1 m=$2 np=$3
    shift 3
    timeout 1800 mpiexec -n "$np" "$PIPELM" bench --preset "$PRESET" --microbatches "$m" --batch "$m" --threads 1 \
        --steps "$STEPS" --warmup "$WARMUP" --json "$tmp/$s.$m.json" --costs-out "$tmp/$s.$m.costs" "$@" \
        > "$tmp/$s.$m.log" 2>&1 || echo "   $s M=$m failed: $(tail -n 2 "$tmp/$s.$m.log")"
}

# merge A B OUT: F, B, O and A (activation bytes) from costs file A, I and W from B
merge() {
    python3 - "$1" "$2" "$3" <<'EOF'
import sys
a, b = (open(f).read().splitlines() for f in sys.argv[1:3])
out = []
for la, lb in zip(a, b):
    if la.startswith("stage "):
        ta, tb = la.split(), lb.split()
        out.append("stage %s F %s B %s I %s W %s O %s A %s" % (ta[1], ta[3], ta[5], tb[7], tb[9], ta[11], ta[13]))
    else:
        out.append(la)
open(sys.argv[3], "w").write("\n".join(out) + "\n")
EOF
}

for m in $MS; do
    run one "$m" 1 --schedule 1f1b
    for s in $SCHEDS; do run "$s" "$m" "$NP" --schedule "$s"; done
    for s in $CHUNKED; do run "$s" "$m" "$NP" --schedule "$s" --chunks-per-rank "$V"; done
    for s in $VSHAPED; do run "$s" "$m" "$NP" --schedule "$s"; done
    merge "$tmp/1f1b.$m.costs" "$tmp/zb-h1.$m.costs" "$tmp/all.$m.costs"
    merge "$tmp/interleaved-1f1b.$m.costs" "$tmp/interleaved-zb.$m.costs" "$tmp/chunks.$m.costs"
    # each schedule predicted twice: from the shared file (what a user would do before running
    # it) and from its own run's costs (I and W, or B, filled from the shared file)
    for s in $SCHEDS $CHUNKED $VSHAPED; do
        shared=$tmp/all.$m.costs v=1
        case " $CHUNKED " in *" $s "*) shared=$tmp/chunks.$m.costs v=$V ;; esac
        case " $VSHAPED " in *" $s "*) v=2 ;; esac # the per-rank file, scaled to 1/2 per chunk
        case $s in zb-h1|interleaved-zb|zb-v) merge "$tmp/$s.$m.costs" "$tmp/$s.$m.costs" "$tmp/own.$s.$m.costs" ;;
                   *) merge "$tmp/$s.$m.costs" "$shared" "$tmp/own.$s.$m.costs" ;; esac
        "$PIPELM" schedule --stages "$NP" --chunks-per-rank "$v" --microbatches "$m" --schedule "$s" \
            --costs "$shared" --grid no > "$tmp/$s.$m.pred" 2>&1
        "$PIPELM" schedule --stages "$NP" --chunks-per-rank "$v" --microbatches "$m" --schedule "$s" \
            --costs "$tmp/own.$s.$m.costs" --grid no > "$tmp/$s.$m.own" 2>&1
    done
done

python3 - "$tmp" "$NP" "$MS" "$SCHEDS $CHUNKED $VSHAPED" "$over" <<'EOF'
import json, re, sys
tmp, NP, Ms, scheds, over = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5]
print()
print("%-16s %2s %4s %11s %10s %6s %10s %6s %7s %8s %7s %7s  %-14s %s" % ("sched", "V", "M", "measured ms",
      "pred ms", "ratio", "pred(own)", "ratio", "bubble", "pred bub", "wait ms", "x P*one", "in flight", "act MB"))
for m in Ms:
    try:
        o = json.load(open("%s/one.%s.json" % (tmp, m)))
    except (OSError, ValueError):
        o = None
    for s in scheds:
        try:
            j = json.load(open("%s/%s.%s.json" % (tmp, s, m)))
            p = open("%s/%s.%s.pred" % (tmp, s, m)).read()
            po = open("%s/%s.%s.own" % (tmp, s, m)).read()
        except (OSError, ValueError):
            print("%-16s %2s %4s  (failed)" % (s, "", m)); continue
        meas = j["step_ms"]["median"]
        mm = re.search(r"step ([0-9.]+) ms.*bubble ([0-9.]+)%", p)
        pred, pbub = (float(mm.group(1)), float(mm.group(2))) if mm else (None, None)
        mo = re.search(r"step ([0-9.]+) ms", po)
        own = float(mo.group(1)) if mo else None
        wait = max(st["wait_ms"] for st in j["stages"])
        fl = ",".join("%d(%d)" % (st["inflight_peak"], st["inflight_bound"]) for st in j["stages"])
        pa = re.findall(r"activations ([0-9.]+) MB", p)
        act = ",".join("%.0f" % st["act_mb_peak"] for st in j["stages"]) + (" (pred %s)" % ",".join(
            "%.0f" % float(x) for x in pa) if pa else "")
        share = "%.3f" % (j["tokens_per_s"] / (NP * o["tokens_per_s"])) if o else "n/a"
        print("%-16s %2s %4s %11.1f %10s %6s %10s %6s %6.1f%% %7s%% %7.1f %7s  %-14s %s%s" % (s,
              j.get("chunks_per_rank", 1), m, meas, "%.1f" % pred if pred else "n/a",
              "%.3f" % (pred / meas) if pred else "n/a", "%.1f" % own if own else "n/a",
              "%.3f" % (own / meas) if own else "n/a", 100 * j["bubble_measured"],
              "%.1f" % pbub if pbub is not None else "n/a", wait, share, fl, act, over))
    if o:
        print("%-16s %2s %4s %12.1f   (one rank, 1f1b: %.0f tokens/s, %.0f act MB)" % ("one rank", 1, m,
              o["step_ms"]["median"], o["tokens_per_s"], o["stages"][0]["act_mb_peak"]))
EOF

# the tuner: its top five for the shared costs of the largest M, each measured (tune --verify),
# its first pick against the best measured of them and against the default command (1f1b)
m=${MS##* }
echo
echo "== pipelm tune on the 1f1b/zb-h1 costs of M=$m (batch $m), its top 5 measured; $(uptime | sed 's/.*load/load/')"
timeout 3600 mpiexec -n "$NP" "$PIPELM" tune --costs "$tmp/all.$m.costs" --batch "$m" --costs-microbatches "$m" --verify 5 \
    -- --preset "$PRESET" --threads 1 > "$tmp/tune.log" 2>&1 || echo "   tune failed: $(tail -n 2 "$tmp/tune.log")"
grep -E "^tune:|^ +#|^ +[1-5] +[0-9.]+ +[0-9.]+%|^verify" "$tmp/tune.log"
python3 - "$tmp/tune.log" "$tmp/1f1b.$m.json" "$m" <<'EOF'
import json, re, sys
v = [(float(a), c) for c, a in re.findall(r"^verify \d+: (.*): measured ([0-9.]+) ms", open(sys.argv[1]).read(), re.M)]
if v:
    best = min(v)
    print("first pick measured %.1f ms, best of the top %d %.1f ms (%s): first / best = %.3f" % (v[0][0], len(v),
          best[0], best[1], v[0][0] / best[0]))
    try:
        d = json.load(open(sys.argv[2]))["step_ms"]["median"]
        print("default command (1f1b, M=%s) measured %.1f ms: first pick / default = %.3f" % (sys.argv[3], d, v[0][0] / d))
    except (OSError, ValueError, KeyError):
        pass
EOF
exit 0
