#!/bin/bash
# Benchmark: every schedule on P ranks, measured, beside the simulator's prediction from
# measured costs.
#
#   bench/schedules.sh [PIPELM]     (env: NP=2, M="8 16", PRESET=tutorial, STEPS=4, WARMUP=1)
#
# For each M: `pipelm bench` runs gpipe, 1f1b and zb-h1 with --costs-out (one thread per
# rank); the F and B seconds of the 1f1b run and the I and W seconds of the zb-h1 run make
# one costs file, and `pipelm schedule --costs` predicts each schedule's step from it. The
# table: measured step (median), predicted step and their ratio, measured and predicted
# bubble, MPI wait, peak in-flight micro-batches per rank. P > the cores oversubscribes them:
# such rows are marked. A report, not a test: it always exits 0.

PIPELM=${PIPELM:-${1:-./build/pipelm}}
NP=${NP:-2}
MS=${M:-8 16}
PRESET=${PRESET:-tutorial}
STEPS=${STEPS:-4}
WARMUP=${WARMUP:-1}
SCHEDS="gpipe 1f1b zb-h1"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/schedules.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
over=""
cores=$(getconf _NPROCESSORS_ONLN)
[ "$NP" -gt "$cores" ] && over=" (oversubscribed: $NP ranks on $cores cores)"
echo "== schedules on $NP ranks x 1 thread, preset $PRESET$over"
for m in $MS; do
    for s in $SCHEDS; do
        timeout 1800 mpiexec -n "$NP" "$PIPELM" bench --preset "$PRESET" --microbatches "$m" --batch "$m" --threads 1 \
            --steps "$STEPS" --warmup "$WARMUP" --schedule "$s" --json "$tmp/$s.$m.json" --costs-out "$tmp/$s.$m.costs" \
            > "$tmp/$s.$m.log" 2>&1 || echo "   $s M=$m failed: $(tail -n 2 "$tmp/$s.$m.log")"
    done
    python3 - "$tmp" "$m" <<'EOF'
import sys
tmp, m = sys.argv[1], sys.argv[2]
def rows(name):
    return open("%s/%s.%s.costs" % (tmp, name, m)).read().splitlines()
a, b = rows("1f1b"), rows("zb-h1")
out = []
for la, lb in zip(a, b):
    if la.startswith("stage "):
        ta, tb = la.split(), lb.split()
        out.append("stage %s F %s B %s I %s W %s O %s" % (ta[1], ta[3], ta[5], tb[7], tb[9], ta[11]))
    else:
        out.append(la)
open("%s/all.%s.costs" % (tmp, m), "w").write("\n".join(out) + "\n")
EOF
    for s in $SCHEDS; do
        "$PIPELM" schedule --stages "$NP" --microbatches "$m" --schedule "$s" --costs "$tmp/all.$m.costs" --grid no \
            > "$tmp/$s.$m.pred" 2>&1
    done
done
python3 - "$tmp" "$NP" "$MS" "$SCHEDS" "$over" <<'EOF'
import json, re, sys
tmp, NP, Ms, scheds, over = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5]
print()
print("%-7s %4s %12s %12s %7s %9s %9s %9s  %s" % ("sched", "M", "measured ms", "predicted ms", "ratio",
      "bubble", "pred bub", "wait ms", "in flight"))
for m in Ms:
    for s in scheds:
        try:
            j = json.load(open("%s/%s.%s.json" % (tmp, s, m)))
            p = open("%s/%s.%s.pred" % (tmp, s, m)).read()
        except (OSError, ValueError):
            print("%-7s %4s  (failed)" % (s, m)); continue
        meas = j["step_ms"]["median"]
        mm = re.search(r"step ([0-9.]+) ms.*bubble ([0-9.]+)%", p)
        pred, pbub = (float(mm.group(1)), float(mm.group(2))) if mm else (None, None)
        wait = max(st["wait_ms"] for st in j["stages"])
        fl = ",".join(re.findall(r"in flight (\d+)", p))
        print("%-7s %4s %12.1f %12s %7s %8.1f%% %8s%% %9.1f  %s%s" % (s, m, meas, "%.1f" % pred if pred else "n/a",
              "%.3f" % (pred / meas) if pred else "n/a", 100 * j["bubble_measured"],
              "%.1f" % pbub if pbub is not None else "n/a", wait, fl, over))
EOF
exit 0
