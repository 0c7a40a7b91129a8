#!/bin/bash
# test_pipeline.sh — pipelined runs are bit-identical to the one-process run; activation
# memory stays within the schedule's bound; failures end every rank quickly and clearly.
# Every mpiexec runs under a timeout.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
STEPS=4
M=4
COMMON="--preset tiny --steps $STEPS --batch 8 --seq-len 32 --microbatches $M --eval-every 0 --progress 0 --log-every 100"

# the reference: one process
mpirun_t 120 1 train $COMMON --metrics ref.jsonl --save-final ref.bin > ref.out 2>&1 || bad reference "exit $?"
[ "$(losses ref.jsonl | wc -l)" -eq $STEPS ] && ok "reference run" || bad "reference run" "no losses"

# uneven explicit splits of the 4 tiny blocks (first/last stage may hold none)
uneven() { case $1 in 1) echo 4 ;; 2) echo 1,3 ;; 3) echo 0,3,1 ;; 4) echo 0,1,2,1 ;; esac; }

# The full tier runs both splits of every P x schedule (24 runs); the plain tier one, the
# automatic and the uneven split alternating, so each P and each schedule meets both (12 runs)
left=0
for P in 1 2 3 4; do
    si=0
    for S in 1f1b gpipe zb-h1; do
        si=$((si + 1))
        k=0
        for SPLIT in auto "$(uneven $P)"; do
            k=$((k + 1))
            if ! full_tier && [ $(((P + si + k) % 2)) = 1 ]; then left=$((left + 1)); continue; fi
            tag="P=$P $S split=$SPLIT"
            f="run_${P}_${S}_${SPLIT//,/-}"
            if ! mpirun_t 120 $P train $COMMON --schedule $S --split $SPLIT --metrics $f.jsonl \
                    --save-final $f.bin > $f.out 2>&1; then
                bad "$tag" "exit status $? ($(tail -n 3 $f.out | tr '\n' ' '))"
                continue
            fi
            if cmp -s ref.bin $f.bin && [ "$(losses ref.jsonl)" = "$(losses $f.jsonl)" ]; then
                ok "$tag: losses and final weights bit-identical to one process"
            else
                bad "$tag" "differs from the one-process run"
            fi
            # activation slots: 1f1b and zb-h1 hold at most min(P-s, M) on stage s, gpipe holds M
            peaks=$(grep '"event":"end"' $f.jsonl | sed 's/.*"inflight_peak":\[\([^]]*\)\].*/\1/')
            okp=1
            s=0
            for p in ${peaks//,/ }; do
                if [ $S = gpipe ]; then want=$M; else want=$((P - s < M ? P - s : M)); fi
                if [ $S = gpipe ] && [ "$p" -ne "$want" ]; then okp=0; fi
                if [ $S != gpipe ] && [ "$p" -gt "$want" ]; then okp=0; fi
                s=$((s + 1))
            done
            [ $okp = 1 ] && [ $s = $P ] && ok "$tag: in-flight micro-batches $peaks" || bad "$tag" "in-flight $peaks"
            if [ $P -gt 1 ]; then
                grep -q '"tied_identical":true' $f.jsonl && ok "$tag: tied embedding copies identical" \
                    || bad "$tag" "tied embedding copies differ"
            fi
        done
    done
done
[ $left = 0 ] || full_only "the other split of each P x schedule ($left runs)"

# activation recomputation (selective: attention probabilities; full: whole blocks; or one per
# stage) gives the same bits, with plain and split (zb-h1) backwards
for RC in selective full none,full,selective; do
    for S in 1f1b zb-h1; do
        P=$(( ${#RC} > 9 && $(echo $RC | tr -cd , | wc -c) == 2 ? 3 : 2 ))
        f=rc_${RC//,/-}_$S
        if mpirun_t 120 $P train $COMMON --schedule $S --recompute $RC --metrics $f.jsonl --save-final $f.bin > $f.out 2>&1 \
                && cmp -s ref.bin $f.bin && [ "$(losses ref.jsonl)" = "$(losses $f.jsonl)" ]; then
            ok "--recompute $RC, P=$P $S: bit-identical to one process without recomputation"
        else bad "--recompute $RC P=$P $S" "$(tail -n 2 $f.out | tr '\n' ' ')"; fi
    done
done
mpirun_t 60 2 train $COMMON --recompute full,none,full > rcbad.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "one per stage (2 here), not 3" rcbad.out; then
    ok "--recompute list of the wrong length refused"; else bad "--recompute list" "rc=$rc"; fi

# a schedule read from torch-style CSV runs and matches
"$PIPELM" schedule --stages 3 --microbatches $M --schedule 1f1b --csv s.csv > /dev/null 2>&1
if mpirun_t 120 3 train $COMMON --schedule-csv s.csv --metrics csv.jsonl --save-final csv.bin > csv.out 2>&1 \
        && cmp -s ref.bin csv.bin; then ok "--schedule-csv run bit-identical"; else bad "--schedule-csv" "$(tail -n 2 csv.out)"; fi
# issue 8's CSV: B0 and B1 run back to back before their SEND_Bs (the input gradient of each
# must live in its own micro-batch's buffer); it must train exactly as one process
printf '0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n1RECV_F0,1F0,1RECV_F1,1F1,1B0,1B1,1SEND_B0,1SEND_B1\n' > late.csv
mpirun_t 120 1 train $COMMON --microbatches 2 --metrics ref2.jsonl --save-final ref2.bin > ref2.out 2>&1
if mpirun_t 120 2 train $COMMON --microbatches 2 --schedule-csv late.csv --metrics late.jsonl --save-final late.bin > late.out 2>&1 \
        && cmp -s ref2.bin late.bin && [ "$(losses ref2.jsonl)" = "$(losses late.jsonl)" ]; then
    ok "a CSV with B0,B1 before SEND_B0,SEND_B1 is bit-identical"; else bad "late SEND_B CSV" "$(tail -n 2 late.out)"; fi
# a CSV whose backwards are out of micro-batch order is refused, naming the action
printf '0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B1,0RECV_B0,0B1,0B0\n1RECV_F0,1F0,1RECV_F1,1F1,1B0,1SEND_B0,1B1,1SEND_B1\n' > order.csv
mpirun_t 60 2 train $COMMON --microbatches 2 --schedule-csv order.csv > order.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "action #6 (0B1): comes before 0B0" order.out; then
    ok "out-of-order backwards refused: $(grep -m1 error order.out | cut -c1-120)"; else bad "out-of-order CSV" "rc=$rc"; fi
# a CSV that deadlocks is refused before any work
printf '0F0,0RECV_B0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n' > dead.csv
mpirun_t 60 2 train $COMMON --microbatches 1 --schedule-csv dead.csv > dead.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "deadlock" dead.out; then
    ok "invalid CSV schedule refused: $(grep -m1 error dead.out)"; else bad "invalid CSV" "rc=$rc"; fi

# wrong rank count for an explicit split: every rank exits non-zero with what to run
mpirun_t 60 3 train $COMMON --split 2,2 > wrong.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "mpiexec -n 2" wrong.out; then ok "wrong rank count refused"; else bad "wrong rank count" "rc=$rc"; fi

# a rank that fails mid-step ends the whole job within seconds, naming the rank
start=$(date +%s)
mpirun_t 60 3 train $COMMON --steps 10 --fail-rank 1 --fail-step 3 > fail.out 2>&1
rc=$?
el=$(( $(date +%s) - start ))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $el -lt 30 ] && grep -q "rank 1: error: injected failure" fail.out; then
    ok "mid-step failure of rank 1 ends the job in ${el}s (exit $rc)"; else bad "mid-step failure" "rc=$rc after ${el}s"; fi

# a bad input file on the data ranks (0 and 2) while rank 1 is fine
printf 'not a token file' > bad.bin
mpirun_t 60 3 train $COMMON --data bad.bin > badfile.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "bad.bin" badfile.out && grep -q "stopping all 3 ranks" badfile.out; then
    ok "bad data file ends every rank: $(grep -m1 error badfile.out)"; else bad "bad data file" "rc=$rc"; fi

# a failure during set-up on one rank only
mpirun_t 60 4 train $COMMON --fail-rank 2 --fail-step 0 > setup.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 2 failed during set-up" setup.out; then
    ok "set-up failure on rank 2 stops all ranks"; else bad "set-up failure" "rc=$rc"; fi

# NaN: a huge learning rate makes the loss non-finite; every rank stops with the cause
mpirun_t 60 2 train $COMMON --steps 20 --lr 1e12 --warmup-steps 0 --grad-clip 0 > nan.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -Eq "non-finite|diverged" nan.out; then
    ok "NaN stops the run: $(grep -m1 -E 'non-finite|diverged' nan.out | cut -c1-120)"; else bad "NaN" "rc=$rc"; fi

# --trace: Chrome trace-event JSON, one track per rank, every action of the schedule in it
mpirun_t 120 2 train $COMMON --steps 2 --microbatches 2 --trace trace.json > trace.out 2>&1 || bad "--trace run" "exit $?"
if python3 - trace.json <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"]
names = {(e["tid"], e["name"]) for e in ev if e.get("ph") == "X"}
tracks = {e["args"]["name"] for e in ev if e.get("ph") == "M"}
need = {(r, n) for r in (0, 1) for n in ("F0", "F1", "B0", "B1", "optimizer")}
need |= {(0, "send F 0"), (0, "send F 1"), (1, "send B 0"), (1, "send B 1")}
missing = need - names
assert tracks == {"rank 0", "rank 1"}, tracks
assert not missing, missing
assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in ev if e.get("ph") == "X")
PY
then ok "--trace parses, one track per rank, all actions present"; else bad "--trace" "see above"; fi

# pipelm bench: the JSON keys scripts depend on
mpirun_t 120 2 "bench" $COMMON --warmup 1 --steps 2 --json bench.json --csv bench.csv > bench.out 2>&1 || bad "bench run" "exit $?"
if python3 - bench.json <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
for k in ("tokens_per_s", "tflops", "mfu", "peak_gflops", "bubble_measured", "bubble_theoretical"):
    assert isinstance(b[k], (int, float)), k
assert set(b["step_ms"]) >= {"min", "median", "max"}
assert len(b["stages"]) == 2
for s in b["stages"]:
    assert set(s) >= {"rank", "blocks", "compute_ms", "wait_ms", "idle_ms", "peak_rss_mb"}, s
assert 0 < b["mfu"] < 1 and b["tokens_per_s"] > 0
PY
then ok "bench JSON has every key"; else bad "bench JSON" "$(head -c 300 bench.json)"; fi
[ "$(wc -l < bench.csv)" -eq 2 ] && ok "bench CSV" || bad "bench CSV" "$(cat bench.csv)"

finish
