#!/bin/bash
# test_gen_sched.sh — generate and bench --generate under every schedule (issue 37, item 3):
# decode follows the stage map of the schedule that placed the stages, so under the V
# placement of zb-v and dualpipev (rank 0 holds the first and the last chunk) it gives the
# same tokens as one rank, greedy and sampled, with and without the KV cache, GPT-2 and
# Llama, on 2 and 3 ranks; every run under a timeout (a deadlock fails, not hangs).
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
COMMON="--batch 4 --microbatches 2 --seq-len 16 --progress 0 --log-every 100"
mpirun_t 120 1 train $COMMON --steps 4 --save-final g.bin > tr.out 2>&1 || bad "train" "exit $?"
mpirun_t 120 1 train $COMMON --preset llama-tiny --steps 4 --save-final l.bin > trl.out 2>&1 || bad "train llama" "exit $?"
printf '1,2,3\n4 5\n7\n9,8,7,6,5\n' > p.txt
md5sum p.txt g.bin l.bin > inputs.md5
G="--prompt-file p.txt --max-new-tokens 10 --prefill-chunk 2"
for M in g l; do
    for T in 0 0.8; do
        mpirun_t 120 1 generate $G --init $M.bin --temperature $T --tokens-out ref.tok > ref.log 2>&1 \
            || bad "$M T=$T one rank" "exit $? $(tail -2 ref.log)"
        for S in zb-v dualpipev interleaved-1f1b; do
            for P in 2 3; do
                for KV in 1 0; do
                    n="$M T=$T --schedule $S on $P ranks --kv-cache $KV"
                    mpirun_t 120 $P generate $G --init $M.bin --temperature $T --schedule $S --kv-cache $KV \
                        --tokens-out o.tok > o.log 2>&1; rc=$?
                    if [ $rc -eq 0 ] && cmp -s o.tok ref.tok; then ok "$n: the tokens of one rank"
                    else bad "$n" "rc=$rc $(grep -m2 -E 'error|signal' o.log)"; fi
                done
            done
        done
    done
done
for S in zb-v dualpipev; do
    mpirun_t 120 2 bench --generate --init g.bin --prompt-file p.txt --max-new-tokens 4 --schedule $S > b.log 2>&1; rc=$?
    if [ $rc -eq 0 ] && grep -q "^generate |" b.log; then ok "bench --generate --schedule $S on 2 ranks"
    else bad "bench --generate $S" "rc=$rc $(grep -m2 -E 'error|signal' b.log)"; fi
done
md5sum -c --quiet inputs.md5 && ok "inputs unchanged" || bad "inputs" "changed"
finish
