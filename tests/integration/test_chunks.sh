#!/bin/bash
# test_chunks.sh — virtual stages (--chunks-per-rank V: P x V stages, stage s on rank s mod P)
# train exactly: interleaved-1f1b, looped-bfs and interleaved-zb over several P, V and M give
# losses and final weights bit-identical to the one-process run; so do schedule CSVs with
# chunks, explicit splits and per-stage recomputation over P V stages, data parallelism over
# chunked pipelines, and Llama. Checkpoints stay named by layer: a save on P x V resumes
# bit-identically on other P' x V' and on 1f1b. Refusals name the reason; a failing rank
# ends every rank. Every mpiexec runs under a timeout.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
STEPS=3
# six blocks: up to 8 stages (the first and the last may hold none)
C="--preset tiny --n-layer 6 --steps $STEPS --batch 40 --seq-len 16 --eval-every 0 --progress 0 --log-every 100"

# same NAME METRICS WEIGHTS REF: losses and final weights equal to reference REF's
same() {
    if cmp -s "$4.bin" "$3" && [ "$(losses "$4.jsonl")" = "$(losses "$2")" ] && [ -n "$(losses "$2")" ]; then
        ok "$1: losses and final weights bit-identical to one process"
    else
        bad "$1" "differs from the one-process run ($(losses "$2" | tr '\n' ' ') vs $(losses "$4.jsonl" | tr '\n' ' '))"
    fi
}

# the references: one process, each M (the gradient sums depend on the micro-batching)
for M in 2 5 8; do
    mpirun_t 120 1 train $C --microbatches $M --metrics ref$M.jsonl --save-final ref$M.bin > ref$M.out 2>&1 \
        || bad "reference M=$M" "exit $?"
done

# every chunked schedule, on P x V layouts with even and odd M (5: interleaved pads to a
# multiple of its group size and leaves the padding out). The full tier runs all 36; the plain
# tier 14: every layout and every schedule with each M (M rotating over the pairs), and the
# three runs the checks after the loop read (P=2 V=2 M=8 interleaved and looped, P=3 V=2 M=8)
plain_run() { # plain_run LAYOUT_INDEX SCHEDULE_INDEX M NAME
    case $4 in run_2x2_interleaved-1f1b_8 | run_2x2_looped-bfs_8 | run_3x2_interleaved-1f1b_8) return 0 ;; esac
    local ms=(2 5 8)
    [ "${ms[$((($1 + $2 + 2) % 3))]}" = "$3" ]
}
left=0
li=0
for PV in 2x2 2x3 3x2 4x2; do
    P=${PV%x*} V=${PV#*x}
    si=0
    for S in interleaved-1f1b looped-bfs interleaved-zb; do
        si=$((si + 1))
        for M in 2 5 8; do
            f=run_${PV}_${S}_$M
            if ! full_tier && ! plain_run $li $((si - 1)) $M $f; then left=$((left + 1)); continue; fi
            tag="P=$P V=$V $S M=$M"
            if ! mpirun_t 180 $P train $C --microbatches $M --schedule $S --chunks-per-rank $V --metrics $f.jsonl \
                    --save-final $f.bin > $f.out 2>&1; then
                bad "$tag" "exit $? ($(grep -m1 error $f.out))"
                continue
            fi
            same "$tag" $f.jsonl $f.bin ref$M
            grep -q '"tied_identical":true' $f.jsonl || bad "$tag" "tied embedding copies differ"
            # the engine's peak of micro-batches held on a rank: at most V M, and looped-bfs holds all V M
            peaks=$(grep '"event":"end"' $f.jsonl | sed 's/.*"inflight_peak":\[\([^]]*\)\].*/\1/')
            for p in ${peaks//,/ }; do
                if [ "$p" -gt $((V * M)) ] || { [ $S = looped-bfs ] && [ "$p" -ne $((V * M)) ]; }; then
                    bad "$tag" "in-flight peaks $peaks (V M = $((V * M)))"
                    break
                fi
            done
        done
    done
    li=$((li + 1))
done
[ $left = 0 ] || full_only "$left more of the 36 layout x schedule x M runs"
# interleaving holds fewer micro-batches than looping: rank 0's peak at P=2 V=2 M=8
pi=$(grep '"event":"end"' run_2x2_interleaved-1f1b_8.jsonl | sed 's/.*"inflight_peak":\[\([0-9]*\).*/\1/')
pl=$(grep '"event":"end"' run_2x2_looped-bfs_8.jsonl | sed 's/.*"inflight_peak":\[\([0-9]*\).*/\1/')
[ -n "$pi" ] && [ -n "$pl" ] && [ "$pi" -lt "$pl" ] && ok "rank 0 holds $pi micro-batches interleaved, $pl looped (P=2 V=2 M=8)" \
    || bad "in-flight interleaved vs looped" "$pi vs $pl"

# the stage table shows every chunk with its rank
grep -q "pipeline: 6 stages = 3 ranks x 2 chunks" run_3x2_interleaved-1f1b_8.out &&
    grep -Eq "^ +5 +2 +5-5 +H " run_3x2_interleaved-1f1b_8.out && ok "stage table: 6 stages, stage 5 on rank 2 holds block 5 and the head" \
    || bad "stage table" "$(grep -A8 '^pipeline' run_3x2_interleaved-1f1b_8.out)"

# a schedule CSV with chunks (written by pipelm schedule) trains the same bits
"$PIPELM" schedule --stages 2 --chunks-per-rank 2 --microbatches 8 --schedule interleaved-zb --csv izb.csv > /dev/null 2>&1
if mpirun_t 120 2 train $C --microbatches 8 --schedule-csv izb.csv --metrics csv.jsonl --save-final csv.bin > csv.out 2>&1; then
    same "interleaved-zb from its CSV (P=2, 4 stages)" csv.jsonl csv.bin ref8
else bad "schedule CSV with chunks" "$(grep -m1 error csv.out)"; fi
mpirun_t 60 2 train $C --microbatches 8 --schedule-csv izb.csv --chunks-per-rank 3 > csv3.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "has 2 chunk(s) per rank.*--chunks-per-rank is 3" csv3.out && ok "a CSV whose chunks disagree with --chunks-per-rank is refused" \
    || bad "CSV chunk mismatch" "rc=$rc $(grep -m1 error csv3.out)"

# an explicit split and per-stage recomputation over the P V stages
if mpirun_t 120 2 train $C --microbatches 8 --schedule interleaved-1f1b --chunks-per-rank 2 --split 0,3,2,1 \
        --recompute none,full,selective,full --metrics sp.jsonl --save-final sp.bin > sp.out 2>&1; then
    same "--split 0,3,2,1 --recompute none,full,selective,full over 4 stages" sp.jsonl sp.bin ref8
else bad "split and recompute over chunks" "$(grep -m1 error sp.out)"; fi

# Llama: untied head on the last chunk, RoPE tables per chunk
L="--preset llama-tiny --n-layer 4 --steps 2 --batch 8 --seq-len 16 --microbatches 4 --eval-every 0 --progress 0"
mpirun_t 120 1 train $L --metrics lref.jsonl --save-final lref.bin > lref.out 2>&1 || bad "llama reference" "exit $?"
if mpirun_t 120 2 train $L --schedule interleaved-zb --chunks-per-rank 2 --metrics l.jsonl --save-final l.bin > l.out 2>&1; then
    same "llama-tiny P=2 V=2 interleaved-zb" l.jsonl l.bin lref
else bad "llama with chunks" "$(grep -m1 error l.out)"; fi

# data parallelism over chunked pipelines: the same bits as the one-chunk pipeline of the same D
D="$C --microbatches 4 --batch 16"
mpirun_t 180 4 train $D --dp 2 --stages 2 --metrics d1.jsonl --save-final d1.bin > d1.out 2>&1 || bad "dp 2 x 1f1b" "exit $?"
for Z in 0 1; do
    if mpirun_t 180 4 train $D --dp 2 --stages 2 --zero $Z --schedule interleaved-1f1b --chunks-per-rank 2 \
            --metrics dz$Z.jsonl --save-final dz$Z.bin > dz$Z.out 2>&1 && cmp -s d1.bin dz$Z.bin &&
            [ "$(losses d1.jsonl)" = "$(losses dz$Z.jsonl)" ]; then
        ok "--dp 2 x 2 ranks x 2 chunks (--zero $Z) equals --dp 2 x 2 stages of 1f1b bit for bit"
    else bad "dp with chunks, zero $Z" "$(grep -m1 error dz$Z.out) $(losses dz$Z.jsonl | tr '\n' ' ') vs $(losses d1.jsonl | tr '\n' ' ')"; fi
done

# checkpoints: saved on 2 ranks x 2 chunks at step 2, resumed on other layouts and schedules
N=4 K=2
R="--preset tiny --n-layer 6 --batch 8 --seq-len 16 --microbatches 4 --eval-every 0 --progress 0 --log-every 100"
mpirun_t 120 1 train $R --steps $N --metrics straight.jsonl --save-final straight.bin > straight.out 2>&1 || bad straight "exit $?"
resumed() { # NAME METRICS WEIGHTS
    if cmp -s straight.bin "$3" && [ "$(losses straight.jsonl | tail -n $((N - K)))" = "$(losses "$2")" ]; then
        ok "$1: steps $((K + 1))-$N and final weights bit-identical to the straight run"
    else bad "$1" "differs from the straight run"; fi
}
mpirun_t 120 2 train $R --steps $K --schedule interleaved-1f1b --chunks-per-rank 2 --ckpt-dir c22 --ckpt-every $K > c22.out 2>&1 \
    || bad "save on 2 x 2" "exit $? $(grep -m1 error c22.out)"
for lay in "3 --schedule interleaved-zb --chunks-per-rank 2" "2 --schedule 1f1b" "1" "2 --schedule looped-bfs --chunks-per-rank 3"; do
    np=${lay%% *}
    f=r_$(echo "$lay" | tr -cd 'a-z0-9')
    mpirun_t 180 $np train $R --steps $N --resume c22/ckpt_0000000$K.h5 ${lay#"$np"} --metrics $f.jsonl --save-final $f.bin \
        > $f.out 2>&1 || bad "resume on $lay" "exit $? $(grep -m1 error $f.out)"
    grep -q "resumed from .*step $K (saved on 4 stages" $f.out && resumed "2 x 2 chunks -> $np ranks${lay#"$np"}" $f.jsonl $f.bin \
        || bad "resume on $lay" "no resume line: $(grep -m1 -i 'error\|resumed' $f.out)"
done
mpirun_t 120 2 train $R --steps $K --ckpt-dir c2 --ckpt-every $K > c2.out 2>&1 || bad "save on 2 stages" "exit $?"
mpirun_t 180 2 train $R --steps $N --resume c2/ckpt_0000000$K.h5 --schedule interleaved-1f1b --chunks-per-rank 2 \
    --metrics r2.jsonl --save-final r2.bin > r2.out 2>&1 || bad "resume 2 -> 2 x 2" "exit $?"
resumed "1f1b on 2 stages -> 2 ranks x 2 chunks" r2.jsonl r2.bin

# --trace with chunks: every compute event names its global stage, run on rank stage mod P
mpirun_t 120 2 train $C --microbatches 4 --steps 1 --schedule interleaved-zb --chunks-per-rank 2 --trace tr.json > tr.out 2>&1 \
    || bad "--trace with chunks" "exit $?"
if python3 - tr.json <<'PY'
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("cat") == "compute"]
seen = {(e["name"][0], e["args"]["stage"], e["args"]["mb"]) for e in ev}
assert all(e["tid"] == e["args"]["stage"] % 2 for e in ev), "a stage on the wrong rank"
want = {(op, s, m) for op in "FIW" for s in range(4) for m in range(4)}
missing = want - seen
assert not missing, sorted(missing)[:5]
PY
then ok "--trace names each compute event's stage (F, I, W of 4 stages x 4 micro-batches, on rank stage mod 2)"
else bad "--trace with chunks" "see above"; fi

# refusals, each naming the reason
refuse() { # NAME PATTERN NP ARGS...
    local name=$1 pat=$2 np=$3
    shift 3
    mpirun_t 60 $np train $C --microbatches 4 "$@" > refuse.out 2>&1
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "$pat" refuse.out; then ok "$name refused: $(grep -m1 error refuse.out | cut -c1-160)"
    else bad "$name" "rc=$rc $(head -c 300 refuse.out)"; fi
}
refuse "chunks on one rank" "need at least 2 pipeline ranks" 1 --schedule interleaved-1f1b --chunks-per-rank 2
refuse "gpipe with chunks" "interleaved-1f1b\|chunk" 2 --schedule gpipe --chunks-per-rank 2
refuse "zb-v with 3 chunks" "zb-v runs exactly 2 chunks per rank" 2 --schedule zb-v --chunks-per-rank 3
refuse "more stages than blocks + 2" "stages" 4 --schedule looped-bfs --chunks-per-rank 3
refuse "--recompute with the wrong count" "one per stage (4 here)" 2 --schedule interleaved-1f1b --chunks-per-rank 2 --recompute none,full

# a rank that fails in the middle of a chunked step ends every rank, named
mpirun_t 60 2 train $C --microbatches 8 --steps 5 --schedule interleaved-1f1b --chunks-per-rank 2 --fail-rank 1 --fail-step 2 \
    > fail.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 1: error: injected failure" fail.out && ok "a failing rank mid-step ends both ranks (rc $rc)" \
    || bad "failure with chunks" "rc=$rc $(tail -n 3 fail.out)"
# a NaN in the weights is named: the rank, and the tensor (its layer)
mpirun_t 60 2 train $C --microbatches 4 --steps 4 --schedule interleaved-1f1b --chunks-per-rank 2 --fail-rank 1 --fail-step 2 \
    --fail-at nan > nan.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "weights of rank 1 (its 2 chunks) already hold a non-finite value, first in h\." nan.out \
    && ok "NaN named: $(grep -m1 'weights of rank' nan.out | cut -c1-160)" || bad "NaN with chunks" "rc=$rc $(grep error nan.out | head -3)"
finish
