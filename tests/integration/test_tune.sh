#!/bin/bash
# test_tune.sh — pipelm tune finds a planted answer: a costs file for 4 ranks whose stage 2
# runs 2x slower, and a per-rank memory cap under which GPipe (it holds the whole batch) and
# the small M cannot run. Every layout the tuner searches is also predicted one by one with
# `pipelm schedule --costs` (costs scaled to each M's micro-batch size here, independently):
# the tuner's first pick must be the fastest of those that fit, no candidate may exceed the
# cap, and without the cap GPipe is a candidate again. --json has the keys the issue names;
# --verify runs the top candidate (on 2 ranks) and prints measured beside predicted; the
# search at P = 64, batch 256 (M up to 256) finishes in under 60 s.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
python3 - <<'PY'
def write(path, k):
    with open(path, "w") as f:
        f.write("stages 4\nmsg_bytes %g\nlatency_s 2e-5\nbytes_per_s 1e9\n" % (65536 * k))
        for s in range(4):
            slow = 2.0 if s == 2 else 1.0
            f.write("stage %d F %g B %g I %g W %g O 0.002 A %g\n" % (s, 0.004 * slow * k, 0.008 * slow * k,
                    0.004 * slow * k, 0.004 * slow * k, 1048576 * k))
write("c.txt", 1.0)
for M in (1, 2, 4, 8):
    write("c%d.txt" % M, 8.0 / M)
PY
CAP=0.005859375 # 6 MB: gpipe holds 8 MB at every M
if "$PIPELM" tune --costs c.txt --stages 4 --batch 8 --costs-microbatches 8 --mem-cap-gb $CAP --json t.json > t.out 2>&1; then
    ok "tune ran: $(head -n 1 t.out)"
else bad "tune" "exit $? $(cat t.out)"; fi
"$PIPELM" tune --costs c.txt --stages 4 --batch 8 --costs-microbatches 8 --mem-cap-gb 100 --json nocap.json > nocap.out 2>&1 \
    || bad "tune without a cap" "exit $?"
# the brute force: every layout predicted on its own
: > brute.txt
for M in 1 2 4 8; do
    for SV in gpipe:1 1f1b:1 zb-h1:1 interleaved-1f1b:2 interleaved-1f1b:4 interleaved-zb:2 interleaved-zb:4 looped-bfs:2 \
              zb-v:2 dualpipev:2; do
        S=${SV%:*} V=${SV#*:}
        "$PIPELM" schedule --stages 4 --microbatches $M --schedule $S --chunks-per-rank $V --grid no --costs c$M.txt \
            > one.out 2>&1 || continue
        step=$(sed -n 's/^predicted from .*: step \([0-9.]*\) ms.*/\1/p' one.out)
        peak=$(sed -n 's/.*activations \([0-9.]*\) MB$/\1/p' one.out | sort -g | tail -n 1)
        echo "$S $M $V $step $peak" >> brute.txt
    done
done
if python3 - t.json nocap.json brute.txt $CAP <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["candidates"]
nocap = json.load(open(sys.argv[2]))["candidates"]
cap_mb = float(sys.argv[4]) * 1024
rows = [l.split() for l in open(sys.argv[3]) if l.strip()]
fit = [(float(r[3]), r) for r in rows if float(r[4]) <= cap_mb + 0.05]
best = min(fit)[0]
for c in t:
    assert set(["command", "predicted_ms", "bubble", "peak_mem_mb"]) <= set(c), c
    assert c["peak_mem_mb"] <= cap_mb + 1e-9, c
    assert c["schedule"] != "gpipe", c
    assert c["command"].startswith("pipelm train --schedule "), c
assert abs(t[0]["predicted_ms"] - best) < 0.006, (t[0], best, sorted(fit)[:3])
assert all(t[i]["predicted_ms"] <= t[i + 1]["predicted_ms"] for i in range(len(t) - 1))
assert any(c["schedule"] == "gpipe" for c in nocap)
# the planted slow stage bounds every one-chunk layout: the batch's 2x F + B on one rank (with
# chunks its layers are spread over two stages on two ranks)
for c in t:
    if c["chunks_per_rank"] == 1:
        assert c["predicted_ms"] >= 8 * (0.008 + 0.016) * 1e3 - 1e-6, c
print("first pick %s (%.3f ms), the fastest of the %d layouts that fit %.1f MB by brute force; gpipe only without the cap"
      % (t[0]["command"], t[0]["predicted_ms"], len(fit), cap_mb))
PY
then ok "planted answer found"; else bad "planted answer" "$(head -n 8 t.out)"; fi
grep -q "mpiexec -n 4 pipelm train --schedule" t.out && [ "$(grep -c '^ *[1-5]  ' t.out)" = 5 ] && ok "the five best printed with their commands" \
    || bad "the table" "$(cat t.out)"
"$PIPELM" tune --costs c.txt --stages 4 --batch 8 --costs-microbatches 8 --mem-cap-gb 0.0001 > none.out 2>&1
rc=$?
[ $rc = 2 ] && grep -q "no layout of the .* tried fits" none.out && ok "a cap nothing fits is refused (exit 2)" || bad "cap refusal" "rc=$rc $(cat none.out)"
# a model of 2 blocks splits into at most 4 stages: on 4 ranks only the one-chunk layouts remain
"$PIPELM" tune --costs c.txt --stages 4 --batch 8 --costs-microbatches 8 --mem-cap-gb 100 --n-layer 2 --json l2.json \
    > l2.out 2>&1 && python3 -c '
import json, sys
c = json.load(open("l2.json"))["candidates"]
assert c and all(x["chunks_per_rank"] == 1 for x in c), c' && ok "--n-layer 2 on 4 ranks: only one-chunk layouts" \
    || bad "--n-layer" "$(cat l2.out)"
# recompute: costs measured with --recompute full (planted: stage 0 holds 16x the activations of
# the others; full recompute keeps an eighth and adds an F to each B and I). Under a 5 MB cap no
# layout fits without recompute on stage 0: the first pick recomputes stage 0 only, and its
# prediction is that of `pipelm schedule --costs` on the mixed costs, independently
python3 - <<'PY'
def write(path, full=False):
    with open(path, "w") as f:
        f.write("stages 4\nmsg_bytes 65536\nlatency_s 2e-5\nbytes_per_s 1e9\n")
        for s in range(4):
            F, B, I, W = 0.004, 0.008, 0.004, 0.004
            a = 4194304 if s == 0 else 262144
            if full: B += F; I += F; a = a / 8
            f.write("stage %d F %g B %g I %g W %g O 0.002 A %g\n" % (s, F, B, I, W, a))
write("h.txt"); write("hf.txt", True)
PY
"$PIPELM" tune --costs h.txt --costs-full hf.txt --stages 4 --batch 8 --costs-microbatches 8 --mem-cap-gb 0.0048828125 \
    --json h.json > h.out 2>&1 || bad "tune --costs-full" "exit $? $(cat h.out)"
"$PIPELM" tune --costs h.txt --stages 4 --batch 8 --costs-microbatches 8 --mem-cap-gb 0.0048828125 --json h0.json \
    > h0.out 2>&1
pick=$(python3 -c '
import json
c = json.load(open("h.json"))["candidates"][0]
print(c["schedule"], c["microbatches"], c["chunks_per_rank"], c["recompute"], c["predicted_ms"], c["peak_mem_mb"])')
set -- $pick
if [ "${4:-}" = "full,none,none,none" ] && [ "${3:-}" = 1 ]; then
    python3 - "$4" <<'PY'
import sys
modes = sys.argv[1].split(",")
none, full = open("h.txt").read().split("\n"), open("hf.txt").read().split("\n")
with open("hm.txt", "w") as f:
    for a, b in zip(none, full):
        f.write((b if a.startswith("stage ") and modes[int(a.split()[1])] == "full" else a) + "\n")
PY
    "$PIPELM" schedule --stages 4 --microbatches "$2" --schedule "$1" --grid no --costs hm.txt > hm.out 2>&1
    step=$(sed -n 's/^predicted from .*: step \([0-9.]*\) ms.*/\1/p' hm.out)
    awk -v a="$step" -v b="$5" -v m="$6" 'BEGIN { exit !(a > 0 && a - b < 0.006 && b - a < 0.006 && m <= 5) }' &&
        grep -q -- "--recompute full,none,none,none" h.out &&
        python3 -c '
import json
c = json.load(open("h.json"))["candidates"]
assert all(x["peak_mem_mb"] <= 5 + 1e-9 for x in c)
u = [x["predicted_ms"] for x in c if x["recompute"] == "full" and x["schedule"] == "'"$1"'" and x["microbatches"] == '"$2"']
assert u and min(u) > '"$5"', u' &&
        ok "--costs-full: stage 0 alone recomputed ($1, M=$2: $5 ms, as schedule --costs predicts $step ms; faster than all stages)" ||
        bad "--costs-full prediction" "tuner $5 ms, schedule --costs '$step' ms, peak $6 MB"
else bad "--costs-full first pick" "$pick; $(head -n 6 h.out)"; fi
grep -q "no layout of the .* tried fits" h0.out && ok "without --costs-full nothing fits that cap" || bad "cap without recompute" "$(head -n 4 h0.out)"
# the split: costs naming each stage's blocks (N 2 on 4 stages of an 8-block tiny model), stage 2
# twice as slow per FLOP. With the model given (the train options), the tuner offers the split
# that gives stage 2 fewer blocks, predicted faster than the measured split for the same
# layout, and pipelm train runs its command
python3 - <<'PY'
with open("s.txt", "w") as f:
    f.write("stages 4\nmsg_bytes 65536\nlatency_s 2e-5\nbytes_per_s 1e9\n")
    for s in range(4):
        slow = 2.0 if s == 2 else 1.0
        f.write("stage %d F %g B %g O 0.002 A 1048576 N 2\n" % (s, 0.004 * slow, 0.008 * slow))
PY
"$PIPELM" tune --costs s.txt --stages 4 --batch 8 --costs-microbatches 8 --mem-cap-gb 100 --json s.json \
    -- --preset tiny --n-layer 8 > s.out 2>&1 || bad "tune with the split" "exit $? $(tail -n 3 s.out)"
sp=$(python3 -c '
import json
c = [x for x in json.load(open("s.json"))["candidates"] if x["schedule"] == "1f1b" and x["microbatches"] == 8]
old = [x for x in c if x["split"] == ""][0]
new = [x for x in c if x["split"]][0]
n = [int(b) for b in new["split"].split(",")]
assert n[2] < 2 and sum(n) == 8 and new["predicted_ms"] < old["predicted_ms"], (old, new)
assert new["command"].endswith(" --split " + new["split"] + " --preset tiny --n-layer 8"), new
print(new["split"], "%.1f" % new["predicted_ms"], "%.1f" % old["predicted_ms"])' 2> s.err)
if [ -n "$sp" ] && set -- $sp && mpirun_t 120 4 train --preset tiny --n-layer 8 --batch 8 --microbatches 8 --steps 1 \
        --schedule 1f1b --split "$1" --progress 0 > s_run.out 2>&1; then
    ok "split rebalanced for the slow stage 2: --split $1 (1f1b, M=8: $2 ms against $3 ms with 2,2,2,2); train runs it"
else bad "split search" "'$sp' $(tail -n 2 s.err) $(tail -n 2 s_run.out)"; fi
# --ranks 4: every D x P = 4. Four equal stages of 2 blocks measured on one replica; on a fast
# network (1e10 B/s) a replicated layout wins (4 replicas of the whole model, 1f1b with M=2, is
# 2 x the model's F + B plus the optimizer: 104 ms and the ring's 0.1 ms); on a slow one (1e6 B/s,
# the all-reduce of the fp32 gradients takes seconds) the pipeline of one replica does
for bw in 1e10 1e6; do
    python3 - $bw <<'PY'
import sys
with open("d.txt", "w") as f:
    f.write("stages 4\nmsg_bytes 65536\nlatency_s 2e-5\nbytes_per_s %s\n" % sys.argv[1])
    for s in range(4):
        f.write("stage %d F 0.004 B 0.008 O 0.002 A 1048576 N 2\n" % s)
PY
    "$PIPELM" tune --costs d.txt --ranks 4 --batch 8 --costs-microbatches 8 --mem-cap-gb 100 --json d$bw.json \
        -- --preset tiny --n-layer 8 > d$bw.out 2>&1 || bad "tune --ranks 4 ($bw B/s)" "exit $? $(tail -n 2 d$bw.out)"
done
if python3 - <<'PY'
import json
fast = json.load(open("d1e10.json"))["candidates"]
slow = json.load(open("d1e6.json"))["candidates"]
assert fast[0]["dp"] > 1 and (" --dp %d " % fast[0]["dp"]) in fast[0]["command"], fast[0]
assert slow[0]["dp"] == 1 and " --dp " not in slow[0]["command"], slow[0]
one = [c for c in fast if c["dp"] == 4 and c["schedule"] == "1f1b" and c["microbatches"] == 2][0]
assert 104.0 <= one["predicted_ms"] <= 104.5, one
assert set(c["dp"] for c in fast) == {1, 2, 4}, set(c["dp"] for c in fast)
PY
then ok "--ranks 4: replicas on a fast network ($(head -n 3 d1e10.out | tail -n 1 | sed 's/.*pipelm train //' | cut -c1-60)), one pipeline on a slow one"
else bad "--ranks search" "$(sed -n 3p d1e10.out) / $(sed -n 3p d1e6.out)"; fi
# --ranks 4 searches T x D x P = 4 too (--tp T: the T that divide the model's heads and MLP).
# The same four stages of 2 blocks, with an optimizer step of 50 ms each. On a fast network
# (1e10 B/s), under a cap of 2 MB of activations a rank, only --tp 4 fits: a TP rank holds
# (10 + 24/4)/34 of its stage's activations (1.85 MB of the whole model's 4 MB, one micro-batch
# in flight at P = 1), where every pipeline holds at least 2.6 MB and every replica 4 MB. Its
# step, by hand: per micro-batch the whole model's F + B / 4 (12 ms) plus 2 all-reduces a block
# in F and in B (32), each 2e-5 s + 3 x 65536 B / 1e10 B/s; the optimizer step / 4, where the
# whole model's is the four stages' 200 ms less the tied table's second copy on stage 3 (GPT-2
# tiny at 8 blocks: 420480 parameters against the stages' 436864). On a slow network (1e6 B/s:
# 0.2 s an all-reduce) and no cap, no TP layout is in the top five.
python3 - <<'PY'
with open("tp.txt", "w") as f:
    f.write("stages 4\nmsg_bytes 65536\nlatency_s 2e-5\nbytes_per_s 1e10\n")
    for s in range(4):
        f.write("stage %d F 0.004 B 0.008 O 0.05 A 1048576 N 2\n" % s)
PY
sed 's/^bytes_per_s .*/bytes_per_s 1e6/' tp.txt > tp_slow.txt
"$PIPELM" tune --costs tp.txt --ranks 4 --batch 8 --costs-microbatches 8 --mem-cap-gb 0.001953125 --json tp_fast.json \
    -- --preset tiny --n-layer 8 > tp_fast.out 2>&1 || bad "tune --ranks 4 --tp (fast, 2 MB)" "exit $? $(tail -n 2 tp_fast.out)"
"$PIPELM" tune --costs tp_slow.txt --ranks 4 --batch 8 --costs-microbatches 8 --mem-cap-gb 100 --json tp_slow.json \
    -- --preset tiny --n-layer 8 > tp_slow.out 2>&1 || bad "tune --ranks 4 --tp (slow)" "exit $? $(tail -n 2 tp_slow.out)"
"$PIPELM" tune --costs tp.txt --ranks 4 --batch 8 --costs-microbatches 8 --mem-cap-gb 100 --json tp_all.json \
    -- --preset tiny --n-layer 8 > tp_all.out 2>&1 || bad "tune --ranks 4 --tp (fast, no cap)" "exit $? $(tail -n 2 tp_all.out)"
if tph=$(python3 - <<'PY'
import json
# --cp C layouts (test_cp.sh checks them) are left out here: the T x D ones only
fast = [c for c in json.load(open("tp_fast.json"))["candidates"] if c["cp"] == 1]
slow = [c for c in json.load(open("tp_slow.json"))["candidates"] if c["cp"] == 1]
every = [c for c in json.load(open("tp_all.json"))["candidates"] if c["cp"] == 1]
assert set(c["tp"] for c in every) == {1, 2, 4}, set(c["tp"] for c in every)
assert set((c["tp"], c["dp"]) for c in every) == {(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (4, 1)}
assert fast and all(c["tp"] == 4 and c["peak_mem_mb"] <= 2.0 for c in fast), fast
f = fast[0]
assert f["dp"] == 1 and f["schedule"] == "1f1b" and f["microbatches"] == 8, f
assert f["command"].startswith("pipelm train --schedule 1f1b --microbatches 8 --tp 4 "), f
C, V, T, L = 64, 256, 64, 8
block = 12 * C * C + 13 * C
whole = V * C + T * C + L * block + 2 * C
stages = whole + V * C
ar = 2e-5 + 3 * 65536 / 1e10
want = 1e3 * (8 * (0.012 + 32 * ar) + 0.2 * whole / stages / 4)
assert abs(f["predicted_ms"] - want) < 0.002, (f, want)
assert all(c["tp"] == 1 for c in slow[:5]), slow[:5]
print("%.3f ms (by hand %.3f)" % (f["predicted_ms"], want))
PY
); then ok "--ranks 4: --tp 4 the only fit under 2 MB, its step $tph; T x D = 1x1..4x1 searched; no TP in the top five on a slow network"
else bad "--tp search" "$(sed -n 3p tp_fast.out) / $(sed -n 3p tp_slow.out)"; fi
tpc=$(python3 -c '
import json
print(json.load(open("tp_fast.json"))["candidates"][0]["command"].replace("pipelm train ", "", 1))' 2> /dev/null)
if [ -n "$tpc" ] && mpirun_t 120 4 train $tpc --batch 8 --steps 1 --progress 0 > tpc.out 2>&1; then ok "the --tp pick runs: $tpc"
else bad "--tp candidate" "'$tpc' $(tail -n 2 tpc.out 2> /dev/null)"; fi
# --verify: measured beside predicted, on a costs file this machine measured
if mpirun_t 120 2 bench --preset tiny --n-layer 2 --batch 4 --seq-len 16 --microbatches 2 --steps 2 --warmup 1 \
        --costs-out m.txt > m.out 2>&1 &&
        mpirun_t 180 2 tune --costs m.txt --batch 4 --costs-microbatches 2 --top 3 --verify 1 --verify-steps 4 --verify-warmup 2 -- --preset tiny --n-layer 2 \
        --seq-len 16 > v.out 2>&1 && grep -q "^verify 1: --schedule .*: measured [0-9.]* ms per step, predicted" v.out; then
    ok "--verify: $(grep '^verify 1' v.out)"
else bad "--verify" "$(tail -n 5 m.out v.out)"; fi
# --measure: the costs measured in the job itself (without and with --recompute full), then the
# search; its temporary files removed
if TMPDIR=$WORK mpirun_t 180 2 tune --measure 2 --ranks 2 --batch 4 --top 2 --json me.json -- --preset tiny \
        --n-layer 2 --seq-len 16 \
        > me.out 2>&1 && [ "$(grep -c '^tune --measure: --schedule 1f1b --microbatches 2.*costs in' me.out)" = 2 ] &&
        grep -q "^tune: .* layouts tried for P=2, batch 4" me.out && [ -z "$(ls "$WORK"/pipelm-tune-* 2> /dev/null)" ]; then
    ok "--measure: $(grep -c 'recompute full' me.out) recompute line(s), $(grep '^tune: ' me.out | cut -c1-60)"
else bad "--measure" "$(grep -i 'error\|tune' me.out | tail -n 4)"; fi
# a --dp 2 candidate of that search runs as its command says
dpc=$(python3 -c '
import json
c = [x for x in json.load(open("me.json"))["candidates"] if x["dp"] == 2]
print(c[0]["command"].replace("pipelm train ", "", 1) if c else "")' 2> /dev/null)
if [ -n "$dpc" ] && mpirun_t 120 2 train $dpc --batch 4 --steps 1 --progress 0 > dpc.out 2>&1 &&
        grep -q "data parallel: 2 replicas" dpc.out; then ok "a --dp 2 candidate runs: $dpc"
else bad "--dp candidate" "'$dpc' $(tail -n 2 dpc.out 2> /dev/null)"; fi
# train --schedule auto takes the tuner's first pick for the same costs and the same model (2 blocks: at most 4 stages)
first=$("$PIPELM" tune --costs m.txt --stages 2 --batch 4 --costs-microbatches 2 --n-layer 2 2>&1 | sed -n 's/^ *1  .* pipelm train \(.*\)$/\1/p')
if mpirun_t 120 2 train --preset tiny --n-layer 2 --batch 4 --seq-len 16 --microbatches 2 --steps 1 --progress 0 \
        --schedule auto --costs-in m.txt > auto.out 2>&1; then
    S=$(echo "$first" | sed 's/--schedule \([^ ]*\).*/\1/') M=$(echo "$first" | sed 's/.*--microbatches \([0-9]*\).*/\1/')
    grep -q "^--schedule auto: $S, $M micro-batches" auto.out && ok "train --schedule auto: $(grep -m1 'schedule auto' auto.out | cut -c1-120)" \
        || bad "--schedule auto" "tune's pick '$first', train: $(grep -m1 'auto' auto.out)"
else bad "--schedule auto" "exit $? $(grep -m1 error auto.out)"; fi
mpirun_t 60 1 train --preset tiny --n-layer 2 --steps 1 --schedule auto > auto2.out 2>&1
rc=$?
[ $rc = 2 ] && grep -q "schedule auto needs --costs-in" auto2.out && ok "--schedule auto without costs refused" || bad "auto refusal" "rc=$rc"
# the search at P = 64, batch 256 (M up to 256)
python3 - <<'PY'
with open("c64.txt", "w") as f:
    f.write("stages 64\nmsg_bytes 32768\nlatency_s 1e-5\nbytes_per_s 1e10\n")
    for s in range(64): f.write("stage %d F 0.01 B 0.02 I 0.01 W 0.01 O 0.005 A 1000000\n" % s)
PY
start=$(date +%s)
"$PIPELM" tune --costs c64.txt --stages 64 --batch 256 --costs-microbatches 256 > t64.out 2>&1
rc=$? secs=$(($(date +%s) - start))
[ $rc = 0 ] && [ $secs -lt 60 ] && ok "P=64, batch 256: $(head -n 1 t64.out) (${secs} s wall)" || bad "P=64 search" "rc=$rc ${secs} s"
finish
