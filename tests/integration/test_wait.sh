#!/bin/bash
# test_wait.sh — the wait split of `pipelm bench`: each rank's measured MPI wait is split into
# the schedule's own wait, a straggler's, the transfers' and the remainder, and the parts add
# up to the measured wait (text and JSON); a rank slowed on purpose (--slow-rank, test-only)
# is named as the straggler in both, with its stage, and the ranks that waited for it; the
# parts are on the trace as counters.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
B="--preset tiny --n-layer 3 --batch 8 --seq-len 32 --microbatches 4 --warmup 1 --steps 3 --progress 0"
check() { # NAME JSON SLOW_RANK (-1: none)
    if python3 - "$2" "$3" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["wait_split"]
slow = int(sys.argv[2])
for r in d["ranks"]:
    parts = r["schedule_ms"] + r["straggler_ms"] + r["transfer_ms"] + r["other_ms"]
    assert abs(parts - r["measured_ms"]) < 0.01, (r, parts)
    assert r["schedule_ms"] >= 0 and r["straggler_ms"] >= 0 and r["transfer_ms"] >= 0, r
if slow >= 0:
    assert d["straggler_rank"] == slow, d
    assert d["straggler"].startswith("stage %d on rank %d: " % (d["straggler_stage"], slow)), d["straggler"]
    assert d["over_cost"][d["straggler_stage"]] > 0.10, d
    waited = [r for r in d["ranks"] if r["rank"] != slow and r["straggler_ms"] > 0]
    assert waited, d
PY
    then ok "$1: the split adds up to the measured wait on every rank$([ $3 -ge 0 ] && echo ", rank $3 named the straggler")"
    else bad "$1" "see above"; fi
}
if mpirun_t 120 3 bench $B --json w0.json > w0.out 2>&1; then check "3 ranks, 1f1b" w0.json -1
else bad "bench without a slow rank" "exit $? $(grep -m1 error w0.out)"; fi
if mpirun_t 120 3 bench $B --slow-rank 2 --slow-ms 30 --json w2.json > w2.out 2>&1; then
    check "3 ranks, rank 2 slowed by 30 ms per action" w2.json 2
    grep -q "straggler: stage 2 on rank 2: F and B [0-9]*% over cost; ranks 0-1 wait" w2.out && ok "the text names it: $(grep straggler: w2.out)" \
        || bad "straggler line" "$(grep -A5 'wait split' w2.out)"
else bad "bench with a slow rank" "exit $? $(grep -m1 error w2.out)"; fi
# the trace carries each rank's parts as counters ("C" events), the straggler's on its track
if mpirun_t 120 3 bench $B --slow-rank 2 --slow-ms 30 --steps 2 --trace wt.json > wt.out 2>&1 && python3 - wt.json <<'PY'
import json, sys
c = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "C"]
names = {(e["tid"], e["name"]) for e in c}
for r in range(3):
    for k in ("schedule", "straggler", "transfer", "other"):
        assert (r, "wait: %s ms" % k) in names, (r, k, sorted(names))
st = {e["tid"]: e["args"]["wait: straggler ms"] for e in c if e["name"] == "wait: straggler ms"}
assert st[0] > 0 and st[1] > 0 and st[2] == 0, st
PY
then ok "--trace: the four parts as counters on every rank's track; ranks 0 and 1 wait for the straggler"
else bad "trace counters" "$(grep -m1 error wt.out)"; fi
# the V shape: the slow stage's rank is found through the placement (stage 1 and 2 on rank 1)
if mpirun_t 120 2 bench $B --schedule zb-v --slow-rank 1 --slow-ms 30 --json wv.json > wv.out 2>&1; then
    check "2 ranks, zb-v, rank 1 slowed" wv.json 1
else bad "bench zb-v with a slow rank" "exit $? $(grep -m1 error wv.out)"; fi
# a costs file as the baseline (--costs-in): the same stages, judged by their own costs
if mpirun_t 120 3 bench $B --costs-out c.txt > c.out 2>&1 &&
        mpirun_t 120 3 bench $B --costs-in c.txt --slow-rank 1 --slow-ms 30 --json wc.json > wc.out 2>&1; then
    check "3 ranks against --costs-in, rank 1 slowed" wc.json 1
else bad "bench --costs-in" "exit $? $(grep -m1 error c.out wc.out)"; fi
finish
