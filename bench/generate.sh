#!/bin/bash
# bench/generate.sh — pipelined decoding (pipelm bench --generate) on the tutorial preset
# (V=10000 C=512 L=8 NH=8, max-seq-len raised to 512 so 256 tokens fit), random weights:
#   1. time to first token, decode tokens/s and the decode bubble on P = 1, 2, 4 ranks with
#      8 prompts (16 tokens each) in flight, REPS rounds with the P interleaved; P=1 both with
#      one thread and with the node's cores, so the ratio to one rank can be read either way;
#   2. the KV-cached decode of 256 tokens against recomputing the prefix at every step
#      (--kv-cache 0), one prompt of 8 tokens, one rank, one thread, interleaved: on the
#      tutorial model and on the tiny preset (max-seq-len 320, random weights);
#   3. torch's cached greedy decode (tests/torch_generate.py --bench, one thread, float32) on
#      the same model file beside pipelm's, one prompt, one rank, one thread.
# Figures go to stdout as one JSON line per run, with `uptime` beside them; run it on an idle
# machine (the issue's targets: P=2 >= 1.7x one rank; cached >= 20x the recompute).
#   bench/generate.sh [BUILD_DIR]   (REPS=2, NEW=64, MPIEXEC=mpiexec)
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build}
PIPELM=$build/pipelm
MPIEXEC=${MPIEXEC:-mpiexec}
REPS=${REPS:-2}
NEW=${NEW:-64}
W=$(mktemp -d "${TMPDIR:-/tmp}/gen_bench.XXXXXX")
trap 'rm -rf "$W"' EXIT
M="--preset tutorial --max-seq-len 512"
"$PIPELM" train $M --steps 1 --batch 1 --seq-len 16 --progress 0 --save-final "$W/w.bin" > "$W/train.out" 2>&1 \
    || { echo "making the weights failed: $(tail -3 "$W/train.out")"; exit 1; }
/usr/bin/python3 -c "
import random; random.seed(1)
open('$W/p8.txt', 'w').write(''.join(','.join(str(random.randrange(10000)) for _ in range(16)) + '\n' for _ in range(8)))
open('$W/p1.txt', 'w').write('1,2,3,4,5,6,7,8\n')"
# run NAME RANKS ARGS...: one benchmark, its JSON line labelled
run() {
    local n=$1 r=$2
    shift 2
    if timeout 900 "$MPIEXEC" -n "$r" "$PIPELM" bench --generate --init "$W/w.bin" --json "$W/$n.json" "$@" \
        > "$W/$n.out" 2>&1; then
        echo "{\"run\":\"$n\",\"load\":\"$(uptime | sed 's/.*load average: //')\",\"result\":$(cat "$W/$n.json")}"
    else echo "{\"run\":\"$n\",\"failed\":\"$(tail -1 "$W/$n.out" | tr -d '"')\"}"; fi
}
echo "# $(uptime)"
for rep in $(seq "$REPS"); do
    run "p1_1thread_$rep" 1 --prompt-file "$W/p8.txt" --max-new-tokens "$NEW" --threads 1
    run "p1_$rep" 1 --prompt-file "$W/p8.txt" --max-new-tokens "$NEW"
    run "p2_$rep" 2 --prompt-file "$W/p8.txt" --max-new-tokens "$NEW"
    run "p4_$rep" 4 --prompt-file "$W/p8.txt" --max-new-tokens "$NEW" --groups 4
done
for rep in $(seq "$REPS"); do
    run "cached256_$rep" 1 --prompt-file "$W/p1.txt" --max-new-tokens 256 --threads 1
    run "recompute256_$rep" 1 --prompt-file "$W/p1.txt" --max-new-tokens 256 --threads 1 --kv-cache 0
    for kv in 1 0; do
        "$MPIEXEC" -n 1 "$PIPELM" bench --generate --preset tiny --max-seq-len 320 --prompt-file "$W/p1.txt" \
            --max-new-tokens 256 --threads 1 --kv-cache $kv --json "$W/tiny$kv.json" > "$W/tiny.out" 2>&1
        echo "{\"run\":\"tiny256_kv${kv}_$rep\",\"load\":\"$(uptime | sed 's/.*load average: //')\",\"result\":$(cat "$W/tiny$kv.json")}"
    done
done
for rep in $(seq "$REPS"); do
    run "pipelm_1prompt_$rep" 1 --prompt-file "$W/p1.txt" --max-new-tokens "$NEW" --threads 1
    echo "{\"run\":\"torch_1prompt_$rep\",\"load\":\"$(uptime | sed 's/.*load average: //')\",\"result\":$(
        OMP_NUM_THREADS=1 /usr/bin/python3 "$top/tests/torch_generate.py" --bench "$W/w.bin" --prompt 1,2,3,4,5,6,7,8 \
        --steps "$NEW")}"
done
echo "# $(uptime)"
